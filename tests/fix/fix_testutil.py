"""Shared helpers for the fix-stage tests (a plain module: tests/fix has no __init__.py and no
conftest.py, so nothing shadows tests/conftest.py)."""

from __future__ import annotations

import difflib


def apply_text_edits(source: str, edits) -> str:
    """Apply TextEdits (1-based lines/columns, end exclusive) to ``source``."""
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))

    def off(line: int, col: int) -> int:
        if line - 1 >= len(lines):
            return len(source)
        return offsets[line - 1] + col - 1

    out = source
    for e in sorted(edits, key=lambda e: (e.line, e.column), reverse=True):
        out = out[: off(e.line, e.column)] + e.text + out[off(e.end_line, e.end_column) :]
    return out


def changed_lines_within(before: str, after: str, matches) -> list[str]:
    """Problems: changed regions of ``before`` that no fixable match's edits cover."""
    spans = [(e.line, e.end_line) for m in matches if m.fixable for e in m.edits]
    # compare line contents: whether the file ends with a newline is the file's, not a line's
    a = [ln.rstrip("\r\n") for ln in before.splitlines(keepends=True)]
    b = [ln.rstrip("\r\n") for ln in after.splitlines(keepends=True)]
    problems = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if i1 == i2:  # pure insertion between original lines i1 and i1+1 (1-based)
            ok = any(lo - 1 <= i1 <= hi for lo, hi in spans)
        else:
            ok = all(any(lo <= ln <= hi for lo, hi in spans) for ln in range(i1 + 1, i2 + 1))
        if not ok:
            problems.append(f"{tag} {i1 + 1}-{i2}: {a[i1:i2]!r} -> {b[j1:j2]!r}")
    return problems
