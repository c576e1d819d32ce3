"""One-off work at the start of a profile: outlier runtime calls (module loads, context creation, first
allocations), stream captures into graphs, torch.compile compilations (and the recompilations after)."""

from __future__ import annotations

import numpy as np

from ..load.columns import INT_NONE, RankTrace, row_positions
from . import names as N
from .context import RankContext

OUTLIER_MIN_US = 1000.0  # an outlier runtime call lasts at least this long ...
OUTLIER_RATIO = 100.0  # ... and at least this many times its API's typical duration in the rank


def startup_calls(c: RankContext, runtime: np.ndarray, step_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start-up calls: outlier runtime calls before the second profiled step (anywhere in a trace of fewer than
    two steps, which cannot tell start-up from a stall that recurs; none where the profile starts after the
    program did, at ProfilerStep#1 or later: RankContext.from_start). An outlier is a launch, synchronisation,
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


def captures_of(c: RankContext, runtime: np.ndarray, step_starts: np.ndarray) -> list[tuple[float, float, int, int]]:
    """Stream captures into CUDA/HIP graphs: on each thread, a Begin*Capture call up to the next End*Capture
    call, before the second profiled step (anywhere with fewer than two steps; later ones recur, as
    startup_calls). Kernels launched meanwhile are recorded into the graph, not run: the GPU idles by
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


def compile_windows(c: RankContext, step_starts: np.ndarray) -> tuple[list[int], list[int]]:
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


def device_op_of(c: RankContext, rows: np.ndarray) -> dict[int, int]:
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


def startup_detail(t: RankTrace, i: int, typical: np.ndarray, rows: np.ndarray, idle_in: np.ndarray,
                    device_op: int | None) -> str:
    k = int(np.searchsorted(rows, i))
    typ, idle = float(typical[k]), float(idle_in[k])
    times = f"{float(t.dur[i]) / typ:,.0f}x" if typ > 0 else "far above"
    text = f"{times} the typical {t.name_of(i)[:60]} ({typ:,.1f} us)"
    if device_op is not None:  # a first launch loads the module of this kernel
        text += f", for {t.name_of(device_op).split('(', 1)[0][:100]}"  # a kernel's name without its arguments
    return text + (f"; the GPU was idle for {idle / 1000.0:,.3f} ms of it" if idle > 0 else "; the GPU was busy meanwhile")


def window_captures(c: RankContext, runtime: np.ndarray, step_starts: np.ndarray) -> dict:
    """A window's stream captures that a cut leaves open, for features/windows.py to pair across windows: per
    thread ((pid, tid) values), a Begin*Capture not ended in the window (its start, the launches after it on
    the thread, whether the rank would count it: from_start and before the second step) and an End*Capture
    before any Begin (its end, the launches before it); and the launches of each thread. O(threads)."""
    t = c.t
    launches = np.flatnonzero(c.name_mask(N.is_launch, runtime))

    def key(pc: int, tc: int) -> tuple:
        return (t.pid_values[pc] if pc < len(t.pid_values) else pc, t.tid_values[tc] if tc < len(t.tid_values) else tc)

    pairs, counts = np.unique(np.stack([np.asarray(t.pid[launches], dtype=np.int64),
                                        np.asarray(t.tid[launches], dtype=np.int64)]), axis=1, return_counts=True)
    out: dict = {"open": {}, "lead": {}, "launches": {key(int(p), int(q)): int(n) for (p, q), n in zip(pairs.T.tolist(), counts.tolist())}}
    bounds = np.flatnonzero(c.name_mask(N.is_capture_bound, runtime))
    if bounds.size == 0:
        return out
    begin_codes = set(t.name_codes(lambda n: n in N.CAPTURE_BEGIN_APIS))
    bounds = bounds[np.lexsort((t.ts[bounds], t.tid[bounds], t.pid[bounds]))]
    first: dict[tuple, int] = {}
    last: dict[tuple, int] = {}
    for i in bounds.tolist():
        th = (int(t.pid[i]), int(t.tid[i]))
        first.setdefault(th, i)
        last[th] = i
    out["bounded"] = [key(*th) for th in first]
    for th, i in first.items():
        on = launches[(t.pid[launches] == th[0]) & (t.tid[launches] == th[1])]
        if int(t.name[i]) not in begin_codes:
            e = float(t.ts[i] + t.dur[i])
            out["lead"][key(*th)] = (e, int((t.ts[on] <= e).sum()))
        j = last[th]
        if int(t.name[j]) in begin_codes:
            b = float(t.ts[j])
            counted = c.from_start and (step_starts.size < 2 or b < step_starts[1])
            out["open"][key(*th)] = (b, int((t.ts[on] >= b).sum()), bool(counted), t.name_of(j), c.frames.frames_for(j))
    return out


CANDIDATES_MAX = 256  # a window's longest start-up candidates kept for the merge (features/windows.py)


def window_startup(c: RankContext, runtime: np.ndarray, step_starts: np.ndarray) -> dict:
    """What features/windows.py needs to find the rank's start-up calls (startup_calls' rule over all windows):
    each launch/sync/alloc API's durations in the window as value counts (its typical call is the rank's lower
    median), and the window's candidates: calls that could be outliers where the rank allows start-up (from
    the start, before the second step), at least OUTLIER_MIN_US long (the CANDIDATES_MAX longest), each with
    its API, duration, span, the first device op it queued and its evidence event (detail filled by the
    merge). O(distinct durations + candidates)."""
    t = c.t
    cand = row_positions(c.name_mask(N.is_launch_sync_or_alloc, runtime))
    d, code = t.dur[cand], t.name[cand]
    pairs, counts = np.unique(np.stack([np.asarray(code, dtype=np.float64), np.asarray(d, dtype=np.float64)]), axis=1,
                              return_counts=True)
    apis: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for k in np.unique(pairs[0]).tolist():
        sel = pairs[0] == k
        apis[t.names[int(k)]] = (pairs[1][sel], counts[sel])
    rows = cand[d >= OUTLIER_MIN_US] if c.from_start else cand[:0]
    if step_starts.size >= 2:
        rows = rows[t.ts[rows] < step_starts[1]]
    rows = np.sort(rows[np.argsort(-t.dur[rows], kind="stable")][:CANDIDATES_MAX])
    op = device_op_of(c, rows) if rows.size else {}
    out = []
    for i in rows.tolist():
        dev = op.get(i)
        out.append({"api": t.name_of(i), "dur": float(t.dur[i]), "ts": float(t.ts[i]), "end": float(t.ts[i] + t.dur[i]),
                    "device_op": t.name_of(dev).split("(", 1)[0][:100] if dev is not None else None,
                    "event": c.ev(i, "")})
    return {"apis": apis, "candidates": out}
