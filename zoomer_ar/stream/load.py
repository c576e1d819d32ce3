"""Streaming load: a trace file (or a folder of per-rank files) -> Job of compact RankTraces.

Mirrors zoomer_ar.load.job.load_trace / load_job (same ranks, same RankInfo, same refusals), but
each file is read in one streaming pass that keeps only what the features use (compact.py), and
the ranks of a folder are read in parallel processes. Files the streaming reader cannot handle
(malformed JSON, a missing traceEvents key, ...) go to the in-memory loader, whose InputError
explains the problem.
"""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Callable

import numpy as np
from pathlib import Path

from ..errors import InputError
from ..load import fastcols
from ..load.columns import RankTrace
from ..load.merged import merged_ranks, rank_distributed_info, split_merged
from ..load.job import (TOO_DEEP, Job, _accelerator, _schema, assemble_job, load_trace, missing_reason, no_traces_reason,
                        rank_files, rank_of_file, rebase_times)
from ..load.reader import Progress, TraceTooBig, scoped_progress
from ..load.repair import StreamRepair
from ..load.stub import RankStub
from ..models import RankInfo, SkippedFile
from ..program_match import raw_names
from .compact import CompactBuilder
from .heap import fix_mmap_threshold, trim_heap
from .parts import constant_columns
from .pool import env_workers, run_pool, shared_progress
from .frames import add_frames
from .guard import MemoryGuard, WindowsNeeded, budget_mb
from .prune import prune
from .scan import SLICE, scan, scan_columns
from .split import RankSink
from .source import CHUNK, BadJSON, StreamError, is_trace_file

MAX_PASSES = 3
# JSON bytes per chunk for the compiled reader: each chunk's events go to the compact builder as
# one run, and its per-run numpy work costs less over bigger runs (1 GB tiled trace: 4 MB chunks
# took 15% less CPU than 1 MB ones, at the same peak RSS)
FAST_CHUNK = 4 << 20
PRUNE_ROWS = 1_000_000  # compact rows above which prune.py drops those no feature can select


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def stream_rank(path: Path, **kw) -> tuple[RankTrace, RankInfo]:
    """One trace file of one rank -> (compact RankTrace, RankInfo), as load_trace would give them
    (stream_ranks; a file that merges ranks is refused: read it with stream_ranks)."""
    pairs = stream_ranks(path, **kw)
    if len(pairs) != 1:
        raise ValueError(f"{path} merges {len(pairs)} ranks: read it with stream_ranks")
    return pairs[0]


def stream_ranks(path: Path, *, rank_hint: int | None = None, progress: Progress | None = None,
                 slice_bytes: int = SLICE, chunk: int | None = None, frames: bool = True,
                 prune_rows: int | None = None, fast: bool | None = None,
                 memory_limit_mb: float | None = None,
                 switch_mb: float | None = None, hash_file: bool = True) -> list[tuple[RankTrace, RankInfo]]:
    """One trace file -> [(compact RankTrace, RankInfo)]: its one rank, as load_trace would give it,
    or the ranks of a `zoomer-ar trace merge` output, as the in-memory loader splits it (split.py).

    `progress` hears of every read of the file (a pass that starts again from 0 is another read: a
    second pass, the evidence frames' pass).
    `fast` (default: where installed) reads events with the compiled reader; a file with an event
    outside its subset is read again with msgspec. Raises StreamError when the file must go to the
    in-memory loader, InputError for bad input the streaming reader recognises itself, and when
    the process outgrows its memory budget (`memory_limit_mb`: None for guard.budget_mb()'s
    default, 0 for none). Past `switch_mb` MB of resident memory (None: never) it raises
    guard.WindowsNeeded: analyze then reads the rank in windows (windowed.py). `hash_file=False` leaves
    RankInfo.sha256 empty (a window file, whose rank takes its original file's hash)."""
    fix_mmap_threshold()
    guard = MemoryGuard(path, budget_mb() if memory_limit_mb is None else (memory_limit_mb or None), switch_mb)
    hints: dict[int | None, dict] = {}
    ranks: list[int] | None = None
    passes = 0
    fast = fast0 = fastcols.available() if fast is None else fast
    repairing = False  # the profiler's unescaped names re-escaped on the way (load/repair.py)
    while True:
        passes += 1
        sink = RankSink(str(path), hints, ranks)
        fix = StreamRepair() if repairing else None
        gc_was_enabled = gc.isenabled()
        gc.disable()  # millions of short-lived tuples and lists: generational passes would only cost
        try:
            if fast:
                res = scan_columns(path, sink.parser(), guard.wrap(sink.add_columns, lambda: sink.n_events),
                                   chunk=chunk or FAST_CHUNK, progress=progress, repair=fix, on_head=sink.on_head,
                                   hash=hash_file)
            else:
                res = scan(path, guard.wrap(sink.add, lambda: sink.n_events), slice_bytes=slice_bytes,
                           chunk=chunk or CHUNK, progress=progress, repair=fix, on_head=sink.on_head, hash=hash_file)
        except fastcols.Unsupported:  # an event outside the compiled reader's subset: msgspec
            fast, passes = False, passes - 1
            continue
        except BadJSON as exc:  # an event name the profiler did not escape: read again, repairing
            if repairing or not exc.unescaped_name:
                raise
            repairing, fast, passes = True, fast0, passes - 1
            continue
        finally:
            if gc_was_enabled:
                gc.enable()
        if sink.n_events == 0:
            raise StreamError("no events")  # the in-memory loader says why
        if sink.ranks is None and (late := merged_ranks(res.top)):
            # a merged trace whose distributedInfo follows its events: read again, split from the start
            ranks, hints, passes = late, {}, passes - 1
            continue
        ranks = sink.ranks
        again = sink.check()
        if again is not None:
            if passes >= MAX_PASSES:
                raise StreamError(f"still incomplete after {passes} passes: {sink.why}") from None
            hints = again
            continue
        break
    if sink.n_useful == 0:
        raise InputError(str(path), "not a Kineto trace: no complete ('X') or instant events")
    top = res.top
    dist = top.get("distributedInfo") or {}
    devices = [str(d.get("name", "")) for d in (top.get("deviceProperties") or []) if isinstance(d, dict)]
    ns = sink.nanoseconds()
    sink.settle()
    if prune_rows is None:
        prune_rows = _env_int("ZOOMER_STREAM_PRUNE_ROWS", PRUNE_ROWS)
    built: list[tuple[RankTrace, CompactBuilder]] = []
    infos: list[RankInfo] = []
    for key, b in sink.items():
        trace = b.finish()
        world = dist.get("world_size")
        if key is not None:  # a rank of a merged trace, as load/merged.split_merged gives it
            rank, rank_source = key, "distributedInfo"
            rank_dist, world = rank_distributed_info(dist, key)
        else:
            rank_dist = dist
            rank, rank_source = rank_of_file(dist, path, rank_hint)
        trace.rank = rank
        if ns:
            trace.ts = trace.ts / 1000.0
            trace.dur = trace.dur / 1000.0
            trace.time_unit_note = "timestamps were nanoseconds; converted to microseconds"
        trace.metadata = {
            "distributedInfo": {k: v for k, v in rank_dist.items() if k != "pg_config"},
            "devices": devices,
            "baseTimeNanoseconds": top.get("baseTimeNanoseconds"),
            "streamed": {"passes": passes, "events": b.n_events, "kept": len(trace), "json_bytes": res.json_bytes},
        }
        if key is not None:
            trace.metadata["merged_from"] = list(ranks or [])
        if fix is not None and fix.fixed:
            trace.metadata["repaired_names"] = fix.fixed  # as the in-memory loader says it (analyze's note)
        rebase_times([trace])  # pruning mirrors the features' sums: on the times they will read
        if len(trace) > prune_rows:
            constant_columns(trace)  # e.g. total_allocated without [memory] events: no bytes per row while pruning
            removed, _ = prune(trace, protect_from=b.main_n)  # the extra block (frames, window) stays
            b.main_n -= removed
            trace.metadata["streamed"]["pruned"] = removed
            trim_heap()
        built.append((trace, b))
        infos.append(RankInfo(
            path=str(path), rank=rank, rank_source=rank_source, sha256=res.sha256, size_bytes=path.stat().st_size,
            n_events=b.n_events, trace_schema=_schema(trace), devices=sorted(set(devices)),
            accelerator=_accelerator(trace, devices), world_size=int(world) if isinstance(world, int) else None,
            backend=str(dist["backend"]) if dist.get("backend") else None,
        ))
    if frames:
        added = add_frames(built, path, ns=ns, slice_bytes=slice_bytes, repair=repairing,
                           owner=sink.owner if sink.ranks is not None else None, progress=progress)
        for (trace, _), n in zip(built, added):
            trace.metadata["streamed"]["frames_added"] = n
    for trace, _ in built:
        constant_columns(trace)
    trim_heap()
    return [(trace, info) for (trace, _), info in zip(built, infos)]


def load_rank(path: Path, *, progress: Progress | None = None, **kw) -> list[tuple[RankTrace, RankInfo]]:
    """stream_ranks (one rank, or a merged trace's), or the in-memory loader where streaming cannot decide."""
    try:
        return stream_ranks(path, progress=progress, **kw)
    except StreamError as exc:
        try:
            return [load_trace(path, progress=progress)]
        except TraceTooBig:  # too big for the explaining reader: say what the streaming reader saw
            raise InputError(str(path), f"not a readable trace ({exc})") from None
    except RecursionError:
        raise InputError(str(path), TOO_DEEP) from None


_BROADCAST = "__zoomer_broadcast__"


def _pack(trace: RankTrace) -> RankTrace:
    """Broadcast (constant) columns travel as one value: pickle would expand them."""
    for f in ("stream", "device", "external_id", "correlation", "nbytes", "total_allocated"):
        a = getattr(trace, f)
        if a.ndim == 1 and a.size and a.strides == (0,):
            setattr(trace, f, (_BROADCAST, a[:1].copy(), a.shape))
    return trace


def _unpack(trace: RankTrace) -> RankTrace:
    for f in ("stream", "device", "external_id", "correlation", "nbytes", "total_allocated"):
        a = getattr(trace, f)
        if isinstance(a, tuple) and a and a[0] == _BROADCAST:
            setattr(trace, f, np.broadcast_to(a[1], a[2]))
    return trace


def summarised(pairs: list[tuple[RankTrace, RankInfo]], digest: bool = True) -> list[tuple[RankStub, RankInfo]]:
    """The ranks read from one file as RankStubs: each rank's feature summary instead of its rows, computed
    on the times the job will have (each rank's own base). A merged trace the in-memory loader read whole
    (where streaming could not decide) is split into its ranks first, as the job assembly would split it."""
    from ..features.extract import summarise_rank

    out = []
    for trace, info in pairs:
        for t, i in (split_merged(trace, info) if merged_ranks(trace.metadata) else None) or [(trace, info)]:
            rebase_times([t])
            summary = summarise_rank(t)
            summary.features.detach()  # kept while the other ranks are read (in this process or the main one)
            stub = RankStub.of(t, summary, digest=digest)
            stub.seen_names = raw_names(t)  # what compare checks another run against (program_match.py)
            out.append((stub, i))
    return out


def _read(path: Path, kw: dict, progress: Progress | None) -> list[tuple[RankTrace | RankStub, RankInfo]]:
    kw = dict(kw)
    summarise = kw.pop("summarise", False)  # False, or "digest" where the job has several files (load.stub)
    if summarise:  # a rank file too big to hold its kept rows at once: in windows of steps (windowed.py)
        from .windowed import read_windowed, switch_mb, wanted

        size = wanted(path)
        got = read_windowed(path, size, progress=progress, digest=summarise == "digest", **kw) if size else None
        if got is not None:
            return got
        if not size:
            seen = [0, 0]  # (bytes, of the file's) read by the one pass: where it outgrew the memory
            inner = progress if progress is not None else scoped_progress(path)

            def tracked(done: int, total: int) -> None:
                seen[:] = done, total
                if inner is not None:
                    inner(done, total)

            try:
                pairs = load_rank(path, progress=tracked, switch_mb=switch_mb(), **kw)
            except WindowsNeeded:  # the one pass outgrew the memory a window needs: start again in windows
                pairs = None  # (outside the except block: its traceback holds the pass's rows)
            if pairs is None:
                gc.collect()
                trim_heap()
                # windows of half what the pass read before it outgrew the memory
                windows = max(2, math.ceil(2 * seen[1] / seen[0])) if seen[0] > 0 else None
                got = read_windowed(path, 0, windows=windows, progress=progress, digest=summarise == "digest", **kw)
                if got is not None:
                    return got
                pairs = load_rank(path, progress=progress, **kw)
            return summarised(pairs, digest=summarise == "digest")
    pairs = load_rank(path, progress=progress, **kw)
    return summarised(pairs, digest=summarise == "digest") if summarise else pairs


def _worker(path: str, kw: dict, slot: int | None = None) -> list[tuple[RankTrace | RankStub, RankInfo]] | InputError:
    try:
        pairs = _read(Path(path), kw, shared_progress(slot))
    except InputError as exc:
        return exc
    return [(trace if isinstance(trace, RankStub) else _pack(trace), info) for trace, info in pairs]


def _files(p: Path) -> list[Path]:
    if p.is_dir():
        files = rank_files(p, is_trace_file)
        if not files:
            raise InputError(str(p), no_traces_reason(p, is_trace_file))
        return files
    return [p]


def load_job_streaming(
    path: str | Path,
    *,
    name: str | None = None,
    progress_factory: Callable[[Path], Progress | None] | None = None,
    workers: int | None = None,
    summarise: bool = False,
    **kw,
) -> Job:
    """load_job, through the streaming reader; ranks of a folder in up to `workers` processes
    (default: ZOOMER_STREAM_WORKERS, else the CPU count). With `summarise`, each rank's features are
    computed where it was read and the job's ranks are RankStubs (load/stub.py): no rank's rows outlive
    its reading, and the features (features.extract) are those of the ranks themselves."""
    p = Path(path)
    if not p.exists():
        raise InputError(str(p), missing_reason(p))
    files = _files(p)
    n_workers = workers if workers is not None else env_workers()
    n_workers = max(1, min(n_workers, len(files)))
    if "memory_limit_mb" not in kw:  # the machine's budget, shared by the ranks read at once
        kw["memory_limit_mb"] = budget_mb(n_workers) or 0.0
    kw["summarise"] = ("digest" if len(files) > 1 else True) if summarise else False
    outcomes: list[list[tuple[RankTrace | RankStub, RankInfo]] | InputError] = []
    if n_workers == 1:
        for f in files:
            try:
                outcomes.append(_read(f, kw, progress_factory(f) if progress_factory else None))
            except InputError as exc:
                outcomes.append(exc)
    else:
        outcomes = run_pool(_worker, files, [(str(f), kw) for f in files], n_workers, progress_factory)
    ranks: list[RankTrace] = []
    infos: list[RankInfo] = []
    skipped: list[SkippedFile] = []
    for f, out in zip(files, outcomes):
        if isinstance(out, InputError):
            if not p.is_dir():
                raise out
            skipped.append(SkippedFile(path=str(f), reason=out.reason))
            continue
        for trace, info in out:
            ranks.append(trace if isinstance(trace, RankStub) else _unpack(trace))
            infos.append(info)
    return assemble_job(p, name, ranks, infos, skipped)
