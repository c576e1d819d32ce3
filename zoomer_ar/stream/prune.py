"""Drop the compact rows that cannot change any feature (for the memory bound on huge traces).

The streaming pass keeps supersets: every aten op that overlaps an optimizer window, every
factory, layer, add and backward op, every runtime call with a launch-like name. On a long
training trace most of them turn out not to matter, and the feature code's working memory grows
with the rows it is given (about 100 bytes per row at its peak). Once the whole rank is known,
`prune` removes the rows that no feature can select, each rule mirroring the selection it
protects (zoomer_ar/features/host.py, operators.py, relations.py and phases.py):

- aten ops kept for the optimizer counts that are not inside an Optimizer.step# window by the
  features' own test (`_inside`: intervals.contained, same float arithmetic);
- factory ops that are not the latest-ending factory before an `aten::_to_copy` on their thread
  (`features.host.factory_then_move` reads only that end time);
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
from ..load.columns import INT_NONE, PH_COMPLETE, RankTrace, row_positions

# name roles
R_PROTECT, R_WINDOW, R_FACTORY, R_BW, R_LAYER, R_ADD, R_COPY_ = 1, 2, 4, 8, 16, 32, 64
_PROTECTED = (N.ITEM_OPS | N.ITEM_FALLBACK_OPS | N.COPY_OPS | N.GEMM_OPS | N.CONV_OPS | N.ZERO_FILL_OPS
              | {"aten::_to_copy"})


def _role(name: str) -> int:
    r = 0
    if (name in _PROTECTED or N.is_profiler_step(name) or N.is_dataloader_next(name) or N.is_optimizer_step(name)
            or N.is_zero_grad(name) or name == "[memory]" or N.is_compile_window(name)):
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


def _inside(ts, dur, tid, idx, outer) -> np.ndarray:
    """features.relations.inside: rows of idx inside the union of `outer` rows on their own thread.
    Ends are `ts + dur` of the rows at hand (the same float sums as a whole `end` column)."""
    keep = np.zeros(idx.size, dtype=bool)
    if idx.size == 0 or outer.size == 0:
        return keep
    for t in _codes_of(tid[outer]):
        o = outer[tid[outer] == t]
        u = iv.union(ts[o], ts[o] + dur[o])
        sel = np.flatnonzero(tid[idx] == t)
        for a in range(0, sel.size, _INSIDE_CHUNK):  # row by row arithmetic: chunks bound the temporaries
            part = sel[a : a + _INSIDE_CHUNK]
            cs = idx[part]
            s, d = ts[cs], dur[cs]
            keep[part] = iv.contained(s, s + d, d, u)
            del s, d, cs
        del sel
    return keep


_CHUNK = 1 << 18  # rows per step of the whole-column sums below
# rows per step of _inside: intervals.contained holds about ten float64 temporaries a row (80 bytes),
# 20 MB at 1 << 18 rows, the prune's peak on a 0.5 GB trace; 2.6 MB at this size, at no cost in time
_INSIDE_CHUNK = 1 << 15


def _chunks(n: int):
    return ((a, min(a + _CHUNK, n)) for a in range(0, n, _CHUNK))


def removable(t: RankTrace) -> np.ndarray:
    """Boolean mask of rows no feature can select.

    Memory: this runs on the whole compact rank before it is pruned, when the rank is at its
    largest, so it keeps no per-row float column (ends are computed on the rows each rule reads),
    takes row positions as int32 and frees each mask once used."""
    n = len(t)
    out = np.zeros(n, dtype=bool)
    x = t.ph == PH_COMPLETE
    device = t.mask_cat(*N.GPU_CATS, *N.ACCEL_ONLY_CATS)
    device &= x
    if not device.any():
        return out  # phases split host time over every host op
    del device  # computed again at the end (one byte per row less while the rules run)
    roles_of = np.fromiter((_role(s) for s in t.names), dtype=np.uint8, count=len(t.names))
    roles = roles_of[t.name]
    ts, dur, tid = t.ts, t.dur, t.tid
    cpu = t.mask_cat(*N.CPU_OP_CATS)
    cpu &= x
    host = t.mask_cat(*N.CPU_OP_CATS, "user_annotation")
    host &= x
    host &= ~t.mask_cat("gpu_user_annotation")
    # a role lets a row go when ...
    ok = np.full(n, True)

    def with_role(base: np.ndarray, bits: int, roles: np.ndarray = roles) -> np.ndarray:
        return base & (np.bitwise_and(roles, bits) != 0)

    # ... per-parameter ops: not inside an optimizer window
    win = row_positions(with_role(cpu, R_WINDOW))
    if win.size:
        opt = t.mask_names(N.is_optimizer_step)
        opt &= x
        opt &= ~t.mask_cat("gpu_user_annotation")
        opt = row_positions(opt)
        ok[win[_inside(ts, dur, tid, win, opt)]] = False
        del opt
    del win
    # ... factories: not the latest-ending factory before a `_to_copy` on the thread
    fac = row_positions(with_role(cpu, R_FACTORY))
    to_copy = row_positions(cpu & t.mask_names(lambda s: s == "aten::_to_copy"))
    if fac.size and to_copy.size:
        for th in _codes_of(tid[to_copy]):
            f = fac[tid[fac] == th]
            if f.size == 0:
                continue
            f_end = t.end[f]
            order = np.argsort(f_end, kind="stable")
            f_end = f_end[order]
            k = np.searchsorted(f_end, ts[to_copy[tid[to_copy] == th]], side="right") - 1
            k = k[k >= 0]
            if k.size:  # every row with that end value: the features read only the value
                need = np.isin(f_end, np.unique(f_end[k]))
                ok[f[order[need]]] = False
    del fac, to_copy
    # ... backward ops: contained in an earlier backward op of the same thread
    bw = row_positions(with_role(host, R_BW))
    if bw.size:
        keep_bw = np.ones(bw.size, dtype=bool)
        for th in _codes_of(tid[bw]):
            sel = np.flatnonzero(tid[bw] == th)
            order = sel[np.argsort(ts[bw[sel]], kind="stable")]
            rows = bw[order]
            e = t.end[rows]
            prev = np.maximum.accumulate(np.concatenate([[-np.inf], e[:-1]]))
            keep_bw[order] = ~(e <= prev)
        ok[bw[keep_bw]] = False
    del bw
    # ... layer and add ops: not the first layer op after a convolution, adds not inside one
    convs = row_positions(cpu & t.mask_names(lambda s: s in N.CONV_OPS))
    if convs.size and with_role(cpu, R_LAYER | R_ADD).any():
        layer = row_positions(cpu & t.mask_names(lambda s: s in N.LAYER_OPS))
        for th in _codes_of(tid[convs]):
            lay = layer[tid[layer] == th]
            lay = lay[np.argsort(ts[lay], kind="stable")]
            if lay.size == 0:
                continue
            cv = convs[tid[convs] == th]
            c_end = t.end[cv]
            k = np.searchsorted(ts[lay], c_end - 1e-6)
            for j, ce in zip(k.tolist(), c_end.tolist()):
                while j < lay.size and ts[lay[j]] < ce:
                    j += 1
                if j < lay.size:
                    ok[lay[j]] = False
        del layer
        adds = row_positions(with_role(cpu, R_ADD))
        ok[adds[_inside(ts, dur, tid, adds, convs)]] = False
        del adds
    del convs
    # ... copy_ casts: no copy op at all
    cp = with_role(cpu, R_COPY_)
    if cp.any() and (cpu & t.mask_names(lambda s: s in N.COPY_OPS)).any():
        ok[cp] = False
    del cp

    roled = with_role(cpu, R_WINDOW | R_FACTORY | R_LAYER | R_ADD | R_COPY_)
    roled |= with_role(host, R_BW)
    roled &= np.bitwise_and(roles, R_PROTECT) == 0
    roled &= ok
    out |= roled
    del roled, ok
    # host ops no feature names (kept before the first device event, for a host-only phase split)
    cpu |= host
    cpu &= roles == 0
    out |= cpu
    del cpu, host, roles, with_role  # (with_role holds roles)
    # never the rows that set the rank's window (wall time, evidence times, trace start)
    span = x & ~t.mask_cat("Trace")
    if span.any():
        first = ts.min(where=span, initial=np.inf)
        last = max(float((ts[a:b] + dur[a:b]).max(where=span[a:b], initial=-np.inf)) for a, b in _chunks(n))
        for a, b in _chunks(n):  # (ts == first) | (end == last), on the span rows, a chunk at a time
            hit = (ts[a:b] == first) | ((ts[a:b] + dur[a:b]) == last)
            hit &= span[a:b]
            out[a:b] &= ~hit
    del span
    out &= ~(x & (ts == ts.min(where=x, initial=np.inf)))

    # runtime calls kept for their correlation id only
    rt = t.mask_cat(*N.RUNTIME_CATS)
    if rt.any():
        rt &= ~t.mask_names(N.is_kept_runtime_call)
        cand = row_positions(rt)
        del rt
        if cand.size:
            device = t.mask_cat(*N.GPU_CATS, *N.ACCEL_ONLY_CATS)
            device &= x
            gpu_corr = np.sort(t.correlation[row_positions(device)])
            del device
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
    dropped = np.flatnonzero(drop)  # k positions; a row's new position is its old one less the drops before it
    np.logical_not(drop, out=drop)
    keep = drop
    n_keep = keep.size - k
    for f in ("ts", "dur", "ph", "cat", "name", "pid", "tid", "correlation", "stream", "device", "external_id",
              "nbytes", "total_allocated"):
        a = getattr(t, f)
        # a broadcast column (compact.constant_columns) stays one value
        setattr(t, f, np.broadcast_to(a[:1], (n_keep,)) if a.ndim == 1 and a.strides == (0,) else a[keep])
    for f in ("input_dims", "input_type", "call_stack", "collective", "msg_nelems", "python_id"):
        d = getattr(t, f)
        if d:
            rows = np.fromiter(d.keys(), dtype=np.int64, count=len(d))
            new_pos = (rows - np.searchsorted(dropped, rows)).tolist()
            setattr(t, f, {p: v for p, (i, v), kept in zip(new_pos, d.items(), keep[rows].tolist()) if kept})
    return k, before
