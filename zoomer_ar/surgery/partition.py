"""Cut one rank's trace into K time windows on disk, in bounded memory, so that each window can be
analysed on its own (the streaming reader keeps every kept row of the file it reads: a window of a
huge trace fits where the whole does not) and the windows' feature summaries summed afterwards.

A variant of cut.split_trace with one rule split_trace does not have: every event goes to exactly
ONE window file (summed features must count nothing twice), except metadata events and the
profiler's `Trace` spans, which go to every file (each file must be a trace of its own); the
source's other top-level keys are in every file. Window 0 reaches back to -inf and the last one on
to +inf: no event is left out, but those a viewer cannot place (validate.placeable), which no
valid output can hold (`unplaced` counts them).

- Cut points: with ProfilerStep#N annotations, the steps are grouped evenly into K groups, and
  the cut before a group is the CPU-side start of its first step (survey.cpu_steps, else
  survey.steps); without steps, K equal slices of the survey's time span.
- Device events (kernels, copies, memsets: events of a non-runtime category whose
  `args.correlation` is a runtime call's) go to the window of the runtime call that launched them:
  a kernel often runs after its step's CPU side has ended. Flow arrows (not `fwdbwd`) follow the
  launch their id names, where it names one. Everything else goes by its start: window k holds
  bounds[k-1] <= ts < bounds[k].
- Memory stays bounded whatever the size: CUPTI and roctracer number launches in launch order, so
  the launches of a window form one range of ids [lo, hi]; a pass keeps K ranges, not one entry per
  launch, and a device event finds its window by a binary search on the ranges' starts. Ranges that
  overlap (ids not in launch order: a merged trace of several ranks, ids reused) leave no way to
  place a device event with bounded memory: NotPartitionable, and the caller reads the trace whole.

Three passes (the steps and the slices' summary, slices.Plan; the launch ranges, skipping the
slices whose launches the first pass kept; the copy), plus a thread that hashes the file as stored
beside the first pass. Memory: the Plan (about 75 bytes a slice, at most 8 MB of kept launches),
K ranges, at most 8 compressed slices waiting for the writer thread.

Where the compiled scanner is built, partition_fast.py makes the same cut in two passes, about
five times faster (benchmarks/README.md, "Trace partition"); these passes are its fallback for
what the scanner does not read, and the reference its files are compared with byte for byte.
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..load.merged import merged_ranks
from ..stream.scan import ScanResult, scan
from ..threads import start as start_thread
from . import guard
from .copying import abort_outputs, output_folder
from .cut import Survey, survey
from .io import TraceWriter, write_queue
from .slices import Batch, Plan, read_slices

_INT64_MAX = np.iinfo(np.int64).max
_DEVICE_WORDS = ("kernel", "memcpy", "memset")  # kernel / Kernel, gpu_memcpy / Memcpy, gpu_memset / Memset


class NotPartitionable(Exception):
    """The trace cannot be cut so that each event lands in one window with bounded memory (the
    message says why, in one line): the caller analyses it whole instead."""


@dataclass
class Partition:
    """The window files of a trace, and what the cut read."""

    files: list[Path]  # the window files, in time order (K >= 1)
    bounds: list[float]  # the K-1 cut times, in the trace's own raw units (us, or ns for ns traces)
    steps: list[tuple[int, int]]  # (first, last) ProfilerStep number of each window; [] when cut by time
    events_in: int  # events read from the source
    sha256: str  # of the source file as stored (what `sha256sum` prints)
    json_bytes: int  # decompressed JSON bytes of the source
    counts: list[int] = field(default_factory=list)  # events of each window, less those copied to every file
    shared: int = 0  # events copied to every file (metadata, `Trace` spans), counted once
    unplaced: int = 0  # events left out: a viewer cannot place them (no ts, pid/tid, (X) dur, (M) name)
    ns: bool = False  # the trace's timestamps are nanoseconds


# ------------------------------------------------------------------------------------------------
# the cut points
# ------------------------------------------------------------------------------------------------


def _groups(nums: list[int], k: int) -> list[list[int]]:
    """`nums` in k consecutive groups of sizes differing by at most one (earlier groups larger)."""
    q, r = divmod(len(nums), k)
    out, i = [], 0
    for g in range(k):
        n = q + (1 if g < r else 0)
        out.append(nums[i : i + n])
        i += n
    return out


def _cuts(src: Path, sv: Survey, k: int) -> tuple[list[float], list[tuple[int, int]]]:
    """(bounds, step groups) for k windows (k already at most the number of steps, where there are steps)."""
    if sv.steps:
        groups = _groups(sorted(sv.steps), k)
        table = sv.cpu_steps if all(g[0] in sv.cpu_steps for g in groups) else sv.steps
        bounds = [float(table[g[0]][0]) for g in groups[1:]]
        if any(b <= a for a, b in zip(bounds, bounds[1:])):
            raise NotPartitionable(f"{src}: the steps' starts are not in step order; cannot cut between them")
        return bounds, [(g[0], g[-1]) for g in groups]
    if sv.span is None:
        raise InputError(str(src), "trace has no timed events ('traceEvents' holds none a viewer can place)")
    a, b = sv.span
    bounds = [a + (b - a) * j / k for j in range(1, k)]
    if any(y <= x for x, y in zip([a, *bounds], bounds)):  # a span too short for k distinct cut times
        raise NotPartitionable(f"{src}: its time span {a:.3f}..{b:.3f} is too short for {k} windows")
    return bounds, []


# ------------------------------------------------------------------------------------------------
# the launches of each window, as one range of correlation ids
# ------------------------------------------------------------------------------------------------


@dataclass
class Ranges:
    """The correlation ids of each window's launches as one range: `starts`, `ends` and `window` of
    the windows that have launches, in window order (starts increasing, ranges disjoint)."""

    starts: np.ndarray
    ends: np.ndarray
    window: np.ndarray

    def windows_of(self, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into key, window) for the keys that lie inside a range."""
        i = np.searchsorted(self.starts, key, "right") - 1
        inside = (key >= 0) & (i >= 0)
        inside &= key <= self.ends[np.maximum(i, 0)] if self.ends.size else False
        idx = np.flatnonzero(inside)
        return idx, self.window[i[idx]]


class LaunchSpans:
    """The lowest and highest correlation id of each window's launches (a launch goes by its start,
    as every non-device event does), gathered a batch at a time; `ranges()` makes them Ranges.
    Shared by launch_ranges and partition_fast's summary pass."""

    def __init__(self, bounds: np.ndarray) -> None:
        self.bounds = bounds
        k = bounds.size + 1
        self.lo = np.full(k, _INT64_MAX, dtype=np.int64)
        self.hi = np.full(k, -1, dtype=np.int64)

    def add(self, corr: np.ndarray, ts: np.ndarray) -> None:
        """Launches with these ids, starting at these times."""
        if corr.size:
            w = np.searchsorted(self.bounds, ts, "right")
            np.minimum.at(self.lo, w, corr)
            np.maximum.at(self.hi, w, corr)

    def widen(self, w: int, c0: int, c1: int) -> None:
        """Launches of window w with ids c0..c1."""
        self.lo[w] = min(int(self.lo[w]), c0)
        self.hi[w] = max(int(self.hi[w]), c1)

    def ranges(self, src: Path) -> Ranges:
        """The windows' ranges; NotPartitionable where two windows' ranges overlap or run backwards
        (ids not in launch order)."""
        has = np.flatnonzero(self.hi >= 0)
        starts, ends = self.lo[has], self.hi[has]
        bad = np.flatnonzero(ends[:-1] >= starts[1:])
        if bad.size:
            j = int(bad[0])
            raise NotPartitionable(
                f"{src}: correlation ids are not in launch order (the launches of window {int(has[j])} hold ids "
                f"{int(starts[j])}..{int(ends[j])}, those of window {int(has[j + 1])} {int(starts[j + 1])}.."
                f"{int(ends[j + 1])}): a device event's window cannot be told from its id")
        return Ranges(np.ascontiguousarray(starts), np.ascontiguousarray(ends), has.astype(np.int64))


def launch_ranges(src: Path, bounds: np.ndarray, plan: Plan, memo: dict) -> Ranges:
    """A pass over the launches (runtime calls with a correlation id): the lowest and highest id of
    each window's launches (a launch goes by its start, as every non-device event does). The
    launches the survey kept (plan.records) are not read again. NotPartitionable where two windows'
    ranges overlap or run backwards (ids not in launch order)."""
    spans = LaunchSpans(bounds)

    def on_slice(b: Batch) -> None:
        idx, corr = b.launch_ids(memo)
        spans.add(corr, b.tl.ts[idx])

    for corr, ts, _end, _x in plan.records:
        spans.add(corr, ts)
    if not all(plan.recorded):
        read_slices(src, on_slice, replay=plan, skip=lambda j: bool(plan.recorded[j]), memo=memo)
    return spans.ranges(src)


# ------------------------------------------------------------------------------------------------
# the file's sha256, beside the first pass
# ------------------------------------------------------------------------------------------------


class _Hasher:
    """sha256 of a file as stored, in a thread (hashlib and file reads release the interpreter lock:
    it runs beside the survey pass); `stop()` ends it early."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.digest = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zoomer-ar-sha256", daemon=True)
        start_thread(self._thread)

    def _run(self) -> None:
        h = hashlib.sha256()
        try:
            with self.path.open("rb") as fh:
                while not self._stop.is_set():
                    data = fh.read(1 << 20)
                    if not data:
                        self.digest = h.hexdigest()
                        return
                    h.update(data)
        except OSError:  # the reader says what is wrong with the file
            return

    def result(self) -> str:
        self._thread.join()
        return self.digest

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class _HeadRead(Exception):
    """Ends the scan of head_keys once the keys before the events are read."""


def head_keys(src: Path) -> dict:
    """The top-level keys before the events array (ScanResult.top), reading only that far."""
    got: dict = {}

    def on_head(res: ScanResult) -> None:
        got.update(res.top)
        raise _HeadRead

    def consume(view) -> None:  # never reached: on_head stops the scan first
        raise _HeadRead

    try:
        scan(src, consume, hash=False, on_head=on_head)
    except _HeadRead:
        pass
    except Exception:  # noqa: BLE001 - the survey reads the file again and says what is wrong with it
        pass
    return got


def _refuse_merged(src: Path, top: dict) -> None:
    ranks = merged_ranks(top)
    if ranks:
        raise NotPartitionable(f"{src}: a merged trace of ranks {', '.join(map(str, ranks[:8]))}"
                               f"{' ...' if len(ranks) > 8 else ''}: cut its rank files instead")


# ------------------------------------------------------------------------------------------------
# the cut
# ------------------------------------------------------------------------------------------------


def _window_count(src: Path, sv: Survey, plan: Plan, windows: int | None, target_bytes: int | None) -> int:
    """K: `windows`, or the events' JSON bytes over target_bytes (rounded up); at most the number of
    steps when cutting by steps."""
    if windows is not None:
        k = windows
    else:
        events_bytes = sum(plan.lengths)  # the events array's bytes (the slices tile it)
        k = max(1, math.ceil(events_bytes / target_bytes))  # type: ignore[operator]
    if sv.steps:
        k = min(k, len(sv.steps))
    return k


def _check_args(src: Path, dst_dir: Path, windows: int | None, target_bytes: int | None,
                compression: str | None) -> None:
    if (windows is None) == (target_bytes is None):
        raise InputError(str(src), "give either a number of windows or a target size in bytes")
    guard.at_least_one(windows, "windows")
    guard.at_least_one(target_bytes, "target_bytes")
    if compression not in (None, "none", "gzip", "zstd"):
        raise InputError(None, f"compression {compression!r}: use gzip, zstd or none")
    guard.require_file(src)
    guard.check_folder_output(dst_dir, src, "window files")
    guard.check_level(compression or "none", None, dst_dir)


def partition_trace(src: Path, dst_dir: Path, *, windows: int | None = None, target_bytes: int | None = None,
                    compression: str | None = None) -> Partition:
    """Cut `src` (one rank's trace) into K window files in `dst_dir` (`<base>.window_<k>.json`, k
    zero-padded to the width of K-1; gzip or zstd with `compression`), each event in exactly one of
    them (see the module's docstring). K is `windows`, or ceil(events' JSON bytes / target_bytes);
    never more than the trace's steps when it has ProfilerStep annotations. InputError (one line)
    for bad input or arguments, NotPartitionable where the windows cannot be told apart in bounded
    memory (a merged trace, correlation ids not in launch order, device events that cannot be tied
    to their launches): analyse the trace whole then. No window file is left behind on failure."""
    src, dst_dir = Path(src), Path(dst_dir)
    _check_args(src, dst_dir, windows, target_bytes, compression)
    _refuse_merged(src, head_keys(src))
    from . import partition_fast  # (it imports this module)

    if partition_fast.available():
        try:
            return partition_fast.partition(src, dst_dir, windows, target_bytes, compression)
        except partition_fast.Fallback:
            pass  # outside the compiled scanner's subset: the original passes, which say what is wrong
    hasher = _Hasher(src)
    try:
        plan = Plan()
        sv = survey(src, plan)
    except BaseException:
        hasher.stop()
        raise
    sha = hasher.result()
    if sv.span is None:
        raise InputError(str(src), "trace has no timed events ('traceEvents' holds none a viewer can place)")
    k = _window_count(src, sv, plan, windows, target_bytes)
    bounds_l, steps = _cuts(src, sv, k)
    bounds = np.array(bounds_l, dtype=np.float64)
    memo: dict = {}
    ranges = launch_ranges(src, bounds, plan, memo) if k > 1 else None
    part = Partition(files=[], bounds=bounds_l, steps=steps, events_in=0, sha256=sha, json_bytes=0,
                     counts=[0] * k, ns=sv.ns)
    res = _copy(src, dst_dir, part, bounds, ranges, plan, memo, compression)
    part.json_bytes = res.json_bytes
    return part


def _copy(src: Path, dst_dir: Path, part: Partition, bounds: np.ndarray, ranges: Ranges | None, plan: Plan,
          memo: dict, compression: str | None) -> ScanResult:
    """The copy pass: each event into its window's file (metadata and `Trace` spans into all)."""
    k = bounds.size + 1
    base = src.name.split(".json")[0]
    suffix = {"gzip": ".json.gz", "zstd": ".json.zst"}.get(compression or "none", ".json")
    width = len(str(k - 1))
    writers: list[TraceWriter] = []
    device_cats: dict = {}
    no_launches = ranges is not None and not ranges.starts.size

    def on_head(res: ScanResult) -> None:
        _refuse_merged(src, res.top)
        for w in writers:
            w.set_head(res)

    def on_slice(b: Batch) -> None:
        part.events_in += b.n
        tl = b.tl
        part.unplaced += tl.unplaced
        everywhere = tl.meta | (tl.timed & ~b.not_trace_span())
        own = tl.timed & ~everywhere
        part.shared += int(everywhere.sum())
        if k == 1:
            win = np.zeros(b.n, dtype=np.int64)
        else:
            win = np.searchsorted(bounds, tl.ts, "right")
            if ranges.starts.size:  # type: ignore[union-attr]
                _, key = b.correlations(memo)
                idx, w = ranges.windows_of(key)  # type: ignore[union-attr]
                win[idx] = w
            elif no_launches and _device_events(b, own, device_cats):
                raise NotPartitionable(f"{src}: it has device events (kernels, copies) but no runtime call with a "
                                       "correlation id: a device event's window cannot be told from its launch")
        win = np.where(own, win, -1)
        part.counts[:] = [c + n for c, n in zip(part.counts, np.bincount(win[own], minlength=k).tolist())]
        targets = range(k) if everywhere.any() else np.unique(win[own]).tolist()
        for j in targets:
            keep = (win == j) | everywhere
            if keep.any():
                writers[j].write_raw(b.selected(keep))

    with output_folder(dst_dir), write_queue(compression in ("gzip", "zstd")) as writes:
        try:
            for j in range(k):
                writers.append(TraceWriter(dst_dir / f"{base}.window_{j:0{width}d}{suffix}",
                                           compression=compression or "none", writes=writes))
            res = read_slices(src, on_slice, on_head=on_head, replay=plan)
            _refuse_merged(src, res.top)  # distributedInfo may follow the events
            _close_windows(writers, part.counts, TraceWriter.tail_of(res))
        except BaseException as exc:
            abort_outputs(writes, exc, writers)
            raise
    _drop_empty(part, writers, base, suffix)
    return res


def _close_windows(writers: list[TraceWriter], counts: list[int], tail: bytes) -> None:
    """End each window's file with the trace's tail; an empty window is no trace (`analyze` refuses
    it): its file is dropped, and _drop_empty numbers the others again."""
    for j, w in enumerate(writers):
        if counts[j]:
            w.close(tail)
        else:
            w.abort()


def _drop_empty(part: Partition, writers: list[TraceWriter], base: str, suffix: str) -> None:
    """part.files: the windows' files. Leave out the windows that hold no event of their own (a cut
    in time through an idle stretch): each joins the window before it (the first kept one reaches
    back to -inf), which holds exactly the events it held, and the files are numbered again in
    order."""
    part.files = [w.path for w in writers]
    kept = [j for j, n in enumerate(part.counts) if n]
    if len(kept) == len(part.counts):
        return
    part.bounds = [part.bounds[j - 1] for j in kept[1:]]
    if part.steps:
        ends = [j - 1 for j in kept[1:]] + [len(part.steps) - 1]
        part.steps = [(part.steps[a][0], part.steps[b][1]) for a, b in zip([0, *kept[1:]], ends)]
    width = len(str(len(kept) - 1))
    files = []
    for i, j in enumerate(kept):
        new = part.files[j].with_name(f"{base}.window_{i:0{width}d}{suffix}")
        if new != part.files[j]:
            part.files[j].rename(new)
        files.append(new)
    part.files = files
    part.counts = [part.counts[j] for j in kept]


def _device_events(b: Batch, own: np.ndarray, memo: dict) -> bool:
    """Whether the slice holds a device-side event (kernel, memcpy, memset category) among `own`."""
    cats = b.column("cat")
    for c in set(cats).difference(memo):
        low = c.lower() if isinstance(c, str) else ""
        memo[c] = any(w in low for w in _DEVICE_WORDS) and "runtime" not in low and "driver" not in low
    dev = np.fromiter(map(memo.__getitem__, cats), dtype=bool, count=b.n)
    return bool((dev & own).any())
