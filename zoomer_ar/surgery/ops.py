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
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..errors import InputError
from ..load.job import rank_files as folder_rank_files
from ..load.job import rank_from_name
from ..stream.compact import NsCounter
from ..stream.scan import ScanResult, scan
from ..stream.source import ChunkReader, StreamError, is_trace_file
from . import guard
from .io import (
    TOO_DEEP, Lite, Placed, TraceWriter, _Sink, compression_for, copy_file, copying_into, decode_top, encode_head,
    read_events,
)
from .validate import placeable, refuse_wrong_types

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
PID_STRIDE = 10_000_000  # merge: rank r's integer pid p becomes r * PID_STRIDE + p
ID_SHIFT = 40  # merge: flow ids and correlation ids of rank r are offset by r << ID_SHIFT
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
        self.unplaced += other.unplaced
        if other.bytes_out is not None:
            self.bytes_out = (self.bytes_out or 0) + other.bytes_out


# ------------------------------------------------------------------------------------------------
# a first pass: step windows, the rank's first event, the time unit
# ------------------------------------------------------------------------------------------------


@dataclass
class Survey:
    steps: dict[int, list[float]] = field(default_factory=dict)  # step number -> [start, end] (CPU and GPU side)
    t0: float | None = None  # first complete non-Trace event (raw units)
    ns: bool = False  # timestamps are nanoseconds (the loader's median test)
    events: int = 0


def survey(path: Path) -> Survey:
    """Steps, first event and time unit of a trace; events a viewer cannot place (see
    validate.placeable) are not counted in them, as slice and split leave them out."""
    sv = Survey()
    counter = NsCounter()
    t0 = [np.inf]

    def on_slice(raws: list, lite: list[Placed]) -> None:
        sv.events += len(lite)
        xs = [e for e in lite if e.ph == "X" and placeable(e)]
        if xs:
            ts = np.fromiter((e.ts for e in xs), dtype=np.float64, count=len(xs))
            counter.add(ts)
            nt = np.fromiter((e.cat != "Trace" for e in xs), dtype=bool, count=len(xs))
            if nt.any():
                t0[0] = min(t0[0], float(ts[nt].min()))
        for e in xs:
            if e.name.startswith("ProfilerStep#") and e.cat in ("user_annotation", "gpu_user_annotation", "Operator",
                                                                "cpu_op", ""):
                m = _STEP_RE.match(e.name)
                if m:
                    w = sv.steps.setdefault(int(m.group(1)), [np.inf, -np.inf])
                    w[0] = min(w[0], float(e.ts))
                    w[1] = max(w[1], float(e.ts) + float(e.dur))

    read_events(path, on_slice, record=Placed)
    sv.t0 = None if not np.isfinite(t0[0]) else t0[0]
    sv.ns = counter.nanoseconds()
    return sv


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
    def of(cls, lite: list[Placed]) -> Timeline:
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


def _keep_in_window(tl: Timeline, w0: float, w1: float) -> np.ndarray:
    inside = (tl.ts <= w1) & (tl.end >= w0) & ((tl.ts < w1) | ~tl.x | (tl.dur == 0))
    return tl.meta | (tl.timed & inside)


def _write_selected(w: TraceWriter, raws: list, keep: np.ndarray) -> int:
    idx = np.flatnonzero(keep).tolist()
    if idx:
        w.write_raw([raws[i] for i in idx])
    return len(idx)


def _copy_with(src: Path, dst: Path, select, *, compression: str | None = None, level: int | None = None,
               record: type = Lite) -> Stats:
    st = Stats()
    guard.check_level(compression_for(dst, compression), level)
    w = TraceWriter(dst, compression=compression, level=level)
    holder: dict[str, ScanResult] = {}

    def on_head(res: ScanResult) -> None:
        holder["res"] = res
        w.set_head(res)

    def on_slice(raws: list, lite: list[Lite]) -> None:
        st.events_in += len(lite)
        st.events_out += _write_selected(w, raws, select(lite, st))

    try:
        res = read_events(src, on_slice, on_head=on_head, record=record)
        w.close(TraceWriter.tail_of(res))
    except BaseException:
        w.abort()
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
    whole; metadata always."""
    if (steps is None) == (window_ms is None):
        raise InputError(str(src), "give either steps N..M or a time window")
    _check_range(steps, window_ms)
    guard.check_file_output(dst, [src])
    guard.check_level(compression_for(dst, compression), level)
    sv = survey(src)
    unit = 1e6 if sv.ns else 1e3  # trace units per millisecond
    if steps is not None:
        lo, hi = steps
        chosen = [w for k, w in sv.steps.items() if lo <= k <= hi]
        if not chosen:
            have = f"{min(sv.steps)}..{max(sv.steps)}" if sv.steps else "none"
            raise InputError(str(src), f"no ProfilerStep#{lo}..{hi} in this trace (steps present: {have})")
        w0, w1 = min(w[0] for w in chosen), max(w[1] for w in chosen)
    else:
        a, b = window_ms
        if absolute:
            w0, w1 = a, b
        else:
            if sv.t0 is None:
                raise InputError(str(src), "no complete events to measure a window from")
            w0, w1 = sv.t0 + a * unit, sv.t0 + b * unit
    def select(lite: list[Placed], st: Stats) -> np.ndarray:
        tl = Timeline.of(lite)
        st.unplaced += tl.unplaced
        return _keep_in_window(tl, w0, w1)

    st = _copy_with(src, dst, select, compression=compression, level=level, record=Placed)
    st.note = f"window {w0:.3f}..{w1:.3f} ({'ns' if sv.ns else 'us'})"
    return st


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
    events too); when nothing but metadata is kept, Stats.warnings names the categories present."""
    cats = {canonical_category(c) for c in cats}
    exclude_cats = {canonical_category(c) for c in exclude_cats}
    pids, tids, phases = {str(p) for p in pids}, {str(t) for t in tids}, set(phases)
    name_re = re.compile(name) if name else None
    exclude_re = re.compile(exclude_name) if exclude_name else None
    memo: dict[tuple, bool] = {}
    seen_cats: set[str] = set()
    kept = [0, 0]  # non-metadata events: seen, kept

    def ok(e: Lite) -> bool:
        if e.ph == "M":
            return True
        key = (e.cat, e.name, e.ph, e.pid, e.tid)
        v = memo.get(key)
        if v is None:
            seen_cats.add(e.cat)
            cat = canonical_category(e.cat)
            v = ((not cats or cat in cats) and cat not in exclude_cats
                 and (not phases or e.ph in phases)
                 and (not pids or str(e.pid) in pids) and (not tids or str(e.tid) in tids)
                 and (name_re is None or name_re.search(e.name) is not None)
                 and (exclude_re is None or exclude_re.search(e.name) is None))
            if len(memo) < 200_000:
                memo[key] = v
        kept[0] += 1
        kept[1] += v
        return v

    def select(lite: list[Lite], st: Stats) -> np.ndarray:
        return np.fromiter(map(ok, lite), dtype=bool, count=len(lite))

    guard.check_file_output(dst, [src])
    st = _copy_with(src, dst, select, compression=compression, level=level)
    if kept[0] and not kept[1]:
        st.warnings.append(_nothing_kept(src, seen_cats))
    return st


def _nothing_kept(src: Path, seen_cats: set[str]) -> str:
    """Why an empty filter result is worth a look: the categories the trace does have."""
    named = sorted(c for c in seen_cats if c)
    have = ", ".join(named) + (", (no category)" if "" in seen_cats else "") if seen_cats else "none"
    return f"{src}: the filter kept no event besides metadata; categories in this trace: {have}"


def split_trace(src: Path, dst_dir: Path, *, steps_per_file: int = 1, max_files: int = 256,
                compression: str | None = "gzip", level: int | None = None) -> Stats:
    """One trace per step (or per `steps_per_file` steps): events overlapping each step's window
    (CPU and GPU side); metadata in every file. Events before the first or after the last step
    are left out, and so are events a viewer cannot place (validate.placeable)."""
    guard.at_least_one(steps_per_file, "--steps-per-file")
    guard.at_least_one(max_files, "--max-files")
    guard.refuse_file_as_dir(dst_dir)
    if guard.same_file(dst_dir, src.parent):
        raise InputError(str(dst_dir), f"is the folder of the input {src.name}: the step files would be read "
                                       "as extra ranks of it; write them to another folder")
    guard.check_level(compression or "none", level)
    sv = survey(src)
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
    writers: list[TraceWriter] = []
    st = Stats()

    def on_head(res: ScanResult) -> None:
        for w in writers:
            w.set_head(res)

    def on_slice(raws: list, lite: list[Placed]) -> None:
        st.events_in += len(lite)
        tl = Timeline.of(lite)
        st.unplaced += tl.unplaced
        timed, meta = tl.timed, tl.meta
        if timed.any():
            lo, hi = float(tl.ts[timed].min()), float(tl.end[timed].max())
            hit = (wins[:, 0] <= hi) & (wins[:, 1] >= lo)
        else:
            hit = np.zeros(len(wins), dtype=bool)
        for j in np.flatnonzero(hit).tolist():
            w0, w1 = wins[j]
            keep = (timed & (tl.ts <= w1) & (tl.end >= w0)) | meta
            st.events_out += _write_selected(writers[j], raws, keep)
        if meta.any():  # metadata in every file
            idx = np.flatnonzero(meta).tolist()
            for j in np.flatnonzero(~hit).tolist():
                writers[j].write_raw([raws[i] for i in idx])

    with _output_folder(dst_dir):
        try:
            for g in groups:  # one by one: those opened before a failing one are aborted below
                writers.append(TraceWriter(dst_dir / f"{base}.steps_{g[0]}-{g[-1]}{suffix}", compression=compression,
                                           level=level))
            res = read_events(src, on_slice, on_head=on_head, record=Placed)
            for w in writers:
                w.close(TraceWriter.tail_of(res))
        except BaseException:
            for w in writers:
                w.abort()
            raise
    st.outputs = [str(w.path) for w in writers]
    return st


def compress_trace(src: Path, dst: Path, *, compression: str | None = None, level: int | None = None) -> Stats:
    """Re-encode a trace file as gzip, zstd or plain JSON (from dst's suffix unless given), streaming.

    The bytes are copied as they are (a round trip gives the same JSON), but only after a first pass
    has read the events as the other commands do: the output is promised to be a valid trace, and a
    JSON file without traceEvents, NaN literals or a cut-off array would otherwise pass through."""
    comp = compression_for(dst, compression)
    guard.check_file_output(dst, [src])
    guard.check_level(comp, level)
    read_events(src, lambda raws, lite: None)
    sink = _Sink(dst, comp, level)
    st = Stats()
    with copying_into(sink, src):
        first = True
        for data, _ in ChunkReader(src, hash=False):
            if first:
                head = data.lstrip()[:1]
                if head not in (b"{", b"["):
                    raise InputError(str(src), "not a JSON trace")
                first = False
            sink.write(data)
        if first:
            raise InputError(str(src), "empty file")
    st.outputs.append(str(dst))
    st.bytes_out = dst.stat().st_size
    st.note = f"from {_human_bytes(sink.bytes_in)} of JSON, {comp}"
    return st


# ------------------------------------------------------------------------------------------------
# jobs: ranks of a folder
# ------------------------------------------------------------------------------------------------


def peek_top(path: Path) -> dict[str, Any]:
    """The top-level keys before the events array (distributedInfo, deviceProperties, ...)."""
    return probe_trace(path)[0] or {}


def probe_trace(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(top-level keys, "") when `path` is a trace (a `traceEvents` array or a bare array of
    events), else (None, why not). Reads only up to the events array, so it is cheap on any size:
    job commands use it to skip stray JSON files the way `analyze` does instead of failing late."""
    out: dict[str, Any] = {}

    class _Stop(Exception):
        pass

    def on_head(res: ScanResult) -> None:
        out.update(decode_top(res.head, b""))
        raise _Stop

    try:
        scan(path, lambda v: None, hash=False, on_head=on_head)
    except _Stop:
        return out, ""
    except StreamError as exc:
        return None, f"not a trace ({exc})"
    except RecursionError:  # msgspec's answer to keys nested deeper than Python's recursion limit
        return None, f"not a trace ({TOO_DEEP})"
    except OSError as exc:
        return None, f"cannot read ({exc.strerror or exc})"
    return out, ""


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
        raise InputError(str(src), "folder holds no trace files (*.json, *.json.gz)")
    return rank_files(files, str(src))


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
    (default: as they are)."""
    if ranks is None:
        if k is None:
            raise InputError(None, "give -k N or --ranks")
        guard.at_least_one(k, "-k")
    _check_folder_output(src, dst)
    job = job_folder(src)
    files = job.files
    have = [r for r, _ in files]
    want = _wanted(src, have, ranks) if ranks is not None else choose_ranks(have, k or 1, seed=seed)
    st = Stats(bytes_out=0, skipped=list(job.skipped))
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
        copy_file(f, dst / name)
        st.outputs.append(str(dst / name))
        st.bytes_out = (st.bytes_out or 0) + (dst / name).stat().st_size
        return True
    stem = name[: -len(".gz")] if name.endswith(".gz") else name[: -len(".zst")] if name.endswith(".zst") else name
    stem = stem if stem.endswith(".json") else stem + ".json"
    out = dst / (stem + {"gzip": ".gz", "zstd": ".zst", "none": ""}[compression])
    return _skip_unreadable(st, f, lambda: compress_trace(f, out, compression=compression))


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
    """filter_trace on each chosen rank file of a job folder, into dst (same file names); rank
    files unusable while read are skipped with a note (_skip_unreadable)."""
    _check_folder_output(src, dst)
    job = job_folder(src)
    have = [r for r, _ in job.files]
    want = set(_wanted(src, have, ranks)) if ranks is not None else set(have)
    st = Stats(skipped=list(job.skipped))
    done = 0
    with _output_folder(dst):
        for r, f in job.files:
            if r in want:
                done += _skip_unreadable(st, f, lambda f=f: filter_trace(f, dst / f.name, **filters))
        _none_left(src, done, st)
    return st


def _remap(events: list[dict], rank: int) -> list[dict]:
    shift = rank << ID_SHIFT
    for e in events:
        pid = e.get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool) and 0 <= pid < PID_STRIDE:
            e["pid"] = rank * PID_STRIDE + pid
        elif pid is not None:
            e["pid"] = f"rank{rank}:{pid}"
        i = e.get("id")
        if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < (1 << ID_SHIFT):
            e["id"] = i + shift
        elif isinstance(i, str):
            e["id"] = f"{rank}:{i}"
        args = e.get("args")
        if isinstance(args, dict):
            for k in _ID_ARGS:
                v = args.get(k)
                if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << ID_SHIFT):
                    args[k] = v + shift
            if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in args:
                args["name"] = f"rank {rank}: {args['name']}"
    return events


def merge_job(src: Path | list[Path], dst: Path, *, compression: str | None = None, level: int | None = None) -> Stats:
    """Per-rank files -> one trace. Integer pids become rank * 10^7 + pid (string pids get a
    `rank<r>:` prefix) and process names a `rank <r>: ` prefix, so each rank keeps its own tracks;
    flow ids and correlation ids are offset by rank << 40 so that links stay within a rank.
    Top-level keys come from the first rank; `distributedInfo` records the merged ranks. Inputs that
    are not traces, or turn out unusable while read, are skipped (Stats.skipped), as `analyze` skips
    them in a job folder."""
    if isinstance(src, (list, tuple)):
        guard.check_file_output(dst, [Path(f) for f in src])
    else:
        guard.refuse_dir_as_file(dst)
        guard.refuse_inside(dst, Path(src), what="merged trace")
    guard.check_level(compression_for(dst, compression), level)
    job = rank_files([Path(f) for f in src]) if isinstance(src, (list, tuple)) else job_folder(Path(src))
    files = list(job.files)
    skipped = list(job.skipped)
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
    dist = dict(top.get("distributedInfo") or {})
    dist.pop("rank", None)
    dist["world_size"] = 1
    dist["merged_ranks"] = [r for r, _ in files]
    top["distributedInfo"] = dist
    head, tail = encode_head(top)
    w = TraceWriter(dst, head=head, tail=tail, compression=compression, level=level)
    st = Stats()
    try:
        for rank, f in files:
            _merge_rank(w, rank, f, st)
        w.close()
    except BaseException:
        w.abort()
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
        refuse_wrong_types(f, view, seen[0])  # decoded where it lies (no copy)
        seen[0] += len(events)
        st.events_in += len(events)
        w.write_objects(_remap(events, rank))
        st.events_out += len(events)

    try:
        scan(f, consume, hash=False)
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
