"""The fix stage: static detection of performance anti-patterns in user code and libcst codemods.

Fixers live in the top-level ``fixers/`` folder (one file per fix) and are discovered by
:mod:`zoomer_ar.fix.registry`. User code is parsed with libcst, never imported or executed.

Public entry points for later stages are in :mod:`zoomer_ar.fix.api`.
"""

from __future__ import annotations

from .base import Example, Fixer, FixerError, SourceParseError, StaticMatch, TextEdit

__all__ = ["Example", "Fixer", "FixerError", "SourceParseError", "StaticMatch", "TextEdit"]
