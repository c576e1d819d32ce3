"""Which fixers could report a finding on the changed lines of a file, decided without libcst.

Parsing a file with libcst and running the fixers costs tens to hundreds of milliseconds; most
files in a large diff cannot hold a finding on their changed lines. Two conservative tiers:

1. file: a fixer's finding needs its names somewhere in the file (``DataLoader`` for the
   dataloader fixer; an aliased import still spells the original name in the import);
2. region: a finding reported by review overlaps a changed line, so the flagged code lies inside
   a top-level statement (found with :mod:`ast`, which is fast) that overlaps the change, and that
   statement's text spells the fixer's name, or a name an import binds to it
   (``from torch.utils.data import DataLoader as DL`` makes ``DL`` count).

A fixer this module does not know (a new file under ``fixers/``) always runs. A file :mod:`ast`
cannot parse goes to libcst whatever tier 1 says, so that it is reported (or, where libcst parses
newer syntax, reviewed with the tier-1 fixers). tests/review checks that the filter never drops a
finding on the fixers' own examples.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from typing import Iterable

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
    "conv-bias-before-bn": ((r"Conv[123]d", r"BatchNorm"), (r"Conv[123]d",)),
    "dataloader-workers": ((r"DataLoader",), (r"DataLoader",)),
    "ddp-bucket-view": ((r"DistributedDataParallel|\bDDP\b",), (r"DistributedDataParallel|\bDDP\b",)),
    "factory-on-device": ((r"torch", TO_DEVICE, FACTORY), (TO_DEVICE, FACTORY)),
    "loop-empty-cache": ((r"empty_cache", LOOP), (r"empty_cache",)),
    "loop-item-sync": ((LOOP, HOST_READ), (HOST_READ,)),
    "loop-synchronize": ((r"synchronize", LOOP), (r"synchronize",)),
    "matmul-precision": ((r"cuda",), ()),  # region: see _matmul_region
    "non-blocking-h2d": ((r"\bfor\b", TO_DEVICE, r"(?i:loader)"), (TO_DEVICE,)),
    "optimizer-foreach": ((OPTIMIZER,), (OPTIMIZER,)),
    "redundant-copy-chain": ((COPY_CHAIN,), (COPY_CHAIN,)),
    "torch-compile": ((r"Module|" + MODEL_FACTORY,), (MODEL_FACTORY,)),  # + classes defined in the file
    "zero-grad-set-to-none": ((r"zero_",), (r"zero_",)),
}


@lru_cache(maxsize=None)
def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def file_candidates(source: str, fixers: Iterable[str]) -> set[str]:
    """Tier 1: the fixers whose names the file spells (unknown fixers always)."""
    out: set[str] = set()
    for name in fixers:
        keys = KEYS.get(name)
        if keys is None or all(_rx(p).search(source) for p in keys[0]):
            out.add(name)
    return out


def _span(stmt: ast.stmt) -> tuple[int, int]:
    start = stmt.lineno
    for dec in getattr(stmt, "decorator_list", ()) or ():
        start = min(start, dec.lineno)
    return start, stmt.end_lineno or stmt.lineno


def _imports(tree: ast.Module) -> dict[str, str]:
    """bound name -> full dotted name, for every import in the file (any depth)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
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


def region_candidates(source: str, fd: FileDiff, fixers: Iterable[str]) -> set[str] | None:
    """Tier 2: of ``fixers``, those that could flag code in a top-level statement the diff
    touches. None when :mod:`ast` cannot parse the source (then every fixer must run)."""
    fixers = set(fixers)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not fixers:
        return set()
    lines = source.splitlines()
    region: list[ast.stmt] = []
    for stmt in tree.body:
        a, b = _span(stmt)
        if fd.touches(a, b, block=True):
            region.append(stmt)
    if not region:
        return set()
    text = "\n".join("\n".join(lines[_span(s)[0] - 1:_span(s)[1]]) for s in region)
    imports: dict[str, str] | None = None
    out: set[str] = set()
    for name in fixers:
        keys = KEYS.get(name)
        if keys is None:
            out.add(name)
            continue
        if name == "matmul-precision":
            if "cuda" in text or any(isinstance(s, (ast.Import, ast.ImportFrom)) for s in region):
                out.add(name)
            continue
        extra: list[str] = []
        if name == "torch-compile":
            extra = sorted({n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)})
        ok = True
        for pattern in keys[1]:
            rx = _rx(pattern)
            if rx.search(text):
                continue
            if imports is None:
                imports = _imports(tree)
            names = [bound for bound, full in imports.items() if rx.search(full)]
            if name == "torch-compile":
                names += extra
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
    second = region_candidates(source, fd, first)
    if second is None:
        return first, True
    return second, bool(second)


def candidates(source: str, fd: FileDiff, fixers: Iterable[str]) -> set[str]:
    """The fixers worth running on this file for this diff."""
    return plan(source, fd, fixers)[0]
