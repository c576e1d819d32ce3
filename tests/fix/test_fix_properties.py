"""Property tests: random compositions of statements (with the anti-patterns, comments and odd
formatting) -> every fixer's output parses, is idempotent and only changes lines it reports."""

from __future__ import annotations

import ast
from collections import Counter

import libcst as cst
from fix_testutil import changed_lines_within
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from zoomer_ar.fix import api
from zoomer_ar.fix.helpers import walk
from zoomer_ar.fix.registry import load_registry

FIXERS = [cls() for cls in load_registry().fixers]

HEADER = [
    "import torch",
    "import torch.nn as nn",
    "from torch import nn",
    "from torch.utils.data import DataLoader",
    "import time",
    "from torch.nn.parallel import DistributedDataParallel as DDP",
    "import torchvision",
]

SIMPLE = [
    "loader = DataLoader(ds, batch_size=4, num_workers=2, pin_memory=True)",
    "loader = DataLoader(ds, batch_size=4)",
    "loader = DataLoader(\n    ds,\n    batch_size=4,  # bs\n)",
    "train_loader = DataLoader(ds, num_workers=0, pin_memory=True)",
    "loader = DataLoader(ds, num_workers=8, pin_memory=False)",
    "opt = torch.optim.Adam(model.parameters(), lr=1e-3)",
    "opt = torch.optim.SGD(\n    model.parameters(),\n    foreach=False,\n)",
    "x = torch.zeros(3, 4).to(device)",
    "y = torch.randn(2).cuda()",
    "z = x.clone().clone()",
    "w = (x.contiguous().contiguous())",
    "v = x.clone().to(device)",
    "u = x.contiguous().clone()",
    "opt.zero_grad(set_to_none=False)",
    "model = Net().to(device)",
    "model = DDP(model, device_ids=[0])",
    "block = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())",
    "print(total)",
    "total = 0.0",
    "running_loss = 0",
    "a = 1; b = 2",
    "x = x.to('cuda')",
    "torch.cuda.synchronize()",
    "torch.cuda.empty_cache()",
    "loss = model(x).sum()",
    "loss.backward()",
    "s = 'torch.cuda.empty_cache()  # zoomer: ignore'",
    "t0 = time.perf_counter()",
    "x = (\n    x\n    .to(device)\n)",
    "f(a,\n  b)  # trailing",
    "y = x \\\n    + 1",
    "pass",
    "net = torchvision.models.resnet18().cuda()",
    "torch.cuda.empty_cache()  # zoomer: ignore[allocator-churn]",
    "opt = torch.optim.AdamW(params, fused=True)",
    "idx = torch.arange(n, dtype=torch.long).to(x.device)",
]

LOOP_BODY = [
    "total += loss.item()",
    "running_loss += criterion(out, y).item() * x.size(0)",
    "print(loss.item())",
    "print(f'loss {loss.item():.3f}')  # log",
    "logger.info('step %d', float(loss))",
    "x, y = x.to(device), y.to(device)",
    "batch = {k: v.to('cuda') for k, v in batch.items()}",
    "images = batch['img'].cuda()",
    "torch.cuda.empty_cache()",
    "torch.cuda.synchronize()",
    "loss = model(x).sum()",
    "preds.append(out.cpu())",
    "acc = (out.argmax(1) == y).float().mean().item()",
    "opt.zero_grad(set_to_none=False)",
    "if i % 10 == 0:\n    print(loss.item())",
    "for p in model.parameters():\n    p.grad.zero_()",
    "for p in model.parameters():\n    if p.grad is not None:\n        p.grad.data.zero_()",
    "t1 = time.perf_counter()",
    "mask = torch.ones(4).to(device)",
    "x = x.clone().contiguous()",
    "break",
    "continue",
]

LOOP_HEADERS = [
    "for x, y in loader:",
    "for i, (x, y) in enumerate(loader):",
    "for step in range(10):",
    "while running:",
    "for batch in train_loader:",
    "for i, batch in enumerate(tqdm(train_loader)):",
]

COMMENTS = ["# note", "# zoomer: ignore", "# TODO: faster", "# zoomer: ignore[sync-point]"]


def _indent(snippet: str, prefix: str) -> list[str]:
    return [prefix + line if line else line for line in snippet.split("\n")]


@st.composite
def items(draw, depth: int, in_loop: bool):
    kinds = ["simple", "simple", "blank", "comment"]
    if in_loop:
        kinds += ["body"] * 6
    if depth < 2:
        kinds += ["loop", "loop", "loop", "def"]
    kind = draw(st.sampled_from(kinds))
    if kind == "simple":
        stmt = draw(st.sampled_from(SIMPLE))
        if "\n" not in stmt and "#" not in stmt and draw(st.booleans()):
            stmt += "  " + draw(st.sampled_from(COMMENTS))
        return ("stmt", stmt)
    if kind == "body":
        return ("stmt", draw(st.sampled_from(LOOP_BODY)))
    if kind == "blank":
        return ("stmt", "")
    if kind == "comment":
        return ("stmt", draw(st.sampled_from(COMMENTS)))
    if kind == "loop":
        header = draw(st.sampled_from(LOOP_HEADERS))
        body = draw(st.lists(items(depth + 1, True), min_size=1, max_size=5))
        return ("block", header, body)
    body = draw(st.lists(items(depth + 1, False), min_size=1, max_size=4))
    return ("block", draw(st.sampled_from(["def train(model, loader):", "def step(self, x):", "if __name__ == '__main__':"])), body)


def _render(item, prefix: str, unit: str) -> list[str]:
    if item[0] == "stmt":
        text = item[1]
        if text in ("break", "continue") and not prefix:
            text = "pass"
        return _indent(text, prefix) if text else [""]
    _, header, body = item
    lines = [prefix + header]
    inner = [ln for it in body for ln in _render(it, prefix + unit, unit)]
    if not any(ln.strip() and not ln.strip().startswith("#") for ln in inner):
        inner.append(prefix + unit + "pass")
    return lines + inner


@st.composite
def programs(draw):
    unit = draw(st.sampled_from(["    ", "  ", "\t"]))
    lines: list[str] = []
    if draw(st.booleans()):
        lines.append('"""A training script."""')
    lines += draw(st.lists(st.sampled_from(HEADER), min_size=0, max_size=5, unique=True))
    if draw(st.booleans()):
        lines.append(draw(st.sampled_from(SIMPLE[:5])))
    if draw(st.booleans()):
        lines += ["", "class Net(nn.Module):", unit + "def __init__(self):", unit * 2 + "super().__init__()",
                  unit * 2 + "self.conv = nn.Conv2d(3, 8, 3)", unit * 2 + "self.bn = nn.BatchNorm2d(8)",
                  unit + "def forward(self, x):", unit * 2 + "return self.bn(self.conv(x))", ""]
    for it in draw(st.lists(items(0, False), min_size=1, max_size=7)):
        lines += _render(it, "", unit)
    newline = draw(st.sampled_from(["\n", "\n", "\r\n"]))
    source = newline.join(lines)
    if draw(st.booleans()):
        source += newline
    return source


def _comments(code: str) -> Counter:
    return Counter(n.value for n in walk(cst.parse_module(code)) if isinstance(n, cst.Comment))


def _parses(code: str) -> bool:
    try:
        cst.parse_module(code)
        ast.parse(code)
    except Exception:
        return False
    return True


SETTINGS = settings(
    max_examples=45,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(programs())
def test_every_fixer_output_parses_is_idempotent_and_local(source):
    assume(_parses(source))
    for fixer in FIXERS:
        matches = fixer.detect(source)
        fixed = fixer.fix(source)
        assert _parses(fixed), (fixer.name, source, fixed)
        assert fixer.fix(fixed) == fixed, (fixer.name, source, fixed)
        assert _comments(fixed) == _comments(source), (fixer.name, source, fixed)
        if fixed != source:
            assert any(m.fixable for m in matches), (fixer.name, source)
            problems = changed_lines_within(source, fixed, matches)
            assert problems == [], (fixer.name, source, fixed, problems)
        else:
            assert not any(m.fixable for m in matches) or all(m.edits for m in matches), (fixer.name, source)


@settings(SETTINGS, max_examples=20)
@given(programs())
def test_all_fixers_together(source):
    assume(_parses(source))
    fixed = api.fix_source(source, select="all")
    assert _parses(fixed)
    assert _comments(fixed) == _comments(source)
    assert api.fix_source(fixed, select="all") == fixed
    assert not any(m.fixable for m in api.static_findings(fixed, select="all"))
