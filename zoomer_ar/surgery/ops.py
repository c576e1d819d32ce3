"""Trace surgery: cut, filter, sample, split, merge and recompress traces, streaming.

Every operation reads its input slice by slice (io.read_events) and writes events verbatim (or,
for merge, re-encoded with remapped ids), so files of any size pass through in bounded memory.
Outputs are Chrome-format traces (`{"traceEvents": [...], ...}` with the input's other top-level
keys) that this tool, HTA and Perfetto open; metadata events (`ph: M`, process and thread names)
are always kept so that tracks stay named.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Iterable, Iterator
from itertools import compress, repeat
from operator import is_, ne
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..errors import InputError
from ..load.job import rank_files as folder_rank_files
from ..load.job import no_traces_reason, rank_from_name
from ..load.reader import DEFAULT_MAX_BYTES, read_trace_bytes
from ..load.merged import ID_SHIFT, PID_STRIDE, merged_dist, merged_ranks  # merge's pid and id offsets; the loader splits by them
from ..load.repair import StreamRepair, repair
from ..stream.nscount import NsCounter
from ..stream.scan import ScanResult, scan
from ..stream.source import BadJSON, ChunkReader, StreamError, is_trace_file
from ..threads import start as start_thread
from . import guard
from .io import (
    TOO_DEEP, Launched, TraceWriter, _Sink, compression_for, copy_file, decode_top, encode_head,
    write_queue,
)
from . import slices
from .slices import Batch, Plan, read_slices
from .timeline import Timeline, slow_correlations
from .validate import _valid_slice, event_problems, refuse_wrong_types

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_ID_ARGS = ("correlation", "External id", "external id")


#: Category names that mean the same events in the two Kineto schemas: today's (`cpu_op`, `kernel`,
#: ...) and the 2021 tb_plugin one (`Operator`, `Kernel`, ...). `--cat`/`--exclude-cat` select a
#: whole group, so one command works on traces of either schema. Keys are lower case: names are
#: compared without regard to case, then through this table (case alone does not make `Runtime`
#: match `cuda_runtime`).
CATEGORY_EQUIVALENTS: dict[str, str] = {
    "operator": "cpu_op",
    "kernel": "kernel",
    "runtime": "cuda_runtime",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
}


def canonical_category(cat: str) -> str:
    """The schema-independent name of a category (see CATEGORY_EQUIVALENTS), for matching only."""
    low = cat.lower()
    return CATEGORY_EQUIVALENTS.get(low, low)


def _human_bytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


@dataclass
class Stats:
    """What an operation did, for its one-line report.

    Byte copies (sample, compress) set `bytes_out` and count no events: they never decode them."""

    events_in: int = 0
    events_out: int = 0
    outputs: list[str] = field(default_factory=list)
    note: str = ""
    bytes_out: int | None = None
    skipped: list[str] = field(default_factory=list)  # "path: reason" of input files that are not traces
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the command did that was not asked (clipping)
    unplaced: int = 0  # events left out because a viewer cannot place them (no ts, pid/tid, X without dur)

    def line(self) -> str:
        outs = ", ".join(self.outputs[:4]) + (f" (+{len(self.outputs) - 4} more)" if len(self.outputs) > 4 else "")
        if self.bytes_out is not None:
            n = len(self.outputs)
            what = f"{n} file{'' if n == 1 else 's'} ({_human_bytes(self.bytes_out)})"
        else:
            what = f"{self.events_out:,} of {self.events_in:,} events"
        dropped = (f"; left out {self.unplaced:,} event{'' if self.unplaced == 1 else 's'} without ts, pid/tid "
                   "or (X) dur" if self.unplaced else "")
        return f"{what} -> {outs}" + (f"; {self.note}" if self.note else "") + dropped

    def add(self, other: Stats) -> None:
        """Fold the result of one file of a job into the job's."""
        self.events_in += other.events_in
        self.events_out += other.events_out
        self.outputs += other.outputs
        self.warnings += other.warnings
        self.notes += other.notes
        self.unplaced += other.unplaced
        if other.bytes_out is not None:
            self.bytes_out = (self.bytes_out or 0) + other.bytes_out


# ------------------------------------------------------------------------------------------------
# a first pass: step windows, the rank's first event, the time unit
# ------------------------------------------------------------------------------------------------


@dataclass
class Survey:
    steps: dict[int, list[float]] = field(default_factory=dict)  # step number -> [start, end] (CPU and GPU side)
    cpu_steps: dict[int, list[float]] = field(default_factory=dict)  # the same, CPU-side annotations only
    t0: float | None = None  # first complete non-Trace event (raw units)
    ns: bool = False  # timestamps are nanoseconds (the loader's median test)
    events: int = 0
    span: tuple[float, float] | None = None  # first start, last end of the timed events but `Trace` spans (raw units)

    @property
    def unit(self) -> float:
        """Trace units per millisecond."""
        return 1e6 if self.ns else 1e3

    def launch_window(self, steps: list[int]) -> list[float]:
        """Where the runtime calls of these steps lie: their CPU side (the GPU-side annotation of a
        step ends after the CPU has started launching the next one), else their whole window."""
        table = self.cpu_steps if all(k in self.cpu_steps for k in steps) else self.steps
        return [min(table[k][0] for k in steps), max(table[k][1] for k in steps)]


def survey(path: Path, plan: Plan | None = None) -> Survey:
    """Steps, first event and time unit of a trace; events a viewer cannot place (see
    validate.placeable) are not counted in them, as slice and split leave them out. `plan`: a Plan
    that records the slices, for the later passes of slice and split (slices.Plan)."""
    sv = Survey()
    counter = NsCounter()
    t0 = [np.inf]
    span = [np.inf, -np.inf]

    def on_slice(b: Batch) -> None:
        sv.events += b.n
        tl = b.tl
        timed = tl.timed & b.not_trace_span()
        if timed.any():
            span[0] = min(span[0], float(tl.ts[timed].min()))
            span[1] = max(span[1], float(tl.end[timed].max()))
        x = tl.x
        if not x.any():
            return
        ts = tl.ts[x]  # the starts of the complete events, in file order (as float64 of e.ts)
        counter.add(ts)
        nt = b.not_trace_span()[x]
        if nt.any():
            t0[0] = min(t0[0], float(ts[nt].min()))
        names = b.column("name")
        steps = x & np.fromiter(map(str.startswith, names, repeat("ProfilerStep#")), dtype=bool, count=b.n)
        for i in np.flatnonzero(steps).tolist():
            e = b.events[i]
            if e.cat in ("user_annotation", "gpu_user_annotation", "Operator", "cpu_op", ""):
                m = _STEP_RE.match(e.name)
                if m:
                    k = int(m.group(1))
                    for table in (sv.steps, sv.cpu_steps) if e.cat != "gpu_user_annotation" else (sv.steps,):
                        w = table.setdefault(k, [np.inf, -np.inf])
                        w[0] = min(w[0], float(e.ts))
                        w[1] = max(w[1], float(e.ts) + float(e.dur))

    read_slices(path, on_slice, check="types", record=plan)
    sv.t0 = None if not np.isfinite(t0[0]) else t0[0]
    sv.span = (span[0], span[1]) if np.isfinite(span[0]) else None
    sv.ns = counter.nanoseconds()
    return sv


def _not_trace_span(lite: list) -> np.ndarray:
    """Events other than the profiler's `Trace` spans (which cover the whole capture: a window
    that holds only them holds nothing)."""
    return np.fromiter((e.cat != "Trace" for e in lite), dtype=bool, count=len(lite))


def _inside(ts: np.ndarray, end: np.ndarray, x: np.ndarray, dur: np.ndarray, w0: float, w1: float) -> np.ndarray:
    """Events that overlap [w0, w1] (a complete event that starts at w1 only when it has no length)."""
    return (ts <= w1) & (end >= w0) & ((ts < w1) | ~x | (dur == 0))


def _keep_in_window(tl: Timeline, w0: float, w1: float) -> np.ndarray:
    return tl.meta | (tl.timed & _inside(tl.ts, tl.end, tl.x, tl.dur, w0, w1))


# ---- the GPU side of a window: events launched from it ----------------------------------------
#
# A kernel (memcpy, memset) runs after the runtime call that launched it returns, often after the
# CPU side of its step has ended; without GPU-side ProfilerStep annotations (most traces) the step
# window ends with the CPU annotation and the time test alone cut those kernels off (half of the
# GPU ops of two steps of hta/ns_resolution_trace). The runtime call and its device events share a
# correlation id (`args.correlation`; the `ac2g` flow arrow between them carries it as `id`): a
# first pass collects the correlation ids of the launches that lie in the windows (Launches), and
# the copy pass keeps the device events and flow arrows with those ids as well.
# (timeline.slow_correlations and slices.fast_correlations compute the ids of a slice.)


def _correlations(lite: list[Launched], tl: Timeline, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """(launch, key) for a slice of Launched records (timeline.slow_correlations)."""
    return slow_correlations(lite, tl, memo)


@dataclass
class Launches:
    """Correlation ids of the launches (runtime calls) that lie in each window, sorted by id:
    `group[i]` is the window of `corr[i]` (a launch on the edge of two windows is in both)."""

    corr: np.ndarray
    group: np.ndarray

    @classmethod
    def none(cls) -> Launches:
        return cls(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))

    def hits(self, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(event index, window) for the events of a slice whose key is a launch of a window."""
        if not self.corr.size:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        lo = np.searchsorted(self.corr, key, "left")
        hi = np.searchsorted(self.corr, key, "right")
        counts = np.where(key >= 0, hi - lo, 0)
        if not counts.any():
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        ev = np.repeat(np.arange(len(key)), counts)
        first = np.repeat(lo, counts)
        offset = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        return ev, self.group[first + offset]


def launches(path: Path, wins: np.ndarray, plan: Plan | None = None, memo: dict | None = None) -> Launches:
    """The launches of each window [w0, w1] of `wins` (a pass over the trace; memory: one id and
    one window index per launch inside the windows). `plan`: the survey's Plan of the file: the
    launches it recorded are taken from it, and of the other slices only those with a launch in
    the windows are read."""
    found: list[np.ndarray] = []
    memo = {} if memo is None else memo

    def add(corr: np.ndarray, ts: np.ndarray, end: np.ndarray, x: np.ndarray, dur: np.ndarray) -> None:
        lo, hi = float(ts.min()), float(end.max())
        for j in np.flatnonzero((wins[:, 0] <= hi) & (wins[:, 1] >= lo)).tolist():
            inside = _inside(ts, end, x, dur, float(wins[j, 0]), float(wins[j, 1]))
            if inside.any():
                c = corr[inside]
                found.append(np.stack([c, np.full(c.size, j, dtype=np.int64)], axis=1))

    def on_slice(b: Batch) -> None:
        tl = b.tl
        launch, _ = b.correlations(memo)
        idx = np.flatnonzero(launch)
        if not idx.size:
            return
        if b.fast:
            corr = b.correlation_ids()[idx]
        else:
            corr = np.fromiter((b.events[i].args.correlation for i in idx.tolist()), dtype=np.int64, count=idx.size)
        add(corr, tl.ts[idx], tl.end[idx], tl.x[idx], tl.dur[idx])

    def skip(k: int) -> bool:
        return bool(plan.recorded[k]) or (not plan.slow[k] and not plan.any_launch_in(k, wins))  # type: ignore

    if plan is not None:
        for corr, ts, end, xz in plan.records:  # x and dur: _inside needs only "complete, of non-zero length"
            add(corr, ts, end, xz, np.ones(xz.size))
    if plan is None or not all(plan.recorded):
        read_slices(path, on_slice, replay=plan, skip=skip if plan is not None else None, memo=memo)
    if not found:
        return Launches.none()
    pairs = np.unique(np.concatenate(found), axis=0)  # sorted by id, then window
    return Launches(np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1]))


def _write_selected(w: TraceWriter, b: Batch, keep: np.ndarray) -> int:
    if not keep.any():
        return 0
    raws = b.selected(keep)
    w.write_raw(raws)
    return len(raws)


def _abort(writes, exc: BaseException, writers: list) -> None:
    """A command failed with `exc`: a write that failed before it is the error to report (writes.settle
    raises it); the outputs are removed either way."""
    try:
        if writes is not None:
            writes.settle(exc)
    finally:
        for w in writers:
            w.abort()


def _copy_with(src: Path, dst: Path, select, *, compression: str | None = None, level: int | None = None,
               check: str = "none", before_close=None, plan: Plan | None = None, skip=None) -> Stats:
    """Copy the events `select(batch, stats)` keeps from src into dst. `check`: read_slices' check
    of the events; `before_close(stats)` may still refuse the result (raise): no output then.
    `plan`, `skip`: the slices `skip(k)` says keep nothing are not decoded (their events are
    counted from the plan)."""
    st = Stats()
    comp = compression_for(dst, compression)
    guard.check_level(comp, level)

    def on_slice(b: Batch) -> None:
        st.events_in += b.n
        st.events_out += _write_selected(w, b, select(b, st))

    def on_skip(k: int) -> None:
        st.events_in += plan.counts[k]  # type: ignore[union-attr]
        st.unplaced += plan.unplaced[k]  # type: ignore[union-attr]

    with write_queue(comp != "none") as writes:
        w = TraceWriter(dst, compression=compression, level=level, writes=writes)
        try:
            res = read_slices(src, on_slice, on_head=w.set_head, check=check, replay=plan, skip=skip, on_skip=on_skip)
            if before_close is not None:
                before_close(st)
            w.close(TraceWriter.tail_of(res))
        except BaseException as exc:
            _abort(writes, exc, [w])
            raise
    st.outputs.append(str(dst))
    return st


# ------------------------------------------------------------------------------------------------
# operations
# ------------------------------------------------------------------------------------------------


def slice_trace(src: Path, dst: Path, *, steps: tuple[int, int] | None = None,
                window_ms: tuple[float, float] | None = None, absolute: bool = False,
                compression: str | None = None, level: int | None = None) -> Stats:
    """Keep the events of steps N..M (ProfilerStep#N to #M, CPU and GPU side), or of a time window
    in milliseconds from the rank's first event (as evidence times are given; `absolute`: raw trace
    timestamps, microseconds or nanoseconds as in the file). Events that overlap the window are kept
    whole; metadata always. For steps, so are the device events (kernels, copies) launched by a
    runtime call in the steps and their flow arrows, wherever they run (Launches): the GPU side of
    the steps; a time window is a cut in time. A window with no event in it is refused (InputError
    naming the trace's time span), and so is a trace without events."""
    if (steps is None) == (window_ms is None):
        raise InputError(str(src), "give either steps N..M or a time window")
    _check_range(steps, window_ms)
    guard.require_file(src)
    guard.check_file_output(dst, [src])
    guard.check_suffix(dst, compression)
    guard.check_level(compression_for(dst, compression), level)
    plan = Plan(launches=steps is not None)  # a --window is a cut in time: no launches to look for
    sv = survey(src, plan)
    if sv.span is None:
        raise InputError(str(src), "trace has no timed events ('traceEvents' holds none a viewer can place)")
    notes: list[str] = []
    if steps is not None:
        lo, hi = steps
        chosen = sorted(k for k in sv.steps if lo <= k <= hi)
        if not chosen:
            raise InputError(str(src), f"no ProfilerStep#{lo}..{hi} in this trace (steps present: {_steps_present(sv)})")
        if len(chosen) != hi - lo + 1:
            notes.append(f"--steps {lo}..{hi}: kept steps {_compact(chosen)}, those this trace has of them "
                         f"(steps present: {_steps_present(sv)})")
        w0, w1 = min(sv.steps[k][0] for k in chosen), max(sv.steps[k][1] for k in chosen)
        what = f"steps {_compact(chosen)}"
    else:
        a, b = window_ms
        if absolute:
            w0, w1 = a, b
        else:
            if sv.t0 is None:
                raise InputError(str(src), "no complete events to measure a window from")
            w0, w1 = sv.t0 + a * sv.unit, sv.t0 + b * sv.unit
        what = f"--window {a:g}..{b:g}" + (" (absolute)" if absolute else " ms")
    memo: dict = {}
    launched = launches(src, np.array([sv.launch_window(chosen)]), plan, memo) if steps is not None \
        else Launches.none()
    kept = [0]  # events other than metadata
    window = np.array([[w0, w1]])

    def select(b: Batch, st: Stats) -> np.ndarray:
        tl = b.tl
        st.unplaced += tl.unplaced
        keep = _keep_in_window(tl, w0, w1)
        if launched.corr.size:
            _, key = b.correlations(memo)
            ev, _ = launched.hits(key)
            keep[ev] = True
        kept[0] += int((keep & ~tl.meta & b.not_trace_span()).sum())
        return keep

    def skip(k: int) -> bool:
        """Slice k keeps nothing: no metadata, no event in the window, no id of a launch in it."""
        return not (plan.slow[k] or plan.meta[k] or plan.any_time_in(k, window)
                    or plan.any_key_in(k, launched.corr))

    def nothing_kept(st: Stats) -> None:
        if not kept[0]:
            raise InputError(str(src), f"{what} holds no event of this trace ({_span_text(sv, absolute)}); "
                                       "nothing written")

    st = _copy_with(src, dst, select, compression=compression, level=level, before_close=nothing_kept, plan=plan,
                    skip=skip)
    st.note = f"window {w0:.3f}..{w1:.3f} ({'ns' if sv.ns else 'us'})"
    st.notes += notes
    return st


def _compact(nums: list[int]) -> str:
    """1..5 for consecutive numbers, else the list."""
    if len(nums) == 1:
        return str(nums[0])
    return f"{nums[0]}..{nums[-1]}" if nums == list(range(nums[0], nums[-1] + 1)) else ", ".join(map(str, nums))


def _steps_present(sv: Survey) -> str:
    return _compact(sorted(sv.steps)) if sv.steps else "none"


def _span_text(sv: Survey, absolute: bool) -> str:
    """Where the trace's events lie, in the units the window was given in."""
    a, b = sv.span  # type: ignore[misc]
    unit = "ns" if sv.ns else "us"
    if absolute or sv.t0 is None:
        return f"its events span {a:.3f}..{b:.3f} {unit} in its own timestamps"
    return (f"its events span {(a - sv.t0) / sv.unit:.3f}..{(b - sv.t0) / sv.unit:.3f} ms from its first event; "
            f"{a:.3f}..{b:.3f} {unit} with --absolute")


def _check_range(steps: tuple[int, int] | None, window_ms: tuple[float, float] | None) -> None:
    """Refuse a reversed step range or an empty or reversed window before reading the trace: either
    would keep only metadata and look like a successful cut."""
    if steps is not None and steps[1] < steps[0]:
        raise InputError(None, f"--steps {steps[0]}..{steps[1]} is reversed: give N..M with N <= M")
    if window_ms is not None:
        a, b = window_ms
        if not (np.isfinite(a) and np.isfinite(b)):
            raise InputError(None, f"--window {a:g}..{b:g}: START and END must be finite numbers")
        if b <= a:
            kind = "empty" if b == a else "reversed"
            raise InputError(None, f"--window {a:g}..{b:g} is {kind}: give START..END with START < END")


def filter_trace(src: Path, dst: Path, *, cats: Iterable[str] = (), exclude_cats: Iterable[str] = (),
                 name: str | None = None, exclude_name: str | None = None, pids: Iterable[str] = (),
                 tids: Iterable[str] = (), phases: Iterable[str] = (),
                 compression: str | None = None, level: int | None = None) -> Stats:
    """Keep events by category, name (regular expression), pid, tid or phase; metadata always.

    Categories match across schemas (CATEGORY_EQUIVALENTS: `--cat kernel` keeps 2021 `Kernel`
    events too); when nothing but metadata is kept, Stats.warnings names the categories present.
    Every event is held to `trace check`'s rules (read_events(check="all")): the events are copied
    verbatim, so one the check refuses would make the output invalid; the file is refused instead."""
    cats = {canonical_category(c) for c in cats}
    exclude_cats = {canonical_category(c) for c in exclude_cats}
    pids, tids, phases = {str(p) for p in pids}, {str(t) for t in tids}, set(phases)
    name_re = compile_pattern(name, "--name")
    exclude_re = compile_pattern(exclude_name, "--exclude-name")
    memo: dict[Any, bool] = {}
    seen_cats: set[str] = set()
    kept = [0, 0]  # non-metadata events: seen, kept

    # The decision depends on the fields the filters look at: memo by those alone (the category,
    # and the name, phase, pid, tid where a filter names them).
    fields = ["cat"] + (["name"] if name_re is not None or exclude_re is not None else []) + \
        (["ph"] if phases else []) + (["pid"] if pids else []) + (["tid"] if tids else [])

    def decide(key: Any) -> bool:
        """Whether a non-metadata event with these values of `fields` passes the filters."""
        v = dict(zip(fields, key)) if len(fields) > 1 else {"cat": key}
        seen_cats.add(v["cat"])
        cat = canonical_category(v["cat"])
        return bool((not cats or cat in cats) and cat not in exclude_cats
                    and (not phases or v["ph"] in phases)
                    and (not pids or str(v["pid"]) in pids) and (not tids or str(v["tid"]) in tids)
                    and (name_re is None or name_re.search(v["name"]) is not None)
                    and (exclude_re is None or exclude_re.search(v["name"]) is None))

    def select(b: Batch, st: Stats) -> np.ndarray:
        n = b.n
        phs = b.column("ph")
        keys = b.column("cat") if len(fields) == 1 else list(zip(*(b.column(f) for f in fields)))
        vals = list(map(memo.get, keys))  # None: not decided yet, or metadata (always kept)
        if None in vals:
            for i in compress(range(n), map(is_, vals, repeat(None))):
                if phs[i] == "M":
                    vals[i] = True
                    continue
                key = keys[i]
                v = memo.get(key)  # decided by an earlier event of this slice
                if v is None:
                    v = decide(key)
                    if len(memo) < 200_000:
                        memo[key] = v
                vals[i] = v
        other = np.fromiter(map(ne, phs, repeat("M")), dtype=bool, count=n)
        keep = np.fromiter(vals, dtype=bool, count=n)
        if not other.all():  # a metadata event whose values a filtered-out event shares
            keep |= ~other
        kept[0] += int(other.sum())
        kept[1] += int((keep & other).sum())
        return keep

    def no_events(st: Stats) -> None:
        if not st.events_in:
            raise InputError(str(src), "trace has no events ('traceEvents' is empty); nothing written")

    guard.require_file(src)
    guard.check_file_output(dst, [src])
    guard.check_suffix(dst, compression)
    st = _copy_with(src, dst, select, compression=compression, level=level, check="all", before_close=no_events)
    if kept[0] and not kept[1]:
        st.warnings.append(_nothing_kept(src, seen_cats))
    return st


def compile_pattern(pattern: str | None, option: str) -> re.Pattern | None:
    """The regular expression of --name / --exclude-name; InputError (exit 2, one line) when it is
    not one, before anything is read or written."""
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InputError(None, f"{option} {pattern!r}: not a valid regular expression ({exc})") from None


def _nothing_kept(src: Path, seen_cats: set[str]) -> str:
    """Why an empty filter result is worth a look: the categories the trace does have."""
    named = sorted(c for c in seen_cats if c)
    have = ", ".join(named) + (", (no category)" if "" in seen_cats else "") if seen_cats else "none"
    return f"{src}: the filter kept no event besides metadata; categories in this trace: {have}"


def split_trace(src: Path, dst_dir: Path, *, steps_per_file: int = 1, max_files: int = 256,
                compression: str | None = "gzip", level: int | None = None) -> Stats:
    """One trace per step (or per `steps_per_file` steps): events overlapping each step's window
    and the device events launched from it (CPU and GPU side, as slice_trace); metadata in every
    file. Events before the first or after the last step are left out, and so are events a viewer
    cannot place (validate.placeable)."""
    guard.at_least_one(steps_per_file, "--steps-per-file")
    guard.at_least_one(max_files, "--max-files")
    guard.require_file(src)
    guard.refuse_file_as_dir(dst_dir)
    if guard.same_file(dst_dir, src.parent):
        raise InputError(str(dst_dir), f"is the folder of the input {src.name}: the step files would be read "
                                       "as extra ranks of it; write them to another folder")
    guard.check_level(compression or "none", level)
    plan = Plan()
    sv = survey(src, plan)
    if not sv.steps:
        raise InputError(str(src), "no ProfilerStep#N annotations: nothing to split by")
    nums = sorted(sv.steps)
    groups = [nums[i : i + max(1, steps_per_file)] for i in range(0, len(nums), max(1, steps_per_file))]
    if len(groups) > max_files:
        raise InputError(str(src), f"{len(groups)} output files (more than --max-files {max_files}); "
                                   "use --steps-per-file")
    base = src.name.split(".json")[0]
    suffix = ".json.gz" if compression == "gzip" else ".json.zst" if compression == "zstd" else ".json"
    wins = np.array([[min(sv.steps[k][0] for k in g), max(sv.steps[k][1] for k in g)] for g in groups])
    memo: dict = {}
    launched = launches(src, np.array([sv.launch_window(g) for g in groups]), plan, memo)
    writers: list[TraceWriter] = []
    st = Stats()

    def on_head(res: ScanResult) -> None:
        for w in writers:
            w.set_head(res)

    def on_slice(b: Batch) -> None:
        st.events_in += b.n
        tl = b.tl
        st.unplaced += tl.unplaced
        timed, meta = tl.timed, tl.meta
        if timed.any():
            lo, hi = float(tl.ts[timed].min()), float(tl.end[timed].max())
            hit = (wins[:, 0] <= hi) & (wins[:, 1] >= lo)
        else:
            hit = np.zeros(len(wins), dtype=bool)
        ev = grp = np.empty(0, dtype=np.int64)
        if launched.corr.size:
            _, key = b.correlations(memo)
            ev, grp = launched.hits(key)
            hit[np.unique(grp)] = True
        for j in np.flatnonzero(hit).tolist():
            w0, w1 = wins[j]
            keep = (timed & (tl.ts <= w1) & (tl.end >= w0)) | meta
            keep[ev[grp == j]] = True
            st.events_out += _write_selected(writers[j], b, keep)
        if meta.any():  # metadata in every file
            metas = b.selected(meta)
            for j in np.flatnonzero(~hit).tolist():
                writers[j].write_raw(metas)

    def skip(k: int) -> bool:
        """Slice k goes to no file: no metadata, no event in a window, no id of a launch in one."""
        return not (plan.slow[k] or plan.meta[k] or plan.any_time_in(k, wins) or plan.any_key_in(k, launched.corr))

    def on_skip(k: int) -> None:
        st.events_in += plan.counts[k]
        st.unplaced += plan.unplaced[k]

    with _output_folder(dst_dir), write_queue(compression in ("gzip", "zstd")) as writes:
        try:
            for g in groups:  # one by one: those opened before a failing one are aborted below
                writers.append(TraceWriter(dst_dir / f"{base}.steps_{g[0]}-{g[-1]}{suffix}", compression=compression,
                                           level=level, writes=writes))
            res = read_slices(src, on_slice, on_head=on_head, replay=plan, skip=skip, on_skip=on_skip)
            for w in writers:
                w.close(TraceWriter.tail_of(res))
        except BaseException as exc:
            _abort(writes, exc, writers)
            raise
    st.outputs = [str(w.path) for w in writers]
    return st


def check_events(src: Path) -> None:
    """A pass that holds every event of src to `trace check`'s rules (types included): InputError
    naming the file and the first event refused. For the commands that copy a file's bytes as they
    are (compress, sample): what they write is then a valid trace."""
    read_slices(src, lambda b: None, check="all")


def compress_trace(src: Path, dst: Path, *, compression: str | None = None, level: int | None = None) -> Stats:
    """Re-encode a trace file as gzip, zstd or plain JSON (from dst's suffix unless given), streaming.

    The bytes are copied as they are (a round trip gives the same JSON), but only after a first pass
    has read the events as the other commands do: the output is promised to be a valid trace, and a
    JSON file without traceEvents, NaN literals or a cut-off array would otherwise pass through."""
    comp = compression_for(dst, compression)
    guard.require_file(src)
    guard.check_file_output(dst, [src])
    guard.check_suffix(dst, comp)
    guard.check_level(comp, level)
    copy = _BackgroundCopy(src, dst, comp, level)  # compresses while the events are checked
    try:
        check_events(src)
        sink = copy.result()
    except BaseException:  # the check failed, or Ctrl-C, SIGTERM: no output left behind
        copy.cancel()
        raise
    st = Stats()
    st.outputs.append(str(dst))
    st.bytes_out = dst.stat().st_size
    st.note = f"from {_human_bytes(sink.bytes_in)} of JSON, {comp}"
    return st


_JSON_CHECK = msgspec.json.Decoder(msgspec.Raw)  # JSON syntax only: the document stays raw bytes


def repair_trace(src: Path, dst: Path, *, compression: str | None = None, level: int | None = None) -> Stats:
    """Write a copy of src that other tools open, where the profiler wrote it as invalid JSON: the event
    names (and old `Call stack` args) it did not escape are re-escaped (zoomer_ar/load/repair.py), every
    other byte is kept. A file that is valid JSON already is copied as it is (a note says so); invalid JSON
    of any other kind is refused.

    The copy streams (load.repair.StreamRepair: memory bounded by two lines, whatever the file's size) and
    is checked as every command's output is before it takes dst's place (_Sink.commit's check), so a
    failed repair leaves an existing dst as it was. Names holding a raw line break are found only at the decoder's error offset, in
    the whole document: where the streamed copy does not check, a file within ZOOMER_MAX_TRACE_BYTES is
    repaired that way instead."""
    comp = compression_for(dst, compression)
    guard.require_file(src)
    guard.check_file_output(dst, [src])
    guard.check_suffix(dst, comp)
    guard.check_level(comp, level)
    fix = StreamRepair()
    try:
        _write_checked(dst, comp, level, (data for data, _ in ChunkReader(src, hash=False, repair=fix)))
    except (StreamError, InputError) as exc:
        if src.stat().st_size <= DEFAULT_MAX_BYTES:
            return _repair_whole(src, dst, comp, level)  # explains the refusal, or repairs at the decoder's offsets
        reason = exc.reason if isinstance(exc, InputError) else str(exc)
        raise InputError(str(src), f"not valid JSON, and not the profiler's unescaped names ({reason})") from None
    return _repaired(src, dst, comp, fix.fixed)


def _repair_whole(src: Path, dst: Path, comp: str, level: int | None) -> Stats:
    """repair_trace on the whole document in memory (load.repair.repair: also the names with a raw line
    break, at the decoder's error offsets)."""
    data = read_trace_bytes(src)
    try:
        _JSON_CHECK.decode(data)
        fixed = 0
    except msgspec.DecodeError as exc:
        got = repair(data, _JSON_CHECK.decode, exc)
        if isinstance(got, BaseException):
            raise InputError(str(src), f"not valid JSON, and not the profiler's unescaped names ({got})") from None
        data, fixed = got.data, got.fixed
    view = memoryview(data)
    try:
        _write_checked(dst, comp, level, (view[i : i + (1 << 22)] for i in range(0, len(view), 1 << 22)))
    except InputError as exc:
        what = "repaired, but still not a valid trace" if fixed else "valid JSON, but not a valid trace"
        raise InputError(str(src), f"{what}: {exc.reason}") from None
    return _repaired(src, dst, comp, fixed)


def _write_checked(dst: Path, comp: str, level: int | None, chunks: Iterable) -> None:
    """The chunks written to dst (compressed as asked), held to check_events' rules before the file
    takes dst's place: on any failure dst is as it was."""
    sink = _Sink(dst, comp, level)
    try:
        for data in chunks:
            sink.write(data)
    except BaseException:
        sink.abort()
        raise
    sink.commit(check=check_events)  # the promise of every command: a valid trace


def _repaired(src: Path, dst: Path, comp: str, fixed: int) -> Stats:
    """The figures of a repair written to dst."""
    st = Stats()
    if not fixed:
        st.notes.append(f"{src} is valid JSON: nothing to repair, copied as it is")
    st.outputs.append(str(dst))
    st.bytes_out = dst.stat().st_size
    st.note = f"{fixed:,} event name{'' if fixed == 1 else 's'} re-escaped, {comp}"
    return st


class _BackgroundCopy:
    """compress_trace's copy of the bytes into the output, in a thread started before the check pass
    (reading, inflating and deflating run without the interpreter lock: the check and the copy take
    the time of the longer one, not of both). The output is committed only once the check passed:
    `result()` then returns the sink to commit, or raises what the copy raised, as a copy made after
    the check would have (OutputError naming the output, InputError naming the input); `cancel()`
    (the check failed) stops the copy and removes its temporary file and the folders it made."""

    def __init__(self, src: Path, dst: Path, comp: str, level: int | None) -> None:
        self.src, self.dst, self.comp, self.level = src, dst, comp, level
        self.sink: _Sink | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zoomer-ar-copy", daemon=True)
        start_thread(self._thread)

    def _run(self) -> None:
        src = self.src
        try:
            sink = self.sink = _Sink(self.dst, self.comp, self.level)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            self.error = exc
            return
        try:
            first = True
            for data, _ in ChunkReader(src, hash=False):
                if self._stop.is_set():
                    return
                if first:
                    head = data.lstrip()[:1]
                    if head not in (b"{", b"["):
                        raise InputError(str(src), "not a JSON trace")
                    first = False
                sink.write(data)
            if first:
                raise InputError(str(src), "empty file")
        except StreamError as exc:  # as copying_into says it
            sink.abort()
            self.error = InputError(str(src), str(exc))
        except OSError as exc:
            sink.abort()
            self.error = InputError(str(src), f"cannot read: {exc.strerror or exc}")
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            sink.abort()
            self.error = exc

    def cancel(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.sink is not None:
            self.sink.abort()

    def result(self) -> _Sink:
        self._thread.join()
        if self.error is not None:
            raise self.error
        sink = self.sink
        assert sink is not None
        try:
            sink.commit()
        except BaseException:
            sink.abort()
            raise
        return sink


# ------------------------------------------------------------------------------------------------
# jobs: ranks of a folder
# ------------------------------------------------------------------------------------------------


def peek_top(path: Path) -> dict[str, Any]:
    """The top-level keys before the events array (distributedInfo, deviceProperties, ...)."""
    return probe_trace(path)[0] or {}


def _no_bar(done: int, total: int) -> None:
    return None


def probe_trace(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(top-level keys, "") when `path` is a trace (a `traceEvents` array or a bare array of
    events, with an event object that has a string `ph` among its first events), else (None, why
    not). Reads only up to the first slice of events (64 kB), so it is cheap on any size: job
    commands use it to skip stray JSON files the way `analyze` does instead of failing late (`[1,2`
    used to pass for a rank: any `[` did)."""
    out: dict[str, Any] = {}

    class _Stop(Exception):
        pass

    def on_head(res: ScanResult) -> None:
        out.update(decode_top(res.head, b""))

    def first_events(view) -> None:  # a trace's array holds event objects with a `ph`
        items = _PROBE.decode(view)  # first: a DecodeError here makes the scanner cut elsewhere
        found, raw = False, None
        for raw in items[:64]:
            try:
                found = isinstance(_PH.decode(raw).ph, str)
            except msgspec.ValidationError:  # not an object
                continue
            if found:
                break
        del items, raw  # the Raw values hold the scanner's buffer: release them before leaving
        raise _Stop if found else _NotEvents

    try:
        scan(path, first_events, hash=False, on_head=on_head, slice_bytes=_PROBE_BYTES, chunk=_PROBE_BYTES,
             progress=_no_bar)  # 64 kB of the file: no bar
    except _Stop:
        return out, ""
    except _NotEvents:
        return None, "not a trace (the events array holds no event objects with a `ph`)"
    except StreamError as exc:
        return None, f"not a trace ({exc})"
    except RecursionError:  # msgspec's answer to keys nested deeper than Python's recursion limit
        return None, f"not a trace ({TOO_DEEP})"
    except OSError as exc:
        return None, f"cannot read ({exc.strerror or exc})"
    return None, "not a trace (no events: 'traceEvents' is empty)"


class _NotEvents(Exception):
    pass


class _Ph(msgspec.Struct):
    ph: Any = None


_PROBE = msgspec.json.Decoder(list[msgspec.Raw])
_PH = msgspec.json.Decoder(_Ph)
_PROBE_BYTES = 64 << 10


def _rank_of(top: dict[str, Any]) -> int | None:
    dist = top.get("distributedInfo")
    r = dist.get("rank") if isinstance(dist, dict) else None
    return r if isinstance(r, int) and not isinstance(r, bool) else None


@dataclass
class JobFiles:
    """The usable rank files of a job (rank order) and a "path: reason" line per skipped file."""

    files: list[tuple[int, Path]]
    skipped: list[str]
    tops: dict[Path, dict[str, Any]]


def rank_files(candidates: list[Path], where: str | None = None) -> JobFiles:
    """Rank the candidates that are traces: distributedInfo.rank, else the file name, else the order
    (as the loader assigns them). Files that are not traces are skipped; if none is left, InputError
    naming them (`where`: the folder)."""
    usable: list[Path] = []
    tops: dict[Path, dict[str, Any]] = {}
    skipped: list[str] = []
    for f in candidates:
        top, why = probe_trace(f)
        if top is None:
            skipped.append(f"{f}: {why}")
        else:
            usable.append(f)
            tops[f] = top
    if not usable:
        reasons = "; ".join(skipped[:3]) + (f"; +{len(skipped) - 3} more" if len(skipped) > 3 else "")
        if where is None and len(skipped) == 1:
            raise InputError(None, skipped[0])
        raise InputError(where, f"no usable trace ({reasons})")
    ranks = [_rank_of(tops[f]) for f in usable]
    if None in ranks or len(set(ranks)) != len(ranks):
        ranks = [rank_from_name(f) for f in usable]
        if None in ranks or len(set(ranks)) != len(ranks):
            ranks = list(range(len(usable)))
    return JobFiles(sorted(zip(ranks, usable)), skipped, tops)  # type: ignore[arg-type]


def job_folder(src: Path) -> JobFiles:
    """The rank files of a job folder (see rank_files); InputError when it holds none."""
    if not src.is_dir():
        raise InputError(str(src), "not a folder of per-rank trace files")
    files = folder_rank_files(src, is_trace_file)
    if not files:
        raise InputError(str(src), no_traces_reason(src, is_trace_file))
    return rank_files(files, str(src))


def refuse_merged(job: JobFiles, why: str) -> None:
    """InputError for a `trace merge` output among a job's files where the command takes each file for
    one rank (load/merged.py: such a file holds several; it counted as one rank, its ranks pooled)."""
    for _, f in job.files:
        if held := merged_ranks(job.tops[f]):
            raise InputError(str(f), f"a trace merging {len(held)} ranks (zoomer-ar trace merge), not one rank's: {why}")


def job_files(src: Path) -> list[tuple[int, Path]]:
    """(rank, file) of the traces of a job folder, in rank order (files that are not traces left out)."""
    return job_folder(src).files


def _wanted(src: Path, have: list[int], ranks: Iterable[int]) -> list[int]:
    """The requested ranks, all present in the job (InputError naming the missing ones)."""
    want = sorted(set(ranks))
    missing = [r for r in want if r not in have]
    if missing:
        raise InputError(str(src), f"ranks {missing} not in this job (ranks present: {_span(have)})")
    return want


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}..{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) else str(ranks)


def choose_ranks(ranks: list[int], k: int, *, seed: int | None = None) -> list[int]:
    """k ranks: evenly spaced from first to last (always both), or a random sample with `seed`."""
    if k >= len(ranks):
        return list(ranks)
    if k <= 0:
        return []
    if seed is not None:
        return sorted(random.Random(seed).sample(ranks, k))
    if k == 1:
        return [ranks[0]]
    pos = sorted({round(i * (len(ranks) - 1) / (k - 1)) for i in range(k)})
    return [ranks[p] for p in pos]


def sample_job(src: Path, dst: Path, k: int | None = None, *, ranks: Iterable[int] | None = None,
               seed: int | None = None, compression: str | None = None) -> Stats:
    """Copy k ranks of a job folder (or the given ranks) into dst; gzip/zstd/plain per `compression`
    (default: as they are). Each chosen rank file is first read through (check_events): one that
    `trace check` would refuse is skipped with a note, as an unusable rank. -k above the number of
    ranks copies them all, with a note; -k or --seed together with --ranks is refused."""
    if ranks is None:
        if k is None:
            raise InputError(None, "give -k N or --ranks")
        guard.at_least_one(k, "-k")
    else:
        ranks = list(ranks)
        if k is not None or seed is not None:
            raise InputError(None, f"--ranks chooses the ranks: give it without {'-k' if k is not None else '--seed'}")
        if not ranks:
            raise InputError(None, "--ranks names no rank")
    _check_folder_output(src, dst)
    job = job_folder(src)
    refuse_merged(job, "sample the rank files it came from")
    files = job.files
    have = [r for r, _ in files]
    want = _wanted(src, have, ranks) if ranks is not None else choose_ranks(have, k or 1, seed=seed)
    st = Stats(bytes_out=0, skipped=list(job.skipped))
    if ranks is None and k is not None and k > len(have):
        st.notes.append(f"-k {k}: the job has {len(have)} rank{'' if len(have) == 1 else 's'}; copying all of them")
    copied = 0
    with _output_folder(dst):
        for r, f in files:
            if r in want:
                copied += _sample_one(st, f, dst, compression)
        _none_left(src, copied, st)
    st.note = f"ranks {want} of {len(have)}"
    return st


def _sample_one(st: Stats, f: Path, dst: Path, compression: str | None) -> bool:
    """Copy (or re-compress) one rank file of sample_job into dst; False when it was skipped."""
    name = f.name
    if not compression:
        def copy() -> Stats:
            check_events(f)
            copy_file(f, dst / name)
            return Stats(outputs=[str(dst / name)], bytes_out=(dst / name).stat().st_size)

        return _skip_unreadable(st, f, copy)
    out = dst / named_for(name, compression)
    return _skip_unreadable(st, f, lambda: compress_trace(f, out, compression=compression))


def named_for(name: str, compression: str | None) -> str:
    """A rank file's name for an output of this compression (x.json.gz -> x.json.zst for zstd, x.json
    for none); None: the name as it is (the output is compressed as the name says)."""
    if not compression:
        return name
    low = name.lower()
    stem = name[: -len(".gz")] if low.endswith(".gz") else name[: -len(".zstd")] if low.endswith(".zstd") else \
        name[: -len(".zst")] if low.endswith(".zst") else name
    stem = stem if stem.lower().endswith(".json") else stem + ".json"
    return stem + {"gzip": ".gz", "zstd": ".zst", "none": ""}[compression]


@contextmanager
def _output_folder(folder: Path) -> Iterator[None]:
    """When the command fails, remove its output folder again if the command created it and it is
    empty (a full disk on the first file, or no usable rank, left an empty folder behind). Files
    written completely before the failure stay."""
    existed = folder.exists()
    try:
        yield
    except BaseException:
        if not existed:
            with suppress(OSError):  # not empty: complete outputs stay
                folder.rmdir()
        raise


def _check_folder_output(src: Path, dst: Path) -> None:
    """A job's output folder must be a folder outside the input job folder (see guard)."""
    guard.refuse_file_as_dir(dst)
    guard.refuse_inside(dst, src, what="output folder")


def _skip_unreadable(st: Stats, f: Path, run) -> bool:
    """Run one rank file's operation; a rank that turns out unusable while it is read (nested too
    deeply, a field of the wrong type, truncated) is skipped with a note, as `analyze` skips it in
    a job folder, instead of failing the whole job. False when skipped. Errors about anything but
    this file (the output, the arguments) still stop the job."""
    try:
        st.add(run())
    except InputError as exc:
        if exc.path != str(f):
            raise
        st.skipped.append(f"{f}: {exc.reason}")
        return False
    return True


def _none_left(src: Path, done: int, st: Stats) -> None:
    """Every chosen rank was skipped while read: nothing usable was written (exit 2 naming them)."""
    if done == 0 and st.skipped:
        reasons = "; ".join(st.skipped[:3]) + (f"; +{len(st.skipped) - 3} more" if len(st.skipped) > 3 else "")
        raise InputError(str(src), f"no usable trace ({reasons})")


def filter_job(src: Path, dst: Path, *, ranks: Iterable[int] | None = None, **filters) -> Stats:
    """filter_trace on each chosen rank file of a job folder, into dst (same file names, with the
    suffix of `compression` when given: x.json -> x.json.gz for gzip); rank files unusable while
    read are skipped with a note (_skip_unreadable)."""
    _check_folder_output(src, dst)
    compile_pattern(filters.get("name"), "--name")  # before the output folder is made
    compile_pattern(filters.get("exclude_name"), "--exclude-name")
    if ranks is not None:
        ranks = list(ranks)
        if not ranks:
            raise InputError(None, "--ranks names no rank")
    job = job_folder(src)
    if ranks is not None:
        refuse_merged(job, "--ranks picks rank files: filter the rank files it came from")
    have = [r for r, _ in job.files]
    want = set(_wanted(src, have, ranks)) if ranks is not None else set(have)
    st = Stats(skipped=list(job.skipped))
    done = 0
    comp = filters.get("compression")
    with _output_folder(dst):
        for r, f in job.files:
            if r in want:
                out = dst / named_for(f.name, comp)
                done += _skip_unreadable(st, f, lambda f=f, out=out: filter_trace(f, out, **filters))
        _none_left(src, done, st)
    return st


def _remap(events: list[dict], rank: int) -> list[dict]:
    """Give the events of rank `rank` their own tracks and ids (see merge_job). For rank 0 the
    offsets are 0: the integer values stay as they are (and are not reassigned)."""
    shift = rank << ID_SHIFT
    base = rank * PID_STRIDE
    limit = 1 << ID_SHIFT
    for e in events:
        get = e.get
        pid = get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool) and 0 <= pid < PID_STRIDE:
            if base:
                e["pid"] = base + pid
        elif pid is not None:
            e["pid"] = f"rank{rank}:{pid}"
        i = get("id")
        if i is not None:
            if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < limit:
                if shift:
                    e["id"] = i + shift
            elif isinstance(i, str):
                e["id"] = f"{rank}:{i}"
        args = get("args")
        if isinstance(args, dict):
            if shift:
                for k in _ID_ARGS:
                    v = args.get(k)
                    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < limit:
                        args[k] = v + shift
            if get("ph") == "M" and get("name") == "process_name" and "name" in args:
                args["name"] = f"rank {rank}: {args['name']}"
    return events


def merge_job(src: Path | list[Path], dst: Path, *, compression: str | None = None, level: int | None = None) -> Stats:
    """Per-rank files -> one trace. Integer pids become rank * 10^7 + pid (string pids get a
    `rank<r>:` prefix) and process names a `rank <r>: ` prefix, so each rank keeps its own tracks;
    flow ids and correlation ids are offset by rank << 40 so that links stay within a rank.
    Top-level keys come from the first rank; `distributedInfo` records the merged ranks. Inputs that
    are not traces, or turn out unusable while read, are skipped (Stats.skipped), as `analyze` skips
    them in a job folder. A folder among several inputs stands for its rank files."""
    if isinstance(src, (list, tuple)):
        folders = [Path(f) for f in src if Path(f).is_dir()]
        if len(src) == 1 and folders:
            src = folders[0]
    if isinstance(src, (list, tuple)):
        for d in folders:
            guard.refuse_inside(dst, d, what="merged trace")
        guard.check_file_output(dst, [Path(f) for f in src if not Path(f).is_dir()])
    else:
        guard.refuse_dir_as_file(dst)
        guard.refuse_inside(dst, Path(src), what="merged trace")
    guard.check_suffix(dst, compression)
    guard.check_level(compression_for(dst, compression), level)
    expanded: list[str] = []
    if isinstance(src, (list, tuple)):
        inputs: list[Path] = []
        for f in map(Path, src):
            if f.is_dir():  # its rank files, as `merge DIR` would read them
                found = folder_rank_files(f, is_trace_file)
                if not found:
                    expanded.append(f"{f}: {no_traces_reason(f, is_trace_file)}")
                inputs += found
            elif f not in inputs:
                inputs.append(f)
        if not inputs:
            raise InputError(None, "; ".join(expanded))
        job = rank_files(inputs)
    else:
        job = job_folder(Path(src))
    refuse_merged(job, "merge the rank files it came from")
    files = list(job.files)
    skipped = expanded + list(job.skipped)
    while True:
        try:
            st = _merge_files(files, job.tops, dst, compression=compression, level=level)
            break
        except InputError as exc:
            bad = [(r, f) for r, f in files if exc.path == str(f)]
            if not bad:
                raise
            # the rank turned out unusable while read (nested too deeply, truncated): the output is
            # one stream that already holds part of it, so merge again without it (rare: the
            # common path reads every rank once)
            files.remove(bad[0])
            skipped.append(f"{bad[0][1]}: {exc.reason}")
            if not files:
                where = None if isinstance(src, (list, tuple)) else str(src)
                if where is None and len(skipped) == 1:
                    raise InputError(str(bad[0][1]), exc.reason) from None
                reasons = "; ".join(skipped[:3]) + (f"; +{len(skipped) - 3} more" if len(skipped) > 3 else "")
                raise InputError(where, f"no usable trace ({reasons})") from None
    st.skipped = skipped
    return st


def _merge_files(files: list[tuple[int, Path]], tops: dict[Path, dict[str, Any]], dst: Path, *,
                 compression: str | None, level: int | None) -> Stats:
    """merge_job on rank files known to be traces; InputError naming a rank that fails while read."""
    first_top = decode_top(*_frame_of(files[0][1]))
    devices: list = []
    seen_dev = set()
    for _, f in files:
        for d in tops[f].get("deviceProperties") or []:
            key = msgspec.json.encode(d)
            if key not in seen_dev:
                seen_dev.add(key)
                devices.append(d)
    top = dict(first_top)
    if devices:
        top["deviceProperties"] = devices
    worlds = [w for _, f in files if isinstance(w := (tops[f].get("distributedInfo") or {}).get("world_size"), int)]
    top["distributedInfo"] = merged_dist(top.get("distributedInfo"), [r for r, _ in files], max(worlds, default=None))
    head, tail = encode_head(top)
    st = Stats()
    with write_queue(compression_for(dst, compression) != "none") as writes:
        w = TraceWriter(dst, head=head, tail=tail, compression=compression, level=level, writes=writes)
        try:
            for rank, f in files:
                _merge_rank(w, rank, f, st)
            w.close()
        except BaseException as exc:
            _abort(writes, exc, [w])
            raise
    st.outputs.append(str(dst))
    st.note = f"ranks {[r for r, _ in files]}"
    return st


_DICTS = msgspec.json.Decoder(list[dict])


def _merge_rank(w: TraceWriter, rank: int, f: Path, st: Stats) -> None:
    """Append the events of rank file f, remapped, to the merged trace. Each slice is first held to
    the loader's types (validate.refuse_wrong_types), as `analyze` reads it: re-encoded as objects,
    a wrong-typed field (`"name": [1, 2]`) would otherwise reach the output, or turn valid by the
    remapping (a float pid becomes a string). InputError naming f when f is unusable."""
    seen = [0]  # events of f before the slice

    def consume(view) -> None:
        events = _DICTS.decode(view)  # first: a DecodeError here makes the scanner cut elsewhere
        if not _valid_slice(view):  # one strict decode passes nearly every slice; else the checks say why
            refuse_wrong_types(f, view, seen[0])  # decoded where it lies (no copy)
            for k, e in enumerate(events):  # and to `trace check`'s rules (a `ph`, a `ts`, ...)
                problems = event_problems(e.get("ph"), e.get("name"), e.get("ts"), e.get("dur"), e.get("pid"),
                                          e.get("tid"), e.get("id"))
                if problems:
                    raise InputError(str(f), f"event {seen[0] + k}: {problems[0]}")
        seen[0] += len(events)
        st.events_in += len(events)
        w.write_objects(_remap(events, rank))
        st.events_out += len(events)

    try:
        scan(f, consume, hash=False, slice_bytes=slices.SLICE_BYTES)
    except BadJSON as exc:
        raise InputError(str(f), str(exc)) from None
    except StreamError as exc:
        raise InputError(str(f), f"cannot stream this trace: {exc}") from None
    except RecursionError:  # msgspec's answer to nesting deeper than Python's recursion limit
        raise InputError(str(f), TOO_DEEP) from None


def _frame_of(path: Path) -> tuple[bytes, bytes]:
    """head and tail bytes of a trace (one streaming pass that decodes nothing); InputError naming
    the file when it turns out unreadable past its head (truncated, corrupt)."""
    try:
        res = scan(path, lambda v: None, hash=False)
    except StreamError as exc:
        raise InputError(str(path), f"cannot stream this trace: {exc}") from None
    except RecursionError:
        raise InputError(str(path), TOO_DEEP) from None
    return res.head, res.tail
