"""Audit fixes (A): conv-bias-before-bn, loop-synchronize, non-blocking-h2d, loop-empty-cache.

The audit's repros exactly as reported, the variants next to them that must still be fixed
(so the new exceptions stay narrow), and one repro run with torch before and after the fix.
"""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from fix_testutil import changed_lines_within

from zoomer_ar.fix.registry import load_registry

FIXERS = {cls.name: cls for cls in load_registry().fixers}


def _check(name: str, source: str):
    """(matches, fixed) with the standard guarantees checked: parses, idempotent, local."""
    fixer = FIXERS[name]()
    matches = fixer.detect(source)
    fixed = fixer.fix(source)
    cst.parse_module(fixed)
    ast.parse(fixed)
    assert fixer.fix(fixed) == fixed, "not idempotent"
    assert changed_lines_within(source, fixed, matches) == []
    return matches, fixed


def _report_only(name: str, source: str, contains: str = ""):
    matches, fixed = _check(name, source)
    assert matches, "not reported"
    assert fixed == source
    assert not any(m.fixable for m in matches)
    assert any(contains in m.message for m in matches), [m.message for m in matches]


def _fixed(name: str, source: str) -> str:
    matches, fixed = _check(name, source)
    assert any(m.fixable for m in matches) and fixed != source
    return fixed


def _untouched(name: str, source: str):
    matches, fixed = _check(name, source)
    assert matches == [] and fixed == source, [m.message for m in matches]


# --------------------------------------------------------------------------------------------
# 1. conv-bias-before-bn: a conv output read by more than the BatchNorm keeps its bias
# --------------------------------------------------------------------------------------------

CONV_HEAD = """\
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
"""

RESIDUAL = CONV_HEAD + "        skip = self.conv2(x)\n        z = self.bn2(skip)\n        return z + skip\n"


def test_conv_output_also_used_as_residual_is_reported_only():
    _report_only("conv-bias-before-bn", RESIDUAL, "also read on line 13")


@pytest.mark.parametrize(
    "body,line",
    [
        # read from the previous iteration of a loop
        ("        s = x\n        for _ in range(2):\n            x = x + s\n            s = self.conv2(x)\n"
         "            x = self.bn2(s)\n        return x\n", 13),
        # read after the branch that bound it
        ("        if x is not None:\n            s = self.conv2(x)\n            z = self.bn2(s)\n        return z + s\n", 14),
        # read later, before being bound again
        ("        s = self.conv2(x)\n        z = self.bn2(s)\n        z = z * 2\n        out = z + s\n        s = z\n"
         "        return out\n", 14),
    ],
)
def test_conv_output_read_elsewhere_is_reported_only(body, line):
    _report_only("conv-bias-before-bn", CONV_HEAD + body, f"also read on line {line}")


def test_conv_output_captured_by_a_closure_is_reported_only():
    body = "        s = self.conv2(x)\n        z = self.bn2(s)\n        f = lambda: s\n        return z, f\n"
    _report_only("conv-bias-before-bn", CONV_HEAD + body, "also read")


@pytest.mark.parametrize(
    "body",
    [
        "        y = self.conv2(x)\n        y = self.bn2(y)\n        return y + x\n",  # bound again by the BN line
        "        s = self.conv2(x)\n        z = self.bn2(s)\n        return z\n",  # the function ends
        "        s = self.conv2(x)\n        return self.bn2(s)\n",
        "        s = self.conv2(x)\n        z = self.bn2(s)\n        s = z * 2\n        return s\n",  # bound again first
        "        for _ in range(2):\n            s = self.conv2(x)\n            x = self.bn2(s)\n        return x\n",
        # other bindings of the name read nothing
        "        s = None\n        for _ in range(2):\n            s = self.conv2(x)\n            x = self.bn2(s)\n        return x\n",
        "        return self.bn2(self.conv2(x)) + x\n",
    ],
)
def test_conv_output_only_read_by_the_bn_is_still_fixed(body):
    fixed = _fixed("conv-bias-before-bn", CONV_HEAD + body)
    assert "nn.Conv2d(c, c, 3, padding=1, bias=False)" in fixed


def test_residual_repro_keeps_its_outputs_with_torch():
    torch = pytest.importorskip("torch")
    fixed = FIXERS["conv-bias-before-bn"]().fix(RESIDUAL)

    def outputs(src: str):
        ns: dict = {}
        exec(compile(src, "<block>", "exec"), ns)
        torch.manual_seed(0)
        block = ns["Block"](4).eval()
        torch.manual_seed(1)
        return block(torch.randn(2, 4, 8, 8))

    assert torch.equal(outputs(RESIDUAL), outputs(fixed))
    # what the old fix did: without the bias the residual changes
    assert not torch.equal(outputs(RESIDUAL), outputs(RESIDUAL.replace("padding=1)", "padding=1, bias=False)")))


# --------------------------------------------------------------------------------------------
# 2. loop-synchronize: kept where streams, events or CUDA graphs are in play
# --------------------------------------------------------------------------------------------

SIDE_STREAM = """\
import torch


def infer(model, loader, s):
    for x in loader:
        with torch.cuda.stream(s):
            y = model(x)
        torch.cuda.synchronize()
        out = y.cpu()
"""


def test_synchronize_after_side_stream_work_is_reported_only():
    _report_only("loop-synchronize", SIDE_STREAM, "stream")


@pytest.mark.parametrize(
    "setup,inner",
    [
        ("", "        torch.cuda.current_stream().wait_stream(s)\n"),
        ("    s = torch.cuda.Stream()\n", ""),
        ("    from torch.cuda import Stream\n    s = Stream()\n", ""),
        ("    ev = torch.cuda.Event()\n", ""),
        ("", "        s.record_event()\n"),
        ("    g = torch.cuda.CUDAGraph()\n", ""),
        ("", "        g.replay()\n"),
        ("    with torch.cuda.graph(g):\n        y = model(x0)\n", ""),
    ],
)
def test_synchronize_near_streams_events_or_graphs_is_reported_only(setup, inner):
    src = f"import torch\n\n\ndef run(model, loader, s, g, x0):\n{setup}    for x in loader:\n{inner}        step(x)\n        torch.cuda.synchronize()\n"
    _report_only("loop-synchronize", src, "stream, event or graph")


def test_synchronize_in_a_function_without_streams_is_still_removed():
    src = SIDE_STREAM.replace("        with torch.cuda.stream(s):\n            y = model(x)\n", "        y = model(x)\n")
    src += "\n\ndef other(s):\n    with torch.cuda.stream(s):\n        pass\n"
    fixed = _fixed("loop-synchronize", src)
    assert "synchronize" not in fixed


# --------------------------------------------------------------------------------------------
# 3. non-blocking-h2d: no non_blocking when the host tensor is written in place afterwards
# --------------------------------------------------------------------------------------------

PINNED = "from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_size=8, pin_memory=True)\n"


@pytest.mark.parametrize(
    "body",
    [
        "    x = batch['img'].cuda()\n    batch['img'].zero_()\n",
        "    x = batch['img'].cuda()\n    batch['img'].copy_(other)\n",
        "    x = batch['img'].cuda()\n    batch['img'].mul_(2)\n",
        "    x = batch['img'].cuda()\n    batch['img'][...] = 0\n",
        "    x = batch['img'].cuda()\n    batch['img'][:, 0] += 1\n",
        "    x = batch['img'].cuda()\n    del batch\n",
        "    x = batch['img'].float().to(device)\n    batch['img'].clamp_(0, 1)\n",
        "    x = batch['img'].cuda()\n    torch.nn.init.zeros_(batch['img'])\n",
        "    x = batch['img'].cuda()\n    torch.add(a, b, out=batch['img'])\n",
        "    img = batch['img']\n    x = img.cuda()\n    batch['img'].zero_()\n",
        "    img = batch['img']\n    x = batch['img'].cuda()\n    img.zero_()\n",
        "    x = batch['img'].cuda()\n    if flip:\n        batch['img'].neg_()\n",
        "    b = {k: v.cuda() for k, v in batch.items()}\n    batch['img'].zero_()\n",
        "    x, y = batch\n    xg = x.cuda()\n    batch[0].zero_()\n",
    ],
)
def test_host_tensor_written_after_the_copy_is_reported_only(body):
    _report_only("non-blocking-h2d", PINNED + "for batch in loader:\n" + body, "writes the host tensor")


@pytest.mark.parametrize(
    "body",
    [
        "    x = batch['img'].cuda()\n    batch['label'].zero_()\n",  # another field of the batch
        "    batch['img'].zero_()\n    x = batch['img'].cuda()\n",  # written before the copy
        "    batch = {k: v.cuda() for k, v in batch.items()}\n    batch['img'].zero_()\n",  # rebound to the copy
        "    x = batch['img'].cuda()\n    y = batch['label'].cuda()\n    batch = None\n    x.mul_(2)\n",
        "    x = batch['img'].cuda()\n    x.sub_(mean)\n    loss = model(x)\n    opt.zero_grad()\n    loss.backward()\n",
        "    y = batch['label'].cuda()\n    out.copy_(batch['label'])\n",  # read, not written
    ],
)
def test_host_tensor_not_written_after_the_copy_is_still_fixed(body):
    fixed = _fixed("non-blocking-h2d", PINNED + "for batch in loader:\n" + body)
    assert "non_blocking=True" in fixed


def test_rebinding_the_batch_names_to_the_device_copy_is_still_fixed():
    src = PINNED + "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n    x.mul_(2)\n    y += 1\n"
    fixed = _fixed("non-blocking-h2d", src)
    assert fixed.count("non_blocking=True") == 2


# --------------------------------------------------------------------------------------------
# 4. loop-empty-cache: OOM recovery and per-model cleanup stay
# --------------------------------------------------------------------------------------------

OOM = """\
import gc
import torch

for b in loader:
    try:
        step(b)
    except torch.cuda.OutOfMemoryError:
        gc.collect()
        torch.cuda.empty_cache()
        continue
"""

SWEEP = """\
import torch

for cfg in cfgs:
    m = build(cfg).cuda()
    evaluate(m)
    del m
    torch.cuda.empty_cache()
"""


@pytest.mark.parametrize("src", [OOM, SWEEP, OOM.replace("        gc.collect()\n", ""),
                                 SWEEP.replace("    del m\n", "    del m\n    gc.collect()\n").replace("import torch", "import gc, torch")])
def test_empty_cache_after_oom_or_cleanup_is_left_alone(src):
    _untouched("loop-empty-cache", src)


def test_empty_cache_in_an_oom_retry_inside_a_function_is_left_alone():
    src = textwrap.dedent("""\
        import torch


        def train(loader):
            for b in loader:
                try:
                    step(b)
                except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
                    del e
                    torch.cuda.empty_cache()
        """)
    _untouched("loop-empty-cache", src)


def test_plain_per_iteration_empty_cache_is_still_removed():
    # (score, not evaluate: a call right after an evaluation pass is a phase boundary, left alone)
    src = SWEEP.replace("    del m\n    torch.cuda.empty_cache()\n", "    torch.cuda.empty_cache()\n    del m\n")
    src = src.replace("evaluate(m)", "score(m)")
    fixed = _fixed("loop-empty-cache", src)
    assert "empty_cache" not in fixed
    # a try block (not its handler) runs every iteration
    src = "import torch\nfor b in loader:\n    try:\n        step(b)\n        torch.cuda.empty_cache()\n    except ValueError:\n        pass\n"
    assert "empty_cache" not in _fixed("loop-empty-cache", src)
