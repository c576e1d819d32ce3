"""Second pass for evidence frames: the Python frames around the events the findings point at.

The compact trace keeps almost no `python_function` events (they are often half of a trace).
Evidence events carry the user frames that enclose them (features.frames.FrameIndex). To give
them the same frames as the in-memory path, the features are computed once on the compact trace
while recording which events FrameIndex is asked about (a dict subclass in place of
`call_stack`: FrameIndex.frames_for starts with `i in trace.call_stack`), then the file is read
again, decoding only what a frame test needs, and every frame that encloses one of those events
on its thread is added. The features ask about the same events after that (frames change no
selection), so their frames are exactly the in-memory ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..features.rank import rank_features
from ..load.columns import PH_COMPLETE, RankTrace
from ..load.repair import StreamRepair
from ..load.schema import RawArgs, RawEvent, NO_ARGS
from .compact import CompactBuilder
from .scan import scan


class _Asked(dict):
    """call_stack stand-in that records the events whose frames were looked up."""

    def __init__(self, base: dict) -> None:
        super().__init__(base)
        self.asked: set[int] = set()

    def __contains__(self, key: object) -> bool:
        self.asked.add(int(key))  # type: ignore[call-overload]
        return super().__contains__(key)


def asked_events(trace: RankTrace) -> set[int]:
    """Indices of the events whose Python frames the features look up (evidence events)."""
    rec = _Asked(trace.call_stack)
    trace.call_stack = rec
    try:
        rank_features(trace)
    finally:
        trace.call_stack = dict(rec)
    return {i for i in rec.asked if i not in trace.call_stack}


class _FrameEvent(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: msgspec.Raw = msgspec.field(default=None)
    dur: msgspec.Raw = msgspec.field(default=None)
    pid: int | str = 0
    tid: int | str = 0
    args: msgspec.Raw = msgspec.field(default=None)


_DECODER = msgspec.json.Decoder(list[_FrameEvent])
_ARGS = msgspec.json.Decoder(RawArgs)
_NUM = msgspec.json.Decoder(int | float)


def add_frames(trace: RankTrace, builder: CompactBuilder, path: Path, *, ns: bool, slice_bytes: int,
               repair: bool = False) -> int:
    """Add to `trace` (in place) the frames around the evidence events; returns how many. `repair`: the
    file holds names the profiler did not escape, re-escaped as the first pass did (load/repair.py)."""
    py_codes = set(trace.cat_code("python_function"))
    if not py_codes or not np.isin(trace.cat, list(py_codes)).any():
        return 0  # no stacks recorded
    asked = sorted(asked_events(trace))
    if not asked:
        return 0
    ia = np.asarray(asked, dtype=np.int64)
    tid_values = builder.tid_index
    want: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
    a_tid = trace.tid[ia]
    a_t0 = trace.ts[ia]
    a_t1 = trace.ts[ia] + trace.dur[ia]
    tids = list(tid_values)
    for code in np.unique(a_tid).tolist():
        sel = a_tid == code
        want[tids[code]] = (a_t0[sel], a_t1[sel])
    scale = 1000.0 if ns else None
    rebased = trace.ts_base
    have = set(builder.extra_ordinals)
    found: list[tuple[int, RawEvent]] = []
    state = {"base": 0}

    def consume(view) -> None:
        events = _DECODER.decode(view)
        base = state["base"]
        state["base"] += len(events)
        for j, e in enumerate(events):
            if e.ph != "X" or e.cat != "python_function":
                continue
            spans = want.get(e.tid)
            if spans is None or e.ts is None:
                continue
            ts = float(_NUM.decode(e.ts))
            dur = float(_NUM.decode(e.dur)) if e.dur is not None else 0.0
            t, d = (ts / scale, dur / scale) if scale else (ts, dur)
            t -= rebased  # the trace's times are relative to its base (load.job.rebase_times)
            end = t + d
            t0s, t1s = spans
            if np.any((t <= t0s) & (end >= t1s)) and base + j not in have:
                args = _ARGS.decode(e.args) if e.args is not None else NO_ARGS
                found.append((base + j, RawEvent(ph=e.ph, name=e.name, cat=e.cat, ts=_NUM.decode(e.ts),
                                                 dur=_NUM.decode(e.dur) if e.dur is not None else 0,
                                                 pid=e.pid, tid=e.tid, args=args)))

    scan(path, consume, slice_bytes=slice_bytes, hash=False, repair=StreamRepair() if repair else None)
    if not found:
        return 0
    builder.merge_extra(trace, found, ns=ns)
    return len(found)


__all__ = ["add_frames", "asked_events", "PH_COMPLETE"]
