"""Public API for later stages, the registry's validation and the generated docs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fix_testutil import apply_text_edits

from zoomer_ar.fix import api
from zoomer_ar.fix.base import FixerError, SourceParseError, StaticMatch
from zoomer_ar.fix.docs import render
from zoomer_ar.fix.registry import clear_cache, load_registry
from zoomer_ar.models import PATTERN_IDS
from zoomer_ar.paths import PROJECT_DIR

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=8)


@torch.no_grad()
def evaluate(model):
    correct = 0
    for x, y in loader:
        out = model(x.to(device))
        correct += (out.argmax(1) == y).sum().item()
    return correct


def train_step(model, x):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)

    def inner():
        return loss.item()

    return loss.item()
"""


def test_static_findings_and_fix_source():
    found = api.static_findings(SCRIPT, "train.py")
    assert all(isinstance(m, StaticMatch) for m in found)
    assert {m.pattern for m in found} >= {"dataloader-bound", "single-tensor-optimizer", "zero-grad-not-none", "sync-point"}
    only = api.static_findings(SCRIPT, "train.py", select="single-tensor-optimizer")
    assert [m.pattern for m in only] == ["single-tensor-optimizer"]
    fixed = api.fix_source(SCRIPT)
    assert "foreach=True" in fixed and "set_to_none=True" in fixed and "num_workers=DATALOADER_WORKERS" in fixed
    assert "x.to(device, non_blocking=True)" in fixed
    assert api.fix_source(fixed) == fixed
    assert api.fix_source(SCRIPT, select=["zero-grad-not-none"]).count("\n") == SCRIPT.count("\n")
    d = api.diff_source(SCRIPT, "train.py", select="zero-grad-set-to-none")
    assert d.startswith("--- a/train.py\n+++ b/train.py\n") and "+    opt.zero_grad(set_to_none=True)" in d
    with pytest.raises(SourceParseError) as exc:
        api.static_findings("def f(:\n", "x.py")
    assert str(exc.value) == "x.py:1:7: cannot parse: invalid syntax"


def test_locate_by_def_line():
    # train_step: def on line 16
    sites = api.locate(SCRIPT, 16, "sync-point", function="train_step")
    assert [(m.line, m.fixer) for m in sites] == [(26, "")]  # not the nested inner()'s .item()
    assert sites[0].message.startswith("candidate site")
    opt = api.locate(SCRIPT, 16, "single-tensor-optimizer")
    assert [(m.line, m.fixer) for m in opt] == [(17, "optimizer-foreach"), (20, "")]
    assert opt[0].fixable and opt[0].replacement == "torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)"
    zg = api.locate(SCRIPT, 16, "zero-grad-not-none")
    assert [m.line for m in zg] == [21] and zg[0].fixer == "zero-grad-set-to-none"


def test_locate_decorated_function_and_module():
    # co_firstlineno of a decorated function is the decorator's line (7); the def is on line 8
    for line in (7, 8):
        sync = api.locate(SCRIPT, line, "sync-point", function="evaluate")
        assert [(m.line, m.fixer) for m in sync] == [(12, "loop-item-sync")]
        assert sync[0].statement_line == 12
    h2d = api.locate(SCRIPT, 7, "pageable-memcpy")
    assert [m.line for m in h2d] == [11]
    loader = api.locate(SCRIPT, 1, "dataloader-bound", function="<module>")
    assert [(m.line, m.fixer) for m in loader] == [(4, "dataloader-workers")]
    # the loop in evaluate() pulls batches from the loader
    assert [m.line for m in api.locate(SCRIPT, 8, "dataloader-bound")] == [10]
    # drifted line: falls back to the only function with that name
    assert [m.line for m in api.locate(SCRIPT, 99, "zero-grad-not-none", function="train_step")] == [21]
    assert api.locate(SCRIPT, 99, "sync-point") == []


def test_locate_conv_bias_finds_transposed_convolutions():
    # a generator's forward: its transposed convolutions (bias already off, so no fixer finding)
    # and its plain convolution are the candidate sites of a conv-bias-before-bn finding
    source = (
        "import torch.nn as nn\n\n\ndef generator(z):\n"
        "    up = nn.ConvTranspose2d(100, 64, 4, 1, 0, bias=False)\n"
        "    out = nn.Conv2d(64, 3, 3, bias=False)\n"
        "    return out(up(z))\n"
    )
    sites = api.locate(source, 4, "conv-bias-before-bn")
    assert [(m.line, m.fixer) for m in sites] == [(5, ""), (6, "")]
    assert "ConvTranspose2d" in sites[0].message


@pytest.mark.parametrize("indent", ["    ", "\t", "  "])
def test_an_expression_edit_keeps_the_blocks_indentation(indent):
    """A call spanning lines inside a block (a DataLoader in a method): its text edit (review's
    suggestion, the SARIF fix) writes the continuation lines at the block's indentation, as
    `zoomer-ar fix` does, so applying the edits gives the fixed file."""
    i1, i2 = indent, indent * 2
    src = (
        "from torch.utils.data import DataLoader\n\n\nclass Trainer:\n"
        f"{i1}def loader(self, dataset):\n"
        f"{i2}return DataLoader(\n{i2}    dataset, batch_size=32,  # big\n{i2}    num_workers=0)\n"
    )
    [m] = [m for m in api.static_findings(src, "t.py", select=["dataloader-workers"]) if m.fixable]
    fixed = api.fix_source(src, select=["dataloader-workers"])
    assert fixed != src
    assert apply_text_edits(src, m.edits) == fixed
    assert any(f"\n{i2}    dataset, batch_size=32,  # big\n" in e.text for e in m.edits)


@pytest.mark.parametrize("pattern", PATTERN_IDS)
def test_locate_accepts_every_pattern(pattern):
    assert isinstance(api.locate(SCRIPT, 16, pattern), list)


def test_locate_unknown_pattern():
    from zoomer_ar.errors import InputError

    with pytest.raises(InputError):
        api.locate(SCRIPT, 16, "nope")


def test_every_fixer_pattern_is_known_and_lookup_works():
    reg = load_registry()
    assert {f.pattern for f in reg.fixers} <= set(PATTERN_IDS)
    assert reg.by_name("dataloader-workers").pattern == "dataloader-bound"
    assert {f.name for f in reg.by_pattern("sync-point")} == {"loop-item-sync", "loop-synchronize"}
    assert {f.name for f in reg.by_pattern("extra-copy")} == {"ddp-bucket-view", "factory-on-device", "redundant-copy-chain"}
    assert api.fixers_for("fp32-matmul") == ["cpu-autocast", "matmul-precision"]
    assert {f.name for f in reg.fixers if f.opt_in} == {"torch-compile", "ddp-bucket-view", "cpu-autocast"}
    assert api.fixers_for("misaligned-gemm") == ["align-gemm-dims"]


GOOD_FIXER = '''
from zoomer_ar.fix.base import Example, Fixer

class Good(Fixer):
    pattern = "idle-gpu"
    name = "good-one"
    summary = "a test fixer"
    explanation = "## What it does\\nNothing."
    VALID = ["x = 1\\n"]
    INVALID = [Example("y = 2\\n", None, "y")]

    def check(self, ctx):
        return []
'''


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def broken(:\n", "cannot load fixer: SyntaxError"),
        ("import does_not_exist_zz\n", "cannot load fixer: ModuleNotFoundError"),
        ("x = 1\n", "expected exactly one Fixer subclass"),
        (GOOD_FIXER.replace('"idle-gpu"', '"no-such-pattern"'), "unknown pattern 'no-such-pattern'"),
        (GOOD_FIXER.replace('"good-one"', '"Bad Name"'), "name must be kebab-case"),
        (GOOD_FIXER.replace('INVALID = [Example("y = 2\\n", None, "y")]', "INVALID = []"), "INVALID must be a non-empty list"),
        (GOOD_FIXER.replace('VALID = ["x = 1\\n"]', 'VALID = ["x = (\\n"]'), "example 0 does not parse"),
        (GOOD_FIXER.replace("    def check(self, ctx):\n        return []\n", ""), "does not implement check()"),
    ],
)
def test_broken_fixer_file_is_a_clear_error(tmp_path, source, message):
    (tmp_path / "good.py").write_text(GOOD_FIXER)
    (tmp_path / "broken.py").write_text(source)
    clear_cache()
    try:
        with pytest.raises(FixerError) as exc:
            load_registry(tmp_path)
        assert str(exc.value).startswith(str(tmp_path / "broken.py")) or str(tmp_path / "broken.py") in str(exc.value)
        assert message in str(exc.value)
        (tmp_path / "broken.py").unlink()
        assert load_registry(tmp_path).names == ["good-one"]
    finally:
        clear_cache()


def test_duplicate_fixer_names(tmp_path):
    (tmp_path / "a.py").write_text(GOOD_FIXER)
    (tmp_path / "b.py").write_text(GOOD_FIXER)
    (tmp_path / "_private.py").write_text("raise RuntimeError\n")
    clear_cache()
    try:
        with pytest.raises(FixerError, match="already used"):
            load_registry(tmp_path)
    finally:
        clear_cache()


def test_docs_are_up_to_date():
    committed = (PROJECT_DIR / "docs" / "fixers.md").read_text()
    assert committed == render(), "regenerate: python -m zoomer_ar.fix.docs > docs/fixers.md"


def test_docs_module_runs():
    proc = subprocess.run([sys.executable, "-m", "zoomer_ar.fix.docs"], capture_output=True, text=True, check=True)
    assert proc.stdout == render()
    for f in load_registry().fixers:
        assert f"## {f.name}" in proc.stdout


def test_no_torch_import():
    """The fix stage analyses code without importing torch."""
    code = "import sys, zoomer_ar.fix.api as a, zoomer_ar.fix.cli; a.fix_source('import torch\\nx = torch.zeros(2).cuda()\\n'); print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"


def test_a_fix_whose_output_does_not_parse_is_refused():
    import libcst as cst

    from zoomer_ar.fix.base import Example, Fixer

    class Breaker(Fixer):
        pattern = "idle-gpu"
        name = "breaker"
        summary = "test"
        explanation = "test"
        VALID = ["x = 1\n"]
        INVALID = [Example("a = 1\n")]

        def check(self, ctx):
            for assign in ctx.nodes(cst.Assign):
                target = assign.targets[0].target
                if isinstance(target, cst.Name) and target.value == "bad":
                    # `f() = 1` is not Python: must be refused
                    yield self.replace(target, "breaks", {target: cst.parse_expression("f()")})
                elif isinstance(target, cst.Name) and target.value == "good":
                    yield self.replace(target, "renames", {target: cst.Name("renamed")})

    src = "bad = 1\ngood = 2\n"
    fixer = Breaker()
    assert len(fixer.detect(src)) == 2
    assert fixer.fix(src) == "bad = 1\nrenamed = 2\n"
