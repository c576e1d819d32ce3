"""Tests generated from every fixer's VALID / INVALID examples (Fixit style)."""

from __future__ import annotations

import ast

import libcst as cst
import pytest

from fix_testutil import apply_text_edits, changed_lines_within

from zoomer_ar.fix.registry import load_registry

REGISTRY = load_registry()

VALID = [
    pytest.param(cls, src, id=f"{cls.name}-valid-{i}") for cls in REGISTRY.fixers for i, src in enumerate(cls.VALID)
]
INVALID = [
    pytest.param(cls, ex, id=f"{cls.name}-invalid-{i}") for cls in REGISTRY.fixers for i, ex in enumerate(cls.INVALID)
]


def test_registry_is_not_empty():
    assert len(REGISTRY.fixers) >= 11


@pytest.mark.parametrize("cls", [pytest.param(c, id=c.name) for c in REGISTRY.fixers])
def test_every_fixer_has_examples_of_both_kinds(cls):
    assert cls.VALID, "needs VALID examples"
    assert any(e.after is not None for e in cls.INVALID), "needs at least one INVALID example with a fix"


@pytest.mark.parametrize(("cls", "source"), VALID)
def test_valid_example_is_left_alone(cls, source):
    fixer = cls()
    assert fixer.detect(source, "example.py") == []
    assert fixer.fix(source) == source


@pytest.mark.parametrize(("cls", "example"), INVALID)
def test_invalid_example_is_reported_and_fixed(cls, example):
    fixer = cls(**example.options)
    matches = fixer.detect(example.before, example.path)
    assert matches, "not detected"
    assert all(m.pattern == cls.pattern and m.fixer == cls.name for m in matches)
    assert any(example.message_contains in m.message for m in matches), [m.message for m in matches]
    for m in matches:
        assert 1 <= m.line <= m.end_line and m.column >= 1 and m.statement_line <= m.line

    fixed = fixer.fix(example.before, example.path)
    expected = example.before if example.after is None else example.after
    assert fixed == expected
    cst.parse_module(fixed)
    ast.parse(fixed)
    assert fixer.fix(fixed, example.path) == fixed, "not idempotent"
    if example.after is None:
        assert not any(m.fixable for m in matches)
    else:
        assert any(m.fixable for m in matches)
        assert not any(m.fixable for m in fixer.detect(fixed, example.path)), "still fixable after the fix"
        assert changed_lines_within(example.before, fixed, matches) == []
        # the reported text edits reproduce the fix when it takes one round
        rewritten = apply_text_edits(example.before, [e for m in matches if m.fixable for e in m.edits])
        if rewritten != fixed:
            one_round = apply_text_edits(
                example.before, [e for m in matches[:1] if m.fixable for e in m.edits]
            )
            assert cst.parse_module(one_round)
        fixable = [m for m in matches if m.fixable]
        if len(fixable) == 1:  # one finding: its edits give the fixed file, or one that takes another round
            alone = apply_text_edits(example.before, fixable[0].edits)
            assert alone == fixed or any(m.fixable for m in fixer.detect(alone, example.path)), alone


@pytest.mark.parametrize(("cls", "example"), INVALID)
def test_invalid_example_suppressed_inline(cls, example):
    """Adding `# zoomer: ignore[<pattern>]` to every line of the flagged statements silences it."""
    fixer = cls(**example.options)
    matches = fixer.detect(example.before, example.path)
    lines = example.before.splitlines(keepends=True)
    flagged = {m.line for m in matches}
    suppressed = []
    for i, line in enumerate(lines, 1):
        body = line.rstrip("\r\n")
        eol = line[len(body) :]
        if i in flagged and "#" not in body and not body.rstrip().endswith(("(", ",", "\\", ":")) and body.strip():
            body = f"{body}  # zoomer: ignore[{cls.pattern}]"
        suppressed.append(body + eol)
    source = "".join(suppressed)
    try:
        cst.parse_module(source)
    except cst.ParserSyntaxError:
        pytest.skip("cannot add a comment on that line")
    remaining = [m for m in fixer.detect(source, example.path) if m.line in flagged and "# zoomer" in suppressed[m.line - 1]]
    assert remaining == []
