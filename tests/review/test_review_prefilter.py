"""The prefilter never drops a finding review would report: on every fixer example, the scenario
programs and alias cases, for every single changed line and every single deletion."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoomer_ar.fix import engine as fix_engine
from zoomer_ar.fix.registry import load_registry
from zoomer_ar.review import prefilter
from zoomer_ar.review.diff import FileDiff
from zoomer_ar.review.engine import to_findings

REPO = Path(__file__).resolve().parents[2]
ALL = fix_engine.select_fixers()
NAMES = [f.name for f in ALL.fixers]
KNOWN = [n for n in NAMES if n in prefilter.KEYS]  # a fixer added later always runs: pruning tests use these

ALIASES = [
    "import torch\nfrom torch.utils.data import DataLoader as DL\n\ndef go(ds):\n    return DL(\n        ds,\n        batch_size=2,\n    )\n",
    "import torch\nfrom torch.optim import AdamW as Opt\nopt = Opt(params,\n    foreach=False)\n",
    "import torch\nfrom torch.cuda import empty_cache as flush\nfor b in batches:\n    step(b)\n    flush()\n",
    "import torch\nfrom torch.nn.parallel import DistributedDataParallel as Wrap\nm = Wrap(model)\n",
    "import torch\nfrom torch import zeros as z\nx = z(3).to('cuda')\n",
    "import torch\nimport torch.nn as nn\n\nclass Net(nn.Module):\n    pass\n\n\nmodel = Net()\nout = model(x)\n",
    "import torch\nfrom torchvision.models import resnet50 as build\nmodel = build()\nout = model(torch.randn(1, 3, 224, 224))\n",
    "import torch\n\ndef train(model, loader, opt):\n    for step, batch in enumerate(loader):\n        running = batch\n        value = running.cpu()\n",
    "import torch\n\n\nmodel = Net().cuda()\n\n\ndef step(opt):\n    loss.backward()\n    opt.step()\n",
    # statement structures: try/except, with, nested loops, inline suites, match, decorators, else blocks
    "import torch\nfrom torch.utils.data import DataLoader\n\ndef f(ds):\n    try:\n        x = 1\n    except ValueError:\n"
    "        loader = DataLoader(ds)\n    else:\n        other = DataLoader(\n            ds,\n        )\n    finally:\n        pass\n",
    "import torch\n\ndef f(loader, model):\n    with torch.no_grad():\n        for epoch in range(3):\n            for x in loader:\n"
    "                loss = model(x)\n                print(loss.item())\n",
    "import torch\n\ndef f(loader, model):\n    for x in loader: v = model(x).item(); w = 2\n    while True: torch.cuda.synchronize()\n",
    "import torch\n\ndef f(cmd, loader, model):\n    for x in loader:\n        match cmd:\n            case {'a': 1}:\n"
    "                y = model(x).cpu()\n            case _:\n                pass\n",
    "import torch\nimport functools\n\n@functools.lru_cache(\n    maxsize=torch.zeros(3).to('cuda').numel(),\n)\ndef f():\n    return 1\n",
    "import torch\n\ndef f(model, loader):\n    for x in loader:\n        y = model(x)\n    else:\n        torch.cuda.empty_cache()\n"
    "    for p in model.parameters():\n        if p.grad is not None:\n            p.grad.zero_()\n",
    "import torch\nfrom torch import optim\n\n\nclass Trainer:\n    def __init__(self, model):\n        self.model = model\n"
    "        self.opt = optim.SGD(\n            model.parameters(),\n            lr=0.1,\n        )\n",
]


def _sources() -> list[tuple[str, str, dict]]:
    out = []
    for cls in load_registry().fixers:
        for i, ex in enumerate(cls.INVALID):
            out.append((f"{cls.name}[{i}]", ex.before, {cls.name: dict(ex.options)} if ex.options else {}))
    for i, src in enumerate(ALIASES):
        out.append((f"alias[{i}]", src, {}))
    for p in sorted((REPO / "training_data" / "scenarios").glob("*.py")):
        out.append((p.name, p.read_text(encoding="utf-8"), {}))
    return out


SOURCES = _sources()


@pytest.mark.parametrize("name, source, options", SOURCES, ids=[s[0] for s in SOURCES])
def test_prefilter_keeps_every_reviewable_finding(name, source, options):
    selection = fix_engine.select_fixers(None, None, options or None)
    matches = fix_engine.detect_source(source, "x.py", selection)
    assert matches or not name.startswith("alias"), "an alias/structure case must plant a finding"
    n = len(source.splitlines())
    for line in range(1, n + 1):
        for fd in (FileDiff("x.py", added={line}), FileDiff("x.py", deletions={line})):
            expected = {f.fixer for f in to_findings(fd, source, matches, {})}
            if not expected:
                continue
            kept = prefilter.candidates(source, fd, NAMES)
            assert expected <= kept, f"{name}: line {line} ({'added' if fd.added else 'deleted after'}): dropped {expected - kept}"


def test_prefilter_prunes():
    plain = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0\n"
    assert prefilter.candidates(plain, FileDiff("p.py", added={2}), KNOWN) == set()
    torchy = (
        "import torch\nfrom torch.utils.data import DataLoader\n\n\ndef make(ds):\n    return DataLoader(ds)\n\n\n"
        "def helper(x):\n    return x + 1\n"
    )
    # the change is in helper(): the DataLoader in make() cannot be on a changed line
    assert prefilter.candidates(torchy, FileDiff("t.py", added={10}), KNOWN) == set()
    assert "dataloader-workers" in prefilter.candidates(torchy, FileDiff("t.py", added={6}), KNOWN)


def test_unknown_fixers_and_unparsable_files_are_never_pruned():
    assert prefilter.candidates("x = 1\n", FileDiff("a.py", added={1}), ["some-new-fixer"]) == {"some-new-fixer"}
    broken = "from torch.utils.data import DataLoader\ndef f(:\n    DataLoader(ds)\n"
    assert "dataloader-workers" in prefilter.candidates(broken, FileDiff("b.py", added={1}), NAMES)
    # a file that does not parse goes to libcst even when no fixer could match, so it is reported
    assert prefilter.plan("def f(:\n", FileDiff("c.py", added={1}), KNOWN) == (set(), True)
    assert prefilter.plan("x = 1\n", FileDiff("c.py", added={1}), KNOWN) == (set(), False)
