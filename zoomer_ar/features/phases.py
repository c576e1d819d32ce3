"""Phase split of a job's time, for profiling-based cost attribution (docs/store.md, "Phases").

Every instant of each rank's profiled wall window (first to last CPU or GPU event, the window
behind `wall_ms`) is given to one of six phases, so the phase shares of a rank add up to 100%:

- **dataloader**: GPU work launched from inside `enumerate(DataLoader)#...__next__`, and GPU idle
  time while the host is inside such a call (the GPU is waiting for input).
- **forward**: GPU work launched by host ops outside backward, optimizer and dataloader (the
  forward pass and whatever else the step does: loss, metrics, host-to-device copies).
- **backward**: GPU work launched from inside `autograd::engine::evaluate_function: ...` ops
  (2021 schema: the autograd nodes, `...Backward`/`...Backward0`), or from the autograd engine's
  backward thread (a thread other than the ProfilerStep thread that runs such ops).
- **optimizer**: GPU work launched from inside `Optimizer.step#...` (and `Optimizer.zero_grad#...`).
- **communication**: collective kernels (`nccl*`/`rccl*`), whoever launched them.
- **idle**: the GPU runs nothing and the host is not inside the DataLoader.

GPU work is attributed through its launching runtime call (correlation id); work whose launch is
not in the trace counts as forward. Where kernels of several phases overlap (streams running
concurrently, communication overlapped by compute), the overlapped time is split equally
between the phases running. A rank without GPU events (CPU-only, or an accelerator without
kernel events) is split the same way on its host ops ("host" basis): optimizer, dataloader and
backward annotations as above, every other host op as forward, the rest as idle.

The job's shares are the mean over ranks (each rank is one device).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..load.columns import INT_NONE, PH_COMPLETE, RankTrace, row_positions
from . import intervals as iv
from . import names as N

PHASES: tuple[str, ...] = ("dataloader", "forward", "backward", "optimizer", "communication", "idle")
# Plausible wall-clock range for trace start times: 2000-01-01 .. 2100-01-01 (seconds since epoch).
_EPOCH_MIN_S = 946_684_800.0
_EPOCH_MAX_S = 4_102_444_800.0
_BACKWARD_NODE_RE = re.compile(r"Backward\d*$")


def is_backward_op(name: str) -> bool:
    """An autograd backward op: `autograd::engine::evaluate_function: XBackward0`, or (2021 schema) the node itself."""
    return name.startswith("autograd::engine::evaluate_function") or bool(_BACKWARD_NODE_RE.search(name))


def _is_optimizer_window(name: str) -> bool:
    return N.is_optimizer_step(name) or N.is_zero_grad(name)


def _plausible_epoch_s(v: float | None) -> bool:
    return v is not None and np.isfinite(v) and _EPOCH_MIN_S <= v <= _EPOCH_MAX_S


def trace_start_unix_s(trace: RankTrace) -> float | None:
    """Wall-clock time of a rank's first complete event, seconds since the epoch.

    Older traces write epoch microseconds: the first timestamp is the answer. Newer ones write
    microseconds of a monotonic clock and `baseTimeNanoseconds`, the epoch time of that clock's
    zero (the host's boot, weeks before the run): the start is the base plus the first timestamp,
    not the base alone."""
    x = trace.ph == PH_COMPLETE
    if not x.any():
        return None
    first_s = (float(trace.ts[x].min()) + trace.ts_base) / 1e6
    if _plausible_epoch_s(first_s):
        return first_s
    base = trace.metadata.get("baseTimeNanoseconds") if trace.metadata else None
    if isinstance(base, (int, float)) and not isinstance(base, bool) and _plausible_epoch_s(base / 1e9):
        start = float(base) / 1e9 + first_s
        return start if _plausible_epoch_s(start) else None
    return None


def _point_in(points: np.ndarray, u: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per point: inside the disjoint sorted interval set u (start inclusive, end exclusive)."""
    s, e = u
    if s.size == 0 or points.size == 0:
        return np.zeros(points.size, dtype=bool)
    k = np.searchsorted(s, points, side="right") - 1
    kk = np.maximum(k, 0)
    return (k >= 0) & (points < e[kk])


def _per_tid_union(trace: RankTrace, idx: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for tid in np.unique(trace.tid[idx]).tolist():
        sel = idx[trace.tid[idx] == tid]
        out[int(tid)] = iv.union(trace.ts[sel], trace.end[sel])
    return out


def _inside_per_tid(trace: RankTrace, points_idx: np.ndarray, unions: dict[int, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Per host event in points_idx: its start lies inside one of `unions` on its own thread."""
    hit = np.zeros(points_idx.size, dtype=bool)
    if not unions or points_idx.size == 0:
        return hit
    tids = trace.tid[points_idx]
    for tid, u in unions.items():
        sel = tids == tid
        if sel.any():
            hit[sel] = _point_in(trace.ts[points_idx[sel]], u)
    return hit


def _split(t0: float, t1: float, phase_unions: dict[str, tuple[np.ndarray, np.ndarray]],
           waiting_for_data: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    """Give every instant of [t0, t1] to the active phases (equal split), idle instants to dataloader or idle."""
    out = {p: 0.0 for p in PHASES}
    if t1 <= t0:
        return out
    bounds = [np.array([t0, t1])]
    for s, e in list(phase_unions.values()) + [waiting_for_data]:
        bounds.append(s)
        bounds.append(e)
    b = np.clip(np.concatenate(bounds), t0, t1)
    del bounds
    b = np.unique(b)
    if b.size < 2:
        return out
    # segments a chunk at a time: a GPU-dense trace has about as many boundaries as kernels, and
    # each segment's share needs a dozen numbers
    for a in range(0, b.size - 1, _SEGMENTS):
        seg_s, seg_e = b[a : a + _SEGMENTS], b[a + 1 : a + _SEGMENTS + 1]
        seg_s = seg_s[: seg_e.size]
        length = seg_e - seg_s
        mid = (seg_s + seg_e) / 2.0
        active = {p: _point_in(mid, u) for p, u in phase_unions.items()}
        n = np.zeros(mid.size)
        for act in active.values():
            n += act
        busy = n > 0
        share = np.where(busy, length / np.maximum(n, 1.0), 0.0)
        del n
        for p, act in active.items():
            out[p] += float(share[act].sum())
        del share, active
        idle = ~busy
        data = idle & _point_in(mid, waiting_for_data)
        out["dataloader"] += float(length[data].sum())
        out["idle"] += float(length[idle & ~data].sum())
    return out


_SEGMENTS = 1 << 18  # segments per step of _split
HOST_HEAD = 4096  # a window's first host-phase intervals kept for the merge (features/windows.py)


def rank_phases(trace: RankTrace, mid: tuple[float, float] | None = None) -> dict[str, Any]:
    """Phase time of one rank, microseconds: {"basis": "gpu"|"host"|None, "wall_us": .., "<phase>_us": ..}.
    `mid`: where the trace is one time window of a rank (features/windows.py), the middle of its device work
    (no other window's work lies there): the result then also holds, under "_w", the split of that middle, the
    phases' device work outside it and the DataLoader calls, from which the merge splits the rest (on a host
    basis: the split between the window's first HOST_HEAD intervals and its last host op's start, and the
    host ops outside that)."""
    t = trace
    x = t.ph == PH_COMPLETE
    allx = x & ~t.mask_cat("Trace")
    out: dict[str, Any] = {"basis": None, "wall_us": 0.0, **{f"{p}_us": 0.0 for p in PHASES}}
    if not allx.any():
        return out
    t0, t1 = float(t.ts.min(where=allx, initial=np.inf)), float((t.ts + t.dur).max(where=allx, initial=-np.inf))
    del allx
    out["wall_us"] = t1 - t0
    host_ops = (t.mask_cat(*N.CPU_OP_CATS, "user_annotation") & x) & ~t.mask_cat("gpu_user_annotation")
    opt = row_positions(host_ops & t.mask_names(_is_optimizer_window))
    dl = row_positions(x & t.mask_names(N.is_dataloader_next) & ~t.mask_cat("gpu_user_annotation"))
    bw = row_positions(host_ops & t.mask_names(is_backward_op))
    steps = row_positions(host_ops & t.mask_names(N.is_profiler_step))
    step_tids = set(np.unique(t.tid[steps]).tolist())
    # the autograd engine's thread: runs backward ops and is not the thread that runs the steps
    bw_threads = set(np.unique(t.tid[bw]).tolist()) - step_tids if step_tids else set()
    dl_union = iv.union(t.ts[dl], t.end[dl])
    device = row_positions((t.mask_cat(*N.GPU_CATS, *N.ACCEL_ONLY_CATS)) & x)
    if device.size:
        out["basis"] = "gpu"
        code = {p: i for i, p in enumerate(PHASES)}  # phase per device event as a 1-byte code
        phase_of = np.full(device.size, code["forward"], dtype=np.uint8)
        # launcher of each device event, by correlation id
        runtime = row_positions(t.mask_cat(*N.RUNTIME_CATS) & x)
        rt_corr = t.correlation[runtime]
        ok = rt_corr != INT_NONE
        runtime, rt_corr = runtime[ok], rt_corr[ok]
        order = np.argsort(rt_corr, kind="stable")
        runtime, rt_corr = runtime[order], rt_corr[order]
        del order
        want = t.correlation[device]
        launcher = np.full(device.size, -1, dtype=runtime.dtype)
        if rt_corr.size:
            pos = np.clip(np.searchsorted(rt_corr, want), 0, rt_corr.size - 1)
            hit = (rt_corr[pos] == want) & (want != INT_NONE)
            launcher = np.where(hit, runtime[pos], -1)
            del pos, hit
        del runtime, rt_corr, ok, want  # per-row temporaries: peak memory of big traces
        has = launcher >= 0
        li = launcher[has]
        sub = np.full(li.size, code["forward"], dtype=np.uint8)
        in_bw = _inside_per_tid(t, li, _per_tid_union(t, bw)) | np.isin(t.tid[li], list(bw_threads))
        sub[in_bw] = code["backward"]
        sub[_inside_per_tid(t, li, _per_tid_union(t, dl))] = code["dataloader"]
        sub[_inside_per_tid(t, li, _per_tid_union(t, opt))] = code["optimizer"]
        phase_of[has] = sub
        del sub, li, has, launcher, in_bw
        comm_codes = t.name_codes(N.is_comm_kernel)
        if comm_codes.size:
            phase_of[t.has_name_code(t.name[device], comm_codes) & t.mask_cat(*N.KERNEL_CATS)[device]] = code["communication"]
        unions = {}
        for p in PHASES:
            sel = device[phase_of == code[p]]
            if sel.size:
                unions[p] = iv.union(t.ts[sel], t.end[sel])
        split = _split(t0, t1, unions, dl_union) if mid is None else dict.fromkeys(PHASES, 0.0)  # windows: the merge's
        if mid is not None:
            lo, hi = max(t0, mid[0]), min(t1, mid[1])
            out["_w"] = {"mid": (lo, hi), "split": _split(lo, hi, unions, dl_union) if hi > lo else None,
                         "edges": {p: _outside(u, lo, hi) for p, u in unions.items()}, "dl": dl_union}
    else:
        host = row_positions(host_ops & ~t.mask_names(N.is_profiler_step))
        if not host.size:
            return out
        out["basis"] = "host"
        unions = {
            "optimizer": iv.union(t.ts[opt], t.end[opt]),
            "dataloader": dl_union,
            "backward": iv.union(t.ts[bw], t.end[bw]),
        }
        special = np.concatenate([opt, dl, bw])
        covered = iv.union(t.ts[special], t.end[special])
        inside = iv.contained(t.ts[host], t.end[host], t.dur[host], covered)
        other = host[~inside]
        if bw_threads:
            other = other[~np.isin(t.tid[other], list(bw_threads))]
            extra = host[np.isin(t.tid[host], list(bw_threads))]
            unions["backward"] = iv.union(np.concatenate([t.ts[bw], t.ts[extra]]), np.concatenate([t.end[bw], t.end[extra]]))
        unions["forward"] = iv.union(t.ts[other], t.end[other])
        unions = {p: u for p, u in unions.items() if u[0].size}
        none = (np.empty(0), np.empty(0))
        split = _split(t0, t1, unions, none) if mid is None else dict.fromkeys(PHASES, 0.0)  # windows: the merge's
        if mid is not None:  # a window without device work: its DataLoader calls for a device-basis merge, and
            # for a host-basis one its split up to its last host op's start and the host ops still open then
            # for a host-basis one: its split between its head (its first HOST_HEAD intervals of each phase, which
            # an earlier window's open host ops may overlap) and its last host op's start, and its phases outside
            last = float(t.ts[host].max())
            head = min([float(u[1][HOST_HEAD - 1]) for u in unions.values() if u[0].size >= HOST_HEAD], default=last)
            head = min(max(head, t0), last)
            out["_w"] = {"mid": (np.inf, np.inf), "split": None, "edges": {}, "dl": dl_union,
                         "host": {"range": (head, last), "split": _split(head, last, unions, none),
                                  "tails": {p: _outside(u, head, last) for p, u in unions.items()}}}
    for p in PHASES:
        out[f"{p}_us"] = split[p]
    return out


def _outside(u: tuple[np.ndarray, np.ndarray], lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The parts of the disjoint sorted intervals u before lo and after hi (all of them where hi <= lo)."""
    s, e = u
    if hi <= lo:
        return s, e
    a, b = s < lo, e > hi
    return (np.concatenate([s[a], np.maximum(s[b], hi)]), np.concatenate([np.minimum(e[a], lo), e[b]]))


def job_phases(ranks: list[RankTrace]) -> dict[str, Any]:
    """The `phases` group of the FeatureVector: per-phase shares (mean over ranks) and the trace start time."""
    return phases_of([rank_phases(tr) for tr in ranks], [trace_start_unix_s(tr) for tr in ranks])


def phases_of(per: list[dict[str, Any]], rank_starts: list[float | None]) -> dict[str, Any]:
    """job_phases from each rank's rank_phases and trace_start_unix_s (computed where the rank was read)."""
    starts = [s for s in rank_starts if s is not None]
    out: dict[str, Any] = {"trace_start_unix_s": min(starts) if starts else None}
    measured = [r for r in per if r["basis"] and r["wall_us"] > 0]
    bases = {r["basis"] for r in measured}
    out["phase_basis"] = ("gpu" if "gpu" in bases else "host") if bases else None
    for p in PHASES:
        if measured:
            out[f"phase_{p}_pct"] = float(np.mean([100.0 * r[f"{p}_us"] / r["wall_us"] for r in measured]))
        else:
            out[f"phase_{p}_pct"] = None
    return out
