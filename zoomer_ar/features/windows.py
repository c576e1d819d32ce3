"""A rank's summary from time windows of its trace (issue #8: a trace of any size in bounded memory).

A huge rank file is cut into K time windows; each event lies in exactly one (a device event in the window
of the runtime call that launched it, any other by its start; metadata and `Trace` spans in every window;
the cuts at CPU-side ProfilerStep starts, else equal time slices). Each window is summarised on its own
(summarise_window: RankContext.window tells the feature parts to record the extra state below, under
RankFeatures.v keys "_w_*" and rank_phases' "_w") and the summaries are merged (merge_windows) into the
rank's summary: summarise_rank of the whole trace where the table says exact (to 1e-9 relative: sums in
another order, times in another base).

Edges and middles. Another window's device work meets a window's only at its edges: its head (its first
HEAD_MAX = 4096 busy intervals; none in the first window) and its tail (the work after its pivot, its last
runtime call or step start: what was still queued when the next window began, bounded by the device's
queue; none in the last window). A window keeps its busy, compute, copy and collective unions at the edges
as intervals (with the op each busy interval begins with), its middle as totals (lengths, intersections,
idle gaps by cause, phase split, per-step busy, 4096 points of busy time), so the merge rebuilds the unions,
the idle gaps between and around the windows and their causes exactly. It holds while no window's edge
reaches into another's middle: merged v "_w_union_overlap_us" measures that (0 on the corpus). State per
window: O(steps + edges + distinct kernel/launch durations), never O(events); the edges cap it near 0.5 MB
pickled however large the window (2-500 KB for the corpus windows).

Measured (tests/test_feature_windows.py): on the 7 corpus traces with >= 4 ProfilerSteps and a generated
54-step trace, each cut into 2 windows and into one window a step (also through surgery.partition's files
and the streaming reader, pruning on), every v value and every phase equal to 1e-9 relative, collectives
and their exposed times to 1e-6 us, the timeline within 0.46 busy-% points; the evidence the same events
but for ties (an equal-keyed event chosen at the cut-off: 4 traces) and short_kernels. On all 82 corpus
traces the loader reads, in 2, 3 and 5 windows (time slices where a trace has no steps): the same. In 20
windows, 2 traces differ where a host op is nested in one that began in an earlier window (approx, below):
linear_kineto's phases (139 us of 117 ms forward counted as backward), eager_trace's cpu_copy_ops (6 for 5).

Windows without device work (time slices) still record their launches, start-up candidates, steady
allocator calls, synchronisations and DataLoader calls (gpu.window_without_device); a graph capture begun in
one window and ended in a later one is paired by thread (startup.window_captures); start-up calls are told
by the rank's typical call (each API's durations as value counts in every window, the candidates' gaps in
the windows' middles kept to give them their start-up part: startup.window_startup, idle.window_startup_gaps).

| value(s) | rule | exact? |
|---|---|---|
| counts, *_total sums, *_ops, *_calls, startup_compiles, recompiles, captured_launches, memory_events | add | exact |
| has_gpu, has_accelerator, has_python_stacks, runtime_calls | any | exact |
| profiler_steps, n_steps | add; n_steps = max(1, steps) | exact |
| first_profiled_step | the first window's first step | exact |
| step_ms, step_ms_p50/p95/cv, first_step_ms | the concatenated steps (start, host end, device end): each from the previous one's completion across windows; GPU-side ProfilerStep ranges matched by name over all windows | exact |
| wall_ms, t0, phases' wall_us, start_unix_s | earliest start, latest end over the windows (absolute) | exact |
| gpu_span_ms | first device start .. last device end | exact |
| gpu_busy_pct | (middles' busy + union of all edges) / span | exact (no edge in a middle) |
| gpu_idle_ms_total, idle_{data,sync,host,other,startup,startup_host}_ms_total, idle_short_gap_share, host_idle_share | middles' gaps as the windows split them; the gaps of all edges and middles together split again (merged DataLoader calls and start-up calls, the synchronisations near the middles' ends, each interval's first op's launch end) | exact (no edge in a middle; at most 4096 syncs an edge) |
| gpu_idle_outside_span_ms_total | recomputed from merged steps and span | exact |
| gpu_busy_pct_steady | per step: its middle's busy + the edges' | exact |
| compute_ms_total, memory_exposed_ms_total, comm_ms_total, exposed_comm_ms_total, comm_overlap_pct | middles' lengths and intersections + the edges' unions | exact |
| kernel_dur_p50/p90_us, launch_dur_p50_us, kernel_to_launch_ratio | percentile / median of the merged value counts (numpy's arithmetic: percentile_of_counts) | exact |
| short_kernel_share, memcpy_dtod_pct_of_gpu_span, fp32_gemm_share, misaligned_gemm_share | merged numerators / denominators | exact |
| zero_grad_fill_ms_total | max(sum host, sum GPU) | exact |
| allocator_calls(_per_step), allocator_ms_per_step | each window's steady calls (the first window's from its 2nd step, later windows' all, the last window's to its last step's end) / (steps - 1) | exact |
| item_calls | _local_scalar_dense calls over all windows, else aten::item | exact |
| dataloader_workers | the first 50 DataLoader calls over the windows | exact |
| memory_peak_bytes | max | exact |
| memory_growth_* | the level at every step end (an earlier window's last where a window has none before it) | exact |
| startup_calls, idle_startup_* | candidates of the first window only where cut at steps (later ones: from_start off, their steps all steady), of every window in time slices; an outlier against its API's lower median over all windows' value counts; its idle part from the merged gaps and the candidates' middle gaps | exact (at most 256 candidates a window, the longest) |
| startup_compiles vs recompiles | first window: before its 2nd step (all of it with one step); later ones: recompiles | exact |
| host ops nested in one that began in an earlier window: cpu_copy_ops (outermost copies), optimizer/zero_grad inner ops, a compile window, the phase of device work launched inside a backward/optimizer/DataLoader op | the later window sees the inner op without its parent | approx: 2 of 82 traces at 20 windows, none at 2-5 |
| sync_calls | the profiler's stop sync dropped in the last window only | exact (a pageable copy and its sync across a cut: approx) |
| captured_launches | added; captures across cuts paired by thread (begin's window, end's window, launches between) | exact (idle time in a window wholly inside a capture: approx) |
| collectives, collectives_exposed | concatenated in start order into the first window's base; exposed less the other windows' compute at the edges | exact |
| evidence | concatenated, ts_ms shifted to the merged t0, re-ranked by evidence_keys else duration, 5 a kind (startup_calls 15); idle/sync gaps: the windows' middle gaps and the merged edge gaps | the same events but for ties; ts_ms +-2e-4 ms (rounded twice); short_kernels are the first 5 in window order (the whole's: file order); an edge gap whose cause changed has no frames nor "host was in" detail; Python frames that began in an earlier window are missing |
| timeline | edges exact, middles from 4096 points each, linear between; one window with device work: its own bins | approx: within 0.5 points on the corpus |
| phases *_us | gpu basis: the middles' splits + the rest split again with all edges' phase work; host basis: each window's split between its first 4096 host-phase intervals and its last host op's start, the rest split again with all windows' host ops outside those | exact (host: unless a host op open at a cut outlasts the next window's head) |
| v values only a window without device work has (launch_count, ...: gpu.NO_DEVICE_KEYS), its host-op GEMM times | kept where another window has device work (its GEMM ops then count no time, as in the whole) | exact |
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..load.columns import INT_NONE, PH_COMPLETE, PH_META, RankTrace
from ..load.job import rebase_times
from ..models import EvidenceEvent, TimelineBin
from . import intervals as iv
from . import names as N
from .context import EVIDENCE_PER_KIND, TIMELINE_BINS, TOL_US, RankFeatures
from .extract import RankSummary
from .gpu import NO_DEVICE_KEYS
from .startup import OUTLIER_MIN_US, OUTLIER_RATIO
from .phases import PHASES, _split, rank_phases, trace_start_unix_s
from .rank import rank_features

__all__ = ["summarise_window", "merge_windows", "window_rows", "window_trace", "percentile_of_counts",
           "median_of_counts"]


# ----------------------------------------------------------------------------------------- window summary


def summarise_window(trace: RankTrace, index: int, count: int) -> RankSummary:
    """summarise_rank of window `index` of `count` of one rank (the trace rebased to its own base), with the
    state merge_windows needs."""
    if not (isinstance(index, int) and isinstance(count, int) and 0 <= index < count):
        raise ValueError(f"summarise_window: window {index} of {count} does not exist")
    rf = rank_features(trace, window=(index, count))
    rf.v.pop("_gpu_union", None)  # O(events): the window's edges and totals stand for it
    g = rf.v.get("_w_gpu")
    mid = (g["head"], g["pivot"]) if g is not None else (np.inf, np.inf)
    return RankSummary(features=rf, phases=rank_phases(trace, mid), start_unix_s=trace_start_unix_s(trace),
                       runtime_calls=bool(set(N.RUNTIME_CATS) & set(trace.cats)))


# ----------------------------------------------------------------------------------------- percentiles


def merge_counts(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Value counts (np.unique(values, return_counts=True)) of several windows as one."""
    parts = [p for p in parts if p[0].size]
    if not parts:
        return np.empty(0), np.empty(0, dtype=np.int64)
    vals, inv = np.unique(np.concatenate([p[0] for p in parts]), return_inverse=True)
    counts = np.bincount(inv, weights=np.concatenate([p[1] for p in parts]).astype(np.float64), minlength=vals.size)
    return vals, counts.astype(np.int64)


def _value_at(vals: np.ndarray, cum: np.ndarray, k: int) -> float:
    """The k-th (0-based) value of the sorted multiset given by vals and cumulative counts cum."""
    return float(vals[int(np.searchsorted(cum, k, side="right"))])


def percentile_of_counts(vals: np.ndarray, counts: np.ndarray, q: float) -> float | None:
    """np.percentile(values, q) (linear interpolation, numpy's very arithmetic) of the values that the
    sorted distinct `vals` with `counts` stand for; None for none."""
    n = int(counts.sum())
    if n == 0:
        return None
    cum = np.cumsum(counts)
    virtual = (n - 1) * np.true_divide(q, 100)
    prev = int(np.floor(virtual))
    prev = min(max(prev, 0), n - 1)
    nxt = min(prev + 1, n - 1)
    gamma = np.float64(virtual - prev)
    a, b = np.float64(_value_at(vals, cum, prev)), np.float64(_value_at(vals, cum, nxt))
    diff = b - a
    return float(b - diff * (1 - gamma)) if gamma >= 0.5 else float(a + diff * gamma)


def median_of_counts(vals: np.ndarray, counts: np.ndarray) -> float | None:
    """np.median of the values (the mean of the two middle ones of an even count)."""
    n = int(counts.sum())
    if n == 0:
        return None
    cum = np.cumsum(counts)
    if n % 2:
        return _value_at(vals, cum, n // 2)
    return float(np.mean([_value_at(vals, cum, n // 2 - 1), _value_at(vals, cum, n // 2)]))


# ----------------------------------------------------------------------------------------- the merge

_ANY = ("has_python_stacks", "has_gpu", "has_accelerator")
_DERIVED = {  # recomputed below, not added
    "profiler_steps", "wall_ms", "first_profiled_step", "step_ms", "step_ms_p50", "step_ms_p95", "step_ms_cv",
    "first_step_ms", "n_steps", "gpu_span_ms", "gpu_busy_pct", "gpu_idle_outside_span_ms_total",
    "gpu_busy_pct_steady", "kernel_dur_p50_us", "kernel_dur_p90_us", "short_kernel_share", "launch_dur_p50_us",
    "kernel_to_launch_ratio", "idle_short_gap_share", "host_idle_share", "memcpy_dtod_pct_of_gpu_span",
    "comm_overlap_pct", "fp32_gemm_share", "misaligned_gemm_share", "misaligned_gemm_ms_total",
    "allocator_calls", "allocator_calls_per_step", "allocator_ms_per_step", "item_calls", "dataloader_workers",
    "zero_grad_fill_ms_total", "memory_peak_bytes", "memory_growth_bytes_per_step", "memory_growth_pct",
    "memory_growth_monotonic", "_gemm_source",
}


_HOST_GEMM = ("gemm_ms_total", "fp32_gemm_ms_total", "fp32_gemm_share", "misaligned_gemm_share", "misaligned_gemm_ms_total",
              "_gemm_source")


class _Windows:
    """The windows' summaries with each one's shift into the first window's time base (us)."""

    def __init__(self, parts: list[tuple[RankSummary, float]]):
        self.s = [p[0] for p in parts]
        self.rf = [s.features for s in self.s]
        self.gpu = any(rf.v.get("has_gpu") for rf in self.rf)
        self.v = [self._view(rf.v) for rf in self.rf]
        self.base = float(parts[0][1])
        self.sh = [float(b) - self.base for _, b in parts]
        self.exposed: dict[tuple[int, str], np.ndarray] = {}  # collectives' exposed times, merged (_merge_exposed)

    def _view(self, v: dict[str, Any]) -> dict[str, Any]:
        """A window's values as the merge reads them: in a rank with device work, a window without any times its
        GEMM ops by their (absent) kernels, as the whole rank does: none of its host-op GEMM times count."""
        if not self.gpu or v.get("has_gpu"):
            return v
        v = {k: x for k, x in v.items() if k not in _HOST_GEMM}
        if "conv_bias_ms_total" in v:
            v["conv_bias_ms_total"] = 0.0
        if "_w_gemm_ops" in v:
            v["_w_gemm_ops"] = (v["_w_gemm_ops"][0], 0.0, 0.0, 0.0)
        return v

    def values(self, key: str) -> list[Any]:
        return [v[key] for v in self.v if v.get(key) is not None]

    def total(self, key: str) -> float:
        return float(sum(self.values(key)))


def merge_windows(parts: list[tuple[RankSummary, float]]) -> tuple[RankSummary, float]:
    """The rank's summary from its windows' (summary, ts_base) in time order, in the first window's time
    base; and that base. The rules and where they are not exact: this module's docstring."""
    if not parts:
        raise ValueError("merge_windows: no windows to merge")
    for k, part in enumerate(parts):
        if not (isinstance(part, tuple) and len(part) == 2 and isinstance(part[0], RankSummary)
                and isinstance(part[1], (int, float)) and "_w_steps" in part[0].features.v):
            raise ValueError(f"merge_windows: part {k} is not (summarise_window's summary, its ts_base)")
    w = _Windows(parts)
    spans = [(v["_w_steps"]["t0"] + sh, v["_w_steps"]["t1"] + sh) for v, sh in zip(w.v, w.sh) if "_w_steps" in v
             and v["_w_steps"]["t1"] != v["_w_steps"]["t0"]]
    t0 = min((a for a, _ in spans), default=w.rf[0].t0)
    t1 = max((b for _, b in spans), default=t0)
    out: dict[str, Any] = {}
    for v in w.v:  # the first window's key order, then any key only later windows have
        for k in v:
            if not k.startswith("_w_") and k != "_gpu_union":
                out.setdefault(k, None)
    for k in list(out):
        vals = w.values(k)
        if k in _ANY:
            out[k] = any(vals)
        elif k in _DERIVED:
            out[k] = vals[0] if vals else None
        elif not vals:
            out[k] = None
        elif all(isinstance(x, bool) for x in vals):
            out[k] = any(vals)
        elif all(isinstance(x, int) and not isinstance(x, bool) for x in vals):
            out[k] = int(sum(vals))
        else:
            out[k] = float(sum(vals))
    rf = RankFeatures(rank=w.rf[0].rank, t0=t0)
    rf.v = out
    ev: dict[str, list[tuple[EvidenceEvent, float | None]]] = {}
    for f, sh in zip(w.rf, w.sh):
        move = (sh + f.t0 - t0) / 1000.0
        for kind, evs in f.evidence.items():
            if w.gpu and not f.v.get("has_gpu") and kind in ("fp32_gemm", "misaligned_gemm"):
                continue  # host-op GEMM evidence of a window without device work (see _Windows._view)
            if not w.gpu and kind in ("allocator", "startup_calls"):
                continue  # gpu_features' evidence: not in a rank without device work
            lst = ev.setdefault(kind, [])
            for e in evs:
                lst.append((e.model_copy(update={"ts_ms": round(e.ts_ms + move, 4)}), f.evidence_keys.get(id(e))))
    steps = _merge_steps(w, out, t0, t1)
    if out.get("has_gpu"):
        _merge_gpu(w, out, steps, t0, ev, rf)
    else:  # windows without device work record their launches for a rank that has some elsewhere
        for k in NO_DEVICE_KEYS:
            out.pop(k, None)
    _merge_host(w, out)
    _merge_memory(w, out, steps, t0, ev, rf.rank)
    _merge_collectives(w, rf)
    for kind, lst in ev.items():
        if kind == "short_kernels":  # the rank's first short kernels, not its longest
            kept = lst[:EVIDENCE_PER_KIND]
        else:
            lst.sort(key=lambda p: -(p[1] if p[1] is not None else p[0].dur_ms * 1000.0))
            kept = lst[: 3 * EVIDENCE_PER_KIND if kind == "startup_calls" else EVIDENCE_PER_KIND]
        rf.evidence[kind] = [e for e, _ in kept]
        rf.evidence_keys.update({id(e): key for e, key in kept if key is not None})
    phases = _merge_phases(w, t0, t1)
    starts = [s.start_unix_s for s in w.s if s.start_unix_s is not None]
    summary = RankSummary(features=rf, phases=phases, start_unix_s=min(starts) if starts else None,
                          runtime_calls=any(s.runtime_calls for s in w.s))
    return summary, w.base


def _merge_steps(w: _Windows, out: dict[str, Any], t0: float, t1: float) -> dict[str, Any]:
    names: list[str] = []
    cols: list[list[np.ndarray]] = [[], [], []]
    by_name: dict[str, float] = {}
    per_window: list[int] = []
    for v, sh in zip(w.v, w.sh):
        st = v.get("_w_steps") or {"names": [], "starts": np.empty(0), "ends": np.empty(0), "dev_end": np.empty(0),
                                   "ranges": {}}
        names += st["names"]
        per_window.append(len(st["names"]))
        for col, key in zip(cols, ("starts", "ends", "dev_end")):
            col.append(np.asarray(st[key], dtype=np.float64) + sh)
        for name, end in st["ranges"].items():
            by_name[name] = max(by_name.get(name, -np.inf), end + sh)
    starts, ends, dev_end = (np.concatenate(c) if c else np.empty(0) for c in cols)
    if by_name:  # the GPU-side ranges decide where any window has one (as device_ends does)
        dev_end = np.asarray([by_name.get(n, np.nan) for n in names], dtype=np.float64)
    order = np.argsort(starts, kind="stable")
    starts, ends, dev_end = starts[order], ends[order], dev_end[order]
    names = [names[i] for i in order.tolist()]
    n = starts.size
    out["profiler_steps"] = int(n)
    out["wall_ms"] = (t1 - t0) / 1000.0
    if n:
        out["first_profiled_step"] = N.profiler_step_number(names[0])
        done = np.maximum.accumulate(np.fmax(ends, dev_end))
        durs = np.diff(np.concatenate([starts[:1], done])) / 1000.0
        out["step_ms"] = float(durs.mean())
        out["step_ms_p50"] = float(np.median(durs))
        out["step_ms_p95"] = float(np.percentile(durs, 95))
        out["step_ms_cv"] = float(durs.std() / durs.mean()) if durs.mean() > 0 else None
        out["first_step_ms"] = float(durs[0])
    else:
        out["step_ms"] = out["wall_ms"]
    out["n_steps"] = max(1, int(n))
    return {"starts": starts, "ends": ends, "per_window": per_window}


def _shifted(w: _Windows, pairs: list[tuple[int, tuple[np.ndarray, np.ndarray]]]) -> tuple[np.ndarray, np.ndarray]:
    """The union of interval sets (window index, (starts, ends)) in the first window's base."""
    if not pairs:
        return np.empty(0), np.empty(0)
    return iv.union(np.concatenate([u[0] + w.sh[i] for i, u in pairs]), np.concatenate([u[1] + w.sh[i] for i, u in pairs]))


def _length(u: tuple[np.ndarray, np.ndarray]) -> float:
    return float((u[1] - u[0]).sum())


def _merge_gpu(w: _Windows, out: dict[str, Any], steps: dict[str, Any], t0: float,
               ev: dict[str, list[tuple[EvidenceEvent, float | None]]], rf: RankFeatures) -> None:
    dev = [(i, v["_w_gpu"], w.sh[i]) for i, v in enumerate(w.v) if "_w_gpu" in v]
    first = min(g["first"] + sh for _, g, sh in dev)
    last = max(g["last"] + sh for _, g, sh in dev)
    span = last - first
    # the busy union: each window's middle as it is, the edges of all windows together
    edge = _shifted(w, [(i, g["edge"]) for i, g, _ in dev])
    busy = sum(g["busy"] - _length(g["edge"]) for _, g, _ in dev) + _length(edge)
    blocks = [(g["block"][0] + sh, g["block"][1] + sh) for _, g, sh in dev if g["block"] is not None]
    out["_w_union_overlap_us"] = float(sum(iv.overlap_with(np.array([a]), np.array([b]), edge)[0] for a, b in blocks))
    out["gpu_span_ms"] = span / 1000.0
    out["gpu_busy_pct"] = 100.0 * busy / span if span > 0 else 100.0
    spanning = _spanning_captures(w)
    out["captured_launches"] = out.get("captured_launches", 0) + sum(x["n"] for x in spanning)
    startup = _startup_calls(w)
    out["startup_calls"] = len(startup)
    spans = [(x["b"], x["e"]) for x in spanning] + [(x["ts"] + w.sh[i], x["end"] + w.sh[i]) for i, x, _ in startup]
    _merge_idle(w, dev, out, t0, ev, spans)
    _startup_evidence(w, startup, first, last, edge, t0, ev)
    _capture_evidence(spanning, first, last, edge, t0, w.rf[0].rank, ev)
    starts = steps["starts"]
    if starts.size:
        n_steps = out["n_steps"]
        w0, w1 = float(starts[0]), float(starts[0]) + out["step_ms"] * 1000.0 * n_steps
        inside = max(0.0, min(w1, last) - max(w0, first))
        out["gpu_idle_outside_span_ms_total"] = max(0.0, (w1 - w0) - inside) / 1000.0
    steady = _steady(w, dev, steps, last, edge)
    if steady is not None:
        out["gpu_busy_pct_steady"] = steady
    else:
        out.pop("gpu_busy_pct_steady", None)
    # kernels and launches: value counts
    kc = merge_counts([v["_w_kernels"]["dur"] for v in w.v if "_w_kernels" in v])
    out["kernel_dur_p50_us"] = percentile_of_counts(*kc, 50)
    out["kernel_dur_p90_us"] = percentile_of_counts(*kc, 90)
    n_kern = int(kc[1].sum())
    out["short_kernel_share"] = sum(v["_w_kernels"]["short"] for v in w.v if "_w_kernels" in v) / n_kern if n_kern else None
    out["launch_dur_p50_us"] = percentile_of_counts(*merge_counts([v["_w_kernels"]["launch"] for v in w.v if "_w_kernels" in v]), 50)
    med = median_of_counts(*merge_counts([v["_w_kernels"]["per_kernel"] for v in w.v if "_w_kernels" in v]))
    if out["kernel_dur_p50_us"] is not None and med is not None and med > 0:
        out["kernel_to_launch_ratio"] = out["kernel_dur_p50_us"] / med
    else:
        out.pop("kernel_to_launch_ratio", None)
    out["memcpy_dtod_pct_of_gpu_span"] = 100.0 * out.get("memcpy_dtod_ms_total", 0.0) * 1000.0 / span if span > 0 else 0.0
    # compute, copies and collectives: middles as they are, edges together
    mids = [g["mid"] for _, g, _ in dev if "mid" in g]
    u = {k: _shifted(w, [(i, g["unions"][k]) for i, g, _ in dev if "unions" in g]) for k in ("compute", "mem", "comm")}
    comp = sum(m["compute"] for m in mids) + _length(u["compute"])
    mem = sum(m["mem"] for m in mids) + _length(u["mem"])
    comm = sum(m["comm"] for m in mids) + _length(u["comm"])
    mem_comp = sum(m["mem_compute"] for m in mids) + iv.intersection_total(u["mem"], u["compute"])
    comm_comp = sum(m["comm_compute"] for m in mids) + iv.intersection_total(u["comm"], u["compute"])
    out["compute_ms_total"] = comp / 1000.0
    out["memory_exposed_ms_total"] = (mem - mem_comp) / 1000.0
    if out.get("comm_kernel_count"):
        out["comm_ms_total"] = comm / 1000.0
        out["comm_overlap_pct"] = 100.0 * comm_comp / comm if comm > 0 else None
        out["exposed_comm_ms_total"] = (comm - comm_comp) / 1000.0
    if out.get("_gemm_source") != "host ops" and w.values("fp32_gemm_share"):
        out["fp32_gemm_share"] = float(out["fp32_gemm_ms_total"] * 1000.0 / max(out["gemm_ms_total"] * 1000.0, 1e-9))
    n = out["profiler_steps"]
    calls, dur = (sum(v["_w_alloc"][j] for v in w.v if "_w_alloc" in v) for j in (0, 1))
    if n < 2:
        calls, dur = 0, 0.0
        ev["allocator"] = []
    out["allocator_calls"] = int(calls)
    out["allocator_calls_per_step"] = calls / max(n - 1, 1)
    out["allocator_ms_per_step"] = float(dur) / 1000.0 / max(n - 1, 1)
    _merge_timeline(w, dev, first, last, t0, rf, edge)
    w.exposed = _merge_exposed(w, dev, u["compute"])


def _merge_exposed(w: _Windows, dev: list, comp_edge: tuple[np.ndarray, np.ndarray]) -> dict[tuple[int, str], np.ndarray]:
    """Each collective's time not overlapped by compute, with the other windows' compute at the edges in view:
    its window's value less the compute the other windows ran beside it. {(window, type): exposed}"""
    out = {}
    for i, g, sh in dev:
        own = (g["unions"]["compute"][0] + sh, g["unions"]["compute"][1] + sh) if "unions" in g else (np.empty(0), np.empty(0))
        f = w.rf[i]
        for ctype, (starts, durs) in f.collectives.items():
            if ctype in f.collectives_exposed:
                a, b = starts + sh, starts + sh + durs
                out[(i, ctype)] = f.collectives_exposed[ctype] - (iv.overlap_with(a, b, comp_edge) - iv.overlap_with(a, b, own))
    return out


def _steady(w: _Windows, dev: list, steps: dict[str, Any], last: float, edge: tuple[np.ndarray, np.ndarray]) -> float | None:
    """gpu.py's steady per-step busy: GPU-side step ranges where the rank has two, else its CPU steps; each
    step's busy time is its window's middle part plus the edges of all windows."""
    ranges = [(g["ranges"][0] + sh, g["ranges"][1] + sh, g["ranges"][2]) for _, g, sh in dev if "ranges" in g]
    if sum(r[0].size for r in ranges) >= 2:
        ws, we, own = (np.concatenate([r[j] for r in ranges]) for j in range(3))
        order = np.argsort(ws)
        ws, we, own = ws[order], we[order], own[order]
    elif steps["starts"].size >= 2:
        ws = steps["starts"]
        we = np.append(ws[1:], max(float(steps["ends"][-1]), last))
        own_parts = []
        for v, k in zip(w.v, steps["per_window"]):
            g = v.get("_w_gpu")
            own_parts.append(g["step_busy"] if g is not None and "step_busy" in g else np.zeros(k))
        own = np.concatenate(own_parts)
    else:
        return None
    per = (own + iv.overlap_with(ws, we, edge)) / np.maximum(we - ws, 1e-9) * 100.0
    per = per[1:] if per.size >= 3 else per
    return float(np.median(per))


_PARTS = ("data", "sync", "host", "other", "startup", "startup_host")


def _spanning_captures(w: _Windows) -> list[dict[str, Any]]:
    """Stream captures begun in one window and ended in a later one (startup.window_captures) that the rank
    counts: their start and end (first window's base), launches, begin call and its frames, and the busy time
    of the windows' middles during them."""
    caps = [v.get("_w_captures") or {"open": {}, "lead": {}, "launches": {}, "bounded": []} for v in w.v]
    out = []
    for k, cap in enumerate(caps):
        for th, o in cap["open"].items():
            n, busy = o[1], (o[5] if len(o) > 5 else 0.0)
            for j in range(k + 1, len(caps)):
                if th in caps[j]["lead"]:
                    lead = caps[j]["lead"][th]
                    if o[2]:
                        out.append({"b": o[0] + w.sh[k], "e": lead[0] + w.sh[j], "n": n + lead[1], "name": o[3],
                                    "frames": o[4], "mid_busy": busy + (lead[2] if len(lead) > 2 else 0.0)})
                    break
                if th in caps[j].get("bounded", []):  # begun again before it ended: not a capture
                    break
                n += caps[j]["launches"].get(th, 0)
                busy += caps[j].get("mid_busy", 0.0)
    return out


def _capture_evidence(spanning: list[dict[str, Any]], first: float, last: float, edge: tuple[np.ndarray, np.ndarray],
                      t0: float, rank: int, ev: dict[str, list[tuple[EvidenceEvent, float | None]]]) -> None:
    """idle.py's evidence of a capture, for those across cuts."""
    for x in spanning:
        a, b = x["b"], x["e"]
        busy = x["mid_busy"] + float(iv.overlap_with(np.array([a]), np.array([b]), edge)[0])
        idle = max(0.0, min(b, last) - max(a, first) - busy) if b > first and a < last else 0.0
        e = EvidenceEvent.model_construct(
            name=f"graph capture ({x['name'][:60]} .. end)", rank=rank, ts_ms=round((a - t0) / 1000.0, 4),
            dur_ms=round((b - a) / 1000.0, 4), stream=None, category="capture",
            detail=f"{x['n']} launch{'es' if x['n'] != 1 else ''} recorded into a graph, not run; the GPU was idle for "
                   f"{idle / 1000.0:,.3f} ms of it", frames=list(x["frames"]))
        ev.setdefault("startup_calls", []).append((e, idle + (b - a) * 1e-12))


def _merge_idle(w: _Windows, dev: list, out: dict[str, Any], t0: float,
                ev: dict[str, list[tuple[EvidenceEvent, float | None]]], spans: list[tuple[float, float]]) -> None:
    """idle.py over the merged windows: the gaps inside each window's middle as the window found them; the
    others (between the windows' edges and middles, all windows together) found again with their causes."""
    # edges and middles as one set of intervals, each with the op it begins with: (start, end, name, launch end)
    items = []
    for i, g, sh in dev:
        names, launch_end = g["edge_ops"]
        e0, e1 = g["edge"]
        for k in range(e0.size):
            items.append((float(e0[k]) + sh, float(e1[k]) + sh, names[k], float(launch_end[k]) + sh, i))
        if g["block"] is not None:
            items.append((g["block"][0] + sh, g["block"][1] + sh, names[-1], float(launch_end[-1]) + sh, i))
    items.sort(key=lambda x: x[0])
    merged: list[list] = []
    for it in items:  # iv.union's rule: a new interval where one starts after all before it ended
        if merged and not it[0] > merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], it[1])
        else:
            merged.append(list(it))
    dl = _shifted(w, [(i, v["_w_idle"]["dl"]) for i, v in enumerate(w.v) if "_w_idle" in v])
    one_off = _shifted(w, [(i, v["_w_idle"]["one_off"]) for i, v in enumerate(w.v) if "_w_idle" in v]
                       + [(0, (np.array([a for a, _ in spans]), np.array([b for _, b in spans])))])
    syncs = sorted(((a + w.sh[i], b + w.sh[i], name, fr) for i, v in enumerate(w.v) if "_w_idle" in v
                    for a, b, name, fr in v["_w_idle"]["syncs"]), key=lambda x: x[1])
    sync_ends = np.array([x[1] for x in syncs])
    inner = [v["_w_idle"]["inner"] for v in w.v if "_w_idle" in v]
    tot = {k: sum(s[k] for s in inner) for k in (*_PARTS, "idle", "short")}
    rank = w.rf[0].rank
    # the windows' own evidence of inner gaps stays; the edge gaps' is made here (the window's where the same)
    own: dict[str, list[tuple[float, float, EvidenceEvent]]] = {"idle_gaps": [], "sync_gaps": []}
    for i, g, sh in dev:
        wi = w.v[i].get("_w_idle", {})
        for kind, key in (("idle_gaps", "shown"), ("sync_gaps", "shown_sync")):
            for (a, b), e in zip(wi.get(key, []), w.rf[i].evidence.get(kind, [])):
                own[kind].append((a + sh, b + sh, e.model_copy(update={"ts_ms": round((a + sh - t0) / 1000.0, 4)})))
    blocks = [(g["block"][0] + sh, g["block"][1] + sh) for _, g, sh in dev if g["block"] is not None]

    def is_inner(a: float, b: float) -> bool:
        return any(lo <= a and b <= hi for lo, hi in blocks)

    cand: dict[str, list[tuple[float, EvidenceEvent]]] = {
        kind: [(b - a, e) for a, b, e in lst if is_inner(a, b)] for kind, lst in own.items()}
    for prev, nxt in zip(merged, merged[1:]):
        g0, g1 = prev[1], nxt[0]
        glen = g1 - g0
        host = bool(np.nan_to_num(nxt[3], nan=-np.inf) > g0 + 1.0)
        k = int(np.searchsorted(sync_ends, g0 - TOL_US)) if sync_ends.size else 0
        parts, sync = _split_gap(g0, g1, dl, one_off, syncs[k:k + 1], host)
        for key in _PARTS:
            tot[key] += parts[key]
        tot["idle"] += glen
        tot["short"] += glen if glen < 50.0 else 0.0
        rest = glen - parts["data"]
        cause = "data" if parts["data"] >= rest else "sync" if sync else "host" if host else "other"
        # the event is made only for the gaps that stay among the shown (_keep_top): an event per gap of
        # every window's edges cost 60 MB in a merge of 8 windows
        _keep_top(cand["idle_gaps"], (glen, ("idle", g0, g1, glen, nxt[2], cause, sync)))
        if sync is not None:
            _keep_top(cand["sync_gaps"], (glen, ("sync", g0, g1, glen, None, cause, sync)))
    # the gaps in windows' middles that start-up candidates overlap: their start-up part with the rank's calls
    for i, v in enumerate(w.v):
        sg = v.get("_w_idle", {}).get("sensitive")
        if sg is None or not sg["g0"].size:
            continue
        g0, g1 = sg["g0"] + w.sh[i], sg["g1"] + w.sh[i]
        st = np.minimum(iv.overlap_with(g0, g1, one_off), g1 - g0)
        tot["startup"] += float((st - sg["startup"]).sum())
        tot["startup_host"] += float((np.minimum(st, sg["rest"]) - np.minimum(sg["startup"], sg["rest"]))[sg["host"]].sum())
    for k in _PARTS:
        out[f"idle_{k}_ms_total"] = tot[k] / 1000.0
    out["gpu_idle_ms_total"] = tot["idle"] / 1000.0
    out["idle_short_gap_share"] = float(tot["short"] / tot["idle"]) if tot["idle"] > 0 else None
    out["host_idle_share"] = float(tot["host"] / tot["idle"]) if tot["idle"] > 0 else None
    ev.pop("idle_gaps", None)
    ev.pop("sync_gaps", None)
    def made(spec: Any) -> EvidenceEvent:
        if isinstance(spec, EvidenceEvent):
            return spec
        what, g0, g1, glen, nxt_name, cause, sync = spec
        if what == "idle":
            same = next((e for a, b, e in own["idle_gaps"] if abs(a - g0) < 1e-6 and abs(b - g1) < 1e-6
                         and e.detail.startswith(f"cause: {cause}")), None)
            if same is None:
                detail, frames = f"cause: {cause}", []
                if cause == "sync" and sync is not None:
                    detail, frames = f"{detail} (after {sync[2][:80]})", sync[3]
                same = _span(f"GPU idle before {nxt_name[:120]}", g0, glen, t0, rank, detail, frames)
            return same
        s_same = next((e for a, b, e in own["sync_gaps"] if abs(a - g0) < 1e-6 and abs(b - g1) < 1e-6), None)
        return s_same or _span("GPU idle after a host synchronisation", g0, glen, t0, rank,
                               f"the queue drained while the host waited in {sync[2][:80]}, then refilled", sync[3])

    for kind, lst in cand.items():
        if lst:
            lst.sort(key=lambda x: -x[0])
            ev[kind] = [(made(e), None) for _, e in lst[:EVIDENCE_PER_KIND]]
    return tot


def _keep_top(lst: list, item: tuple) -> None:
    """Append `item` (key first) to `lst`, which is cut back to the EVIDENCE_PER_KIND largest keys now and then
    (a stable sort: among equal keys the earlier stay first, as a sort of every item would keep them)."""
    lst.append(item)
    if len(lst) > 64:
        lst.sort(key=lambda x: -x[0])
        del lst[EVIDENCE_PER_KIND:]


def _startup_calls(w: _Windows) -> list[tuple[int, dict, float]]:
    """startup.startup_calls over all windows: the candidates (startup.window_startup) at least OUTLIER_RATIO
    times their API's typical call in the rank (the lower median of its calls in every window).
    [(window, candidate, typical us)] in time order."""
    ws = [v.get("_w_startup") for v in w.v]
    want = {x["api"] for x in (c for s in ws if s for c in s["candidates"])}
    typical = {}
    for api in want:
        vals, counts = merge_counts([s["apis"][api] for s in ws if s and api in s["apis"]])
        cum = np.cumsum(counts)
        typical[api] = _value_at(vals, cum, (int(cum[-1]) - 1) // 2)
    out = [(i, x, typical[x["api"]]) for i, s in enumerate(ws) if s for x in s["candidates"]
           if x["dur"] >= OUTLIER_MIN_US and x["dur"] >= OUTLIER_RATIO * typical[x["api"]]]
    return sorted(out, key=lambda o: o[1]["ts"] + w.sh[o[0]])


def _startup_evidence(w: _Windows, startup: list[tuple[int, dict, float]], first: float, last: float,
                      edge: tuple[np.ndarray, np.ndarray], t0: float,
                      ev: dict[str, list[tuple[EvidenceEvent, float | None]]]) -> None:
    """idle.py's start-up evidence: the calls by the GPU idle time inside them (then their length), with the
    typical call and the device op they queued."""
    if not startup:
        return
    shown = []
    for i, x, typ in startup:
        sh = w.sh[i]
        a, b = x["ts"] + sh, x["end"] + sh
        busy = x.get("mid_busy", 0.0) + float(iv.overlap_with(np.array([a]), np.array([b]), edge)[0])
        idle = max(0.0, min(b, last) - max(a, first)) - busy if b > first and a < last else 0.0
        times = f"{x['dur'] / typ:,.0f}x" if typ > 0 else "far above"
        text = f"{times} the typical {x['api'][:60]} ({typ:,.1f} us)"
        if x["device_op"] is not None:
            text += f", for {x['device_op']}"
        text += f"; the GPU was idle for {idle / 1000.0:,.3f} ms of it" if idle > 0 else "; the GPU was busy meanwhile"
        e = x["event"]
        move = (sh + w.rf[i].t0 - t0) / 1000.0
        shown.append((e.model_copy(update={"ts_ms": round(e.ts_ms + move, 4), "detail": text}), idle + x["dur"] * 1e-12))
    shown.sort(key=lambda p: -p[1])
    ev.setdefault("startup_calls", []).extend(shown[:EVIDENCE_PER_KIND])


def _split_gap(g0: float, g1: float, dl_u: tuple, one_off: tuple, syncs: list,
               host: bool) -> tuple[dict[str, float], tuple | None]:
    """idle.py's split of one gap [g0, g1] into data, sync, host and other, and its start-up parts: from the
    merged DataLoader and start-up unions, the synchronisation that ends first at or after g0 - TOL_US (a list
    of at most one) and whether the next op's launch ended after g0. (parts us, the synchronisation it followed)"""
    glen = g1 - g0
    a, b = np.array([g0]), np.array([g1])
    data = min(float(iv.overlap_with(a, b, dl_u)[0]), glen) if dl_u[0].size else 0.0
    rest = glen - data
    cand = syncs[0] if syncs else None
    sync = cand is not None and cand[1] >= g0 - TOL_US and cand[1] <= g1 and cand[0] < g0
    st = min(float(iv.overlap_with(a, b, one_off)[0]), glen) if one_off[0].size else 0.0
    hb = not sync and host
    return ({"data": data, "sync": rest if sync else 0.0, "host": rest if hb else 0.0,
             "other": rest if not sync and not host else 0.0, "startup": st, "startup_host": min(st, rest) if hb else 0.0},
            cand if sync else None)


def _span(name: str, start: float, dur: float, t0: float, rank: int, detail: str, frames: list) -> EvidenceEvent:
    return EvidenceEvent.model_construct(name=name, rank=rank, ts_ms=round((start - t0) / 1000.0, 4),
                                         dur_ms=round(dur / 1000.0, 4), stream=None, category="idle", detail=detail,
                                         frames=list(frames))


def _merge_timeline(w: _Windows, dev: list, first: float, last: float, t0: float, rf: RankFeatures,
                    edge: tuple[np.ndarray, np.ndarray]) -> None:
    """RankFeatures.timeline of the rank: each bin's busy time at the windows' edges exactly, in their middles
    from the middles' busy time at 4096 evenly spaced points each (linear between them)."""
    edges = np.linspace(first, last, TIMELINE_BINS + 1)
    busy = iv.overlap_with(edges[:-1], edges[1:], edge)
    for _, g, sh in dev:
        if "mid_cum" in g:
            lo, hi, cum = g["mid_cum"]
            at = np.interp(edges, np.linspace(lo, hi, cum.size) + sh, cum)
            busy += np.diff(at)
    cov = np.clip(busy / np.maximum(np.diff(edges), 1e-9) * 100.0, 0.0, 100.0)
    own = w.rf[dev[0][0]].timeline() if len(dev) == 1 else []
    if len(own) == TIMELINE_BINS:  # one window with device work: its own bins are the rank's
        cov = np.array([b.busy_pct for b in own])
    rf._timeline = [TimelineBin.model_construct(t_ms=round((a - t0) / 1000.0, 3), busy_pct=round(b, 2))
                    for a, b in zip(edges[:-1].tolist(), cov.tolist())]


def _merge_host(w: _Windows, out: dict[str, Any]) -> None:
    items = [v["_w_items"] for v in w.v if "_w_items" in v]
    if items:
        scalar = sum(a for a, _ in items)
        out["item_calls"] = int(scalar if scalar else sum(b for _, b in items))
    flags = [f for v in w.v for f in v.get("_w_dl_workers", [])]
    if flags:
        out["dataloader_workers"] = any(flags[:50])
    if "zero_grad_fill_ms_total" in out:
        gpu = out.get("zero_grad_fill_gpu_ms_total")
        out["zero_grad_fill_ms_total"] = max(out.get("zero_grad_fill_host_ms_total", 0.0), gpu or 0.0)
    ops = [v["_w_gemm_ops"] for v in w.v if "_w_gemm_ops" in v]
    n_ops, gemm, mis, fp32 = (sum(o[j] for o in ops) for j in range(4))
    if n_ops and gemm > 0:
        out["misaligned_gemm_share"] = mis / gemm
        out["misaligned_gemm_ms_total"] = mis / 1000.0
        if out.get("_gemm_source") == "host ops":
            out["fp32_gemm_share"] = fp32 / gemm
    peaks = w.values("memory_peak_bytes")
    if peaks:
        out["memory_peak_bytes"] = float(max(peaks))


def _merge_memory(w: _Windows, out: dict[str, Any], steps: dict[str, Any], t0: float,
                  ev: dict[str, list[tuple[EvidenceEvent, float | None]]], rank: int) -> None:
    """memory.py's growth over all step ends: each window's levels, an earlier window's last where it has none."""
    growth = ("memory_growth_bytes_per_step", "memory_growth_pct", "memory_growth_monotonic")
    for k in growth:  # none unless measured below
        out[k] = None
    ev.pop("memory", None)
    best = _growth(w, steps)
    if best is None:
        for k in growth:
            out.pop(k)
        return
    out["memory_growth_bytes_per_step"], out["memory_growth_pct"], out["memory_growth_monotonic"], dev = best
    ends = steps["ends"]
    mems = [v.get("_w_memory") for v in w.v]
    frames = next((m[dev]["frames"] for m in reversed(mems) if m and dev in m), [])
    ev["memory"] = [(EvidenceEvent(
        name=f"allocated memory at step ends ({'host memory' if dev < 0 else f'device {dev}'})",
        rank=rank, ts_ms=round((float(ends[0]) - t0) / 1000.0, 4), dur_ms=round(float(ends[-1] - ends[0]) / 1000.0, 4),
        category="[memory]", detail=f"grows {best[0] / 2**20:.2f} MiB per step ({best[1]:.1f}% over the window)",
        frames=frames), None)]


def _growth(w: _Windows, steps: dict[str, Any]) -> tuple[float, float, bool, int] | None:
    ends = steps["ends"]
    mems = [v.get("_w_memory") for v in w.v]
    devices = sorted({d for m in mems if m for d in m})
    if ends.size < 3 or not devices:
        return None
    best = None
    for dev in devices:
        levels, prev = [], np.nan
        for m, k in zip(mems, steps["per_window"]):
            got = (m or {}).get(dev)
            lv = np.full(k, prev) if got is None else np.where(np.isnan(got["levels"]), prev, got["levels"])
            levels.append(lv)
            if got is not None:
                prev = got["last"][1]
        level = np.concatenate(levels) if levels else np.empty(0)
        level = level[~np.isnan(level)]
        if level.size < 3:
            continue
        slope = float(np.polyfit(np.arange(level.size), level, 1)[0])
        growth = 100.0 * (level[-1] - level[0]) / max(level[0], 1.0)
        mono = bool(np.all(np.diff(level) >= -1024))
        if best is None or slope > best[0]:
            best = (slope, growth, mono, dev)
    return best


def _merge_collectives(w: _Windows, rf: RankFeatures) -> None:
    types = list(dict.fromkeys(c for f in w.rf for c in f.collectives))
    for ctype in types:
        got = [(f.collectives[ctype], w.exposed.get((i, ctype), f.collectives_exposed.get(ctype)), sh)
               for i, (f, sh) in enumerate(zip(w.rf, w.sh)) if ctype in f.collectives]
        starts = np.concatenate([c[0] + sh for c, _, sh in got])
        durs = np.concatenate([c[1] for c, _, _ in got])
        order = np.argsort(starts, kind="stable")
        rf.collectives[ctype] = (starts[order], durs[order])
        if all(e is not None for _, e, _ in got):
            rf.collectives_exposed[ctype] = np.concatenate([e for _, e, _ in got])[order]


def _merge_phases(w: _Windows, t0: float, t1: float) -> dict[str, Any]:
    """rank_phases of the rank: on a device basis, each window's middle as it split it, the rest of the wall
    window split again with every window's device work outside its middle; on a host basis, each window's split
    between its head and its last host op's start, the rest split again with all windows' host ops outside
    those (exact unless a host op open at a cut outlasts the next window's head)."""
    measured = [s.phases for s in w.s if s.phases.get("basis")]
    bases = {p["basis"] for p in measured}
    out: dict[str, Any] = {"basis": ("gpu" if "gpu" in bases else "host") if bases else None, "wall_us": 0.0,
                           **{f"{p}_us": 0.0 for p in PHASES}}
    if not measured or t1 <= t0:
        return out
    out["wall_us"] = t1 - t0
    parts = [(s.phases["_w"], sh) for s, sh in zip(w.s, w.sh) if "_w" in s.phases]
    if out["basis"] == "gpu" and parts:
        for p in PHASES:
            out[f"{p}_us"] = float(sum(x["split"][p] for x, _ in parts if x["split"] is not None))
        unions = {}
        for p in PHASES:
            u = _shifted(w, [(i, s.phases["_w"]["edges"][p]) for i, s in enumerate(w.s)
                             if "_w" in s.phases and p in s.phases["_w"]["edges"]])
            if u[0].size:
                unions[p] = u
        dl = _shifted(w, [(i, s.phases["_w"]["dl"]) for i, s in enumerate(w.s) if "_w" in s.phases])
        mids = sorted((x["mid"][0] + sh, x["mid"][1] + sh) for x, sh in parts if x["split"] is not None)
        at = t0
        for lo, hi in mids + [(t1, t1)]:  # the wall window outside the middles
            if lo > at:
                for p, us in _split(at, min(lo, t1), unions, dl).items():
                    out[f"{p}_us"] += us
            at = max(at, hi)
        return out
    host = [(s.phases["_w"]["host"], sh) for s, sh in zip(w.s, w.sh) if "host" in s.phases.get("_w", {})]
    for p in PHASES:
        out[f"{p}_us"] = float(sum(x["split"][p] for x, _ in host))
    tails = {}
    for p in PHASES:
        got = [(i, s.phases["_w"]["host"]["tails"][p]) for i, s in enumerate(w.s)
               if "host" in s.phases.get("_w", {}) and p in s.phases["_w"]["host"]["tails"]]
        u = _shifted(w, got)
        if u[0].size:
            tails[p] = u
    none = (np.empty(0), np.empty(0))
    at = t0
    for lo, hi in sorted((x["range"][0] + sh, x["range"][1] + sh) for x, sh in host) + [(t1, t1)]:
        if lo > at:  # between one window's last host op start and the next window's first
            for p, us in _split(at, min(lo, t1), tails, none).items():
                out[f"{p}_us"] += us
        at = max(at, hi)
    return out


# ----------------------------------------------------------------------------------------- an in-memory cutter


def window_rows(trace: RankTrace, count: int) -> list[np.ndarray]:
    """The rows of each of `count` time windows of a loaded rank (for tests: surgery.partition's rules in
    memory). Cuts at the CPU-side starts of ProfilerStep#N, steps grouped evenly (at most one window a step),
    else equal time slices; a device event goes with the runtime call that launched it (correlation id), any other row by its
    start; metadata rows and `Trace` spans go to every window. Rows in file order."""
    t = trace
    x = t.ph == PH_COMPLETE
    steps = np.flatnonzero(t.mask_names(N.is_profiler_step) & ~t.mask_cat("gpu_user_annotation") & x)
    step_ts = np.sort(t.ts[steps])
    if step_ts.size:  # never more windows than steps (surgery.partition's rule): one step, one window
        count = max(1, min(count, step_ts.size))
        cuts = np.array([step_ts[(k * step_ts.size) // count] for k in range(1, count)])
    else:
        allx = x & ~t.mask_cat("Trace")
        a, b = (float(t.ts[allx].min()), float((t.ts[allx] + t.dur[allx]).max())) if allx.any() else (0.0, 0.0)
        cuts = a + (b - a) * np.arange(1, count) / count
    ts = np.nan_to_num(np.asarray(t.ts, dtype=np.float64), nan=-np.inf)
    win = np.searchsorted(cuts, ts, side="right")
    runtime = np.flatnonzero(t.mask_cat(*N.RUNTIME_CATS) & x & (t.correlation != INT_NONE))
    device = np.flatnonzero(t.mask_cat(*N.GPU_CATS, *N.ACCEL_ONLY_CATS) & (t.correlation != INT_NONE))
    if runtime.size and device.size:
        corr = t.correlation[runtime].astype(np.int64)
        order = np.argsort(corr, kind="stable")
        keys, rows = corr[order], runtime[order]
        want = t.correlation[device].astype(np.int64)
        pos = np.clip(np.searchsorted(keys, want), 0, keys.size - 1)
        hit = keys[pos] == want
        win[device[hit]] = win[rows[pos[hit]]]
    every = (t.ph == PH_META) | t.mask_cat("Trace")
    return [np.flatnonzero((win == k) | every) for k in range(count)]


_COLUMNS = ("ts", "dur", "ph", "cat", "name", "pid", "tid", "correlation", "stream", "device", "external_id",
            "nbytes", "total_allocated")
_SPARSE = ("input_dims", "input_type", "call_stack", "collective", "msg_nelems", "python_id")


def window_trace(trace: RankTrace, rows: np.ndarray) -> RankTrace:
    """The rank's rows `rows` (sorted) as a trace of their own, rebased to their own base (load.job.rebase_times)."""
    cols: dict[str, Any] = {}
    for f in _COLUMNS:
        a = getattr(trace, f)
        cols[f] = np.broadcast_to(a[:1], (rows.size,)) if a.ndim == 1 and a.strides == (0,) and a.size else a[rows]
    cols["ts"] = np.asarray(cols["ts"], dtype=np.float64) + trace.ts_base  # absolute again: exact (whole us)
    sparse: dict[str, Any] = {}
    for f in _SPARSE:
        d = getattr(trace, f)
        keys = np.fromiter(d.keys(), dtype=np.int64, count=len(d)) if d else np.empty(0, dtype=np.int64)
        pos = np.searchsorted(rows, keys)
        hit = (pos < rows.size) & (rows[np.minimum(pos, max(rows.size - 1, 0))] == keys) if rows.size else pos < 0
        sparse[f] = {p: v for p, v, h in zip(pos.tolist(), d.values(), hit.tolist()) if h}
    out = replace(trace, **cols, **sparse, metadata=dict(trace.metadata), thread_names=dict(trace.thread_names),
                  process_names=dict(trace.process_names), ts_base=0.0)
    rebase_times([out])
    return out
