"""What the store's hours are hours of: GPUs, accelerators (MTIA), or both.

A recorded run's `gpu_hours` are GPU-hours on a GPU trace and accelerator-hours on a trace whose device is not a
GPU (features.names.device_noun: has_accelerator without has_gpu). The digest and history add runs up, so
their unit is the union of their runs' devices: "GPU", "accelerator", or "GPU/accelerator" when both are
summed (never one name for the other's hours). The columns keep their `gpu_hours` names.
"""

from __future__ import annotations

from sqlalchemy import and_, case, func
from sqlalchemy.sql.elements import ColumnElement

from ..features.names import ACCELERATOR_NOUN as ACCELERATOR
from ..features.names import BOTH_NOUNS as BOTH
from ..features.names import GPU_NOUN as GPU
from .orm import Analysis

__all__ = ["ACCELERATOR", "BOTH", "GPU", "accelerator_only", "hours_unit", "noun"]


def accelerator_only() -> ColumnElement[int]:
    """1 for a run on an accelerator that is not a GPU (MTIA), else 0 (GPU and CPU-only runs: device_noun's
    "GPU"), from the run's stored features; the same SQL meaning on SQLite and PostgreSQL."""
    feats = Analysis.features
    return case(
        (and_(feats["has_accelerator"].as_boolean(), ~func.coalesce(feats["has_gpu"].as_boolean(), False)), 1),
        else_=0,
    )


def noun(any_accelerator_only: object, all_accelerator_only: object) -> str:
    """The devices of a set of runs from max() and min() of accelerator_only() over them (None: no runs)."""
    if not any_accelerator_only:
        return GPU
    return ACCELERATOR if all_accelerator_only else BOTH


def hours_unit(device: str) -> str:
    """"GPU-hours", "accelerator-hours" or "GPU/accelerator-hours" (cost_attribution's `hours_unit` spelling)."""
    return f"{device}-hours"
