"""The fix stage: static detection of performance anti-patterns in user code and libcst codemods.

Fixers live in the top-level ``fixers/`` folder (one file per fix) and are discovered by
:mod:`zoomer_ar.fix.registry`. User code is parsed with libcst, never imported or executed.

Public entry points for later stages are in :mod:`zoomer_ar.fix.api`. Importing this package
is cheap (libcst loads on first use), so the CLI starts fast.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Example", "Fixer", "FixerError", "SourceParseError", "StaticMatch", "TextEdit"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import base

        return getattr(base, name)
    raise AttributeError(name)
