"""Device-side features: GPU busy time and its timeline, kernels and their launches, copies and memsets,
communication and its overlap with compute, GEMM kernel precision, allocator calls in steady steps.
The idle gaps inside the GPU span and their causes are idle.py's."""

from __future__ import annotations

import numpy as np

from ..load.columns import INT_NONE, row_positions
from . import intervals as iv
from . import names as N
from .context import EVIDENCE_PER_KIND, RankContext, RankFeatures, pct
from . import syncs as S
from .idle import idle_gaps, window_idle
from .startup import captures_of, startup_calls, window_captures, window_startup


def gpu_features(c: RankContext, rf: RankFeatures, step_starts: np.ndarray, step_ends: np.ndarray) -> None:
    t = c.t
    v = rf.v
    n_steps = v["n_steps"]
    gpu_idx = row_positions(c.gpu)
    accel_idx = np.flatnonzero(t.mask_cat(*N.ACCEL_ONLY_CATS) & c.x)
    v["has_gpu"] = bool(gpu_idx.size)
    v["has_accelerator"] = bool(gpu_idx.size or accel_idx.size)
    if not gpu_idx.size:
        if c.window is not None:  # other windows of the rank may have device work: this one's launches count
            window_without_device(c, rf, step_starts, step_ends)
        return
    runtime = t.mask_cat(*N.RUNTIME_CATS) & c.x
    startup, typical = startup_calls(c, runtime, step_starts)  # before the per-GPU-row temporaries
    if c.window is not None:  # the merge tells start-up calls with the rank's typical calls, not the window's
        v["_w_startup"] = window_startup(c, runtime, step_starts)
        startup, typical = startup[:0], typical[:0]
    v["startup_calls"] = int(startup.size)
    captures = captures_of(c, runtime, step_starts)
    v["captured_launches"] = int(sum(n for _, _, _, n in captures))
    if c.window is not None:
        v["_w_captures"] = window_captures(c, runtime, step_starts)
    gs, ge = t.ts[gpu_idx], c.end[gpu_idx]
    us, ue = iv.union(gs, ge)
    del ge  # the per-row temporaries of this function are dropped once used: peak memory of big traces
    span = float(ue.max() - us.min())
    busy = float((ue - us).sum())
    v["gpu_span_ms"] = span / 1000.0
    v["gpu_busy_pct"] = 100.0 * busy / span if span > 0 else 100.0
    v["_gpu_union"] = (us, ue)
    if c.window is not None:
        v["_w_gpu"] = window_gpu(c, us, ue, runtime, step_starts, step_ends, busy)
        caps = v["_w_captures"]  # the middle's busy time after an open capture's start, before a leading end's end
        mid_busy = v["_w_gpu"]["busy"] - iv.total(*v["_w_gpu"]["edge"]) if v["_w_gpu"]["edge"][0].size else v["_w_gpu"]["busy"]
        for k, o in list(caps["open"].items()):
            after = float(iv.overlap_with(np.array([o[0]]), np.array([np.inf]), (us, ue))[0]
                          - iv.overlap_with(np.array([o[0]]), np.array([np.inf]), v["_w_gpu"]["edge"])[0])
            caps["open"][k] = (*o, after)
        for k, (e, n) in list(caps["lead"].items()):
            before = float(iv.overlap_with(np.array([-np.inf]), np.array([e]), (us, ue))[0]
                           - iv.overlap_with(np.array([-np.inf]), np.array([e]), v["_w_gpu"]["edge"])[0])
            caps["lead"][k] = (e, n, before)
        caps["mid_busy"] = mid_busy
        cands = v["_w_startup"]["candidates"]
        if cands:  # each candidate's busy time in the window's middle: the merge finds its idle time
            a, b = np.array([x["ts"] for x in cands]), np.array([x["end"] for x in cands])
            mid = iv.overlap_with(a, b, (us, ue)) - iv.overlap_with(a, b, v["_w_gpu"]["edge"])
            for x, m in zip(cands, mid.tolist()):
                x["mid_busy"] = m
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
    del gs, gpu_idx  # idle_gaps takes them again: this frame holds no per-row temporary meanwhile

    # --- kernels / launches
    kern = row_positions(t.mask_cat(*N.KERNEL_CATS) & c.x)
    kd = t.dur[kern]
    v["kernel_count"] = int(kern.size)
    v["kernel_ms_total"] = float(kd.sum()) / 1000.0
    v["kernel_dur_p50_us"] = pct(kd, 50)
    v["kernel_dur_p90_us"] = pct(kd, 90)
    v["short_kernel_share"] = float((kd < 10.0).mean()) if kd.size else None
    launch = row_positions(c.name_mask(N.is_launch, runtime))
    v["launch_count"] = int(launch.size)
    v["launch_dur_p50_us"] = pct(t.dur[launch], 50)
    v["launch_ms_total"] = float(t.dur[launch].sum()) / 1000.0
    per_kernel = launch_cost_per_kernel(c, launch, kern)
    if c.window is not None:  # value counts: exact percentiles of the merged windows (O(distinct values))
        v["_w_kernels"] = {"dur": np.unique(kd, return_counts=True), "launch": np.unique(t.dur[launch], return_counts=True),
                           "per_kernel": np.unique(per_kernel, return_counts=True), "short": int((kd < 10.0).sum())}
    del launch
    if v["kernel_dur_p50_us"] is not None and per_kernel.size and float(np.median(per_kernel)) > 0:
        v["kernel_to_launch_ratio"] = v["kernel_dur_p50_us"] / float(np.median(per_kernel))

    idle_gaps(c, rf, us, ue, runtime, startup, typical, captures)
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
        rf.evidence["dtod"] = c.worst(dtod, detail=lambda i: f"{t.nbytes[i]:,.0f} bytes" if t.nbytes[i] == t.nbytes[i] else "")
        rf.evidence["pageable"] = c.worst(pg, detail=lambda i: f"{t.nbytes[i]:,.0f} bytes" if t.nbytes[i] == t.nbytes[i] else "")

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
    if c.window is not None:
        window_unions(v["_w_gpu"], comp_u, mem_u, iv.union(t.ts[comm], c.end[comm]))
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
        order = comm[np.argsort(t.ts[comm], kind="stable")]
        codes, inverse = np.unique(t.name[order], return_inverse=True)
        types = np.array([N.collective_type(t.names[int(c)]) for c in codes.tolist()], dtype=object)[inverse]
        for ctype in dict.fromkeys(types.tolist()):  # in order of first appearance
            of = order[types == ctype]
            rf.collectives[ctype] = (t.ts[of].astype(np.float64), t.dur[of].astype(np.float64))
            rf.collectives_exposed[ctype] = (t.dur[of] - iv.overlap_with(t.ts[of], c.end[of], comp_u)).astype(np.float64)
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
    if c.window is not None:
        alloc, steady_steps = window_allocs(c, alloc, step_starts, step_ends)
    elif step_starts.size >= 2:
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
    if c.window is not None:
        v["_w_alloc"] = (int(alloc.size), float(t.dur[alloc].sum()))


HEAD_MAX = 4096  # busy intervals at the start of a window kept for the merge (features/windows.py)
MID_SAMPLES = 4096  # points of the busy time in a window's middle kept for the merged timeline


def _clip(u: tuple[np.ndarray, np.ndarray], lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    s, e = u
    keep = (e >= lo) & (s <= hi) & (lo < np.inf)
    return np.maximum(s[keep], lo), np.minimum(e[keep], hi)


def _split(u: tuple[np.ndarray, np.ndarray], head: float, pivot: float) -> tuple[tuple, tuple]:
    """A union's edge part (its intervals starting by `head`, and after `pivot`) and its middle."""
    s, e = u
    tail = _clip(u, pivot, np.inf)
    mid = _clip((s[s > head], e[s > head]), -np.inf, pivot)
    return (np.concatenate([s[s <= head], tail[0]]), np.concatenate([e[s <= head], tail[1]])), mid


def window_gpu(c: RankContext, us: np.ndarray, ue: np.ndarray, runtime: np.ndarray, step_starts: np.ndarray,
               step_ends: np.ndarray, busy: float) -> dict:
    """A window's device state for features/windows.py. Another window's device work can only meet this one's
    at its edges: its head (its first HEAD_MAX busy intervals, up to `head`; none in the first window) and its
    tail (after its pivot, its last runtime call or step start: work still queued when the next window began;
    the device queue bounds it; none in the last window). Between them lies its middle, which the merge takes
    as it is. Kept: the busy union's first start, last end and length; its edge intervals with the op each
    begins with (name, when its launch call ended: an idle gap's cause); the middle's extent and its first op;
    each step's busy time in the middle (CPU steps, GPU-side ProfilerStep ranges). O(HEAD_MAX + queue + steps)."""
    t = c.t
    index, _ = c.window or (0, 1)
    rt_ts = t.ts[runtime]
    pivot = np.inf if c.last_window else max(float(rt_ts.max()) if rt_ts.size else float(us[-1]),
                                             float(step_starts[-1]) if step_starts.size else -np.inf)
    head = -np.inf if index == 0 or us.size == 0 else float(ue[min(HEAD_MAX, us.size) - 1])
    if head >= pivot:  # a small window: all edge
        head = pivot = np.inf
    edge, mid = _split((us, ue), head, pivot)
    # the op each edge interval (and the middle) begins with, and when its launching call ended
    gpu_idx = row_positions(c.gpu)
    order = gpu_idx[np.argsort(t.ts[gpu_idx], kind="stable")]
    firsts = np.concatenate([edge[0], mid[0][:1]])
    ops = order[np.clip(np.searchsorted(t.ts[order], firsts - 1e-6), 0, order.size - 1)]
    keys, rows = c.launch_index()
    launch_end = np.full(ops.size, np.nan)
    if keys.size:
        want = t.correlation[ops]
        pos = np.clip(np.searchsorted(keys, want), 0, keys.size - 1)
        hit = (keys[pos] == want) & (want != INT_NONE)
        launch_end[hit] = c.end[rows[pos[hit]]]
    out: dict = {"first": float(us[0]), "last": float(ue.max()), "busy": busy, "pivot": pivot, "head": head,
                 "edge": edge, "edge_ops": ([t.name_of(int(i)) for i in ops.tolist()], launch_end),
                 "block": (float(mid[0][0]), float(mid[1].max())) if mid[0].size else None}
    if mid[0].size:  # the middle's busy time up to evenly spaced points (the merged timeline's bins)
        xs = np.linspace(float(mid[0][0]), float(mid[1].max()), MID_SAMPLES + 1)
        out["mid_cum"] = (float(xs[0]), float(xs[-1]), iv.overlap_with(np.full(xs.size, xs[0]), xs, mid))

    def own(ws: np.ndarray, we: np.ndarray) -> np.ndarray:  # busy time in the middle
        return iv.overlap_with(ws, we, (us, ue)) - iv.overlap_with(ws, we, edge)

    if step_starts.size:
        last = max(float(step_ends[-1]), float(ue.max())) if c.last_window else np.inf
        out["step_busy"] = own(step_starts, np.append(step_starts[1:], last))
    gpu_steps = np.flatnonzero(c.name_mask(N.is_profiler_step) & t.mask_cat("gpu_user_annotation"))
    if gpu_steps.size:
        so = np.argsort(t.ts[gpu_steps])
        ws, we = t.ts[gpu_steps][so], c.end[gpu_steps][so]
        out["ranges"] = (ws.astype(np.float64), we.astype(np.float64), own(ws, we))
    return out


def window_unions(w: dict, comp_u: tuple, mem_u: tuple, comm_u: tuple) -> None:
    """The compute, copy/memset and collective unions of a window (see window_gpu): their edge parts, and
    their middles' lengths and intersections (what the merge adds as they are)."""
    head, pivot = w["head"], w["pivot"]
    (ce, cm), (me, mm), (ke, km) = (_split(u, head, pivot) for u in (comp_u, mem_u, comm_u))
    w["unions"] = {"compute": ce, "mem": me, "comm": ke}
    w["mid"] = {"compute": float((cm[1] - cm[0]).sum()), "mem": float((mm[1] - mm[0]).sum()),
                "comm": float((km[1] - km[0]).sum()), "mem_compute": iv.intersection_total(mm, cm),
                "comm_compute": iv.intersection_total(km, cm)}


NO_DEVICE_KEYS = ("startup_calls", "captured_launches", "launch_count", "launch_ms_total", "allocator_calls",
                  "allocator_calls_per_step", "allocator_ms_per_step")


def window_without_device(c: RankContext, rf: RankFeatures, step_starts: np.ndarray, step_ends: np.ndarray) -> None:
    """A window without device events: the host side of gpu_features (start-up calls, captures, launches,
    steady allocator calls) and what the merge needs to split the GPU idle time around it (idle.window_idle).
    The merge keeps these (NO_DEVICE_KEYS) only where another window of the rank has device work."""
    t = c.t
    v = rf.v
    runtime = t.mask_cat(*N.RUNTIME_CATS) & c.x
    v["_w_startup"] = window_startup(c, runtime, step_starts)
    for x in v["_w_startup"]["candidates"]:
        x["mid_busy"] = 0.0
    startup = np.empty(0, dtype=np.int64)
    captures = captures_of(c, runtime, step_starts)
    v["_w_captures"] = window_captures(c, runtime, step_starts)
    launch = row_positions(c.name_mask(N.is_launch, runtime))
    ld = t.dur[launch]
    alloc, steady = window_allocs(c, np.flatnonzero(c.name_mask(N.ALLOCATOR_APIS, runtime)), step_starts, step_ends)
    v.update(startup_calls=int(startup.size), captured_launches=int(sum(n for _, _, _, n in captures)),
             launch_count=int(launch.size), launch_ms_total=float(ld.sum()) / 1000.0, allocator_calls=int(alloc.size),
             allocator_calls_per_step=alloc.size / steady, allocator_ms_per_step=float(t.dur[alloc].sum()) / 1000.0 / steady)
    v["_w_alloc"] = (int(alloc.size), float(t.dur[alloc].sum()))
    v["_w_kernels"] = {"dur": (np.empty(0), np.empty(0, dtype=np.int64)), "launch": np.unique(ld, return_counts=True),
                       "per_kernel": np.unique(ld.astype(np.float64), return_counts=True), "short": 0}
    compiles = c.compiles[0]
    one_off = iv.union(np.concatenate([t.ts[startup], [b for b, _, _, _ in captures], t.ts[compiles]]),
                       np.concatenate([c.end[startup], [e for _, e, _, _ in captures], c.end[compiles]]))
    item = S.device_waits(c, np.flatnonzero(c.name_mask(N.ITEM_OPS, t.mask_cat(*N.CPU_OP_CATS))), runtime)
    dl = np.flatnonzero(c.name_mask(N.is_dataloader_next))
    empty = np.empty(0)
    v["_w_idle"] = window_idle(c, None, empty, empty, dl, np.union1d(c.sync_calls(), item), one_off,
                               dict.fromkeys(("data", "sync", "host", "other", "startup", "startup_host"), empty))
    rf.evidence["allocator"] = c.worst(alloc)


def window_allocs(c: RankContext, alloc: np.ndarray, step_starts: np.ndarray, step_ends: np.ndarray) -> tuple[np.ndarray, int]:
    """The allocator calls of a window that lie in the rank's steady steps (from its second step to its last
    step's end): in the first window from its second step, in later ones all (their steps are all steady), up
    to the last step's end in the last window. (calls, the window's steady steps)"""
    index, _ = c.window or (0, 1)
    n = step_starts.size
    lo = (float(step_starts[1]) if n >= 2 else np.inf) if index == 0 else -np.inf
    hi = float(step_ends[-1]) if c.last_window and n else np.inf
    ts = c.t.ts[alloc]
    return alloc[(ts >= lo) & (ts <= hi)], max(n - 1 if index == 0 else n, 1)




def launch_cost_per_kernel(c: RankContext, launch: np.ndarray, kern: np.ndarray) -> np.ndarray:
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
