"""How rows relate: nesting on a thread (inside, outermost) and the device time a host op launched."""

from __future__ import annotations

import numpy as np

from ..load.columns import INT_NONE, row_positions
from . import intervals as iv
from . import names as N
from .context import RankContext


def inside(c: RankContext, outer: np.ndarray, candidates: np.ndarray) -> np.ndarray:
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


def outermost(c: RankContext, idx: np.ndarray) -> np.ndarray:
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


def gpu_time_by_op(c: RankContext, ops: np.ndarray) -> np.ndarray:
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


def gpu_time_of(c: RankContext, ops: np.ndarray) -> float:
    return float(gpu_time_by_op(c, ops).sum())


def gpu_time_launched_inside(c: RankContext, ops: np.ndarray) -> float:
    """GPU time (us) of the kernels and memsets launched by the runtime calls inside `ops` on their thread:
    an op's kernels are launched by the ops nested in it (aten::zero_ -> aten::fill_ -> cudaLaunchKernel), whose
    External id is not the outer op's. Matched by External id where no runtime call inside carries a correlation."""
    t = c.t
    if ops.size == 0:
        return 0.0
    launches = inside(c, ops, t.mask_cat(*N.RUNTIME_CATS) & c.x)
    launches = launches[t.correlation[launches] != INT_NONE]
    if launches.size == 0:
        return gpu_time_of(c, ops)
    dev = row_positions(t.mask_cat(*N.KERNEL_CATS, *N.MEMSET_CATS) & c.x)
    hit = np.isin(t.correlation[dev], t.correlation[launches])
    return float(t.dur[dev[hit]].sum())
