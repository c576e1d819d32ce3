"""Which characters a name the service stores may hold (job names, report names, owners)."""

from __future__ import annotations

import unicodedata

#: Unicode control, format, line- and paragraph-separator characters: never part of a stored name
_UNPRINTABLE = ("Cc", "Cf", "Zl", "Zp")
#: separators of the store's `<team>/<job>` key: never part of a job name
SEPARATORS = "/\\"


def bad_chars(v: str, extra: str = "") -> list[str]:
    """The unprintable characters of `v` and those of `extra`, sorted."""
    return sorted({ch for ch in v if ch in extra or unicodedata.category(ch) in _UNPRINTABLE})


def store_job_name(name: str) -> str:
    """A report name as the `<job>` of `<team>/<job>`: separators and unprintable characters become '_'."""
    bad = set(bad_chars(name, SEPARATORS))
    return "".join("_" if ch in bad else ch for ch in name).strip() or "job"
