"""Discovery of the fixers in ``fixers/*.py`` (loaded by file path) and their validation.

Each file defines exactly one :class:`~zoomer_ar.fix.base.Fixer` subclass. A file that does not
import, defines no fixer or defines an invalid one is a :class:`FixerError` naming the file.
Files whose name starts with ``_`` are skipped.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import libcst as cst

from .. import paths
from ..errors import InputError
from ..models import PATTERN_IDS
from .base import Example, Fixer, FixerError
from .catalogue import UnknownId, select_ids

_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_MODULE_PREFIX = "zoomer_ar_fixers"


def _load_file(path: Path) -> type[Fixer]:
    modname = f"{_MODULE_PREFIX}.{path.stem}"
    try:
        spec = importlib.util.spec_from_file_location(modname, path)
        if spec is None or spec.loader is None:
            raise FixerError(f"{path}: cannot load fixer file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        spec.loader.exec_module(module)
    except FixerError:
        raise
    except Exception as exc:
        sys.modules.pop(modname, None)
        raise FixerError(f"{path}: cannot load fixer: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, Fixer) and obj is not Fixer and obj.__module__ == modname and obj.name
    ]
    if len(found) != 1:
        raise FixerError(f"{path}: expected exactly one Fixer subclass with a name, found {len(found)}")
    cls = found[0]
    cls.source_file = str(path)
    validate(cls, path)
    return cls


def validate(cls: type[Fixer], path: Path | str = "") -> None:
    """Check a fixer class's declarations (not its behaviour: the test suite does that)."""
    where = f"{path}: fixer {cls.name!r}" if path else f"fixer {cls.name!r}"

    def fail(reason: str) -> None:
        raise FixerError(f"{where}: {reason}")

    if not _NAME_RE.match(cls.name or ""):
        fail("name must be kebab-case")
    if cls.pattern not in PATTERN_IDS:
        fail(f"unknown pattern {cls.pattern!r} (one of zoomer_ar.models.PATTERN_IDS)")
    if not cls.summary.strip() or "\n" in cls.summary.strip():
        fail("summary must be one non-empty line")
    if not cls.explanation.strip():
        fail("explanation is empty")
    if cls.check is Fixer.check:
        fail("does not implement check()")
    if not isinstance(cls.OPTIONS, dict) or not all(
        isinstance(k, str) and isinstance(v, tuple) and len(v) == 2 for k, v in cls.OPTIONS.items()
    ):
        fail("OPTIONS must map names to (default, help) tuples")
    if not isinstance(cls.VALID, list) or not all(isinstance(v, str) for v in cls.VALID):
        fail("VALID must be a list of source strings")
    if not isinstance(cls.INVALID, list) or not cls.INVALID or not all(isinstance(e, Example) for e in cls.INVALID):
        fail("INVALID must be a non-empty list of Example")
    for i, src in enumerate([*cls.VALID, *(e.before for e in cls.INVALID), *(e.after for e in cls.INVALID if e.after)]):
        try:
            cst.parse_module(src)
        except Exception as exc:
            fail(f"example {i} does not parse: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    for e in cls.INVALID:
        unknown = set(e.options) - set(cls.OPTIONS)
        if unknown:
            fail(f"example uses unknown option(s) {sorted(unknown)}")


@dataclass(frozen=True)
class Registry:
    """The fixers, by name (sorted), with lookups by name and by pattern id."""

    fixers: tuple[type[Fixer], ...]

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fixers]

    def by_name(self, name: str) -> type[Fixer]:
        for f in self.fixers:
            if f.name == name:
                return f
        raise KeyError(name)

    def by_pattern(self, pattern: str) -> list[type[Fixer]]:
        return [f for f in self.fixers if f.pattern == pattern]

    def resolve(self, ids: Iterable[str]) -> list[type[Fixer]]:
        """Fixers named by ids (fixer names or pattern ids; ``all``); unknown ids are an InputError."""
        try:
            return select_ids(self.fixers, ids)
        except UnknownId as exc:
            raise InputError(None, f"unknown fixer or pattern id: {exc.args[0]!r} (see `zoomer-ar fix --list`)") from None

    def instantiate(self, classes: Iterable[type[Fixer]], options: Mapping[str, Mapping[str, Any]] | None = None) -> list[Fixer]:
        """Fixer instances; ``options`` maps a fixer name or a pattern id to that fixer's options."""
        options = options or {}
        known = set(self.names) | set(PATTERN_IDS)
        for key, values in options.items():
            if key not in known:
                raise InputError(None, f"options for unknown fixer or pattern id: {key!r}")
            if key not in self.names:
                accepted = {k for f in self.by_pattern(key) for k in f.OPTIONS}
                unknown = sorted(set(values) - accepted)
                if unknown:
                    raise InputError(None, f"no {key} fixer takes option(s) {', '.join(unknown)}")
        out = []
        for cls in classes:
            merged: dict[str, Any] = {}
            for key in (cls.pattern, cls.name):
                for k, v in (options.get(key) or {}).items():
                    if k in cls.OPTIONS or key == cls.name:
                        merged[k] = v
            try:
                out.append(cls(**merged))
            except FixerError as exc:
                raise InputError(None, str(exc)) from None
        return out


@lru_cache(maxsize=8)
def _load(directory: str) -> Registry:
    root = Path(directory)
    if not root.is_dir():
        raise FixerError(f"{root}: fixers folder not found")
    classes: list[type[Fixer]] = []
    for path in sorted(root.glob("*.py")):
        if path.name.startswith("_"):
            continue
        cls = _load_file(path)
        for other in classes:
            if other.name == cls.name:
                raise FixerError(f"{path}: fixer name {cls.name!r} already used by {other.source_file}")
        classes.append(cls)
    return Registry(tuple(sorted(classes, key=lambda c: c.name)))


def load_registry(directory: Path | str | None = None) -> Registry:
    """The fixers in ``directory`` (default: zoomer_ar.paths.FIXERS_DIR), loaded once per process."""
    return _load(str(Path(directory or paths.FIXERS_DIR).resolve()))


def clear_cache() -> None:
    _load.cache_clear()
