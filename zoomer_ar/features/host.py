"""Host-side features: synchronisations and .item(), the DataLoader, the optimizer step and its
per-parameter ops, zero_grad fills, host-side copies and factory-then-move."""

from __future__ import annotations

import numpy as np

from . import intervals as iv
from . import names as N
from .context import RankContext, RankFeatures
from .relations import gpu_time_launched_inside, inside, outermost


def host_features(c: RankContext, rf: RankFeatures, step_starts: np.ndarray, step_ends: np.ndarray) -> None:
    t = c.t
    v = rf.v
    cpu_ops = t.mask_cat(*N.CPU_OP_CATS) & c.x
    # syncs
    sync = c.sync_calls()
    v["sync_calls"] = int(sync.size)
    v["sync_blocked_ms_total"] = float(t.dur[sync].sum()) / 1000.0
    item = np.flatnonzero(c.name_mask(N.ITEM_OPS, cpu_ops))
    if item.size == 0:
        item = np.flatnonzero(c.name_mask(N.ITEM_FALLBACK_OPS, cpu_ops))
    v["item_calls"] = int(item.size)
    item_outer = np.flatnonzero(c.name_mask(N.ITEM_FALLBACK_OPS, cpu_ops))
    if c.window is not None:  # the rank counts aten::item only where no window has _local_scalar_dense
        v["_w_items"] = (int(np.count_nonzero(c.name_mask(N.ITEM_OPS, cpu_ops))), int(item_outer.size))
    rf.evidence["sync"] = c.worst(np.concatenate([sync, item_outer if item_outer.size else item]))
    # dataloader
    dl = np.flatnonzero(c.name_mask(N.is_dataloader_next))
    v["dataloader_ms_total"] = float(t.dur[dl].sum()) / 1000.0
    v["dataloader_calls"] = int(dl.size)
    if dl.size:
        v["dataloader_workers"] = any("MultiProcessing" in t.name_of(int(i)) for i in dl[:50])
        if c.window is not None:  # the rank's first 50 calls may span windows
            v["_w_dl_workers"] = ["MultiProcessing" in t.name_of(int(i)) for i in dl[:50]]
    rf.evidence["dataloader"] = c.worst(dl)
    # optimizer
    opt = np.flatnonzero(c.name_mask(N.is_optimizer_step))
    opt = opt[~t.mask_cat("gpu_user_annotation")[opt]]
    v["optimizer_steps"] = int(opt.size)
    v["optimizer_ms_total"] = float(t.dur[opt].sum()) / 1000.0
    fused = opt[t.has_name_code(t.name[opt], t.name_codes(N.is_fused_optimizer_step))]
    foreach = per_param = 0
    for windows, loop in ((opt[~np.isin(opt, fused)], True), (fused, False)):
        in_step = inside(c, windows, cpu_ops)
        codes, counts = np.unique(t.name[in_step], return_counts=True)  # per distinct name, not per op
        for code, count in zip(codes.tolist(), counts.tolist()):
            n = t.names[code]
            if n.startswith(("aten::_foreach_", "aten::_fused_")):
                foreach += count
            elif n.startswith("aten::") and loop:  # a fused optimizer's own aten ops are bookkeeping
                per_param += count
    v["optimizer_foreach_ops"] = foreach
    v["optimizer_per_param_ops"] = per_param
    v["optimizer_single_tensor_frames"] = c.frames.names_matching("_single_tensor_")
    rf.evidence["optimizer"] = c.worst(opt)
    # zero_grad fills
    zg = np.flatnonzero(c.name_mask(N.is_zero_grad))
    zg = zg[~t.mask_cat("gpu_user_annotation")[zg]]
    v["zero_grad_calls"] = int(zg.size)
    fills = inside(c, zg, cpu_ops & t.mask_name_in(N.ZERO_FILL_OPS))
    v["zero_grad_fill_ops"] = int(fills.size)
    # the fills' host time and their kernels' GPU time lie on two timelines that overlap when the GPU runs
    # behind the host: removing the fills saves at most the longer of the two, not their sum
    fill_host = float(t.dur[fills].sum()) / 1000.0
    fill_gpu = gpu_time_launched_inside(c, fills) / 1000.0 if v.get("has_gpu") else 0.0
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
    copies = outermost(c, copies)
    copies = copies[~holds_precision_cast(c, copies, cpu_ops)]
    v["cpu_copy_ops"] = int(copies.size)
    v["cpu_copy_ms_total"] = float(t.dur[copies].sum()) / 1000.0
    # factory op then a move/cast (torch.zeros(n).to(dev))
    v["factory_then_move"], ftm = factory_then_move(c, cpu_ops)
    rf.evidence["copies"] = c.worst(np.concatenate([ftm, copies]).astype(np.int64))


_LOW_PRECISION = ("c10::BFloat16", "c10::Half", "c10::Float8")


def holds_precision_cast(c: RankContext, outer: np.ndarray, cpu_ops: np.ndarray) -> np.ndarray:
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


def factory_then_move(c: RankContext, cpu_ops: np.ndarray) -> tuple[int, np.ndarray]:
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
