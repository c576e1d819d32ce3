"""What a model version's meta.json must hold for inference to run on it (learn.model.read_meta).

Everything a vote reads is checked when the version loads, so a damaged or hand-edited meta.json is one
load error naming it (`analyze` then notes it and reports the rules' findings) instead of an internal
error in the middle of a vote. The checks follow what `train` writes:

- ``version``, ``feature_schema_version``: non-empty strings;
- ``feature_names``: distinct strings; for a model of this code's feature-schema major version, names this
  code extracts (learn.featurize.feature_names: a minor version only adds features, so an unknown name is
  damage, which would otherwise read as a missing value on every row);
- ``vocab``: {field: [strings]};
- per label: ``file`` a file name inside the version folder, ``threshold`` in [0, 1], ``add_threshold`` a
  number (above 1 means "off"), ``calibration`` absent/null, Platt ``{a, b}`` or isotonic ``{x, y}``
  (equal-length, non-empty lists of numbers, x non-decreasing).
"""

from __future__ import annotations

import math
from typing import Any


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _calibration_problem(cal: Any) -> str | None:
    if cal is None:
        return None
    if not isinstance(cal, dict):
        return "not an object"
    kind = cal.get("kind")
    if kind == "platt":
        return None if _number(cal.get("a")) and _number(cal.get("b")) else "platt needs numbers a and b"
    if kind == "isotonic":
        x, y = cal.get("x"), cal.get("y")
        if not (isinstance(x, list) and isinstance(y, list) and x and len(x) == len(y)
                and all(_number(v) for v in x + y)):
            return "isotonic needs lists x and y of numbers, of one non-zero length"
        if any(b < a for a, b in zip(x, x[1:])):
            return "isotonic x is not in increasing order"
        return None
    return f"unknown kind {kind!r} (expected platt or isotonic)"


def _label_problem(info: dict[str, Any]) -> str | None:
    f = info.get("file")
    if not (isinstance(f, str) and f and f not in (".", "..") and "/" not in f and "\\" not in f):
        return f"file {f!r} is not a file name inside the version folder"
    if not (_number(info.get("threshold")) and 0.0 <= info["threshold"] <= 1.0):
        return f"threshold {info.get('threshold')!r} is not a probability"
    if "add_threshold" in info and not _number(info["add_threshold"]):
        return f"add_threshold {info['add_threshold']!r} is not a number"
    why = _calibration_problem(info.get("calibration"))
    return f"calibration: {why}" if why else None


def _feature_names_problem(names: Any, schema: str) -> str | None:
    if not (isinstance(names, list) and names and all(isinstance(n, str) and n for n in names)):
        return "feature_names is not a list of feature names"
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        return f"feature_names repeats {', '.join(twice[:3])}"
    from ..detect.ensemble import schema_compatible
    from .featurize import feature_names

    if schema_compatible(schema):  # another major version is refused with its own reason (ensemble)
        known = set(feature_names())
        unknown = [n for n in names if n not in known]
        if unknown:
            return (f"feature_names holds {', '.join(unknown[:3])}{' ...' if len(unknown) > 3 else ''}, which feature "
                    f"schema {schema} does not have")
    return None


def meta_problem(meta: dict[str, Any]) -> str | None:
    """Why inference cannot run on this meta.json (None when it can); `labels` is known to be a dict of dicts."""
    for key in ("version", "feature_schema_version"):
        if not (isinstance(meta.get(key), str) and meta[key].strip()):
            return f"{key} {meta.get(key)!r} is not a non-empty string"
    why = _feature_names_problem(meta.get("feature_names"), meta["feature_schema_version"])
    if why:
        return why
    vocab = meta.get("vocab", {})
    if not (isinstance(vocab, dict) and all(isinstance(v, list) and all(isinstance(s, str) for s in v)
                                            for v in vocab.values())):
        return "vocab is not {field: [strings]}"
    for pattern, info in meta["labels"].items():
        why = _label_problem(info)
        if why:
            return f"labels.{pattern}: {why}"
    return None
