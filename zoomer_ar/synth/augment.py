"""Augmentation of real traces: inject an anti-pattern into a real background, labelled by construction.

Every operation works on the columnar `RankTrace` of a real trace (from the real loader) and
returns a modified copy; the variant then goes through the real feature extractor. The primitive is
`insert_time(trace, at, d)`: everything that starts at or after `at` moves `d` later, host ranges
open at `at` (ProfilerStep, enclosing ops) stretch by `d`, GPU work in flight moves with the rest;
then the events that explain the inserted time are added:

- `inject_sync`: `aten::item` -> `aten::_local_scalar_dense` -> `cudaStreamSynchronize` returning
  where the GPU then idles (the queue drained while the host waited, then refilled late);
- `inject_dataloader`: an `enumerate(DataLoader)#...__next__` range at each step start;
- `inject_dtod`: `Memcpy DtoD (Device -> Device)` copies (with their `cudaMemcpyAsync` calls);
- `delay_rank`: clones a rank into a multi-rank job and delays one rank before each collective,
  stretching the others' collectives by the wait (a straggler).

The cost of the injection (inserted GPU time over the new wall time) gives the label of the
injected pattern (>= 5% positive, < 1% negative); the source trace's LABELS.yaml labels carry over
where the injection cannot change them, and idle-gpu is re-judged from the new GPU busy share.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..features import intervals as iv
from ..features import names as N
from ..load import Job
from ..load.columns import INT_NONE, PH_COMPLETE, RankTrace
from ..models import PATTERN_IDS

POSITIVE_PCT = 5.0
NEGATIVE_PCT = 1.0


def clone_trace(t: RankTrace) -> RankTrace:
    """A copy to edit: its columns writable and in the loader's wide types (the loader keeps ids in
    the narrowest type that holds them and one-value columns as read-only broadcasts; new events get
    new correlation ids, new codes)."""
    c = copy.copy(t)
    for name in ("ts", "dur", "ph", "nbytes", "total_allocated"):
        setattr(c, name, getattr(t, name).copy())
    for name in ("cat", "name", "pid", "tid"):  # codes: int8 where a trace has under 128 names or categories
        setattr(c, name, getattr(t, name).astype(np.int32))
    for name in ("correlation", "stream", "device", "external_id"):
        setattr(c, name, getattr(t, name).astype(np.int64))
    c.names = list(t.names)
    c.cats = list(t.cats)
    c.pid_values = list(t.pid_values)
    c.tid_values = list(t.tid_values)
    return c


def _gpu_mask(t: RankTrace) -> np.ndarray:
    return t.mask_cat(*N.GPU_CATS) | t.mask_cat("gpu_user_annotation")


def insert_time(t: RankTrace, at: float, d: float, stretch: np.ndarray | None = None) -> None:
    """Open a gap of `d` us at time `at` (in place). `stretch`: event indices that stretch instead of moving."""
    insert_times(t, np.array([at]), np.array([d]), stretch)


def insert_times(t: RankTrace, at: np.ndarray, d: np.ndarray, stretch: np.ndarray | None = None) -> np.ndarray:
    """Open gaps d[i] at times at[i] (original coordinates), all at once, in place.

    An event moves by the gaps at or before its start; a host range also grows by the gaps strictly
    inside it; a GPU op is atomic and moves by every gap before its end. Returns, per gap, how far
    the gap itself moved (the sum of the gaps strictly before it)."""
    order = np.argsort(at, kind="stable")
    at, d = at[order], d[order]
    cum = np.concatenate([[0.0], np.cumsum(d)])
    end = t.ts + t.dur
    gpu = _gpu_mask(t)
    if stretch is not None and stretch.size:
        gpu = gpu.copy()
        gpu[stretch] = False
    before_start = cum[np.searchsorted(at, t.ts, side="right")]
    before_end = cum[np.searchsorted(at, end, side="left")]
    shift = np.where(gpu, np.maximum(before_start, before_end), before_start)
    grow = np.where(gpu, 0.0, np.maximum(before_end - before_start, 0.0))
    t.ts = t.ts + shift
    t.dur = t.dur + grow
    moved = np.empty(at.size)
    moved[order] = cum[:-1]
    return moved


def _code(values: list, v: Any) -> int:
    if v in values:
        return values.index(v)
    values.append(v)
    return len(values) - 1


@dataclass
class NewEvent:
    name: str
    cat: str
    ts: float
    dur: float
    host: bool = True
    correlation: int = INT_NONE
    stream: int = INT_NONE
    nbytes: float = float("nan")


def append_events(t: RankTrace, events: list[NewEvent], host_tid: int, host_pid: int, gpu_tid: int, gpu_pid: int,
                  device: int) -> None:
    if not events:
        return
    n = len(events)
    name = np.array([_code(t.names, e.name) for e in events], dtype=t.name.dtype)
    cat = np.array([_code(t.cats, e.cat) for e in events], dtype=t.cat.dtype)
    t.ts = np.concatenate([t.ts, [e.ts for e in events]])
    t.dur = np.concatenate([t.dur, [e.dur for e in events]])
    t.ph = np.concatenate([t.ph, np.full(n, PH_COMPLETE, dtype=t.ph.dtype)])
    t.cat = np.concatenate([t.cat, cat])
    t.name = np.concatenate([t.name, name])
    t.pid = np.concatenate([t.pid, np.array([host_pid if e.host else gpu_pid for e in events], dtype=t.pid.dtype)])
    t.tid = np.concatenate([t.tid, np.array([host_tid if e.host else gpu_tid for e in events], dtype=t.tid.dtype)])
    t.correlation = np.concatenate([t.correlation, np.array([e.correlation for e in events], dtype=t.correlation.dtype)])
    t.stream = np.concatenate([t.stream, np.array([e.stream for e in events], dtype=t.stream.dtype)])
    t.device = np.concatenate([t.device, np.array([INT_NONE if e.host else device for e in events], dtype=t.device.dtype)])
    t.external_id = np.concatenate([t.external_id, np.full(n, INT_NONE, dtype=t.external_id.dtype)])
    t.nbytes = np.concatenate([t.nbytes, [e.nbytes for e in events]])
    t.total_allocated = np.concatenate([t.total_allocated, np.full(n, np.nan)])


@dataclass
class Anatomy:
    """Where things are in a real trace: the host thread, the main GPU stream, steps, compute kernels."""

    host_tid: int
    host_pid: int
    gpu_tid: int
    gpu_pid: int
    stream: int
    device: int
    step_starts: np.ndarray
    kernel_ends: np.ndarray
    span: tuple[float, float]
    n_steps: int
    max_corr: int
    collectives: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))


def anatomy(t: RankTrace) -> Anatomy | None:
    x = t.ph == PH_COMPLETE
    kern = np.flatnonzero(t.mask_cat(*N.KERNEL_CATS) & x)
    if kern.size == 0:
        return None
    comm_codes = t.name_codes(N.is_comm_kernel)
    is_comm = np.isin(t.name[kern], comm_codes) if comm_codes.size else np.zeros(kern.size, bool)
    comp = kern[~is_comm] if (~is_comm).any() else kern
    streams, counts = np.unique(t.stream[comp], return_counts=True)
    stream = int(streams[np.argmax(counts)])
    on_stream = comp[t.stream[comp] == stream]
    g_i = int(on_stream[0])
    steps = np.flatnonzero(t.mask_names(N.is_profiler_step) & x & ~t.mask_cat("gpu_user_annotation"))
    host = np.flatnonzero(t.mask_cat(*N.RUNTIME_CATS) & x)
    if steps.size:
        h_i = int(steps[0])
    elif host.size:
        tids, c = np.unique(t.tid[host], return_counts=True)
        h_i = int(host[t.tid[host] == tids[np.argmax(c)]][0])
    else:
        h_i = int(np.flatnonzero(x & ~t.mask_cat(*N.GPU_CATS))[0])
    gpu = np.flatnonzero(t.mask_cat(*N.GPU_CATS) & x)
    corr_ok = t.correlation[t.correlation != INT_NONE]
    return Anatomy(
        host_tid=int(t.tid[h_i]), host_pid=int(t.pid[h_i]), gpu_tid=int(t.tid[g_i]), gpu_pid=int(t.pid[g_i]),
        stream=stream, device=int(t.device[g_i]) if t.device[g_i] != INT_NONE else 0,
        step_starts=np.sort(t.ts[steps]), kernel_ends=np.sort((t.ts + t.dur)[on_stream]),
        span=(float(t.ts[gpu].min()), float((t.ts + t.dur)[gpu].max())), n_steps=int(steps.size),
        max_corr=int(corr_ok.max()) if corr_ok.size else 0,
        collectives=kern[is_comm][np.argsort(t.ts[kern[is_comm]])],
    )


def busy_pct(t: RankTrace) -> float | None:
    gpu = np.flatnonzero(t.mask_cat(*N.GPU_CATS) & (t.ph == PH_COMPLETE))
    if gpu.size == 0:
        return None
    us, ue = iv.union(t.ts[gpu], t.ts[gpu] + t.dur[gpu])
    span = float(ue.max() - us.min())
    return 100.0 * float((ue - us).sum()) / span if span > 0 else 100.0


def wall_us(t: RankTrace) -> float:
    x = (t.ph == PH_COMPLETE) & ~t.mask_cat("Trace")
    return float((t.ts + t.dur)[x].max() - t.ts[x].min())


def _pick_points(a: Anatomy, rng: np.random.Generator, n: int) -> np.ndarray:
    """n distinct kernel-end times inside the GPU span (where the GPU was busy)."""
    ends = a.kernel_ends[(a.kernel_ends > a.span[0]) & (a.kernel_ends < a.span[1] - 1.0)]
    if ends.size == 0:
        return np.empty(0)
    return np.sort(rng.choice(ends, size=min(n, ends.size), replace=False))


def _insert_many(t: RankTrace, points: list[tuple[float, float]], make) -> tuple[float, list[NewEvent]]:
    """Insert gaps [(at, d)]; `make(at, d, k)` returns the events explaining each gap (original coordinates)."""
    if not points:
        return 0.0, []
    at = np.array([p[0] for p in points])
    d = np.array([p[1] for p in points])
    moved = insert_times(t, at, d)
    events: list[NewEvent] = []
    for k, (a, dd) in enumerate(points):
        for e in make(a, dd, k):
            e.ts += moved[k]
            events.append(e)
    return float(d.sum()), events


def inject_sync(t: RankTrace, rng: np.random.Generator, n: int, gap_us: float) -> float:
    a = anatomy(t)
    if a is None:
        return 0.0
    pts = [(float(p), gap_us * float(rng.uniform(0.6, 1.4))) for p in _pick_points(a, rng, n)]
    corr = a.max_corr + 1_000_000

    def make(at: float, d: float, k: int) -> list[NewEvent]:
        return [
            NewEvent("aten::item", "cpu_op", at - 30.0, 33.0),
            NewEvent("aten::_local_scalar_dense", "cpu_op", at - 29.0, 31.0),
            NewEvent("cudaStreamSynchronize", "cuda_runtime", at - 20.0, 20.5, correlation=corr + k),
        ]

    total, events = _insert_many(t, pts, make)
    append_events(t, events, a.host_tid, a.host_pid, a.gpu_tid, a.gpu_pid, a.device)
    return total


def inject_dataloader(t: RankTrace, rng: np.random.Generator, stall_us: float, workers: bool) -> float:
    a = anatomy(t)
    if a is None:
        return 0.0
    if a.step_starts.size:
        starts = [float(s) + 1.0 for s in a.step_starts]
    else:
        k = int(rng.integers(1, 4))
        starts = [a.span[0] + (a.span[1] - a.span[0]) * (i + 0.5) / k for i in range(k)]
    pts = [(s, stall_us * float(rng.uniform(0.7, 1.3))) for s in starts]
    it = "_MultiProcessingDataLoaderIter" if workers else "_SingleProcessDataLoaderIter"

    def make(at: float, d: float, k: int) -> list[NewEvent]:
        return [NewEvent(f"enumerate(DataLoader)#{it}.__next__", "user_annotation", at, d)]

    total, events = _insert_many(t, pts, make)
    append_events(t, events, a.host_tid, a.host_pid, a.gpu_tid, a.gpu_pid, a.device)
    return total


def inject_dtod(t: RankTrace, rng: np.random.Generator, n: int, each_us: float, gbps: float = 300.0) -> float:
    a = anatomy(t)
    if a is None:
        return 0.0
    pts = [(float(p), each_us * float(rng.uniform(0.5, 1.5))) for p in _pick_points(a, rng, n)]
    corr = a.max_corr + 2_000_000

    def make(at: float, d: float, k: int) -> list[NewEvent]:
        return [
            NewEvent("Memcpy DtoD (Device -> Device)", "gpu_memcpy", at, d, host=False, correlation=corr + k,
                     stream=a.stream, nbytes=d * gbps * 1e3),
            NewEvent("cudaMemcpyAsync", "cuda_runtime", at - 12.0, 5.0, correlation=corr + k),
        ]

    total, events = _insert_many(t, pts, make)
    append_events(t, events, a.host_tid, a.host_pid, a.gpu_tid, a.gpu_pid, a.device)
    return total


def delay_rank(job: Job, rng: np.random.Generator, world: int, delay_us: float) -> tuple[Job, float, int] | None:
    """Clone rank 0 into `world` ranks; one rank arrives late to every collective by ~delay_us.

    Returns the new job, the mean wait the other ranks spend per collective in total (us), and the
    straggler's rank."""
    base = job.ranks[0]
    a = anatomy(base)
    if a is None or a.collectives.size == 0:
        return None
    late = int(rng.integers(0, world))
    ranks = [clone_trace(base) for _ in range(world)]
    coll_ts = base.ts[a.collectives].copy()
    waits = [delay_us * float(rng.uniform(0.6, 1.4)) for _ in coll_ts]
    at = np.asarray(coll_ts, dtype=float)
    d = np.asarray(waits)
    for r, t in enumerate(ranks):
        if r == late:
            insert_times(t, at - 0.5, d)  # late: everything from just before each collective moves
        else:
            insert_times(t, at + 0.25, d, stretch=a.collectives)  # the others wait inside the collective
    infos = []
    for r, t in enumerate(ranks):
        t.rank = r
        t.metadata = dict(base.metadata, distributedInfo={"rank": r, "world_size": world, "backend": "nccl"})
        info = job.info.ranks[0].model_copy(update={"rank": r, "rank_source": "distributedInfo", "world_size": world})
        infos.append(info)
    new_info = job.info.model_copy(update={"ranks": infos, "world_size": world})
    return Job(info=new_info, ranks=ranks), float(sum(waits)), late


def relabel(base: dict[str, str], injected: str, cost_pct: float, inserted_share: float, busy_before: float | None,
            busy_after: float | None) -> dict[str, str]:
    """Labels of a variant: the injected pattern by its cost, idle-gpu by the new busy share, the rest carried over."""
    out = {p: base.get(p, "unknown") for p in PATTERN_IDS}
    for p, lab in list(out.items()):
        if lab == "positive" and p != injected and inserted_share > 0.3:
            out[p] = "unknown"  # its share of the (longer) wall time may have dropped below 5%
    if base.get(injected) == "positive":
        out[injected] = "positive"
    elif cost_pct >= POSITIVE_PCT:
        out[injected] = "positive"
    elif cost_pct < NEGATIVE_PCT and base.get(injected) == "negative":
        out[injected] = "negative"
    else:
        out[injected] = "unknown"
    if busy_after is not None:
        out["idle-gpu"] = "positive" if busy_after < 50 else "negative" if busy_after > 90 else "unknown"
    if injected != "launch-bound":
        lb = base.get("launch-bound", "unknown")
        if busy_after is not None and busy_after > 95:
            out["launch-bound"] = "negative"
        elif lb == "positive" and inserted_share < 0.1:
            out["launch-bound"] = "positive"  # the launch gaps still dominate the (little) added idle time
        else:
            out["launch-bound"] = "unknown"
    return out
