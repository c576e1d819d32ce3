"""Node positions (line, column ranges) of a libcst module, as libcst's PositionProvider gives
them, about three times faster.

Positions are the costliest metadata the fixers use: libcst's provider regenerates the code and,
for every token, splits it on newlines with a regular expression, and for every node builds two
CodePosition and one CodeRange objects and enters a generator-based context manager. This one
does the same walk (the nodes' own ``_codegen``, so the same tokens and the same syntactic ranges:
``record_syntactic_position`` with its ``start_node``/``end_node`` hoisting, ``after_codegen`` not
overwriting a recorded range), splits only tokens that hold a line break, keeps plain tuples and
builds a CodeRange only for the nodes asked about. tests/fix/test_positions.py holds it equal to
libcst's provider on every node of a corpus of real files.
"""

from __future__ import annotations

import re
from typing import Iterator, Mapping

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodeRange
from libcst._position import CodePosition

_NEWLINE = re.compile(r"\r\n?|\n")


class _Record:
    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: "_State", node: cst.CSTNode, start_node: cst.CSTNode | None, end_node: cst.CSTNode | None):
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(self, *exc: object) -> bool:
        s = self.state
        computed = s.computed
        l0, c0 = computed[self.start_node][:2] if self.start_node is not None else self.start
        l1, c1 = computed[self.end_node][2:] if self.end_node is not None else (s.line, s.column)
        computed[self.node] = (l0, c0, l1, c1)
        return False


class _State(CodegenState):
    """libcst's PositionProvidingCodegenState, with plain tuples."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.line = 1  # one-indexed
        self.column = 0  # zero-indexed
        self.stack: list[tuple[int, int]] = []
        self.computed: dict[cst.CSTNode, tuple[int, int, int, int]] = {}

    def _advance(self, value: str) -> None:
        if "\n" in value or "\r" in value:
            segments = _NEWLINE.split(value)
            self.line += len(segments) - 1
            self.column = len(segments[-1])
        else:
            self.column += len(value)

    def add_indent_tokens(self) -> None:
        self.tokens.extend(self.indent_tokens)
        for token in self.indent_tokens:
            self._advance(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self._advance(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self.stack.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        l0, c0 = self.stack.pop()
        if node not in self.computed:  # a syntactic range recorded already stays
            self.computed[node] = (l0, c0, self.line, self.column)

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None,
                                  end_node: cst.CSTNode | None = None) -> _Record:  # type: ignore[override]
        return _Record(self, node, start_node, end_node)


class Positions(Mapping[cst.CSTNode, CodeRange]):
    """node -> CodeRange, built when asked for."""

    def __init__(self, computed: dict[cst.CSTNode, tuple[int, int, int, int]]):
        self._computed = computed

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        l0, c0, l1, c1 = self._computed[node]
        return CodeRange(CodePosition(l0, c0), CodePosition(l1, c1))

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self._computed)

    def __len__(self) -> int:
        return len(self._computed)


def positions(module: cst.Module) -> Positions:
    """The syntactic position of every node of ``module`` (libcst's PositionProvider)."""
    state = _State(module)
    module._codegen(state)
    return Positions(state.computed)
