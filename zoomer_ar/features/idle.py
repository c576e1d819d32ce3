"""GPU idle time inside the GPU span, split by cause (the host launching late, a synchronisation that
drained the queue, the DataLoader, work already queued), the start-up part of it, and the worst gaps as
evidence with the host call the host sat in."""

from __future__ import annotations

import numpy as np

from ..load.columns import INT_NONE, row_positions
from ..models import EvidenceEvent
from . import intervals as iv
from . import names as N
from . import syncs as S
from .context import EVIDENCE_PER_KIND, TOL_US, RankContext, RankFeatures
from .startup import device_op_of, startup_detail


def idle_gaps(c: RankContext, rf: RankFeatures, us: np.ndarray, ue: np.ndarray, runtime: np.ndarray,
              startup: np.ndarray, typical: np.ndarray, captures: list[tuple[float, float, int, int]]) -> None:
    """Idle gaps of the GPU busy union (us, ue) and their causes; sets the launch lookup that gives GPU
    evidence its launching call's frames from then on (RankContext.launcher)."""
    t = c.t
    v = rf.v
    compiles = c.compiles[0]
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
    gpu_idx = row_positions(c.gpu)
    gs = t.ts[gpu_idx]
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
    one_off = (np.empty(0), np.empty(0))
    if startup.size or captures or compiles:
        one_off = iv.union(np.concatenate([t.ts[startup], [b for b, _, _, _ in captures], t.ts[compiles]]),
                           np.concatenate([c.end[startup], [e for _, e, _, _ in captures], c.end[compiles]]))
    if one_off[0].size and glen.size:
        in_startup = np.minimum(iv.overlap_with(g0, g1, one_off), glen)
    v["idle_startup_ms_total"] = float(in_startup.sum()) / 1000.0
    v["idle_startup_host_ms_total"] = float(np.minimum(in_startup, rest)[~sync_caused & host_bound].sum()) / 1000.0
    if c.window is not None:
        v["_w_idle"] = window_idle(c, v["_w_gpu"]["block"], g0, g1, dl, sync_like, one_off, {
            "data": data_part, "sync": np.where(sync_caused, rest, 0.0), "host": np.where(~sync_caused & host_bound, rest, 0.0),
            "other": np.where(~sync_caused & ~host_bound, rest, 0.0), "startup": in_startup,
            "startup_host": np.where(~sync_caused & host_bound, np.minimum(in_startup, rest), 0.0)})
        v["_w_idle"]["sensitive"] = window_startup_gaps(v, g0, g1, rest, ~sync_caused & host_bound, in_startup)
    del in_startup
    v["idle_data_ms_total"] = float(data_part.sum()) / 1000.0
    v["idle_sync_ms_total"] = sync_sum / 1000.0
    v["idle_host_ms_total"] = host_sum / 1000.0
    v["idle_other_ms_total"] = other_sum / 1000.0
    v["host_idle_share"] = float(host_sum / idle_total) if idle_total > 0 else None
    if glen.size:
        top = np.argsort(-glen)[:EVIDENCE_PER_KIND]
        if c.window is not None:  # the longest inner gaps too: edge gaps may shrink once the windows are merged
            top = window_shown(v["_w_gpu"]["block"], g0, g1, top, np.arange(glen.size))
        # the cause of the shown gaps only (a string array over every gap costs 20 bytes a gap)
        cause = {int(j): "data" if data_part[j] >= rest[j] else "sync" if sync_caused[j] else "host" if host_bound[j]
                 else "other" for j in top}
        sync_gaps = np.flatnonzero(sync_caused)
        sync_top = sync_gaps[np.argsort(-glen[sync_gaps])][:EVIDENCE_PER_KIND]
        if c.window is not None:
            sync_top = window_shown(v["_w_gpu"]["block"], g0, g1, sync_top, sync_gaps)
        blocked = blocking_calls(c, runtime, g0, g1, np.union1d(top, sync_top))
        shown = []
        for j in top.tolist():
            detail, source = f"cause: {cause[j]}", c.launcher(int(nxt[j]))  # where the late work was launched
            if cause[j] == "sync":
                detail, source = f"{detail} (after {t.name_of(int(sync_of[j]))[:80]})", int(sync_of[j])
            shown.append(gap_event(c, f"GPU idle before {t.name_of(int(nxt[j]))[:120]}", float(g0[j]), float(glen[j]),
                                    detail, blocked.get(j), source))
        rf.evidence["idle_gaps"] = shown
        if c.window is not None:  # which shown gaps another window cannot change (features/windows.py)
            v["_w_idle"]["shown"] = [(float(g0[j]), float(g1[j])) for j in top.tolist()]
            v["_w_idle"]["shown_sync"] = [(float(g0[j]), float(g1[j])) for j in sync_top.tolist()]
        if sync_gaps.size:
            rf.evidence["sync_gaps"] = [
                gap_event(c, "GPU idle after a host synchronisation", float(g0[j]), float(glen[j]),
                           f"the queue drained while the host waited in {t.name_of(int(sync_of[j]))[:80]}, then refilled",
                           blocked.get(int(j)), int(sync_of[j]))
                for j in sync_top
            ]

    def idle_during(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:  # GPU idle time inside each interval
        return iv.overlap_with(starts, ends, (g0, g1)) if glen.size else np.zeros(starts.size)

    if startup.size:
        idle_in = idle_during(t.ts[startup], c.end[startup])
        device_op = device_op_of(c, startup)
        rf.evidence["startup_calls"] = c.worst(startup, key=idle_in + t.dur[startup] * 1e-12,  # idle first, then length
                                               detail=lambda i: startup_detail(t, i, typical, startup, idle_in,
                                                                                device_op.get(i)))
    if captures:
        b, e = np.array([x[0] for x in captures]), np.array([x[1] for x in captures])
        idle_cap = idle_during(b, e)
        shown = []
        for k in np.lexsort((-(e - b), -idle_cap))[:EVIDENCE_PER_KIND].tolist():  # idle first, then length
            _, _, row, n = captures[k]
            ev = span_event(c, f"graph capture ({t.name_of(row)[:60]} .. end)", float(b[k]), float(e[k] - b[k]),
                             "capture", f"{n} launch{'es' if n != 1 else ''} recorded into a graph, not run; the GPU "
                             f"was idle for {float(idle_cap[k]) / 1000.0:,.3f} ms of it", row)
            c.keys[id(ev)] = float(idle_cap[k]) + float(e[k] - b[k]) * 1e-12
            shown.append(ev)
        rf.evidence.setdefault("startup_calls", []).extend(shown)
    if compiles:
        rows = np.asarray(compiles, dtype=np.int64)
        idle_c = idle_during(t.ts[rows], c.end[rows])
        rf.evidence.setdefault("startup_calls", []).extend(c.worst(
            rows, key=idle_c + t.dur[rows] * 1e-12,
            detail=lambda i: "torch.compile compiling; the GPU was idle for "
                             f"{float(idle_c[np.searchsorted(rows, i)]) / 1000.0:,.3f} ms of it"))


BLOCKED_SHARE = 0.5  # a host call covering at least this share of an idle gap is what the host was doing


def blocking_calls(c: RankContext, runtime: np.ndarray, g0: np.ndarray, g1: np.ndarray, shown: np.ndarray) -> dict[int, tuple[int, float]]:
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


def gap_event(c: RankContext, name: str, g0: float, glen: float, detail: str, blocked: tuple[int, float] | None,
               source: int | None) -> EvidenceEvent:
    """An idle gap as evidence: where the host was blocked in a call for most of it, that call and its
    Python frames; otherwise the frames of `source` (the call that launched the work after the gap, or the
    synchronisation it followed)."""
    if blocked is not None:
        row, ov = blocked
        detail += f"; the host was in {c.t.name_of(row)[:80]} for {ov / 1000.0:,.3f} ms of it"
        source = row
    return span_event(c, name, g0, glen, "idle", detail, source)


def span_event(c: RankContext, name: str, start: float, dur: float, category: str, detail: str,
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


EDGE_SYNCS = 4096  # synchronisations kept at the edges of a window's device work (features/windows.py)
EDGE_FRAMES = 32  # of them, those nearest the middle's ends carry their Python frames


def window_idle(c: RankContext, block: tuple[float, float] | None, g0: np.ndarray, g1: np.ndarray, dl: np.ndarray,
                sync_like: np.ndarray, one_off: tuple[np.ndarray, np.ndarray], parts: dict[str, np.ndarray]) -> dict:
    """What features/windows.py needs of a window's idle gaps. Those inside the middle of its device work
    (gpu.window_gpu's block) no other window changes: their totals by cause. Those at its edges the merge
    finds again with the other windows' work, and their causes with what is kept here: the DataLoader calls,
    the synchronisations that end before the middle or near its end, the start-up calls' union. O(steps +
    edge)."""
    t = c.t
    inner = (g0 >= block[0]) & (g1 <= block[1]) if block is not None else np.zeros(g0.size, dtype=bool)
    glen = (g1 - g0)[inner]
    sums = {k: float(a[inner].sum()) for k, a in parts.items()}
    sums.update(idle=float(glen.sum()), short=float(glen[glen < 50.0].sum()))
    s_end = c.end[sync_like]
    edge = (s_end <= block[0]) | (s_end >= block[1] - TOL_US) if block is not None else np.ones(s_end.size, dtype=bool)
    rows = sync_like[edge]
    rows = rows[np.argsort(c.end[rows], kind="stable")][:EDGE_SYNCS]
    # frames (evidence) for the syncs nearest the middle's two ends only: a scan of the Python events each
    ends = c.end[rows]
    near = np.zeros(rows.size, dtype=bool)
    if block is not None:
        before = np.flatnonzero(ends <= block[0])
        near[before[-EDGE_FRAMES:]] = True
        near[np.flatnonzero(ends > block[0])[:EDGE_FRAMES]] = True
    else:
        near[:EDGE_FRAMES] = True
    syncs = [(float(t.ts[i]), float(c.end[i]), t.name_of(int(i)), c.frames.frames_for(int(i)) if f else [])
             for i, f in zip(rows.tolist(), near.tolist())]
    return {"inner": sums, "syncs": syncs, "dl": iv.union(t.ts[dl], c.end[dl]), "one_off": one_off}


def window_shown(block: tuple[float, float] | None, g0: np.ndarray, g1: np.ndarray, top: np.ndarray,
                 among: np.ndarray) -> np.ndarray:
    """A window's gaps shown as evidence: its longest, and its longest inside the middle of its device work (which
    no other window changes; the merge keeps the longest of all)."""
    if block is None or among.size == 0:
        return top
    inner = among[(g0[among] >= block[0]) & (g1[among] <= block[1])]
    extra = inner[np.argsort(-(g1[inner] - g0[inner]), kind="stable")][:EVIDENCE_PER_KIND]
    out = np.concatenate([top, extra[~np.isin(extra, top)]])
    return out[np.argsort(-(g1[out] - g0[out]), kind="stable")]


def window_startup_gaps(v: dict, g0: np.ndarray, g1: np.ndarray, rest: np.ndarray, host: np.ndarray,
                        in_startup: np.ndarray) -> dict[str, np.ndarray]:
    """The gaps in the middle of a window's device work that a start-up candidate (startup.window_startup)
    overlaps, with what the window split of them (rest, host-bound, start-up part without candidates): the
    merge gives them their start-up part once it knows which candidates are start-up calls."""
    cands, block = v["_w_startup"]["candidates"], v["_w_gpu"]["block"]
    caps = v.get("_w_captures") or {"open": {}, "lead": {}}
    a = [x["ts"] for x in cands] + [o[0] for o in caps["open"].values()] + [-np.inf] * len(caps["lead"])
    b = [x["end"] for x in cands] + [np.inf] * len(caps["open"]) + [x[0] for x in caps["lead"].values()]
    sel = np.zeros(g0.size, dtype=bool)
    if a and block is not None and g0.size:  # (and the captures a cut leaves open: they may count)
        u = iv.union(np.array(a, dtype=np.float64), np.array(b, dtype=np.float64))
        sel = (g0 >= block[0]) & (g1 <= block[1]) & (iv.overlap_with(g0, g1, u) > 0)
    return {"g0": g0[sel], "g1": g1[sel], "rest": rest[sel], "host": host[sel], "startup": in_startup[sel]}
