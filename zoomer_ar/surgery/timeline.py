"""The time columns of a slice of events, and the correlation ids that tie device events to the
runtime calls that launched them: the original, per-event code (for Placed and Launched records).

slices.py builds the same arrays from strictly decoded records without a Python call per event;
this code reads the slices the strict decode refuses, and is the reference the fast path is
tested against (tests/test_surgery_speed_equivalence.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .validate import placeable

_LAUNCH_CAT_WORDS = ("runtime", "driver")  # cuda_runtime, Runtime (2021), cuda_driver, mtia_runtime, hip...
_NOT_LAUNCH_FLOWS = ("fwdbwd",)  # flow arrows whose ids are not correlation ids
_FLOWS = ("s", "t", "f")
_INT64_MAX = (1 << 63) - 1


@dataclass
class Timeline:
    """The time columns of a slice of Placed events, with the events a viewer cannot place
    (`ok` False) kept out of every selection: copying them would make the output invalid."""

    ok: np.ndarray  # placeable (validate.placeable)
    meta: np.ndarray  # placeable metadata events (ph M): kept in every output
    ts: np.ndarray  # 0 where not ok or metadata
    end: np.ndarray  # ts + dur for X events, ts for the others
    x: np.ndarray
    dur: np.ndarray

    @classmethod
    def of(cls, lite: list) -> Timeline:
        n = len(lite)
        ok = np.fromiter(map(placeable, lite), dtype=bool, count=n)
        meta = ok & np.fromiter((e.ph == "M" for e in lite), dtype=bool, count=n)
        timed = ok & ~meta
        ts = np.fromiter((e.ts if t else 0.0 for e, t in zip(lite, timed.tolist())), dtype=np.float64, count=n)
        x = timed & np.fromiter((e.ph == "X" for e in lite), dtype=bool, count=n)
        dur = np.fromiter((e.dur if d else 0.0 for e, d in zip(lite, x.tolist())), dtype=np.float64, count=n)
        return cls(ok, meta, ts, ts + dur, x, dur)

    @property
    def timed(self) -> np.ndarray:
        return self.ok & ~self.meta

    @property
    def unplaced(self) -> int:
        return int((~self.ok).sum())


def _is_launcher(cat: Any, memo: dict) -> bool:
    v = memo.get(cat)
    if v is None:
        low = cat.lower() if isinstance(cat, str) else ""
        v = memo[cat] = any(w in low for w in _LAUNCH_CAT_WORDS)
    return v


def _id_of(v: Any) -> int:
    return v if type(v) is int and 0 <= v <= _INT64_MAX else -1


def slow_correlations(lite: list, tl: Timeline, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """(launch, key) for a slice of Launched records: `launch` marks the timed runtime calls with a
    correlation id, `key` is the id that ties an event to a launch (-1: none): the correlation of
    a device-side event, the id of a flow arrow."""
    n = len(lite)
    launcher = np.fromiter((_is_launcher(e.cat, memo) for e in lite), dtype=bool, count=n)
    corr = np.fromiter((_id_of(e.args.correlation) if e.args is not None else -1 for e in lite), dtype=np.int64,
                       count=n)
    flow = tl.ok & np.fromiter((e.ph in _FLOWS and e.cat not in _NOT_LAUNCH_FLOWS for e in lite), dtype=bool, count=n)
    launch = tl.timed & launcher & (corr >= 0)
    key = np.where(tl.timed & ~launcher, corr, -1)
    if flow.any():
        ids = np.fromiter((_id_of(e.id) for e in lite), dtype=np.int64, count=n)
        key = np.where(flow, ids, key)
    return launch, key
