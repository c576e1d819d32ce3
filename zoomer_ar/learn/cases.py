"""The labelled case: one job's feature vector, one label per anti-pattern, and where it came from.

Stored one JSON object per line (JSONL; training_data/README.md documents the schema):

    {"case_id": "synth-000042", "source": "synth", "group": "synth:000042", "weight": 1.0,
     "feature_schema_version": "1.0.0", "features": {...FeatureVector fields...},
     "labels": {"idle-gpu": "negative", "sync-point": "positive", ...},   # all PATTERN_IDS
     "costs": {"sync-point": 7.2},        # planted/injected cost, % of wall time, where measured
     "provenance": {"trace_sha256": [...], "generator": {...}, "real_trace": "...", "command": "..."}}

Label meaning is LABELS.yaml's: positive (present, avoidable cost >= 5%), negative (absent or < 1%),
unknown (between, or not observable): unknown labels are left out of training and scoring.
`group` keeps variants of one source together (one real trace and all its augmentations, one
scenario and its clean twin): grouped cross-validation and the held-out split never cut a group.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from ..errors import InputError
from ..models import PATTERN_IDS

Label = Literal["positive", "negative", "unknown"]
Source = Literal["example", "synth", "augment", "verdict", "real"]
CASE_SCHEMA_VERSION = "1"
HELD_OUT_PERCENT = 20


class LabelledCase(BaseModel):
    case_id: str
    source: Source
    group: str
    weight: float = 1.0
    feature_schema_version: str
    features: dict[str, Any]
    labels: dict[str, Label]
    costs: dict[str, float] = Field(default_factory=dict)
    provenance: dict[str, Any] = Field(default_factory=dict)

    def label(self, pattern: str) -> Label:
        return self.labels.get(pattern, "unknown")


def full_labels(partial: dict[str, str]) -> dict[str, str]:
    return {p: partial.get(p, "unknown") for p in PATTERN_IDS}


def held_out(group: str, percent: int = HELD_OUT_PERCENT) -> bool:
    """The fixed held-out part of any corpus: a group is held out by a hash of its name, so the same
    source lands on the same side in every corpus built (and models trained on different corpora
    can be compared on it)."""
    return int(hashlib.sha1(group.encode()).hexdigest()[:8], 16) % 100 < percent


def _open(path: Path, mode: str):
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def write_cases(path: Path, cases: Iterable[LabelledCase]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = path.with_name(path.name + ".tmp")
    with _open(tmp, "w") as fh:
        for c in cases:
            fh.write(json.dumps(c.model_dump(mode="json"), sort_keys=True, allow_nan=False) + "\n")
            n += 1
    tmp.replace(path)
    return n


def validation_summary(exc: ValidationError) -> str:
    """A pydantic ValidationError in one line: the first problem and how many more."""
    errs = exc.errors()
    if not errs:
        return "invalid"
    e = errs[0]
    where = ".".join(str(x) for x in e.get("loc", ())) or "record"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    msg = e.get("msg", "invalid")
    return f"{where}: {msg}{more}" if e.get("type") != "json_invalid" else f"not valid JSON ({msg})"


def read_cases(path: Path) -> Iterator[LabelledCase]:
    """Cases from a corpus JSONL file; InputError (file:line, one line) for a record that is not a case."""
    try:
        with _open(path, "r") as fh:
            for lineno, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    yield LabelledCase.model_validate_json(line)
                except ValidationError as exc:
                    raise InputError(f"{path}:{lineno}", f"not a corpus case: {validation_summary(exc)}") from None
    except OSError as exc:  # also gzip's BadGzipFile
        raise InputError(str(path), f"cannot read the corpus ({getattr(exc, 'strerror', None) or exc})") from None
    except EOFError:
        raise InputError(str(path), "truncated compressed corpus") from None
    except UnicodeDecodeError:
        raise InputError(str(path), "not a corpus JSONL file (binary content)") from None


