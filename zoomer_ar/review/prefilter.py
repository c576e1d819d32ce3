"""Which fixers could report a finding on the changed lines of a file, decided without libcst.

Parsing a file with libcst and running the fixers costs tens to hundreds of milliseconds; most
files in a large diff cannot hold a finding on their changed lines. Two conservative tiers:

1. file: a fixer's finding needs its names somewhere in the file (``DataLoader`` for the
   dataloader fixer; an aliased import still spells the original name in the import);
2. region: a finding reported by review overlaps a changed line, so the flagged code lies in a
   statement (found with :mod:`ast`, which is fast) containing that line: the simple statement,
   the header of an enclosing compound statement, or an enclosing loop (loops are flagged whole).
   That code must spell the fixer's name, or a name an import binds to it
   (``from torch.utils.data import DataLoader as DL`` makes ``DL`` count).

A fixer this module does not know (a new file under ``fixers/``) always runs. A file :mod:`ast`
cannot parse goes to libcst whatever tier 1 says, so that it is reported (or, where libcst parses
newer syntax, reviewed with the tier-1 fixers). tests/review checks that the filter never drops a
finding on the fixers' own examples.
"""

from __future__ import annotations

import ast
import bisect
import re
import warnings
from functools import lru_cache
from typing import Iterable

from ..fix.lines import split_lines
from .diff import FileDiff

LOOP = r"\b(?:for|while)\b"
TO_DEVICE = r"\b(?:to|cuda)\b"
FACTORY = (r"\b(?:zeros|ones|empty|full|rand|randn|randint|arange|linspace|logspace|eye|tensor|as_tensor"
           r"|zeros_like|ones_like|empty_like|full_like)\b")
HOST_READ = r"(?i:loss)|\b(?:item|cpu|numpy|tolist)\b"
OPTIMIZER = r"Adam|SGD|RMSprop|Adagrad|Adadelta|Rprop"
COPY_CHAIN = r"\.\s*(?:contiguous|detach|cpu|cuda|float|half|double|bfloat16|long|int|bool|clone|to)\s*\("
MODEL_FACTORY = r"torchvision|timm|transformers|AutoModel|create_model"

#: fixer -> (regexes the whole file must all match, regexes the changed region must all match)
KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "conv-bias-before-bn": ((r"Conv(?:Transpose)?[123]d", r"BatchNorm"), (r"Conv(?:Transpose)?[123]d",)),
    "dataloader-workers": ((r"DataLoader",), (r"DataLoader",)),
    "ddp-bucket-view": ((r"DistributedDataParallel|\bDDP\b",), (r"DistributedDataParallel|\bDDP\b",)),
    "factory-on-device": ((r"torch", FACTORY, TO_DEVICE), (TO_DEVICE, FACTORY)),
    "loop-empty-cache": ((r"empty_cache", LOOP), (r"empty_cache",)),
    "loop-item-sync": ((LOOP, HOST_READ), (HOST_READ,)),
    "loop-synchronize": ((r"synchronize", LOOP), (r"synchronize",)),
    "matmul-precision": ((r"cuda",), ()),  # region: see _matmul_region
    "non-blocking-h2d": ((r"(?i:loader)", r"\bfor\b", TO_DEVICE), (TO_DEVICE,)),
    "optimizer-foreach": ((OPTIMIZER,), (OPTIMIZER,)),
    "redundant-copy-chain": ((COPY_CHAIN,), (COPY_CHAIN,)),
    # + classes and functions defined in the file (a model built by a function of the file)
    "torch-compile": ((r"Module|Sequential|" + MODEL_FACTORY,), (r"Sequential|" + MODEL_FACTORY,)),
    "zero-grad-set-to-none": ((r"zero_",), (r"zero_",)),
    "append-detach": ((r"append",), (r"append",)),
}


#: substrings of the lower-cased text one of which any match of the pattern contains (a cheap
#: necessary condition checked before the regex)
GUARDS: dict[str, tuple[str, ...]] = {
    HOST_READ: ("loss", "item", "cpu", "numpy", "tolist"),
    r"DistributedDataParallel|\bDDP\b": ("distributeddataparallel", "ddp"),
    r"(?i:loader)": ("loader",),
}


@lru_cache(maxsize=None)
def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


class _Text:
    def __init__(self, text: str):
        self.text = text
        self._lower: str | None = None

    def search(self, pattern: str) -> bool:
        guard = GUARDS.get(pattern)
        if guard is not None:
            if self._lower is None:
                self._lower = self.text.lower()
            if not any(g in self._lower for g in guard):
                return False
        return _rx(pattern).search(self.text) is not None


def file_candidates(source: str, fixers: Iterable[str]) -> set[str]:
    """Tier 1: the fixers whose names the file spells (unknown fixers always)."""
    text = _Text(source)
    out: set[str] = set()
    for name in fixers:
        keys = KEYS.get(name)
        if keys is None or all(text.search(p) for p in keys[0]):
            out.add(name)
    return out


def _span(stmt: ast.AST) -> tuple[int, int]:
    start = stmt.lineno  # type: ignore[attr-defined]
    for dec in getattr(stmt, "decorator_list", ()) or ():
        start = min(start, dec.lineno)
    return start, getattr(stmt, "end_lineno", None) or start


_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)


def _blocks(node: ast.AST) -> list[tuple[int | None, list[ast.stmt]]]:
    """The statement lists of a compound statement, each with the first line of its own header
    (``except X:``, ``case P:``) when it has one."""
    out: list[tuple[int | None, list[ast.stmt]]] = []
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            out.append((None, block))
    for h in getattr(node, "handlers", None) or ():
        out.append((h.lineno, h.body))
    for c in getattr(node, "cases", None) or ():
        out.append((c.pattern.lineno, c.body))
    return out


def _statements(body: list[ast.stmt]):
    """Every statement, nested ones included (no expressions: imports and classes are statements)."""
    stack = list(reversed(body))
    while stack:
        s = stack.pop()
        yield s
        for _, block in reversed(_blocks(s)):
            stack.extend(reversed(block))


def _imports(tree: ast.Module) -> dict[str, str]:
    """bound name -> full dotted name, for every import in the file (any depth)."""
    out: dict[str, str] = {}
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            mod = "." * (node.level or 0) + (node.module or "")
            for a in node.names:
                if a.name != "*":
                    out[a.asname or a.name] = f"{mod}.{a.name}"
    return out


class _Region:
    """The code a finding on the touched lines can flag.

    A finding overlaps a touched line L, so the statement holding the flagged code (the flagged
    node itself for a whole loop) contains L. Of each statement containing L: a simple statement
    whole; a compound statement its header (decorators, the ``for``/``if``/``def`` line(s), the
    ``except``/``case`` line of the block holding L), a loop or ``with`` whole (loops are flagged
    whole)."""

    def __init__(self, tree: ast.Module, touched: list[int]):
        self.touched = touched  # sorted
        self.lines: set[int] = set()
        self.simple: list[ast.stmt] = []
        self._visit(tree.body)

    def _hits(self, a: int, b: int) -> bool:
        i = bisect.bisect_left(self.touched, a)
        return i < len(self.touched) and self.touched[i] <= b

    def _add(self, a: int, b: int) -> None:
        self.lines.update(range(a, b + 1))

    def _visit(self, body: list[ast.stmt]) -> None:
        for s in body:
            a, b = _span(s)
            if not self._hits(a, b):
                continue
            blocks = _blocks(s)
            if not blocks:
                self._add(a, b)
                self.simple.append(s)
                continue
            first_body = min(blk[0].lineno for _, blk in blocks)
            self._add(a, max(a, first_body - 1))
            if isinstance(s, _LOOPS):
                self._add(a, b)
            for head, blk in blocks:
                start = _span(blk[0])[0]
                if head is not None and self._hits(head, _span(blk[-1])[1]):
                    self._add(head, max(head, start - 1))
                self._visit(blk)

    def text(self, source_lines: list[str]) -> str:
        return "\n".join(source_lines[n - 1] for n in sorted(self.lines) if 0 < n <= len(source_lines))


def _parse(source: str) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def compiles(source: str) -> bool:
    """A cheap syntax check (bytecode compile, about twice as fast as building an AST)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<review>", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False


def region_candidates(source: str, fd: FileDiff, fixers: Iterable[str]) -> set[str] | None:
    """Tier 2: of ``fixers``, those that could flag code in the statements the diff touches.
    None when :mod:`ast` cannot parse the source (then every fixer must run)."""
    fixers = set(fixers)
    tree = _parse(source)
    if tree is None:
        return None
    if not fixers:
        return set()
    touched = sorted(fd.added | {k for g in fd.deletions for k in (g, g + 1)})
    region = _Region(tree, touched)
    if not region.lines:
        return set()
    region_text = _Text(region.text([line.rstrip("\r\n") for line in split_lines(source)]))  # ast's line numbers
    text = region_text.text
    imports: dict[str, str] | None = None
    out: set[str] = set()
    for name in fixers:
        keys = KEYS.get(name)
        if keys is None:
            out.add(name)
            continue
        if name == "matmul-precision":
            if "cuda" in text or any(isinstance(s, (ast.Import, ast.ImportFrom)) for s in region.simple):
                out.add(name)
            continue
        ok = True
        for pattern in keys[1]:
            if region_text.search(pattern):
                continue
            rx = _rx(pattern)
            if imports is None:
                imports = _imports(tree)
            names = [bound for bound, full in imports.items() if rx.search(full)]
            if name == "torch-compile":
                names += [n.name for n in _statements(tree.body)
                          if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
            if not any(re.search(rf"\b{re.escape(n)}\b", text) for n in names):
                ok = False
                break
        if ok:
            out.add(name)
    return out


def plan(source: str, fd: FileDiff, fixers: Iterable[str]) -> tuple[set[str], bool]:
    """(the fixers worth running on this file for this diff, whether the file must be parsed
    with libcst even without any: it does not parse with :mod:`ast`, so libcst reports why, or
    parses it where ast cannot)."""
    names = list(fixers)
    first = file_candidates(source, names)
    if not first:
        return set(), not compiles(source) and _parse(source) is None
    second = region_candidates(source, fd, first)
    if second is None:
        return first, True
    return second, bool(second)


def candidates(source: str, fd: FileDiff, fixers: Iterable[str]) -> set[str]:
    """The fixers worth running on this file for this diff."""
    return plan(source, fd, fixers)[0]
