"""Per-rank feature extraction: everything that can be measured inside one rank's trace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..load.columns import INT_NONE, PH_COMPLETE, PH_INSTANT, RankTrace, row_positions
from ..models import EvidenceEvent, TimelineBin
from . import intervals as iv
from . import names as N
from . import syncs as S
from .frames import FrameIndex

TOL_US = 50.0  # tolerance when relating host calls to GPU idle edges
EVIDENCE_PER_KIND = 5


@dataclass
class RankFeatures:
    rank: int
    v: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, list[EvidenceEvent]] = field(default_factory=dict)
    # what each evidence event was chosen by, where not its duration (us; e.g. a GEMM op's GPU time, a
    # collective's exposed time): the job's evidence keeps that order when it merges the ranks'
    evidence_keys: dict[int, float] = field(default_factory=dict)  # id(event) -> key
    collectives: list[tuple[str, float, float]] = field(default_factory=list)  # (type, ts, dur) in order
    t0: float = 0.0  # the rank's first complete event: evidence times (ts_ms) are relative to it
    _timeline_of: tuple[np.ndarray, np.ndarray, float] | None = None  # (union starts, ends, t0)

    def timeline(self, bins: int = 120) -> list[TimelineBin]:
        """GPU busy % in `bins` equal slices of the GPU's span, for the report; computed when asked
        (a job's report shows one rank's)."""
        if self._timeline_of is None:
            return []
        us, ue, t0 = self._timeline_of
        edges = np.linspace(float(us.min()), float(ue.max()), bins + 1)
        cov = iv.overlap_with(edges[:-1], edges[1:], (us, ue)) / np.maximum(np.diff(edges), 1e-9) * 100.0
        return [  # plain floats, validated by construction: model_construct skips pydantic's checks
            TimelineBin.model_construct(t_ms=round((a - t0) / 1000.0, 3), busy_pct=round(b, 2))
            for a, b in zip(edges[:-1].tolist(), cov.tolist())
        ]


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


class _Ctx:
    """Shared per-rank state: masks, step windows, frame index, evidence builder."""

    def __init__(self, trace: RankTrace):
        self.t = trace
        self.x = trace.ph == PH_COMPLETE
        self.end = trace.end
        self.frames = FrameIndex(trace)
        host = trace.mask_cat(*N.HOST_CATS) & self.x
        gpu = trace.mask_cat(*N.GPU_CATS) & self.x
        allx = self.x & ~trace.mask_cat("Trace")
        self.t0 = float(trace.ts[allx].min()) if allx.any() else 0.0
        self.t1 = float(self.end[allx].max()) if allx.any() else 0.0
        self.host = host
        self.gpu = gpu
        self.gpu_cats = set(trace.cat_code(*N.GPU_CATS))
        self.launch_lookup: tuple[np.ndarray, np.ndarray] | None = None  # set by _gpu: evidence frames from then on
        self._launches: tuple[np.ndarray, np.ndarray] | None = None
        self.ext_time: tuple[np.ndarray, np.ndarray] | None = None
        self._syncs: np.ndarray | None = None
        self.keys: dict[int, float] = {}  # RankFeatures.evidence_keys
        self.compiles: tuple[list[int], list[int]] = ([], [])  # torch.compile windows: (start-up, recompiles)
        # may the profile hold the program's start-up? Not when its first step is ProfilerStep#N, N >= 1: the
        # iterations before it (a schedule's wait and warm-up steps) ran unrecorded, and start-up with them
        self.from_start = True

    def sync_calls(self) -> np.ndarray:
        """Host synchronisation API calls, without the profiler's own stop synchronisation and
        those that are the mechanics of a host-to-device copy from pageable memory (see
        zoomer_ar/features/syncs.py); computed once per rank."""
        if self._syncs is None:
            t = self.t
            runtime = t.mask_cat(*N.RUNTIME_CATS) & self.x
            sync = np.flatnonzero(self.name_mask(N.SYNC_APIS, runtime))
            drop = np.union1d(S.profiler_stop_syncs(self, sync), S.pageable_copy_syncs(self, runtime, sync, TOL_US))
            self._syncs = np.setdiff1d(sync, drop, assume_unique=True)
        return self._syncs

    def launch_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(correlation ids sorted, their runtime rows) of the runtime calls that carry one; built once
        per rank (the step times and the idle-gap causes both look launches up by correlation)."""
        if self._launches is None:
            t = self.t
            rt = row_positions(t.mask_cat(*N.RUNTIME_CATS) & self.x)
            rt = rt[t.correlation[rt] != INT_NONE]
            order = np.argsort(t.correlation[rt], kind="stable").astype(rt.dtype)
            self._launches = (t.correlation[rt][order], rt[order])
        return self._launches

    def launcher(self, i: int) -> int | None:
        """The host runtime call that launched GPU event i (by correlation id)."""
        if self.launch_lookup is None or self.t.correlation[i] == INT_NONE:
            return None
        corr, idx = self.launch_lookup
        pos = int(np.searchsorted(corr, self.t.correlation[i]))
        if pos < corr.size and corr[pos] == self.t.correlation[i]:
            return int(idx[pos])
        return None

    def name_mask(self, pred, base: np.ndarray | None = None) -> np.ndarray:
        """Rows whose name satisfies pred (a function), or is one of pred (a str or a collection)."""
        m = self.t.mask_names(pred) if callable(pred) else self.t.mask_name_in(pred)
        return m & (self.x if base is None else base)

    def ev(self, i: int, detail: str = "", frames: bool = True) -> EvidenceEvent:
        t = self.t
        stream = int(t.stream[i]) if t.stream[i] != INT_NONE else None
        return EvidenceEvent.model_construct(  # typed here (str, int, rounded float): no validation pass
            name=t.name_of(i)[:300],
            rank=t.rank,
            ts_ms=round((float(t.ts[i]) - self.t0) / 1000.0, 4),
            dur_ms=round(float(t.dur[i]) / 1000.0, 4),
            stream=stream,
            category=t.cat_of(i),
            detail=detail,
            frames=self._frames(i) if frames else [],
        )

    def _frames(self, i: int):
        if int(self.t.cat[i]) in self.gpu_cats:
            j = self.launcher(i)
            return self.frames.frames_for(j) if j is not None else []
        return self.frames.frames_for(i)

    def worst(self, idx: np.ndarray, key: np.ndarray | None = None, k: int = EVIDENCE_PER_KIND, detail=None):
        if idx.size == 0:
            return []
        if key is None:
            top = idx[np.argsort(-self.t.dur[idx], kind="stable")[:k]]
            return [self.ev(int(i), detail(int(i)) if detail else "") for i in top]
        order = np.argsort(-key, kind="stable")[:k]
        out = []
        for j in order.tolist():
            e = self.ev(int(idx[j]), detail(int(idx[j])) if detail else "")
            self.keys[id(e)] = float(key[j])
            out.append(e)
        return out


def _steps(c: _Ctx, rf: RankFeatures) -> tuple[np.ndarray, np.ndarray]:
    t = c.t
    cpu_side = ~t.mask_cat("gpu_user_annotation")
    m = c.name_mask(N.is_profiler_step) & cpu_side
    idx = np.flatnonzero(m)
    idx = idx[np.argsort(t.ts[idx], kind="stable")]
    starts, ends = t.ts[idx], c.end[idx]
    durs = t.dur[idx] / 1000.0
    if idx.size:
        # a step is over when its host side has ended and the device has finished the work it queued: a host
        # running ahead of the GPU (short CPU steps while the queue fills) does not shorten the steps. Each
        # step lasts from the previous one's completion to its own, so the steps add up to the time from the
        # first step's start to the last one's completion (work of neighbouring steps overlapping on several
        # streams counts once). The device side: Kineto's GPU-side ProfilerStep range of the same name where
        # the trace has it, else the device events that the step's runtime calls queued (correlation ids).
        dev_end = _device_ends(c, idx, starts, ends, ~cpu_side)
        done = np.maximum.accumulate(np.fmax(ends, dev_end))
        durs = np.diff(np.concatenate([starts[:1], done])) / 1000.0
    rf.v["profiler_steps"] = int(idx.size)
    rf.v["wall_ms"] = (c.t1 - c.t0) / 1000.0
    if idx.size:
        number = N.profiler_step_number(t.name_of(int(idx[0])))
        rf.v["first_profiled_step"] = number
        c.from_start = number is None or number == 0
    if idx.size:
        rf.v["step_ms"] = float(durs.mean())
        rf.v["step_ms_p50"] = float(np.median(durs))
        rf.v["step_ms_p95"] = float(np.percentile(durs, 95))
        rf.v["step_ms_cv"] = float(durs.std() / durs.mean()) if durs.mean() > 0 else None
        rf.v["first_step_ms"] = float(durs[0])
    else:
        rf.v["step_ms"] = rf.v["wall_ms"]
    rf.v["n_steps"] = max(1, int(idx.size))
    return starts, ends


def _device_ends(c: _Ctx, idx: np.ndarray, starts: np.ndarray, ends: np.ndarray, gpu_side: np.ndarray) -> np.ndarray:
    """Per CPU step (rows idx, sorted by start): when the device finished the step's work (us; NaN where it
    queued none): the end of the GPU-side ProfilerStep range of the same name where the trace records them,
    else the last end of the device events whose runtime call (by correlation id) began inside the step."""
    t = c.t
    out = np.full(idx.size, np.nan)
    ranges = np.flatnonzero(c.name_mask(N.is_profiler_step) & gpu_side)
    if ranges.size:
        by_name: dict[int, float] = {}
        for code, end in zip(t.name[ranges].tolist(), c.end[ranges].tolist()):
            by_name[code] = max(by_name.get(code, -np.inf), end)
        return np.asarray([by_name.get(code, np.nan) for code in t.name[idx].tolist()], dtype=np.float64)
    dev = row_positions(c.gpu)
    keys, rt = c.launch_index()
    if dev.size == 0 or rt.size == 0:
        return out
    launched = t.ts[rt]
    want = t.correlation[dev]
    pos = np.clip(np.searchsorted(keys, want), 0, keys.size - 1)
    hit = (keys[pos] == want) & (want != INT_NONE)
    dev, at = dev[hit], launched[pos[hit]]
    k = np.searchsorted(starts, at, side="right") - 1
    inside = (k >= 0) & (at <= ends[np.maximum(k, 0)])
    if not inside.any():
        return out
    last = np.full(idx.size, -np.inf)
    np.maximum.at(last, k[inside], c.end[dev[inside]])
    out[np.isfinite(last)] = last[np.isfinite(last)]
    return out


def _gpu(c: _Ctx, rf: RankFeatures, step_starts: np.ndarray, step_ends: np.ndarray) -> None:
    t = c.t
    v = rf.v
    n_steps = v["n_steps"]
    gpu_idx = row_positions(c.gpu)
    accel_idx = np.flatnonzero(t.mask_cat(*N.ACCEL_ONLY_CATS) & c.x)
    v["has_gpu"] = bool(gpu_idx.size)
    v["has_accelerator"] = bool(gpu_idx.size or accel_idx.size)
    if not gpu_idx.size:
        return
    runtime = t.mask_cat(*N.RUNTIME_CATS) & c.x
    startup, typical = _startup_calls(c, runtime, step_starts)  # before the per-GPU-row temporaries
    v["startup_calls"] = int(startup.size)
    captures = _captures(c, runtime, step_starts)
    v["captured_launches"] = int(sum(n for _, _, _, n in captures))
    compiles, recompiles = c.compiles
    gs, ge = t.ts[gpu_idx], c.end[gpu_idx]
    us, ue = iv.union(gs, ge)
    del ge  # the per-row temporaries of this function are dropped once used: peak memory of big traces
    span = float(ue.max() - us.min())
    busy = float((ue - us).sum())
    v["gpu_span_ms"] = span / 1000.0
    v["gpu_busy_pct"] = 100.0 * busy / span if span > 0 else 100.0
    v["_gpu_union"] = (us, ue)
    # step time with no device work at all: before the device's first op and after its last one, inside the
    # profiled steps (a CPU preprocess before the device starts); the idle gaps below lie inside the GPU span
    if step_starts.size:
        w0, w1 = float(step_starts[0]), float(step_starts[0]) + v["step_ms"] * 1000.0 * n_steps
        inside = max(0.0, min(w1, float(ue.max())) - max(w0, float(us.min())))
        v["gpu_idle_outside_span_ms_total"] = max(0.0, (w1 - w0) - inside) / 1000.0
    # steady-state per-step busy: GPU-side step annotations if present, else CPU step windows
    gpu_steps = np.flatnonzero(c.name_mask(N.is_profiler_step) & t.mask_cat("gpu_user_annotation"))
    if gpu_steps.size >= 2:
        order = np.argsort(t.ts[gpu_steps])
        ws, we = t.ts[gpu_steps][order], c.end[gpu_steps][order]
    elif step_starts.size >= 2:
        ws = step_starts
        we = np.append(step_starts[1:], max(step_ends[-1], float(ue.max())))
    else:
        ws = we = np.empty(0)
    if ws.size:
        per = iv.overlap_with(ws, we, (us, ue)) / np.maximum(we - ws, 1e-9) * 100.0
        per = per[1:] if per.size >= 3 else per
        v["gpu_busy_pct_steady"] = float(np.median(per))
    rf._timeline_of = (us, ue, c.t0)  # timeline bins for the report, when asked

    # --- kernels / launches
    kern = row_positions(t.mask_cat(*N.KERNEL_CATS) & c.x)
    kd = t.dur[kern]
    v["kernel_count"] = int(kern.size)
    v["kernel_ms_total"] = float(kd.sum()) / 1000.0
    v["kernel_dur_p50_us"] = _pct(kd, 50)
    v["kernel_dur_p90_us"] = _pct(kd, 90)
    v["short_kernel_share"] = float((kd < 10.0).mean()) if kd.size else None
    launch = row_positions(c.name_mask(N.is_launch, runtime))
    v["launch_count"] = int(launch.size)
    v["launch_dur_p50_us"] = _pct(t.dur[launch], 50)
    v["launch_ms_total"] = float(t.dur[launch].sum()) / 1000.0
    per_kernel = _launch_cost_per_kernel(c, launch, kern)
    del launch
    if v["kernel_dur_p50_us"] is not None and per_kernel.size and float(np.median(per_kernel)) > 0:
        v["kernel_to_launch_ratio"] = v["kernel_dur_p50_us"] / float(np.median(per_kernel))

    # --- idle gaps and their causes
    g0, g1 = iv.gaps(us, ue)
    glen = g1 - g0
    idle_total = float(glen.sum())
    v["gpu_idle_ms_total"] = idle_total / 1000.0
    v["idle_short_gap_share"] = float(glen[glen < 50.0].sum() / idle_total) if idle_total > 0 else None
    data_part = np.zeros(glen.size)
    dl = np.flatnonzero(c.name_mask(N.is_dataloader_next))
    if dl.size and glen.size:
        data_part = np.minimum(iv.overlap_with(g0, g1, iv.union(t.ts[dl], c.end[dl])), glen)
    rest = glen - data_part
    # next GPU op after each gap and the host call that launched it
    order = np.argsort(gs, kind="stable").astype(gpu_idx.dtype)
    sorted_starts = gs[order]
    nxt = gpu_idx[order[np.clip(np.searchsorted(sorted_starts, g1 - 1e-6), 0, order.size - 1)]] if glen.size else np.empty(0, int)
    del gs, gpu_idx, order, sorted_starts
    rt_corr_sorted, rt_sorted = c.launch_index()
    # host-bound gap: the host call that launched the next GPU op ended after the gap began
    host_bound = np.zeros(glen.size, dtype=bool)
    if glen.size and rt_corr_sorted.size:
        want = t.correlation[nxt]
        pos = np.clip(np.searchsorted(rt_corr_sorted, want), 0, rt_corr_sorted.size - 1)
        hit = (rt_corr_sorted[pos] == want) & (want != INT_NONE)
        del want
        launch_end = np.where(hit, c.end[rt_sorted[pos]], np.nan)
        del pos, hit
        host_bound = np.nan_to_num(launch_end, nan=-np.inf) > g0 + 1.0
        del launch_end
    c.launch_lookup = (rt_corr_sorted, rt_sorted)
    # syncs: host calls that block until the GPU drains
    item = S.device_waits(c, np.flatnonzero(c.name_mask(N.ITEM_OPS, t.mask_cat(*N.CPU_OP_CATS))), runtime)
    sync_like = np.union1d(c.sync_calls(), item)
    del item
    sync_caused = np.zeros(glen.size, dtype=bool)
    sync_of = np.empty(0, dtype=np.int64)  # per gap: the row of the sync call it follows (where sync_caused)
    if sync_like.size and glen.size:
        se_order = np.argsort(c.end[sync_like])
        s_end = c.end[sync_like][se_order]
        s_start = t.ts[sync_like][se_order]
        k = np.clip(np.searchsorted(s_end, g0 - TOL_US), 0, s_end.size - 1)
        sync_caused = (s_end[k] >= g0 - TOL_US) & (s_end[k] <= g1) & (s_start[k] < g0)
        sync_of = sync_like[se_order[k]]
        del s_end, s_start, k, se_order
    # each gap's rest (after data) goes to sync, host or other; one buffer holds each part in
    # turn (rest x mask is rest or 0.0: the values np.where would give, summed in the same order)
    part = np.empty(glen.size)
    np.multiply(rest, sync_caused, out=part)
    sync_sum = float(part.sum())
    other = rest - part
    np.multiply(rest, ~sync_caused & host_bound, out=part)
    host_sum = float(part.sum())
    other -= part
    other_sum = float(other.sum())
    del part, other
    # GPU idle while the host sat in a start-up call (an outlier runtime call in the first step): of all gaps, and
    # of the host-bound part of each gap (what idle_host counts)
    in_startup = np.zeros(glen.size)
    if (startup.size or captures or compiles) and glen.size:
        one_off = iv.union(np.concatenate([t.ts[startup], [b for b, _, _, _ in captures], t.ts[compiles]]),
                           np.concatenate([c.end[startup], [e for _, e, _, _ in captures], c.end[compiles]]))
        in_startup = np.minimum(iv.overlap_with(g0, g1, one_off), glen)
    v["idle_startup_ms_total"] = float(in_startup.sum()) / 1000.0
    v["idle_startup_host_ms_total"] = float(np.minimum(in_startup, rest)[~sync_caused & host_bound].sum()) / 1000.0
    del in_startup
    v["idle_data_ms_total"] = float(data_part.sum()) / 1000.0
    v["idle_sync_ms_total"] = sync_sum / 1000.0
    v["idle_host_ms_total"] = host_sum / 1000.0
    v["idle_other_ms_total"] = other_sum / 1000.0
    v["host_idle_share"] = float(host_sum / idle_total) if idle_total > 0 else None
    if glen.size:
        top = np.argsort(-glen)[:EVIDENCE_PER_KIND]
        # the cause of the shown gaps only (a string array over every gap costs 20 bytes a gap)
        cause = {int(j): "data" if data_part[j] >= rest[j] else "sync" if sync_caused[j] else "host" if host_bound[j]
                 else "other" for j in top}
        sync_gaps = np.flatnonzero(sync_caused)
        sync_top = sync_gaps[np.argsort(-glen[sync_gaps])][:EVIDENCE_PER_KIND]
        blocked = _blocking_calls(c, runtime, g0, g1, np.union1d(top, sync_top))
        shown = []
        for j in top.tolist():
            detail, source = f"cause: {cause[j]}", c.launcher(int(nxt[j]))  # where the late work was launched
            if cause[j] == "sync":
                detail, source = f"{detail} (after {t.name_of(int(sync_of[j]))[:80]})", int(sync_of[j])
            shown.append(_gap_event(c, f"GPU idle before {t.name_of(int(nxt[j]))[:120]}", float(g0[j]), float(glen[j]),
                                    detail, blocked.get(j), source))
        rf.evidence["idle_gaps"] = shown
        if sync_gaps.size:
            rf.evidence["sync_gaps"] = [
                _gap_event(c, "GPU idle after a host synchronisation", float(g0[j]), float(glen[j]),
                           f"the queue drained while the host waited in {t.name_of(int(sync_of[j]))[:80]}, then refilled",
                           blocked.get(int(j)), int(sync_of[j]))
                for j in sync_top
            ]
    def idle_during(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:  # GPU idle time inside each interval
        return iv.overlap_with(starts, ends, (g0, g1)) if glen.size else np.zeros(starts.size)

    if startup.size:
        idle_in = idle_during(t.ts[startup], c.end[startup])
        device_op = _device_op_of(c, startup)
        rf.evidence["startup_calls"] = c.worst(startup, key=idle_in + t.dur[startup] * 1e-12,  # idle first, then length
                                               detail=lambda i: _startup_detail(t, i, typical, startup, idle_in,
                                                                                device_op.get(i)))
    if captures:
        b, e = np.array([x[0] for x in captures]), np.array([x[1] for x in captures])
        idle_cap = idle_during(b, e)
        shown = []
        for k in np.lexsort((-(e - b), -idle_cap))[:EVIDENCE_PER_KIND].tolist():  # idle first, then length
            _, _, row, n = captures[k]
            ev = _span_event(c, f"graph capture ({t.name_of(row)[:60]} .. end)", float(b[k]), float(e[k] - b[k]),
                             "capture", f"{n} launch{'es' if n != 1 else ''} recorded into a graph, not run; the GPU "
                             f"was idle for {float(idle_cap[k]) / 1000.0:.3f} ms of it", row)
            c.keys[id(ev)] = float(idle_cap[k]) + float(e[k] - b[k]) * 1e-12
            shown.append(ev)
        rf.evidence.setdefault("startup_calls", []).extend(shown)
    if compiles:
        rows = np.asarray(compiles, dtype=np.int64)
        idle_c = idle_during(t.ts[rows], c.end[rows])
        rf.evidence.setdefault("startup_calls", []).extend(c.worst(
            rows, key=idle_c + t.dur[rows] * 1e-12,
            detail=lambda i: "torch.compile compiling; the GPU was idle for "
                             f"{float(idle_c[np.searchsorted(rows, i)]) / 1000.0:.3f} ms of it"))
    del g0, g1, glen, data_part, rest, sync_caused, host_bound, nxt, sync_of
    short = kern[kd < 10.0]
    del kd
    if short.size:
        rf.evidence["short_kernels"] = [c.ev(int(i), "shorter than 10 us", frames=False) for i in short[:EVIDENCE_PER_KIND]]

    # --- memcpy / memset
    mc = np.flatnonzero(t.mask_cat(*N.MEMCPY_CATS) & c.x)
    kinds = {code: N.memcpy_kind(t.names[code]) for code in np.unique(t.name[mc]).tolist()}
    pageable = {code for code in kinds if N.is_pageable(t.names[code])}
    mc_names = t.name[mc]
    of_kind = {kind: mc[t.has_name_code(mc_names, [code for code, k in kinds.items() if k == kind])]
               for kind in ("htod", "dtoh", "dtod")}  # by name code: no string per copy
    del mc_names
    for kind, sel in of_kind.items():
        v[f"memcpy_{kind}_count"] = int(sel.size)
        v[f"memcpy_{kind}_ms_total"] = float(t.dur[sel].sum()) / 1000.0
    v["memcpy_dtod_pct_of_gpu_span"] = 100.0 * v["memcpy_dtod_ms_total"] * 1000.0 / span if span > 0 else 0.0
    pg = mc[t.has_name_code(t.name[mc], sorted(pageable))] if pageable else mc[:0]
    v["memcpy_pageable_count"] = int(pg.size)
    v["memcpy_pageable_ms_total"] = float(t.dur[pg].sum()) / 1000.0
    ms = np.flatnonzero(t.mask_cat(*N.MEMSET_CATS) & c.x)
    v["memset_count"] = int(ms.size)
    v["memset_ms_total"] = float(t.dur[ms].sum()) / 1000.0
    if mc.size:
        dtod = of_kind["dtod"]
        rf.evidence["dtod"] = c.worst(dtod, detail=lambda i: f"{t.nbytes[i]:.0f} bytes" if t.nbytes[i] == t.nbytes[i] else "")
        rf.evidence["pageable"] = c.worst(pg, detail=lambda i: f"{t.nbytes[i]:.0f} bytes" if t.nbytes[i] == t.nbytes[i] else "")

    # --- communication
    comm_codes = t.name_codes(N.is_comm_kernel)
    is_comm = t.has_name_code(t.name[kern], comm_codes)
    comm = kern[is_comm]
    compute = kern[~is_comm]
    v["comm_kernel_count"] = int(comm.size)
    comp_u = iv.union(t.ts[compute], c.end[compute])
    del compute, is_comm
    v["compute_ms_total"] = float((comp_u[1] - comp_u[0]).sum()) / 1000.0
    # copies and memsets that compute kernels do not hide (a copy on its own stream overlapping kernels costs
    # the step nothing): what the bottleneck's memory share counts
    moves = np.concatenate([mc, ms])
    mem_u = iv.union(t.ts[moves], c.end[moves])
    del moves
    v["memory_exposed_ms_total"] = (float((mem_u[1] - mem_u[0]).sum()) - iv.intersection_total(mem_u, comp_u)) / 1000.0
    del mem_u
    if comm.size:
        comm_u = iv.union(t.ts[comm], c.end[comm])
        comm_total = float((comm_u[1] - comm_u[0]).sum())
        overlap = iv.intersection_total(comm_u, comp_u)
        v["comm_ms_total"] = comm_total / 1000.0
        v["comm_overlap_pct"] = 100.0 * overlap / comm_total if comm_total > 0 else None
        v["exposed_comm_ms_total"] = (comm_total - overlap) / 1000.0
        exposed_each = t.dur[comm] - iv.overlap_with(t.ts[comm], c.end[comm], comp_u)
        rf.evidence["comm"] = c.worst(comm, key=exposed_each, detail=lambda i: "collective not overlapped by compute")
        order = np.argsort(t.ts[comm], kind="stable")
        rf.collectives = [
            (N.collective_type(t.name_of(int(i))), float(t.ts[i]), float(t.dur[i])) for i in comm[order]
        ]
    else:
        v["comm_ms_total"] = 0.0
        v["exposed_comm_ms_total"] = 0.0

    # --- GEMM kernels (precision)
    gemm_codes = t.name_codes(N.is_gemm_kernel)
    gemm = kern[t.has_name_code(t.name[kern], gemm_codes)]
    gemm = gemm[~t.has_name_code(t.name[gemm], comm_codes)]
    v["gemm_ms_total"] = float(t.dur[gemm].sum()) / 1000.0
    fp32_codes = t.name_codes(N.is_fp32_gemm_kernel)
    fp32 = gemm[t.has_name_code(t.name[gemm], fp32_codes)]
    v["fp32_gemm_ms_total"] = float(t.dur[fp32].sum()) / 1000.0
    v["_gemm_source"] = "kernels"
    if gemm.size:
        v["fp32_gemm_share"] = float(t.dur[fp32].sum() / max(t.dur[gemm].sum(), 1e-9))
        rf.evidence["fp32_gemm"] = c.worst(fp32, detail=lambda i: "FP32 GEMM kernel (no TF32/half precision)")

    # --- allocator calls in steady-state steps
    alloc = np.flatnonzero(c.name_mask(N.ALLOCATOR_APIS, runtime))
    if step_starts.size >= 2:
        steady_start = step_starts[1]
        in_steady = (t.ts[alloc] >= steady_start) & (t.ts[alloc] <= step_ends[-1])
        alloc = alloc[in_steady]
        steady_steps = step_starts.size - 1
    else:
        # no steady state to go by (churn is allocation repeated step after step): a trace without two
        # profiler steps shows start-up (CUDA context, cuBLAS workspaces, the caching allocator's first
        # blocks) and device-wide waits inside cudaFree, not churn
        alloc = alloc[:0]
        steady_steps = 1
    v["allocator_calls"] = int(alloc.size)
    v["allocator_calls_per_step"] = alloc.size / steady_steps
    v["allocator_ms_per_step"] = float(t.dur[alloc].sum()) / 1000.0 / steady_steps
    rf.evidence["allocator"] = c.worst(alloc)


OUTLIER_MIN_US = 1000.0  # an outlier runtime call lasts at least this long ...
OUTLIER_RATIO = 100.0  # ... and at least this many times its API's typical duration in the rank


def _startup_calls(c: _Ctx, runtime: np.ndarray, step_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start-up calls: outlier runtime calls before the second profiled step (anywhere in a trace of fewer than
    two steps, which cannot tell start-up from a stall that recurs; none where the profile starts after the
    program did, at ProfilerStep#1 or later: _Ctx.from_start). An outlier is a launch, synchronisation,
    copy or allocation (the calls both readers keep) lasting at least OUTLIER_MIN_US and at least
    OUTLIER_RATIO times the typical call of the same API in the rank (its lower median: the median of an odd
    count, the lower middle value of an even one, so one slow call among two still stands out): the first
    launch of a kernel that loads its module, context creation, a first cudaMalloc/cudaFree. Outliers in
    later steps recur: they stay ordinary idle time. Returns (rows in file order, each one's typical us)."""
    t = c.t
    cand = row_positions(c.name_mask(N.is_launch_sync_or_alloc, runtime))
    if cand.size == 0 or not c.from_start:
        return cand[:0], np.empty(0)
    d, code = t.dur[cand], t.name[cand]
    slow_names = np.unique(code[d >= OUTLIER_MIN_US])  # only APIs with a long call can have an outlier
    if slow_names.size == 0:
        return cand[:0], np.empty(0)
    keep = np.isin(code, slow_names)
    cand, d, code = cand[keep], d[keep], code[keep]
    order = np.lexsort((d, code))
    sc, sd = code[order], d[order]
    first = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]])
    counts = np.diff(np.r_[first, sc.size])
    typical = np.repeat(sd[first + (counts - 1) // 2], counts)
    hit = (sd >= OUTLIER_MIN_US) & (sd >= OUTLIER_RATIO * typical)
    rows, typical = cand[order[hit]], typical[hit]
    if step_starts.size >= 2:
        early = t.ts[rows] < step_starts[1]
        rows, typical = rows[early], typical[early]
    back = np.argsort(rows, kind="stable")
    return rows[back], typical[back]


def _captures(c: _Ctx, runtime: np.ndarray, step_starts: np.ndarray) -> list[tuple[float, float, int, int]]:
    """Stream captures into CUDA/HIP graphs: on each thread, a Begin*Capture call up to the next End*Capture
    call, before the second profiled step (anywhere with fewer than two steps; later ones recur, as
    _startup_calls). Kernels launched meanwhile are recorded into the graph, not run: the GPU idles by
    design, a one-off cost (a graph is replayed many times). [(start us, end us, begin row, launches inside)]"""
    t = c.t
    bounds = np.flatnonzero(c.name_mask(N.is_capture_bound, runtime))
    if bounds.size == 0 or not c.from_start:
        return []
    begin_codes = set(t.name_codes(lambda n: n in N.CAPTURE_BEGIN_APIS))
    launches = None
    out = []
    bounds = bounds[np.lexsort((t.ts[bounds], t.tid[bounds]))]
    open_row = None
    for i in bounds.tolist():
        if open_row is not None and t.tid[i] != t.tid[open_row]:
            open_row = None  # a capture not ended on its thread: not counted
        if int(t.name[i]) in begin_codes:
            open_row = i
            continue
        if open_row is None:
            continue
        b, e = float(t.ts[open_row]), float(t.ts[i] + t.dur[i])
        if step_starts.size < 2 or b < step_starts[1]:
            if launches is None:
                launches = np.flatnonzero(c.name_mask(N.is_launch, runtime))
            inside = (t.ts[launches] >= b) & (t.ts[launches] <= e) & (t.tid[launches] == t.tid[open_row])
            out.append((b, e, open_row, int(inside.sum())))
        open_row = None
    return out


def _compiles(c: _Ctx, step_starts: np.ndarray) -> tuple[list[int], list[int]]:
    """torch.compile phases (names.is_compile_window), outermost on their thread, in file order: those that
    start before the second profiled step (all of them with fewer than two steps) compile the model once;
    later ones are recompilations (new shapes, failed guards), a cost each time. (start-up rows, later rows)"""
    t = c.t
    rows = np.flatnonzero(c.name_mask(N.is_compile_window))
    if rows.size == 0:
        return [], []
    rows = rows[np.lexsort((-t.dur[rows], t.ts[rows], t.tid[rows]))]  # by thread, start, longest first
    outer, tid, reach = [], None, -np.inf
    for i in rows.tolist():
        if t.tid[i] != tid:
            tid, reach = t.tid[i], -np.inf
        if t.ts[i] >= reach:
            outer.append(i)
            reach = float(t.ts[i] + t.dur[i])
        else:
            reach = max(reach, float(t.ts[i] + t.dur[i]))
    outer.sort()
    if not c.from_start:  # the first compilation ran before the profile: every one in it compiles again
        return [], outer
    if step_starts.size < 2:
        return outer, []
    cut = float(step_starts[1])
    return [i for i in outer if t.ts[i] < cut], [i for i in outer if t.ts[i] >= cut]


def _device_op_of(c: _Ctx, rows: np.ndarray) -> dict[int, int]:
    """{runtime row: the first device op (kernel, copy, memset) it queued, by correlation id} for `rows`."""
    t = c.t
    corr = t.correlation[rows]
    want = corr[corr != INT_NONE]
    if want.size == 0:
        return {}
    dev = row_positions(c.gpu)
    dev = dev[np.isin(t.correlation[dev], want)]
    first: dict[int, int] = {}
    for g in dev.tolist():  # file order: the first op of each correlation
        first.setdefault(int(t.correlation[g]), g)
    return {int(i): first[int(k)] for i, k in zip(rows.tolist(), corr.tolist()) if int(k) in first}


def _startup_detail(t: RankTrace, i: int, typical: np.ndarray, rows: np.ndarray, idle_in: np.ndarray,
                    device_op: int | None) -> str:
    k = int(np.searchsorted(rows, i))
    typ, idle = float(typical[k]), float(idle_in[k])
    times = f"{float(t.dur[i]) / typ:,.0f}x" if typ > 0 else "far above"
    text = f"{times} the typical {t.name_of(i)[:60]} ({typ:.1f} us)"
    if device_op is not None:  # a first launch loads the module of this kernel
        text += f", for {t.name_of(device_op).split('(', 1)[0][:100]}"  # a kernel's name without its arguments
    return text + (f"; the GPU was idle for {idle / 1000.0:.3f} ms of it" if idle > 0 else "; the GPU was busy meanwhile")


BLOCKED_SHARE = 0.5  # a host call covering at least this share of an idle gap is what the host was doing


def _blocking_calls(c: _Ctx, runtime: np.ndarray, g0: np.ndarray, g1: np.ndarray, shown: np.ndarray) -> dict[int, tuple[int, float]]:
    """For the shown idle gaps (indices into g0/g1): the runtime call - a launch, a synchronisation
    or an allocation, on any host thread - that covers the largest part of the gap, where it covers
    at least BLOCKED_SHARE of it: {gap: (row, overlap us)}. The host was blocked inside that call
    while the device had nothing to do (a synchronous copy waiting for its stream, a cudaMalloc, a
    launch stalled by a full queue). Only calls that both readers keep are candidates (stream/compact.py
    keeps every runtime call of these kinds, prune.py never drops them)."""
    t = c.t
    if shown.size == 0:
        return {}
    need = BLOCKED_SHARE * float((g1[shown] - g0[shown]).min())
    cand = np.flatnonzero(c.name_mask(N.is_launch_sync_or_alloc, runtime))
    cand = cand[t.dur[cand] >= need]
    out: dict[int, tuple[int, float]] = {}
    if cand.size == 0:
        return out
    cs, ce = t.ts[cand], c.end[cand]
    for j in shown.tolist():
        a, b = float(g0[j]), float(g1[j])
        ov = np.minimum(ce, b) - np.maximum(cs, a)
        best = np.lexsort((cand, cs, -ov))[0]  # the largest overlap; then the earliest start; then file order
        if ov[best] >= BLOCKED_SHARE * (b - a) and ov[best] > 0:
            out[j] = (int(cand[best]), float(ov[best]))
    return out


def _gap_event(c: _Ctx, name: str, g0: float, glen: float, detail: str, blocked: tuple[int, float] | None,
               source: int | None) -> EvidenceEvent:
    """An idle gap as evidence: where the host was blocked in a call for most of it, that call and its
    Python frames; otherwise the frames of `source` (the call that launched the work after the gap, or the
    synchronisation it followed)."""
    if blocked is not None:
        row, ov = blocked
        detail += f"; the host was in {c.t.name_of(row)[:80]} for {ov / 1000.0:.3f} ms of it"
        source = row
    return _span_event(c, name, g0, glen, "idle", detail, source)


def _span_event(c: _Ctx, name: str, start: float, dur: float, category: str, detail: str,
                frames_of: int | None) -> EvidenceEvent:
    """A stretch of time (an idle gap, a graph capture) as evidence, with the Python frames of row `frames_of`."""
    return EvidenceEvent.model_construct(  # typed here (str, int, rounded float): no validation pass
        name=name,
        rank=c.t.rank,
        ts_ms=round((start - c.t0) / 1000.0, 4),
        dur_ms=round(dur / 1000.0, 4),
        stream=None,
        category=category,
        detail=detail,
        frames=c.frames.frames_for(frames_of) if frames_of is not None else [],
    )


def _host(c: _Ctx, rf: RankFeatures, step_starts: np.ndarray, step_ends: np.ndarray) -> None:
    t = c.t
    v = rf.v
    cpu_ops = t.mask_cat(*N.CPU_OP_CATS) & c.x
    runtime = t.mask_cat(*N.RUNTIME_CATS) & c.x
    # syncs
    sync = c.sync_calls()
    v["sync_calls"] = int(sync.size)
    v["sync_blocked_ms_total"] = float(t.dur[sync].sum()) / 1000.0
    item = np.flatnonzero(c.name_mask(N.ITEM_OPS, cpu_ops))
    if item.size == 0:
        item = np.flatnonzero(c.name_mask(N.ITEM_FALLBACK_OPS, cpu_ops))
    v["item_calls"] = int(item.size)
    item_outer = np.flatnonzero(c.name_mask(N.ITEM_FALLBACK_OPS, cpu_ops))
    rf.evidence["sync"] = c.worst(np.concatenate([sync, item_outer if item_outer.size else item]))
    # dataloader
    dl = np.flatnonzero(c.name_mask(N.is_dataloader_next))
    v["dataloader_ms_total"] = float(t.dur[dl].sum()) / 1000.0
    v["dataloader_calls"] = int(dl.size)
    if dl.size:
        v["dataloader_workers"] = any("MultiProcessing" in t.name_of(int(i)) for i in dl[:50])
    rf.evidence["dataloader"] = c.worst(dl)
    # optimizer
    opt = np.flatnonzero(c.name_mask(N.is_optimizer_step))
    opt = opt[~t.mask_cat("gpu_user_annotation")[opt]]
    v["optimizer_steps"] = int(opt.size)
    v["optimizer_ms_total"] = float(t.dur[opt].sum()) / 1000.0
    inside = _inside(c, opt, cpu_ops)
    codes, counts = np.unique(t.name[inside], return_counts=True)  # per distinct name, not per op
    foreach = per_param = 0
    for code, count in zip(codes.tolist(), counts.tolist()):
        n = t.names[code]
        if n.startswith(("aten::_foreach_", "aten::_fused_")):
            foreach += count
        elif n.startswith("aten::"):
            per_param += count
    v["optimizer_foreach_ops"] = foreach
    v["optimizer_per_param_ops"] = per_param
    v["optimizer_single_tensor_frames"] = c.frames.names_matching("_single_tensor_")
    rf.evidence["optimizer"] = c.worst(opt)
    # zero_grad fills
    zg = np.flatnonzero(c.name_mask(N.is_zero_grad))
    zg = zg[~t.mask_cat("gpu_user_annotation")[zg]]
    v["zero_grad_calls"] = int(zg.size)
    fills = _inside(c, zg, cpu_ops & t.mask_name_in(N.ZERO_FILL_OPS))
    v["zero_grad_fill_ops"] = int(fills.size)
    # the fills' host time and their kernels' GPU time lie on two timelines that overlap when the GPU runs
    # behind the host: removing the fills saves at most the longer of the two, not their sum
    fill_host = float(t.dur[fills].sum()) / 1000.0
    fill_gpu = _gpu_time_launched_inside(c, fills) / 1000.0 if v.get("has_gpu") else 0.0
    v["zero_grad_fill_host_ms_total"] = fill_host
    v["zero_grad_fill_gpu_ms_total"] = fill_gpu if v.get("has_gpu") else None
    v["zero_grad_fill_ms_total"] = max(fill_host, fill_gpu)
    rf.evidence["zero_grad"] = c.worst(zg) if fills.size else []
    # host-side copies (outside optimizer and dataloader)
    copies = np.flatnonzero(cpu_ops & t.mask_name_in(N.COPY_OPS))
    excluded = np.concatenate([opt, dl, zg])
    if excluded.size and copies.size:
        cov = iv.union(t.ts[excluded], c.end[excluded])
        inside_excl = iv.contained(t.ts[copies], c.end[copies], t.dur[copies], cov)
        copies = copies[~inside_excl]
    copies = _outermost(c, copies)
    copies = copies[~_holds_precision_cast(c, copies, cpu_ops)]
    v["cpu_copy_ops"] = int(copies.size)
    v["cpu_copy_ms_total"] = float(t.dur[copies].sum()) / 1000.0
    # factory op then a move/cast (torch.zeros(n).to(dev))
    v["factory_then_move"], ftm = _factory_then_move(c, cpu_ops)
    rf.evidence["copies"] = c.worst(np.concatenate([ftm, copies]).astype(np.int64))


_LOW_PRECISION = ("c10::BFloat16", "c10::Half", "c10::Float8")


def _holds_precision_cast(c: _Ctx, outer: np.ndarray, cpu_ops: np.ndarray) -> np.ndarray:
    """For each outer copy op: does it contain an aten::copy_ to or from half/bfloat16?

    Such casts are mixed-precision traffic (autocast weight and activation casts), the price of a
    fix for fp32-matmul, not redundant copies."""
    t = c.t
    out = np.zeros(outer.size, dtype=bool)
    if outer.size == 0:
        return out
    inner = np.flatnonzero(cpu_ops & t.mask_name_in("aten::copy_"))
    verdict: dict[int, bool] = {}  # equal type lists are one shared object (load.columns): judge each once
    types = t.input_type
    casts = []
    for i in inner.tolist():
        v = types.get(i)
        if not v:
            continue
        hit = verdict.get(id(v))
        if hit is None:
            hit = verdict[id(v)] = any(isinstance(x, str) and x.startswith(_LOW_PRECISION) for x in v[:2])
        if hit:
            casts.append(i)
    casts = np.asarray(casts, dtype=np.int64)
    if casts.size == 0:
        return out
    for tid in np.unique(t.tid[outer]):
        sel = np.flatnonzero(t.tid[outer] == tid)
        k = casts[t.tid[casts] == tid]
        if k.size == 0:
            continue
        ks = np.sort(t.ts[k])
        o = outer[sel]
        lo = np.searchsorted(ks, t.ts[o], side="left")
        hi = np.searchsorted(ks, c.end[o], side="right")
        out[sel] = hi > lo
    return out


def _launch_cost_per_kernel(c: _Ctx, launch: np.ndarray, kern: np.ndarray) -> np.ndarray:
    """Each launch call's duration divided by the kernels it launched (matched by correlation id;
    at least one). A cudaLaunchKernel launches one kernel; a cudaGraphLaunch replays a whole
    captured graph (every kernel of a CUDA-graphed training step), so its host cost is spread
    over all of them and the step is no longer launch-bound however short its kernels are."""
    t = c.t
    cost = t.dur[launch].astype(np.float64)
    if launch.size == 0 or kern.size == 0:
        return cost
    kc = t.correlation[kern]
    keys, counts = np.unique(kc[kc != INT_NONE], return_counts=True)
    if keys.size == 0:
        return cost
    lc = t.correlation[launch]
    pos = np.clip(np.searchsorted(keys, lc), 0, keys.size - 1)
    n = np.where((keys[pos] == lc) & (lc != INT_NONE), counts[pos], 1)
    return cost / np.maximum(n, 1)


def _inside(c: _Ctx, outer: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Indices of candidate events that lie inside any of the `outer` events on the same thread."""
    t = c.t
    cand = np.flatnonzero(candidates)
    if outer.size == 0 or cand.size == 0:
        return np.empty(0, dtype=np.int64)
    keep = np.zeros(cand.size, dtype=bool)
    for tid in np.unique(t.tid[outer]):
        o = outer[t.tid[outer] == tid]
        u = iv.union(t.ts[o], c.end[o])
        sel = t.tid[cand] == tid
        if sel.any():
            cs = cand[sel]
            keep[sel] = iv.contained(t.ts[cs], c.end[cs], t.dur[cs], u)
    return cand[keep]


def _outermost(c: _Ctx, idx: np.ndarray) -> np.ndarray:
    """Drop events nested inside another event of the same set on the same thread."""
    t = c.t
    if idx.size < 2:
        return idx
    keep = np.ones(idx.size, dtype=bool)
    for tid in np.unique(t.tid[idx]):
        sel = np.flatnonzero(t.tid[idx] == tid)
        order = sel[np.argsort(t.ts[idx[sel]], kind="stable")]
        running_end = -np.inf
        # plain floats (the same float64 values): a Python loop over numpy scalars costs more
        for j, end in zip(order.tolist(), c.end[idx[order]].tolist()):
            if end <= running_end + 1e-9:
                keep[j] = False
            else:
                running_end = max(running_end, end)
    return idx[keep]


def _gpu_time_by_op(c: _Ctx, ops: np.ndarray) -> np.ndarray:
    """Per host op: GPU kernel/memset time it launched (matched by External id), microseconds."""
    t = c.t
    if c.ext_time is None:
        kern = np.flatnonzero(t.mask_cat(*N.KERNEL_CATS, *N.MEMSET_CATS) & c.x)
        ext = t.external_id[kern]
        ok = ext != INT_NONE
        keys, inv = np.unique(ext[ok], return_inverse=True)
        c.ext_time = (keys, np.bincount(inv, weights=t.dur[kern][ok], minlength=keys.size))
    keys, times = c.ext_time
    if ops.size == 0 or keys.size == 0:
        return np.zeros(ops.size)
    want = t.external_id[ops]
    pos = np.clip(np.searchsorted(keys, want), 0, keys.size - 1)
    return np.where((keys[pos] == want) & (want != INT_NONE), times[pos], 0.0)


def _gpu_time_of(c: _Ctx, ops: np.ndarray) -> float:
    return float(_gpu_time_by_op(c, ops).sum())


def _gpu_time_launched_inside(c: _Ctx, ops: np.ndarray) -> float:
    """GPU time (us) of the kernels and memsets launched by the runtime calls inside `ops` on their thread:
    an op's kernels are launched by the ops nested in it (aten::zero_ -> aten::fill_ -> cudaLaunchKernel), whose
    External id is not the outer op's. Matched by External id where no runtime call inside carries a correlation."""
    t = c.t
    if ops.size == 0:
        return 0.0
    launches = _inside(c, ops, t.mask_cat(*N.RUNTIME_CATS) & c.x)
    launches = launches[t.correlation[launches] != INT_NONE]
    if launches.size == 0:
        return _gpu_time_of(c, ops)
    dev = row_positions(t.mask_cat(*N.KERNEL_CATS, *N.MEMSET_CATS) & c.x)
    hit = np.isin(t.correlation[dev], t.correlation[launches])
    return float(t.dur[dev[hit]].sum())


def _factory_then_move(c: _Ctx, cpu_ops: np.ndarray) -> tuple[int, np.ndarray]:
    t = c.t
    to_copy = np.flatnonzero(cpu_ops & t.mask_name_in("aten::_to_copy"))
    factory = np.flatnonzero(cpu_ops & t.mask_name_in(N.FACTORY_OPS))
    if to_copy.size == 0 or factory.size == 0:
        return 0, np.empty(0, dtype=np.int64)
    hits = []  # per thread, in the order of np.unique: the evidence's order among equal durations
    for tid in np.unique(t.tid[to_copy]):
        f = factory[t.tid[factory] == tid]
        if f.size == 0:
            continue
        f_end_sorted = np.sort(c.end[f])
        on = np.flatnonzero(t.tid[to_copy] == tid)
        ts = t.ts[to_copy[on]]
        k = np.searchsorted(f_end_sorted, ts, side="right") - 1  # the latest factory ending by each move
        ok = k >= 0
        ok[ok] = ts[ok] - f_end_sorted[k[ok]] < 100.0
        hits.append(to_copy[on[ok]])
    out = np.concatenate(hits).astype(np.int64) if hits else np.empty(0, dtype=np.int64)
    return int(out.size), out


def _operators(c: _Ctx, rf: RankFeatures) -> None:
    """Shape/dtype-level features from cpu ops with record_shapes (GEMM precision/alignment, conv+bn)."""
    t = c.t
    v = rf.v
    cpu_ops = t.mask_cat(*N.CPU_OP_CATS) & c.x
    gemm_ops = np.flatnonzero(cpu_ops & t.mask_name_in(N.GEMM_OPS))
    has_gpu = v.get("has_gpu", False)
    # op time: GPU kernel time when on a GPU, else host op time
    op_times = _gpu_time_by_op(c, gemm_ops) if has_gpu else t.dur[gemm_ops]
    times = dict(zip(gemm_ops.tolist(), op_times.tolist()))
    misaligned, mis_time, gemm_time, fp32_time, fp32_ops = [], 0.0, 0.0, 0.0, []
    for i in gemm_ops.tolist():
        dims = t.input_dims.get(i)
        types = t.input_type.get(i) or []
        kn = _gemm_kn(t.name_of(i), dims)
        dtype = next((x for x in types if isinstance(x, str) and x), "")
        el = 2 if ("Half" in dtype or "BFloat16" in dtype) else 8 if dtype == "double" else 4 if dtype else 0
        dur = times[i]
        gemm_time += dur
        if dtype == "float":
            fp32_time += dur
            fp32_ops.append(i)
        if kn and el:
            req = 16 // el
            if any(x % req for x in kn if x > 0):
                misaligned.append(i)
                mis_time += dur
    v["misaligned_gemm_ops"] = len(misaligned)
    if gemm_ops.size and gemm_time > 0:
        v["misaligned_gemm_share"] = mis_time / gemm_time
        v["misaligned_gemm_ms_total"] = mis_time / 1000.0
        mis = np.asarray(misaligned, dtype=np.int64)
        rf.evidence["misaligned_gemm"] = c.worst(  # the ops that cost most: GPU time on a GPU, as the impact counts
            mis, key=np.asarray([times[i] for i in misaligned], dtype=np.float64),
            detail=lambda i: f"shapes {t.input_dims.get(i)}" + (f", GPU time {times[i] / 1000.0:.4f} ms" if has_gpu else ""),
        )
        if not has_gpu:  # CPU trace: precision from op dtypes
            v["gemm_ms_total"] = gemm_time / 1000.0
            v["fp32_gemm_ms_total"] = fp32_time / 1000.0
            v["fp32_gemm_share"] = fp32_time / gemm_time
            v["_gemm_source"] = "host ops"
            rf.evidence["fp32_gemm"] = c.worst(
                np.asarray(fp32_ops, dtype=np.int64), detail=lambda i: f"fp32 inputs, shapes {t.input_dims.get(i)}"
            )
    # conv (with bias) directly followed by batch norm
    convs = np.flatnonzero(cpu_ops & t.mask_name_in(N.CONV_OPS))
    pairs: list[int] = []
    bias_time = 0.0
    if convs.size:
        layer = np.flatnonzero(cpu_ops & t.mask_name_in(N.LAYER_OPS))
        for tid in np.unique(t.tid[convs]):
            lay = layer[t.tid[layer] == tid]
            lay = lay[np.argsort(t.ts[lay], kind="stable")]
            lay_ts = t.ts[lay]
            for i in convs[t.tid[convs] == tid]:
                dims = t.input_dims.get(int(i))
                if not (isinstance(dims, list) and len(dims) > 2 and dims[2]):
                    continue
                k = np.searchsorted(lay_ts, c.end[i] - 1e-6)
                # skip ops nested inside the convolution
                while k < lay.size and lay_ts[k] < c.end[i]:
                    k += 1
                if k < lay.size and t.name_of(int(lay[k])) in N.BN_OPS:
                    pairs.append(int(i))
        if pairs:
            adds = np.flatnonzero(cpu_ops & t.mask_name_in(("aten::add_", "aten::add")))
            bias_adds = _inside(c, np.asarray(pairs), np.isin(np.arange(len(t)), adds))
            bias_time = (_gpu_time_of(c, bias_adds) if has_gpu else float(t.dur[bias_adds].sum()))
    v["conv_bias_bn_pairs"] = len(pairs)
    v["conv_bias_ms_total"] = bias_time / 1000.0
    rf.evidence["conv_bias"] = c.worst(np.asarray(pairs, dtype=np.int64), detail=lambda i: "convolution with bias feeding batch norm")


def _gemm_kn(name: str, dims) -> tuple[int, ...] | None:
    """(K, N) of a GEMM op from its Input Dims, or None when shapes are missing."""
    if not isinstance(dims, list):
        return None
    try:
        if name == "aten::mm" and len(dims) >= 2 and len(dims[0]) == 2 and len(dims[1]) == 2:
            return int(dims[0][1]), int(dims[1][1])
        if name == "aten::addmm" and len(dims) >= 3 and len(dims[1]) == 2 and len(dims[2]) == 2:
            return int(dims[1][1]), int(dims[2][1])
        if name == "aten::bmm" and len(dims) >= 2 and len(dims[0]) == 3 and len(dims[1]) == 3:
            return int(dims[0][2]), int(dims[1][2])
        if name == "aten::baddbmm" and len(dims) >= 3 and len(dims[1]) == 3 and len(dims[2]) == 3:
            return int(dims[1][2]), int(dims[2][2])
    except (TypeError, ValueError, IndexError):
        return None
    return None


def _memory(c: _Ctx, rf: RankFeatures, step_starts: np.ndarray, step_ends: np.ndarray) -> None:
    t = c.t
    v = rf.v
    mem = np.flatnonzero((t.ph == PH_INSTANT) & t.mask_name_in("[memory]"))
    v["memory_events"] = int(mem.size)
    tot = t.total_allocated[mem]
    ok = ~np.isnan(tot)
    mem, tot = mem[ok], tot[ok]
    if mem.size == 0:
        return
    v["memory_peak_bytes"] = float(tot.max())
    if step_ends.size < 3:
        return
    best = None
    for dev in np.unique(t.device[mem]):
        sel = t.device[mem] == dev
        m_ts, m_tot = t.ts[mem][sel], tot[sel]
        order = np.argsort(m_ts, kind="stable")
        m_ts, m_tot = m_ts[order], m_tot[order]
        k = np.searchsorted(m_ts, step_ends, side="right") - 1
        valid = k >= 0
        if valid.sum() < 3:
            continue
        level = m_tot[k[valid]]
        slope = float(np.polyfit(np.arange(level.size), level, 1)[0])
        growth = 100.0 * (level[-1] - level[0]) / max(level[0], 1.0)
        mono = bool(np.all(np.diff(level) >= -1024))
        if best is None or slope > best[0]:
            best = (slope, growth, mono, int(dev))
    if best:
        v["memory_growth_bytes_per_step"], v["memory_growth_pct"], v["memory_growth_monotonic"], dev = best
        # where the memory is allocated: the Python frames around the largest allocation of the last step
        last = (t.ts[mem] >= step_starts[-1]) & (t.ts[mem] <= step_ends[-1]) & (t.device[mem] == dev)
        allocs = mem[last & (t.nbytes[mem] > 0)]
        frames = c.frames.frames_for(int(allocs[np.argmax(t.nbytes[allocs])])) if allocs.size else []
        rf.evidence["memory"] = [
            EvidenceEvent(
                name=f"allocated memory at step ends (device {dev})",
                rank=t.rank,
                ts_ms=round((float(step_ends[0]) - c.t0) / 1000.0, 4),
                dur_ms=round(float(step_ends[-1] - step_ends[0]) / 1000.0, 4),
                category="[memory]",
                detail=f"grows {best[0] / 2**20:.2f} MiB per step ({best[1]:.1f}% over the window)",
                frames=frames,
            )
        ]


def rank_features(trace: RankTrace) -> RankFeatures:
    c = _Ctx(trace)
    rf = RankFeatures(rank=trace.rank, t0=c.t0)
    rf.v["has_python_stacks"] = c.frames.available
    step_starts, step_ends = _steps(c, rf)
    c.compiles = compiles, recompiles = _compiles(c, step_starts)  # host-side; _gpu relates them to idle time
    rf.v["startup_compiles"], rf.v["recompiles"] = len(compiles), len(recompiles)
    rf.v["recompile_ms_total"] = float(trace.dur[np.asarray(recompiles, dtype=np.int64)].sum()) / 1000.0
    _gpu(c, rf, step_starts, step_ends)
    _host(c, rf, step_starts, step_ends)
    _operators(c, rf)
    _memory(c, rf, step_starts, step_ends)
    if recompiles:
        rf.evidence["recompiles"] = c.worst(np.asarray(recompiles, dtype=np.int64),
                                            detail=lambda i: "torch.compile compiling again: a recompilation")
    rf.evidence_keys = c.keys
    return rf
