"""Refuse sources nested too deeply for the native parsers before they are parsed.

libcst's parser is native (Rust) and recurses once per nesting level: ``x = ((((...1))))`` with
about 1,500 brackets, or a few thousand chained operators, overflows the C stack and the whole
process dies with SIGSEGV, which no ``except`` can catch. So the text is measured first, with
Python's own tokenizer (no recursion, strings and comments understood), against limits that
CPython itself enforces or close to them: 200 nested brackets ("too many nested parentheses"),
100 indentation levels ("too many levels of indentation") and about 1,000 chained operators in
one expression (``ast.parse`` fails between 1,000 and 3,000). A file over them is not runnable
Python anyway, so skipping it loses nothing. :func:`parse_in_big_stack` adds margin: the native
parse runs on a thread whose stack is far larger than these limits need, whatever the caller's.
"""

from __future__ import annotations

import io
import os
import queue
import threading
import tokenize
from typing import Callable, TypeVar

#: CPython's tokenizer refuses more nested brackets (MAXLEVEL) or indentation (MAXINDENT)
MAX_BRACKETS = 200
MAX_INDENT = 100
#: operators chained in one expression (each nests the tree one level deeper in libcst)
MAX_CHAIN = 1000
#: the parse thread's stack: ~5 KiB of native stack per bracket level was measured, so the
#: limits above need a few MiB; reserved virtual memory, only the touched pages are used
PARSE_STACK_BYTES = 256 * 1024 * 1024

_OPEN = frozenset("([{")
_CLOSE = frozenset(")]}")
#: operator tokens that do not nest: separators, assignment and closing brackets
_FLAT_OPS = frozenset({",", ";", ":", "=", "->", "...", *_CLOSE})
_LAYOUT = frozenset({tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE})
_NESTING_WORDS = frozenset({"not", "and", "or", "if", "else", "lambda", "await", "in", "is", "yield", "for", "async"})

T = TypeVar("T")


class _Depth:
    """Running nesting measures over a token stream; ``problem`` names the first limit passed."""

    def __init__(self) -> None:
        self.chains: list[int] = [0]  # operators chained at each open bracket level
        self.total = 0  # sum(self.chains) + brackets open: the deepest tree path so far
        self.indent = 0
        self.elifs: dict[int, int] = {}
        self.line_start = True
        self.previous: tokenize.TokenInfo | None = None
        self.problem: str | None = None
        self.where: tuple[int, int] = (1, 0)  # (line, column) where the first limit was passed

    def _chain(self, step: int = 1) -> None:
        self.chains[-1] += step
        self.total += step

    def feed(self, tok: tokenize.TokenInfo) -> None:
        kind, text = tok.type, tok.string
        if kind == tokenize.INDENT:
            self.indent += 1
        elif kind == tokenize.DEDENT:
            self.indent -= 1
        elif kind == tokenize.NEWLINE:
            self.total -= sum(self.chains)
            self.chains = [0]
            self.line_start = True
        elif kind == tokenize.OP and text in _OPEN:
            self._chain()  # f(...)(...), a[0][0]: each call or subscript nests once more
            self.chains.append(0)
            self.total += 1
        elif kind == tokenize.OP and text in _CLOSE and len(self.chains) > 1:
            self.total -= self.chains.pop() + 1
        elif kind == tokenize.OP and text in (",", ";"):
            self.total -= self.chains[-1]
            self.chains[-1] = 0
        elif kind == tokenize.OP and text not in _FLAT_OPS:
            self._chain()  # a + b + c, -x, a.b.c: each operator nests the tree one level
        elif kind == tokenize.NAME and text in _NESTING_WORDS:
            self._chain()
        elif kind == tokenize.STRING and self.previous is not None and self.previous.type == tokenize.STRING:
            self._chain()  # "a" "b" "c": implicit concatenation nests in libcst
        if self.line_start and kind not in _LAYOUT:
            self._elif(kind == tokenize.NAME and text == "elif")
            self.line_start = False
        if kind not in (tokenize.NL, tokenize.COMMENT):
            self.previous = tok
        self._check(tok)

    def _elif(self, is_elif: bool) -> None:
        """An if/elif chain is an If nested in the previous one's ``orelse``."""
        run = self.elifs.get(self.indent, 0) + 1 if is_elif else 0
        self.elifs = {d: n for d, n in self.elifs.items() if d < self.indent}
        self.elifs[self.indent] = run

    def _check(self, tok: tokenize.TokenInfo) -> None:
        if self.problem is not None:
            return
        self.where = tok.start
        if len(self.chains) - 1 > MAX_BRACKETS:
            self.problem = f"more than {MAX_BRACKETS} nested brackets"
        elif self.indent > MAX_INDENT:
            self.problem = f"more than {MAX_INDENT} levels of indentation"
        elif self.total + sum(self.elifs.values()) > MAX_CHAIN:
            self.problem = f"more than {MAX_CHAIN} chained operators or elifs"


def _raw_brackets(source: str) -> int:
    """The deepest raw bracket nesting, strings and comments included: the fallback measure
    for text the tokenizer gives up on (it over-counts, which only errs on the safe side)."""
    depth = deepest = 0
    for ch in source:
        if ch in _OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif ch in _CLOSE and depth:
            depth -= 1
    return deepest


def nesting_problem(source: str) -> tuple[int, int, str] | None:
    """Why ``source`` is too deeply nested to hand to a native parser, as (line, 1-based
    column, reason) where the first limit is passed, or None when it is not."""
    depth = _Depth()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            depth.feed(tok)
            if depth.problem is not None:
                return depth.where[0], depth.where[1] + 1, depth.problem
    except (tokenize.TokenError, SyntaxError, ValueError):
        # invalid text past this point: the parser will report it, unless the rest is deep
        if _raw_brackets(source) > MAX_BRACKETS:
            return 1, 1, f"more than {MAX_BRACKETS} nested brackets"
    return None


def parse_in_big_stack(parse: Callable[[], T]) -> T:
    """``parse()`` on a thread with a :data:`PARSE_STACK_BYTES` stack, so the native parser's
    headroom does not depend on the calling thread (a worker thread's stack may be small,
    ``ulimit -s`` may be lowered). One such thread serves every parse of the process (starting a
    thread with that stack cost about 5 ms a file); a forked child starts its own. Exceptions are
    re-raised in the caller."""
    jobs = _parse_thread()
    if jobs is None:  # no such thread here (ulimit -v): the limits still hold
        return parse()
    box: dict[str, object] = {}
    done = threading.Event()
    jobs.put((parse, box, done))
    done.wait()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def _serve(jobs: "queue.SimpleQueue") -> None:
    while True:
        parse, box, done = jobs.get()
        try:
            box["value"] = parse()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc
        finally:
            done.set()
            del parse, box, done  # nothing of a finished parse stays alive here


_PARSER: tuple[int, threading.Thread, "queue.SimpleQueue"] | None = None  # (pid, thread, its jobs)


def _parse_thread() -> "queue.SimpleQueue | None":
    """The jobs queue of this process's parse thread, started on first use (None if it cannot be)."""
    global _PARSER
    with _STACK_LOCK:
        if _PARSER is not None and _PARSER[0] == os.getpid() and _PARSER[1].is_alive():
            return _PARSER[2]
        jobs: queue.SimpleQueue = queue.SimpleQueue()
        try:
            old = threading.stack_size(PARSE_STACK_BYTES)
            try:
                worker = threading.Thread(target=_serve, args=(jobs,), name="zoomer-parse", daemon=True)
                worker.start()
            finally:
                threading.stack_size(old)
        except (RuntimeError, ValueError, MemoryError):
            return None
        _PARSER = (os.getpid(), worker, jobs)
        return jobs


_STACK_LOCK = threading.Lock()


def _forget_parser() -> None:
    """In a forked child: the parent's parse thread did not come along, and a lock another
    thread held at the fork would stay held; start afresh."""
    global _PARSER, _STACK_LOCK
    _PARSER = None
    _STACK_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parser)
