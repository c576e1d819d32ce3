"""fix/catalogue.py reads the fixers' names, patterns and opt-in flags from their source: the same as
the registry (which imports and validates them) on the shipped fixers, and None - the registry
decides - where a file does not read statically."""

from __future__ import annotations

import shutil

import pytest

from zoomer_ar.fix import catalogue
from zoomer_ar.fix.registry import load_registry
from zoomer_ar.models import PATTERN_IDS
from zoomer_ar.paths import FIXERS_DIR

def test_catalogue_equals_the_registry():
    reg = load_registry()
    cat = catalogue.entries()
    assert cat is not None
    assert [(e.name, e.pattern, e.opt_in) for e in cat] == [(f.name, f.pattern, bool(f.opt_in)) for f in reg.fixers]
    for ident in [*PATTERN_IDS, *reg.names, "all", " Idle-GPU "]:
        got = catalogue.resolve([ident])
        assert [e.name for e in got] == [f.name for f in reg.resolve([ident])], ident
    assert catalogue.resolve(["no-such-fixer"]) is None


@pytest.mark.parametrize("edit", [
    ('    name = "optimizer-foreach"', '    name = "optimizer-" + "foreach"'),  # computed: not read statically
    ("class ", "class Broken(:\nclass "),  # a syntax error
])
def test_a_file_it_cannot_read_leaves_it_to_the_registry(tmp_path, edit):
    for p in FIXERS_DIR.glob("*.py"):
        shutil.copy2(p, tmp_path / p.name)
    target = tmp_path / "optimizer_foreach.py"
    text = target.read_text()
    assert edit[0] in text
    target.write_text(text.replace(edit[0], edit[1], 1))
    assert catalogue.entries(tmp_path) is None
    assert catalogue.resolve(["single-tensor-optimizer"], tmp_path) is None


def test_reports_name_fixers_without_importing_them(fresh_analyze):
    """The report's fixer names come from the catalogue: analysing without --source imports no fixer
    module and not libcst (about 0.3 s of each run)."""
    imported, out = fresh_analyze(("libcst", "zoomer_ar_fixers"))
    assert imported == []
    assert "`dataloader-workers`" in (out / "report.md").read_text()
