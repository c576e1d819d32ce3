"""Reading a findings.json that `zoomer-ar analyze` wrote (for `compare` and `record`).

Anything else is bad input: one line naming the file and what is wrong (InputError, exit 2) -
unreadable, not UTF-8 JSON, JSON of the wrong shape (the first field at fault, and how many more),
or a `schema_version` this version does not read (another major version than ANALYSIS_SCHEMA_VERSION's:
a newer zoomer-ar wrote it). A findings.json without `schema_version` is read as the current version.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .errors import InputError
from .models import ANALYSIS_SCHEMA_VERSION, Analysis

_MAJOR = ANALYSIS_SCHEMA_VERSION.split(".")[0]
_KEYS = ("schema_version", "job", "features", "bottleneck", "findings")


def load_findings(path: str | Path) -> Analysis:
    """The Analysis in the findings.json at `path`; InputError (one line naming it) when it is not one."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(str(p), f"cannot read it ({exc.strerror or exc})") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(str(p), f"not a findings.json: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise InputError(str(p), f"not a findings.json: not JSON ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise InputError(str(p), "not a findings.json: JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise InputError(str(p), f"not a findings.json: a JSON {_kind(doc)}, not an object with {', '.join(_KEYS)}")
    if not any(k in doc for k in _KEYS):
        keys = ", ".join(list(doc)[:6]) or "none"
        raise InputError(str(p), f"not a findings.json: none of {', '.join(_KEYS)} (top-level keys: {keys})")
    version = doc.get("schema_version", ANALYSIS_SCHEMA_VERSION)
    if not isinstance(version, str) or not version.strip():
        raise InputError(str(p), f"not a findings.json: schema_version {json.dumps(version)} is not a version string")
    if version.split(".")[0] != _MAJOR:
        raise InputError(str(p), f"findings.json schema_version {version!r} is not one this zoomer-ar reads "
                                 f"({_MAJOR}.x): analyse the trace again with this version")
    from pydantic import ValidationError

    try:
        analysis = Analysis.model_validate(doc)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        loc = ".".join(str(x) for x in first.get("loc", ())) or "(top level)"
        more = f"; {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''}" if len(errors) > 1 else ""
        raise InputError(str(p), f"not a findings.json: {loc}: {first.get('msg', 'invalid')}{more}") from None
    # analyze writes impacts of 0 or more, pct_of_step at most the step: NaN, infinity or a negative share would
    # turn every total they enter (compare's gains, the store's digest sums) into NaN or nonsense
    for i, f in enumerate(analysis.findings):
        for name, top in (("pct_of_step", 100.0), ("ms_per_step", math.inf), ("gpu_hours_per_1000_steps", math.inf)):
            v = getattr(f.impact, name)
            if not (math.isfinite(v) and 0.0 <= v <= top):
                want = "a share of the step from 0 to 100" if top == 100.0 else "a finite number of 0 or more"
                raise InputError(str(p), f"not a findings.json: findings.{i}.impact.{name}: {v!r} is not {want}")
    return analysis


def _kind(doc: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(doc), "number")
