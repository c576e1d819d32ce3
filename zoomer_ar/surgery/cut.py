"""`trace slice` and `trace split`: cuts by profiler steps or by time. A first pass (survey) finds
the steps, the first event and the time unit; for steps, a pass over the launches (Launches) finds the
device events launched from them, kept wherever they run."""

from __future__ import annotations
import re
from itertools import repeat
from dataclasses import dataclass, field
from pathlib import Path
import numpy as np
from ..errors import InputError
from ..stream.nscount import NsCounter
from ..stream.scan import ScanResult
from . import guard
from .io import Launched, TraceWriter, compression_for, write_queue
from .slices import Batch, Plan, read_slices
from .timeline import Timeline, slow_correlations
from .copying import Stats, abort_outputs, copy_with, output_folder, write_selected


_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


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
        idx, corr = b.launch_ids(memo)
        if idx.size:
            tl = b.tl
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




def slice_trace(src: Path, dst: Path, *, steps: tuple[int, int] | None = None,
                window_ms: tuple[float, float] | None = None, absolute: bool = False,
                compression: str | None = None, level: int | None = None) -> Stats:
    """Keep the events of steps N..M (ProfilerStep#N to #M, CPU and GPU side), or of a time window
    in milliseconds from the rank's first complete event (as evidence times are given; `absolute`: raw trace
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
    guard.check_level(compression_for(dst, compression), level, dst)
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

    st = copy_with(src, dst, select, compression=compression, level=level, before_close=nothing_kept, plan=plan,
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
    return (f"its events span {(a - sv.t0) / sv.unit:.3f}..{(b - sv.t0) / sv.unit:.3f} ms from its first complete event; "
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




def split_trace(src: Path, dst_dir: Path, *, steps_per_file: int = 1, max_files: int = 256,
                compression: str | None = "gzip", level: int | None = None) -> Stats:
    """One trace per step (or per `steps_per_file` steps): events overlapping each step's window
    and the device events launched from it (CPU and GPU side, as slice_trace); metadata in every
    file. Events before the first or after the last step are left out, and so are events a viewer
    cannot place (validate.placeable)."""
    guard.at_least_one(steps_per_file, "--steps-per-file")
    guard.at_least_one(max_files, "--max-files")
    guard.require_file(src)
    guard.check_folder_output(dst_dir, src, "step files")
    guard.check_level(compression or "none", level, dst_dir)
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
            st.events_out += write_selected(writers[j], b, keep)
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

    with output_folder(dst_dir), write_queue(compression in ("gzip", "zstd")) as writes:
        try:
            for g in groups:  # one by one: those opened before a failing one are aborted below
                writers.append(TraceWriter(dst_dir / f"{base}.steps_{g[0]}-{g[-1]}{suffix}", compression=compression,
                                           level=level, writes=writes))
            res = read_slices(src, on_slice, on_head=on_head, replay=plan, skip=skip, on_skip=on_skip)
            for w in writers:
                w.close(TraceWriter.tail_of(res))
        except BaseException as exc:
            abort_outputs(writes, exc, writers)
            raise
    st.outputs = [str(w.path) for w in writers]
    if st.events_out > st.events_in:  # "76,855 of 75,718 events" needs its reason
        st.note = ("an event in several files counts once in each: the metadata goes into every file, an event "
                   "spanning two steps' windows into both")
    return st
