"""Drop the compact rows that cannot change any feature (for the memory bound on huge traces).

The streaming pass keeps supersets: every aten op that overlaps an optimizer window, every
factory, layer, add and backward op, every runtime call with a launch-like name. On a long
training trace most of them turn out not to matter, and the feature code's working memory grows
with the rows it is given (about 100 bytes per row at its peak). Once the whole rank is known,
`prune` removes the rows that no feature can select, each rule mirroring the selection it
protects (zoomer_ar/features/rank.py and phases.py):

- aten ops kept for the optimizer counts that are not inside an Optimizer.step# window by the
  features' own test (`_inside`: overlap >= 0.999 x duration, same float arithmetic);
- factory ops that are not the latest-ending factory before an `aten::_to_copy` on their thread
  (`_factory_then_move` reads only that end time);
- backward ops contained in an earlier backward op of their thread (phases reads only their
  union per thread and the set of threads);
- layer, batch-norm and add ops that are neither the first layer op after a convolution on its
  thread nor (adds) inside a convolution (`_operators`, conv + bias + batch norm); all of them
  when the rank has no convolution;
- `aten::copy_` casts when there is no copy op they could sit in;
- runtime calls that neither launch, synchronise nor allocate and whose correlation id no GPU or
  accelerator event carries.

A row with several roles (an `aten::empty` inside an optimizer window is a factory and a
per-parameter op) goes only when every role lets it go; rows of any other kind are never
dropped, and nothing is dropped from a rank without device events (its phase split reads every
host op). tests/huge checks features and findings with pruning forced on every corpus trace.
"""

from __future__ import annotations

import numpy as np

from ..features import intervals as iv
from ..features import names as N
from ..features.phases import is_backward_op
from ..load.columns import INT_NONE, PH_COMPLETE, RankTrace

# name roles
R_PROTECT, R_WINDOW, R_FACTORY, R_BW, R_LAYER, R_ADD, R_COPY_ = 1, 2, 4, 8, 16, 32, 64
_PROTECTED = (N.ITEM_OPS | N.ITEM_FALLBACK_OPS | N.COPY_OPS | N.GEMM_OPS | N.CONV_OPS | N.ZERO_FILL_OPS
              | {"aten::_to_copy"})


def _role(name: str) -> int:
    r = 0
    if (name in _PROTECTED or N.is_profiler_step(name) or N.is_dataloader_next(name) or N.is_optimizer_step(name)
            or N.is_zero_grad(name) or name == "[memory]"):
        r |= R_PROTECT
    if name.startswith("aten::"):
        r |= R_WINDOW
    if name in N.FACTORY_OPS:
        r |= R_FACTORY
    if is_backward_op(name):
        r |= R_BW
    if name in N.LAYER_OPS or name in N.BN_OPS:
        r |= R_LAYER
    if name in ("aten::add_", "aten::add"):
        r |= R_ADD
    if name == "aten::copy_":
        r |= R_COPY_
    return r


def _codes_of(a: np.ndarray) -> list[int]:
    """Distinct values of a small-range integer array (thread codes), sorted: np.unique without its
    hash table, which is slow on millions of values."""
    if a.size == 0:
        return []
    lo = int(a.min())
    return (np.flatnonzero(np.bincount(a.astype(np.int64) - lo)) + lo).tolist()


def _inside(ts, end, dur, tid, idx, outer) -> np.ndarray:
    """features.rank._inside: rows of idx inside the union of `outer` rows on their own thread."""
    keep = np.zeros(idx.size, dtype=bool)
    if idx.size == 0 or outer.size == 0:
        return keep
    for t in _codes_of(tid[outer]):
        o = outer[tid[outer] == t]
        u = iv.union(ts[o], end[o])
        sel = tid[idx] == t
        if sel.any():
            cs = idx[sel]
            keep[sel] = iv.overlap_with(ts[cs], end[cs], u) >= dur[cs] * 0.999
    return keep


def removable(t: RankTrace) -> np.ndarray:
    """Boolean mask of rows no feature can select."""
    n = len(t)
    out = np.zeros(n, dtype=bool)
    x = t.ph == PH_COMPLETE
    device = t.mask_cat(*N.GPU_CATS, *N.ACCEL_ONLY_CATS) & x
    if not device.any():
        return out  # phases split host time over every host op
    roles_of = np.fromiter((_role(s) for s in t.names), dtype=np.uint8, count=len(t.names))
    roles = roles_of[t.name]
    ts, dur, tid = t.ts, t.dur, t.tid
    end = ts + dur
    cpu = t.mask_cat(*N.CPU_OP_CATS) & x
    host = (t.mask_cat(*N.CPU_OP_CATS, "user_annotation") & x) & ~t.mask_cat("gpu_user_annotation")
    # a role lets a row go when ...
    ok = np.full(n, True)

    # ... per-parameter ops: not inside an optimizer window
    win = np.flatnonzero(cpu & ((roles & R_WINDOW) != 0))
    if win.size:
        opt = np.flatnonzero(t.mask_names(N.is_optimizer_step) & x & ~t.mask_cat("gpu_user_annotation"))
        ok[win[_inside(ts, end, dur, tid, win, opt)]] = False
    # ... factories: not the latest-ending factory before a `_to_copy` on the thread
    fac = np.flatnonzero(cpu & ((roles & R_FACTORY) != 0))
    to_copy = np.flatnonzero(cpu & t.mask_names(lambda s: s == "aten::_to_copy"))
    if fac.size and to_copy.size:
        for th in _codes_of(tid[to_copy]):
            f = fac[tid[fac] == th]
            if f.size == 0:
                continue
            order = np.argsort(end[f], kind="stable")
            f_end = end[f][order]
            k = np.searchsorted(f_end, ts[to_copy[tid[to_copy] == th]], side="right") - 1
            k = k[k >= 0]
            if k.size:  # every row with that end value: the features read only the value
                need = np.isin(f_end, np.unique(f_end[k]))
                ok[f[order[need]]] = False
    # ... backward ops: contained in an earlier backward op of the same thread
    bw = np.flatnonzero(host & ((roles & R_BW) != 0))
    if bw.size:
        keep_bw = np.ones(bw.size, dtype=bool)
        for th in _codes_of(tid[bw]):
            sel = np.flatnonzero(tid[bw] == th)
            order = sel[np.argsort(ts[bw[sel]], kind="stable")]
            e = end[bw[order]]
            prev = np.maximum.accumulate(np.concatenate([[-np.inf], e[:-1]]))
            keep_bw[order] = ~(e <= prev)
        ok[bw[keep_bw]] = False
    # ... layer and add ops: not the first layer op after a convolution, adds not inside one
    lay_role = cpu & ((roles & (R_LAYER | R_ADD)) != 0)
    convs = np.flatnonzero(cpu & t.mask_names(lambda s: s in N.CONV_OPS))
    if convs.size and lay_role.any():
        layer = np.flatnonzero(cpu & t.mask_names(lambda s: s in N.LAYER_OPS))
        for th in _codes_of(tid[convs]):
            lay = layer[tid[layer] == th]
            lay = lay[np.argsort(ts[lay], kind="stable")]
            if lay.size == 0:
                continue
            c_end = end[convs[tid[convs] == th]]
            k = np.searchsorted(ts[lay], c_end - 1e-6)
            for j, ce in zip(k.tolist(), c_end.tolist()):
                while j < lay.size and ts[lay[j]] < ce:
                    j += 1
                if j < lay.size:
                    ok[lay[j]] = False
        adds = np.flatnonzero(cpu & ((roles & R_ADD) != 0))
        ok[adds[_inside(ts, end, dur, tid, adds, convs)]] = False
    # ... copy_ casts: no copy op at all
    cp = cpu & ((roles & R_COPY_) != 0)
    if cp.any() and (cpu & t.mask_names(lambda s: s in N.COPY_OPS)).any():
        ok[cp] = False

    roled = cpu & ((roles & (R_WINDOW | R_FACTORY | R_LAYER | R_ADD | R_COPY_)) != 0)
    roled |= host & ((roles & R_BW) != 0)
    roled &= (roles & R_PROTECT) == 0
    out |= roled & ok
    # host ops no feature names (kept before the first device event, for a host-only phase split)
    out |= (cpu | host) & (roles == 0)
    # never the rows that set the rank's window (wall time, evidence times, trace start)
    span = x & ~t.mask_cat("Trace")
    if span.any():
        out &= ~(span & ((ts == ts[span].min()) | (end == end[span].max())))
    out &= ~(x & (ts == ts[x].min()))

    # runtime calls kept for their correlation id only
    rt = t.mask_cat(*N.RUNTIME_CATS)
    if rt.any():
        launchlike = t.mask_names(lambda s: N.is_launch(s) or s in N.SYNC_APIS or s in N.ALLOCATOR_APIS)
        cand = np.flatnonzero(rt & ~launchlike)
        if cand.size:
            gpu_corr = np.sort(t.correlation[np.flatnonzero(device)])
            corr = t.correlation[cand]
            pos = np.clip(np.searchsorted(gpu_corr, corr), 0, max(gpu_corr.size - 1, 0))
            hit = gpu_corr[pos] == corr if gpu_corr.size else np.zeros(corr.size, dtype=bool)
            needed = x[cand] & (corr != INT_NONE) & hit
            out[cand[~needed]] = True
    return out


def prune(t: RankTrace, protect_from: int | None = None) -> tuple[int, int]:
    """Remove, in place, the rows `removable` marks (never rows at or after `protect_from`);
    returns (rows removed, rows removed before `protect_from`)."""
    drop = removable(t)
    if protect_from is not None:
        drop[protect_from:] = False
    k = int(drop.sum())
    before = int(drop[:protect_from].sum()) if protect_from is not None else k
    if k == 0:
        return 0, 0
    keep = ~drop
    del drop
    new_pos = np.cumsum(keep) - 1
    for f in ("ts", "dur", "ph", "cat", "name", "pid", "tid", "correlation", "stream", "device", "external_id",
              "nbytes", "total_allocated"):
        setattr(t, f, getattr(t, f)[keep])
    for f in ("input_dims", "input_type", "call_stack", "collective", "msg_nelems", "python_id"):
        d = getattr(t, f)
        if d:
            setattr(t, f, {int(new_pos[i]): v for i, v in d.items() if keep[i]})
    return k, before
