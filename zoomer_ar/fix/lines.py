"""Splitting source text into lines, the two ways that matter here.

* :func:`split_lines`: the lines Python, libcst and :mod:`ast` count (``\\n``, ``\\r\\n`` and a
  lone ``\\r`` end a line; nothing else does). Fixers' line numbers refer to these.
* :func:`split_git_lines`: the lines ``git diff`` and ``git apply`` count (only ``\\n`` ends a
  line; a ``\\r`` is an ordinary character, so a file with old-Mac CR-only endings is one line).
  Unified diffs meant for ``git apply`` and the line numbers of a pull request's diff use these.

``str.splitlines`` is neither: it also breaks at form feeds, ``\\x1c``-``\\x1e``, ``\\x85`` and
U+2028/U+2029, which may sit on a line of their own or inside a string literal.

Both keep the line endings, so ``"".join(split_x(text)) == text``.
"""

from __future__ import annotations

import re
from bisect import bisect_right

_PY_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_GIT_LINE_RE = re.compile(r"[^\n]*\n|[^\n]+\Z")


def split_lines(source: str) -> list[str]:
    """Lines with their endings, split the way Python and libcst count lines (\\n, \\r\\n, \\r)."""
    return _PY_LINE_RE.findall(source)


def split_git_lines(text: str) -> list[str]:
    """Lines with their endings, split the way git counts lines (\\n only)."""
    return _GIT_LINE_RE.findall(text)


def has_lone_cr(text: str) -> bool:
    """Whether a ``\\r`` not followed by ``\\n`` ends a line: git and Python then number lines
    differently."""
    return re.search(r"\r(?!\n)", text) is not None


class LineMap:
    """Between git's line numbers of a text and Python's (1-based, both ways).

    Git line ``g`` holds Python lines ``first(g)``..``last(g)`` (more than one only where a lone
    ``\\r`` ends a line inside it); Python line ``n`` lies in git line ``git_line(n)``."""

    def __init__(self, text: str):
        self._starts: list[int] = []  # the first Python line of each git line
        n = 1
        for g in split_git_lines(text):
            self._starts.append(n)
            n += len(split_lines(g))
        self._end = n - 1  # the number of Python lines
        self.identity = len(self._starts) == self._end

    def first(self, g: int) -> int:
        if self.identity or g < 1:
            return g
        if g > len(self._starts):
            return self._end + (g - len(self._starts))
        return self._starts[g - 1]

    def last(self, g: int) -> int:
        if self.identity or g < 1:
            return g
        if g >= len(self._starts):
            return self._end + (g - len(self._starts))
        return self._starts[g] - 1

    def git_line(self, n: int) -> int:
        if self.identity or n < 1:
            return n
        if n > self._end:
            return len(self._starts) + (n - self._end)
        return bisect_right(self._starts, n)
