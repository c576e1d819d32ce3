"""The fixers' names, patterns and opt-in flags, read from ``fixers/*.py`` without running them.

A report names the fixers behind each finding (`render/report.py`). Loading the registry for that
imported every fixer module (and libcst with them) and parsed every fixer's examples: about 0.3 s
of each `zoomer-ar analyze`, for three class attributes per file. This reads them from each file's
syntax tree instead: the one class deriving from `Fixer` and its literal `name`, `pattern` and
`opt_in` assignments. A file it cannot read that way (a computed attribute, a fixer defined through
another base class, a syntax error) makes `entries` return None, and the caller loads the registry,
which says what is wrong. tests/fix/test_catalogue.py checks that both agree on the shipped fixers.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .. import paths
from ..models import PATTERN_IDS


#: opt-in fixers that the job's recorded facts (the capture helper's job.json) make safe to apply, so that
#: `zoomer-ar analyze` puts them in patch.diff: name -> (section, key that must be true, whether the trace must be
#: host-only). cpu-autocast speeds up CPU matmuls: a job that ran on an accelerator gains nothing from it,
#: whatever the host CPU supports.
FACT_UNLOCKS = {"cpu-autocast": ("cpu", "native_bf16", True)}


@dataclass(frozen=True)
class Entry:
    name: str
    pattern: str
    opt_in: bool


def _read(path: Path) -> Entry | None:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)
               and any(isinstance(b, ast.Name) and b.id == "Fixer" for b in n.bases)]
    if len(classes) != 1:
        return None
    found: dict[str, object] = {}
    for stmt in classes[0].body:
        target = value = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        if isinstance(target, ast.Name) and target.id in ("name", "pattern", "opt_in"):
            if not isinstance(value, ast.Constant):
                return None
            found[target.id] = value.value
    name, pattern, opt_in = found.get("name"), found.get("pattern"), found.get("opt_in", False)
    if not (isinstance(name, str) and name and isinstance(pattern, str) and isinstance(opt_in, bool)):
        return None
    return Entry(name, pattern, opt_in)


@lru_cache(maxsize=8)
def _entries(directory: str) -> tuple[Entry, ...] | None:
    out = []
    for path in sorted(Path(directory).glob("*.py")):
        if path.name.startswith("_"):
            continue
        e = _read(path)
        if e is None:
            return None
        out.append(e)
    if len({e.name for e in out}) != len(out):
        return None  # the registry's error to give
    return tuple(sorted(out, key=lambda e: e.name))


def entries(directory: Path | str | None = None) -> tuple[Entry, ...] | None:
    """Every fixer's (name, pattern, opt-in) by name, or None where a file does not read statically."""
    return _entries(str(Path(directory or paths.FIXERS_DIR).resolve()))


class UnknownId(KeyError):
    """An id that is neither a fixer's name, a pattern id nor ``all`` (args[0]: the id as written)."""


def select_ids(fixers, ids) -> list:
    """The fixers (anything with `name` and `pattern`, sorted by name) that ids name: fixer names,
    pattern ids or ``all``, case and blanks ignored; sorted by name, each once. UnknownId otherwise.
    The registry's `resolve` and the catalogue's answer the same through it."""
    by_name = {f.name: f for f in fixers}
    out: list = []
    for raw in ids:
        ident = raw.strip().lower()
        if not ident:
            continue
        if ident == "all":
            found = list(fixers)
        elif ident in by_name:
            found = [by_name[ident]]
        elif ident in PATTERN_IDS:
            found = [f for f in fixers if f.pattern == ident]
        else:
            raise UnknownId(raw)
        out.extend(f for f in found if f not in out)
    return sorted(out, key=lambda f: f.name)


def resolve(ids, directory: Path | str | None = None) -> list[Entry] | None:
    """`Registry.resolve` on the catalogue; None where the catalogue does not read or an id is unknown
    (the registry's error to give)."""
    cat = entries(directory)
    if cat is None:
        return None
    try:
        return select_ids(cat, ids)
    except UnknownId:
        return None
