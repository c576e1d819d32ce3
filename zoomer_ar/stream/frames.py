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

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..features.rank import rank_features
from ..load.columns import PH_COMPLETE, RankTrace
from ..load.reader import Progress
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
_MISSING = object()


def add_frames(built: list[tuple[RankTrace, CompactBuilder]], path: Path, *, ns: bool, slice_bytes: int,
               repair: bool = False, owner: Callable[[Any], int | None] | None = None,
               progress: Progress | None = None) -> list[int]:
    """Add to each trace (in place) the frames around its evidence events, in one more pass over the
    file; returns how many each got. `built`: the file's one rank, or the ranks of a merged trace, whose
    events `owner` tells apart (by pid: the rank, -1 for none; stream/split.py): each rank's events are
    counted apart, as its builder counted them. `repair`: the file holds names the profiler did not
    escape, re-escaped as the first pass did (load/repair.py)."""
    wanted: list[dict[Any, tuple[np.ndarray, np.ndarray]] | None] = [_wanted(trace, b) for trace, b in built]
    found: list[list[tuple[int, RawEvent]]] = [[] for _ in built]
    if not any(wanted):
        return [0] * len(built)
    scale = 1000.0 if ns else None
    at = {(None if owner is None else trace.rank): k for k, (trace, _) in enumerate(built)}
    have = [set(b.extra_ordinals) for _, b in built]
    seen = [0] * len(built)  # events of each rank so far: their ordinals
    owner_cache: dict[Any, int | None] = {}

    def consume(view) -> None:
        events = _DECODER.decode(view)
        for e in events:
            if owner is None:
                k = 0
            else:
                key = owner_cache.get(e.pid, _MISSING)
                if key is _MISSING:
                    key = owner_cache[e.pid] = owner(e.pid)
                k = at.get(key)
                if k is None:
                    continue  # no rank's event (an annotated trace's markers), or a rank left without events
            ordinal = seen[k]
            seen[k] += 1
            if e.ph != "X" or e.cat != "python_function":
                continue
            spans = wanted[k].get(e.tid) if wanted[k] else None
            if spans is None or e.ts is None:
                continue
            ts = float(_NUM.decode(e.ts))
            dur = float(_NUM.decode(e.dur)) if e.dur is not None else 0.0
            t, d = (ts / scale, dur / scale) if scale else (ts, dur)
            t -= built[k][0].ts_base  # the trace's times are relative to its base (load.job.rebase_times)
            end = t + d
            t0s, t1s = spans
            if np.any((t <= t0s) & (end >= t1s)) and ordinal not in have[k]:
                args = _ARGS.decode(e.args) if e.args is not None else NO_ARGS
                found[k].append((ordinal, RawEvent(ph=e.ph, name=e.name, cat=e.cat, ts=_NUM.decode(e.ts),
                                                   dur=_NUM.decode(e.dur) if e.dur is not None else 0,
                                                   pid=e.pid, tid=e.tid, args=args)))

    scan(path, consume, slice_bytes=slice_bytes, hash=False, repair=StreamRepair() if repair else None, progress=progress)
    for (trace, b), got in zip(built, found):
        if got:
            b.merge_extra(trace, got, ns=ns)
    return [len(got) for got in found]


def _wanted(trace: RankTrace, builder: CompactBuilder) -> dict[Any, tuple[np.ndarray, np.ndarray]] | None:
    """Per thread (tid value): the start and end times of the evidence events whose frames the
    features look up; None where the trace has no stacks or no such event."""
    py_codes = set(trace.cat_code("python_function"))
    if not py_codes or not np.isin(trace.cat, list(py_codes)).any():
        return None  # no stacks recorded
    asked = sorted(asked_events(trace))
    if not asked:
        return None
    ia = np.asarray(asked, dtype=np.int64)
    want: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
    a_tid = trace.tid[ia]
    a_t0 = trace.ts[ia]
    a_t1 = trace.ts[ia] + trace.dur[ia]
    tids = list(builder.tid_index)
    for code in np.unique(a_tid).tolist():
        sel = a_tid == code
        want[tids[code]] = (a_t0[sel], a_t1[sel])
    return want


__all__ = ["add_frames", "asked_events", "PH_COMPLETE"]
