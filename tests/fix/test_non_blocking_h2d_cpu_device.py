"""non-blocking-h2d leaves `.to(device)` alone when `device` is a CPU device spelled out in its
scope (`device = torch.device("cpu")`, `device = "cpu"`): a copy to the CPU is not a host-to-device
copy. Found by benchmarks/bench_peers_torch.py: the fixer reported (and rewrote) the batch copies of
the CPU scenario training_data/scenarios/dataloader_bound_clean.py, whose manifest says it must not
show pageable-memcpy."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoomer_ar.fix.api import fix_source, static_findings

REPO = Path(__file__).resolve().parents[2]
SCEN = REPO / "training_data" / "scenarios"

LOOP = (
    "import torch\n"
    "from torch.utils.data import DataLoader\n"
    "\n"
    "def main(ds, model):\n"
    "    device = {device}\n"
    "    loader = DataLoader(ds, batch_size=8, num_workers=2, pin_memory=True)\n"
    "    for x, y in loader:\n"
    "        model(x.to(device), y.to(device))\n"
)


def _pageable(source: str) -> list:
    return [m for m in static_findings(source, "t.py") if m.pattern == "pageable-memcpy"]


@pytest.mark.parametrize("device", ['torch.device("cpu")', '"cpu"', "torch.device('cpu', 0)"])
def test_copy_to_a_cpu_device_name_is_not_reported_nor_rewritten(device):
    source = LOOP.format(device=device)
    assert _pageable(source) == []
    assert fix_source(source, ["pageable-memcpy"]) == source


@pytest.mark.parametrize("device", ['torch.device("cuda")', '"cuda:0"', "torch.device(args.device)"])
def test_copy_to_an_accelerator_name_is_still_fixed(device):
    source = LOOP.format(device=device)
    assert len(_pageable(source)) == 2
    assert fix_source(source, ["pageable-memcpy"]).count("non_blocking=True") == 2


def test_a_name_bound_to_cpu_and_to_something_else_is_still_an_accelerator_copy():
    source = LOOP.format(device='torch.device("cpu")').replace(
        "    loader =", "    if torch.cuda.is_available():\n        device = torch.device(\"cuda\")\n    loader =")
    assert len(_pageable(source)) == 2


def test_a_module_level_cpu_device_read_in_a_function():
    source = LOOP.format(device='"unused"').replace("import torch\n", 'import torch\nDEVICE = torch.device("cpu")\n', 1)
    source = source.replace(".to(device)", ".to(DEVICE)")
    assert _pageable(source) == []
    # a parameter named like a device stays an accelerator: its value is not known here
    param = LOOP.format(device='"x"').replace("def main(ds, model):\n    device = \"x\"\n", "def main(ds, model, device):\n")
    assert len(_pageable(param)) == 2


@pytest.mark.parametrize("name", ["dataloader_bound", "dataloader_bound_clean"])
def test_the_cpu_dataloader_scenarios_show_no_pageable_memcpy(name):
    path = SCEN / f"{name}.py"
    assert _pageable(path.read_text(encoding="utf-8")) == []
