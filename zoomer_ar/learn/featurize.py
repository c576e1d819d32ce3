"""Feature vectors -> model input rows.

Column order: the FeatureVector fields in declaration order (minus identifiers that carry no
behaviour: `slowest_rank`, `most_compute_rank`, `trace_start_unix_s`), then one derived column per `*_ms_per_step`
field: its share of the step (`pct_step:<field>` = 100 * field / step_ms), because the labels are
costs relative to the step and trees cannot divide. bools -> 0/1, None -> NaN (LightGBM treats it
as missing), strings -> the index in a vocabulary stored with the model (unseen -> NaN).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..features.schema import FeatureVector

EXCLUDED = ("slowest_rank", "most_compute_rank", "trace_start_unix_s")


def base_fields() -> list[str]:
    return [n for n in FeatureVector.model_fields if n not in EXCLUDED]


def derived_fields() -> list[str]:
    return [f"pct_step:{n}" for n in FeatureVector.model_fields if n.endswith("_ms_per_step")]


def feature_names() -> list[str]:
    return base_fields() + derived_fields()


def string_fields() -> list[str]:
    out = []
    for name, f in FeatureVector.model_fields.items():
        ann = str(f.annotation)
        if "str" in ann and name not in EXCLUDED:
            out.append(name)
    return out


def full_features(features: dict[str, Any]) -> dict[str, Any]:
    """A stored feature dict completed with FeatureVector defaults (older cases lack newer fields)."""
    known = {k: v for k, v in features.items() if k in FeatureVector.model_fields}
    try:
        return FeatureVector(**known).model_dump()
    except Exception:  # a stored value no longer validates: keep what is there, defaults for the rest
        base = FeatureVector().model_dump()
        base.update(known)
        return base


def _num(v: Any) -> float:
    if v is None:
        return math.nan
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(float(v)) else math.nan
    return math.nan


def row(features: dict[str, Any], names: list[str], vocab: dict[str, list[str]]) -> np.ndarray:
    step = features.get("step_ms")
    out = np.empty(len(names), dtype=np.float64)
    for j, name in enumerate(names):
        if name.startswith("pct_step:"):
            v = features.get(name[9:])
            out[j] = 100.0 * float(v) / float(step) if (isinstance(v, (int, float)) and not isinstance(v, bool)
                                                          and isinstance(step, (int, float)) and step and step > 0) else math.nan
        elif name in vocab:
            v = features.get(name)
            out[j] = float(vocab[name].index(v)) if v in vocab[name] else math.nan
        else:
            out[j] = _num(features.get(name))
    return out


def matrix(rows: list[dict[str, Any]], names: list[str], vocab: dict[str, list[str]]) -> np.ndarray:
    if not rows:
        return np.empty((0, len(names)))
    return np.vstack([row(r, names, vocab) for r in rows])


def build_vocab(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    vocab: dict[str, list[str]] = {}
    for name in string_fields():
        vocab[name] = sorted({str(r[name]) for r in rows if isinstance(r.get(name), str)})
    return vocab
