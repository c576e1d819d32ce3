"""Public functions of the fix stage for later stages (analysis, reports, relaunch).

All functions take source text, never import or execute it, and raise
:class:`~zoomer_ar.fix.base.SourceParseError` (an InputError) when it does not parse.
``select``/``ignore`` take fixer names or pattern ids (a comma-separated string or a list);
``options`` maps a fixer name or pattern id to that fixer's options, e.g.
``{"dataloader-bound": {"num_workers": 8}}`` from trace evidence. Opt-in fixers
(``torch-compile``, ``ddp-bucket-view``) report by default and rewrite only when selected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from . import engine
from .base import Context, StaticMatch
from .locate import check_pattern, find_function, locate_in
from .registry import Registry, load_registry

Ids = str | Iterable[str] | None
Options = Mapping[str, Mapping[str, Any]] | None


def static_findings(source: str, path: str = "<string>", select: Ids = None, *, ignore: Ids = None, options: Options = None) -> list[StaticMatch]:
    """Statically visible anti-patterns in ``source`` (sorted by position)."""
    selection = engine.select_fixers(select, ignore, options)
    return engine.detect_source(source, path, selection)


def fix_source(source: str, select: Ids = None, *, ignore: Ids = None, options: Options = None, path: str = "<string>") -> str:
    """``source`` with the selected fixes applied (idempotent; the result always parses)."""
    selection = engine.select_fixers(select, ignore, options)
    return engine.fix_source_with(source, path, selection)


def diff_source(source: str, path: str, select: Ids = None, *, ignore: Ids = None, options: Options = None) -> str:
    """A unified diff (``a/path``, ``b/path``) of :func:`fix_source`; empty when nothing changes."""
    fixed = fix_source(source, select, ignore=ignore, options=options, path=path)
    return engine.unified_diff(path, source, fixed) if fixed != source else ""


def locate(
    source: str,
    function_def_line: int,
    pattern: str,
    *,
    function: str | None = None,
    path: str = "<string>",
    options: Options = None,
) -> list[StaticMatch]:
    """Statements inside the function whose ``def`` (or first decorator) is on
    ``function_def_line`` that relate to ``pattern``: the fixers' static findings (with
    replacements) first-class, plus candidate sites (``fixer == ""``, message
    ``candidate site (...)``) such as the ``.item()``, the ``DataLoader(...)``, the ``.to(...)``
    or the optimizer construction. ``function`` (the Kineto frame's name) disambiguates and
    ``"<module>"`` means module-level code. Empty when no such function exists."""
    check_pattern(pattern)
    selection = engine.select_fixers([pattern], None, options) if _has_fixers(pattern) else None
    ctx = Context(source, path, fixing=selection.fixing if selection else ())
    region = find_function(ctx, function_def_line, function)
    if region is None:
        return []
    return locate_in(ctx, region, pattern, selection.fixers if selection else ())


def locate_file(path: str | Path, function_def_line: int, pattern: str, *, function: str | None = None) -> list[StaticMatch]:
    """:func:`locate` for a file on disk (decoded with its PEP 263 encoding)."""
    p = Path(path)
    text, _ = engine.decode(p.read_bytes())
    return locate(text, function_def_line, pattern, function=function, path=str(p))


def run_directory(root: str | Path, select: Ids = None, *, ignore: Ids = None, options: Options = None, fix: bool = True,
                  only: Iterable[str | Path] | None = None,
                  scopes: Mapping[str, Iterable[str]] | None = None) -> engine.RunResult:
    """:func:`zoomer_ar.fix.engine.run`: findings, ``.diff()`` / ``.diff_bytes()`` for a tree (with
    ``only``: for those files of it; with ``scopes``: fixing only inside those functions of each file,
    see zoomer_ar.sourcemap.patch_scopes)."""
    return engine.run(root, select=select, ignore=ignore, options=options, fix=fix,
                      only=None if only is None else [Path(root) / q for q in only], scopes=scopes)


def fixers(registry: Registry | None = None) -> list[dict[str, Any]]:
    """The registry as plain data: name, pattern, opt_in, summary, options."""
    reg = registry or load_registry()
    return [
        {
            "name": f.name,
            "pattern": f.pattern,
            "opt_in": f.opt_in,
            "summary": f.summary,
            "options": {k: v[0] for k, v in f.OPTIONS.items()},
        }
        for f in reg.fixers
    ]


def fixers_for(pattern: str) -> list[str]:
    """Names of the fixers for a pattern id (for Finding.fixers)."""
    return [f.name for f in load_registry().by_pattern(pattern)]


def _has_fixers(pattern: str) -> bool:
    return bool(load_registry().by_pattern(pattern))
