"""Which host calls made the GPU wait, and which of them are the job's own.

A sync-point finding is about synchronisations the user's code makes (`.item()`, `.cpu()`,
`torch.cuda.synchronize()`). A trace also holds calls that look alike and are not: the profiler's
own device sync when it stops, the stream sync inside a copy from pageable memory (the pageable
copy's cost), `.item()` on CPU tensors. These helpers tell them apart for context.py and idle.py;
`c` is the per-rank context (the trace `t`, the complete-event mask `x`, end times `end`, `name_mask`).
"""

from __future__ import annotations

import numpy as np

from ..load.columns import INT_NONE
from . import names as N


def device_waits(c, ops: np.ndarray, runtime: np.ndarray) -> np.ndarray:
    """The ops (of `ops`) that called the device runtime: a `.item()` on a GPU tensor copies the
    value back and synchronises inside `aten::_local_scalar_dense`; on a CPU tensor (an optimizer's
    step counter, a Python-side metric) it calls nothing and cannot make the GPU wait. A rank whose
    trace records no runtime calls keeps every op (nothing to tell them apart by)."""
    t = c.t
    rt = np.flatnonzero(runtime)
    if ops.size == 0 or rt.size == 0:
        return ops
    keep = np.zeros(ops.size, dtype=bool)
    for tid in np.unique(t.tid[ops]):
        on = np.flatnonzero(t.tid[ops] == tid)
        starts = np.sort(t.ts[rt[t.tid[rt] == tid]])
        if starts.size:
            o = ops[on]
            keep[on] = np.searchsorted(starts, c.end[o], side="right") > np.searchsorted(starts, t.ts[o], side="left")
    return ops[keep]


_DEVICE_SYNCS = ("cudaDeviceSynchronize", "hipDeviceSynchronize", "cuCtxSynchronize")


def profiler_stop_syncs(c, sync: np.ndarray) -> np.ndarray:
    """The device synchronisation torch.profiler makes when it stops tracing (stop_trace ->
    torch.cuda.synchronize): a device-wide sync call that begins after the last ProfilerStep on
    its thread has ended. Nearly every Kineto trace ends with one (29 of the corpus's step-annotated
    traces, every examples/gpu recording); it is the profiler's, not the job's."""
    t = c.t
    dev = sync[t.mask_name_in(_DEVICE_SYNCS)[sync]]
    if dev.size == 0:
        return dev
    steps = np.flatnonzero(c.name_mask(N.is_profiler_step) & ~t.mask_cat("gpu_user_annotation"))
    out = []
    for tid in np.unique(t.tid[dev]):
        on = steps[t.tid[steps] == tid]
        if on.size:
            d = dev[t.tid[dev] == tid]
            out.append(d[t.ts[d] >= c.end[on].max()])
    return np.concatenate(out) if out else dev[:0]


def pageable_copy_syncs(c, runtime: np.ndarray, sync: np.ndarray, gap_us: float) -> np.ndarray:
    """The sync calls (of `sync`) that belong to a host-to-device copy from pageable memory.

    PyTorch copies a pageable host tensor to the GPU with cudaMemcpyAsync (hipMemcpyAsync) and then
    synchronises the stream (the staging buffer must outlive the copy); a synchronous cudaMemcpy is
    the copy itself. Such a call is the pageable copy's cost (pageable-memcpy: pin the memory and
    copy with non_blocking=True), not a synchronisation the user wrote (sync-point): a sync call
    that is itself a pageable HtoD copy's runtime call, or that begins within gap_us of the end of
    one on the same thread, with no other runtime call between them. Device-to-host copies keep
    their syncs: the host waits for data it asked for (`.cpu()`, `.item()`). Where the trace does
    not say pageable or pinned (ROCm's "Memcpy HtoD (Host -> Device)"), a sync call that is itself
    the HtoD copy's runtime call (hipMemcpyWithStream) is the copy's cost too."""
    t = c.t
    if sync.size == 0:
        return sync
    mc = np.flatnonzero(t.mask_cat(*N.MEMCPY_CATS) & c.x)
    htod = [k for k in np.unique(t.name[mc]).tolist() if N.memcpy_kind(t.names[k]) == "htod"]
    codes = [k for k in htod if N.is_pageable(t.names[k])]
    # ROCm names a copy "Memcpy HtoD (Host -> Device)", pageable or pinned alike: a synchronous copy call
    # (hipMemcpyWithStream, what a blocking .to(device) issues there) is that copy's cost, not a user sync
    unknown = [k for k in htod if not N.is_pageable(t.names[k]) and "pinned" not in t.names[k].lower()]
    if not codes and not unknown:
        return sync[:0]
    rt = np.flatnonzero(runtime)

    def copies_of(kind_codes: list[int]) -> np.ndarray:
        corr = t.correlation[mc[t.has_name_code(t.name[mc], kind_codes)]] if kind_codes else np.empty(0, np.int64)
        corr = corr[corr != INT_NONE]
        return np.isin(t.correlation[rt], corr) & (t.correlation[rt] != INT_NONE)

    is_copy = copies_of(codes)
    is_own = is_copy | copies_of(unknown)
    if not is_own.any():
        return sync[:0]
    is_sync = np.isin(rt, sync)
    out = [rt[is_sync & is_own]]
    for tid in np.unique(t.tid[rt[is_copy]]):
        on = rt[t.tid[rt] == tid]
        on = on[np.argsort(t.ts[on], kind="stable")]
        prev_copy = np.isin(on[:-1], rt[is_copy])
        after = np.isin(on[1:], sync) & prev_copy & (t.ts[on[1:]] - c.end[on[:-1]] <= gap_us)
        out.append(on[1:][after])
    return np.unique(np.concatenate(out))
