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

from pydantic import BaseModel, Field

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


def read_cases(path: Path) -> Iterator[LabelledCase]:
    with _open(path, "r") as fh:
        for line in fh:
            line = line.strip()
            if line:
                yield LabelledCase.model_validate_json(line)


