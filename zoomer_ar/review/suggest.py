"""A fixer's rewrite as whole replaced lines: the body of a GitHub ```suggestion block.

A GitHub suggestion replaces the lines a review comment spans (``start_line``..``line``); it can
only be offered when those lines lie inside one hunk of the pull request's diff. The fixer gives
its rewrite as text edits (1-based lines and columns, end exclusive); here they become the new
text of the lines they touch.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..fix.base import TextEdit, parse_source
from ..fix.lines import split_lines
from .prefilter import compiles

__all__ = ["MAX_SUGGESTION_LINES", "Rewrite", "fence", "rewrite", "split_lines"]

MAX_SUGGESTION_LINES = 60


def _lf_lines(text: str) -> list[str]:
    """The lines of ``text`` (Python's line breaks) ending in ``\\n``, the last one as it is."""
    out = []
    for line in split_lines(text):
        body = line.rstrip("\r\n")
        out.append(body + "\n" if len(body) < len(line) else body)
    return out


@dataclass(frozen=True)
class Rewrite:
    first: int  # first replaced line (1-based)
    last: int  # last replaced line
    old: str  # the original text of those lines
    new: str  # their replacement (no trailing newline handling: whole lines)

    @property
    def suggestion(self) -> str:
        """The suggestion block's body (a block with nothing in it deletes the lines)."""
        body = self.new.replace("\r\n", "\n").replace("\r", "\n")
        return body[:-1] if body.endswith("\n") else body

    def diff(self, path: str) -> str:
        old = _lf_lines(self.old)
        new = _lf_lines(self.new)
        out = list(difflib.unified_diff(old, new, f"a/{path}", f"b/{path}", n=0, lineterm="\n"))
        text = "".join(line if line.endswith("\n") else line + "\n" for line in out[2:])
        return re.sub(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", lambda m: _shift(m.group(0), self.first - 1), text, flags=re.M)


def _shift(header: str, by: int) -> str:
    return re.sub(r"([-+])(\d+)", lambda m: f"{m.group(1)}{int(m.group(2)) + by}", header)


def rewrite(lines: Sequence[str], edits: Sequence[TextEdit]) -> Rewrite | None:
    """The lines the edits touch, before and after; None without edits or when they overlap."""
    if not edits:
        return None
    spans = []
    for e in edits:
        last = e.end_line - 1 if e.end_column == 1 and e.end_line > e.line else e.end_line
        spans.append((e.line, last))
    first = min(s[0] for s in spans)
    last = max(s[1] for s in spans)
    if first < 1 or last > len(lines) + 1:
        return None
    last = min(last, len(lines))
    old = "".join(lines[first - 1:last])
    # offsets of each line start inside `old`
    starts: dict[int, int] = {}
    pos = 0
    for n in range(first, last + 2):
        starts[n] = pos
        if n <= last:
            pos += len(lines[n - 1])

    def offset(line: int, column: int) -> int:
        if line > last:
            return len(old)
        return starts[line] + column - 1

    chunks = sorted(((offset(e.line, e.column), offset(e.end_line, e.end_column), e.text) for e in edits))
    out: list[str] = []
    cursor = 0
    for a, b, text in chunks:
        if a < cursor:
            return None  # overlapping edits
        out.append(old[cursor:a])
        out.append(text)
        cursor = b
    out.append(old[cursor:])
    new = "".join(out)
    if new == old:
        return None
    if old.endswith(("\n", "\r")) and new and not new.endswith(("\n", "\r")):
        new += "\n"
    return Rewrite(first, last, old, new)


def fence(body: str, lang: str = "suggestion") -> str:
    """A fenced block whose fence is longer than any backtick run in the body."""
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{body}\n{ticks}" if body else f"{ticks}{lang}\n{ticks}"


def apply_rewrites(lines: Sequence[str], rws: Iterable[Rewrite]) -> str:
    """The text with each rewrite's lines replaced (rewrites sorted, not overlapping)."""
    out: list[str] = []
    cursor = 0
    for rw in sorted(rws, key=lambda r: r.first):
        out.extend(lines[cursor:rw.first - 1])
        out.append(rw.new)
        cursor = rw.last
    out.extend(lines[cursor:])
    return "".join(out)


def cst_parses(code: str) -> bool:
    """Whether libcst parses `code` (syntax newer than this Python's compiler included)."""
    try:
        parse_source(code, None)
    except Exception:
        return False
    return True


def parse_check(source: str):
    """How to tell that a rewrite of `source` still parses: Python's compiler when it accepts the
    original, else libcst."""
    return compiles if compiles(source) else cst_parses
