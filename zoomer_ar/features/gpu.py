"""Device-side features: GPU busy time and its timeline, kernels and their launches, copies and memsets,
communication and its overlap with compute, GEMM kernel precision, allocator calls in steady steps.
The idle gaps inside the GPU span and their causes are idle.py's."""

from __future__ import annotations

import numpy as np

from ..load.columns import INT_NONE, row_positions
from . import intervals as iv
from . import names as N
from .context import EVIDENCE_PER_KIND, RankContext, RankFeatures, pct
from .idle import idle_gaps
from .startup import captures_of, startup_calls


def gpu_features(c: RankContext, rf: RankFeatures, step_starts: np.ndarray, step_ends: np.ndarray) -> None:
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
    startup, typical = startup_calls(c, runtime, step_starts)  # before the per-GPU-row temporaries
    v["startup_calls"] = int(startup.size)
    captures = captures_of(c, runtime, step_starts)
    v["captured_launches"] = int(sum(n for _, _, _, n in captures))
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
