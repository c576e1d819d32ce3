"""Profiler steps: how many, how long (each from the previous one's completion to its own), the first one."""

from __future__ import annotations

import numpy as np

from ..load.columns import INT_NONE, row_positions
from . import names as N
from .context import RankContext, RankFeatures


def profiler_steps(c: RankContext, rf: RankFeatures) -> tuple[np.ndarray, np.ndarray]:
    t = c.t
    cpu_side = ~t.mask_cat("gpu_user_annotation")
    m = c.name_mask(N.is_profiler_step) & cpu_side
    idx = np.flatnonzero(m)
    idx = idx[np.argsort(t.ts[idx], kind="stable")]
    starts, ends = t.ts[idx], c.end[idx]
    durs = t.dur[idx] / 1000.0
    if idx.size:
        # a step is over when its host side has ended and the device has finished the work it queued: a host
        # running ahead of the GPU (short CPU steps while the queue fills) does not shorten the steps. Each
        # step lasts from the previous one's completion to its own, so the steps add up to the time from the
        # first step's start to the last one's completion (work of neighbouring steps overlapping on several
        # streams counts once). The device side: Kineto's GPU-side ProfilerStep range of the same name where
        # the trace has it, else the device events that the step's runtime calls queued (correlation ids).
        dev_end = device_ends(c, idx, starts, ends, ~cpu_side)
        done = np.maximum.accumulate(np.fmax(ends, dev_end))
        durs = np.diff(np.concatenate([starts[:1], done])) / 1000.0
    if c.window is not None:  # what the windows' merge needs to time the steps as the whole rank does
        rf.v["_w_steps"] = window_steps(c, idx, starts, ends, dev_end if idx.size else starts, ~cpu_side)
    rf.v["profiler_steps"] = int(idx.size)
    rf.v["wall_ms"] = (c.t1 - c.t0) / 1000.0
    if idx.size:
        number = N.profiler_step_number(t.name_of(int(idx[0])))
        rf.v["first_profiled_step"] = number
        c.from_start = number is None or number == 0
        if c.window is not None and c.window[0] > 0:  # a later window's first step is not the profile's first
            c.from_start = False
    if idx.size:
        rf.v["step_ms"] = float(durs.mean())
        rf.v["step_ms_p50"] = float(np.median(durs))
        rf.v["step_ms_p95"] = float(np.percentile(durs, 95))
        rf.v["step_ms_cv"] = float(durs.std() / durs.mean()) if durs.mean() > 0 else None
        rf.v["first_step_ms"] = float(durs[0])
    else:
        rf.v["step_ms"] = rf.v["wall_ms"]
    rf.v["n_steps"] = max(1, int(idx.size))
    return starts, ends


def device_ends(c: RankContext, idx: np.ndarray, starts: np.ndarray, ends: np.ndarray, gpu_side: np.ndarray) -> np.ndarray:
    """Per CPU step (rows idx, sorted by start): when the device finished the step's work (us; NaN where it
    queued none): the end of the GPU-side ProfilerStep range of the same name where the trace records them,
    else the last end of the device events whose runtime call (by correlation id) began inside the step."""
    t = c.t
    out = np.full(idx.size, np.nan)
    ranges = np.flatnonzero(c.name_mask(N.is_profiler_step) & gpu_side)
    if ranges.size:
        by_name: dict[int, float] = {}
        for code, end in zip(t.name[ranges].tolist(), c.end[ranges].tolist()):
            by_name[code] = max(by_name.get(code, -np.inf), end)
        return np.asarray([by_name.get(code, np.nan) for code in t.name[idx].tolist()], dtype=np.float64)
    dev = row_positions(c.gpu)
    keys, rt = c.launch_index()
    if dev.size == 0 or rt.size == 0:
        return out
    launched = t.ts[rt]
    want = t.correlation[dev]
    pos = np.clip(np.searchsorted(keys, want), 0, keys.size - 1)
    hit = (keys[pos] == want) & (want != INT_NONE)
    dev, at = dev[hit], launched[pos[hit]]
    k = np.searchsorted(starts, at, side="right") - 1
    inside = (k >= 0) & (at <= ends[np.maximum(k, 0)])
    if not inside.any():
        return out
    last = np.full(idx.size, -np.inf)
    np.maximum.at(last, k[inside], c.end[dev[inside]])
    out[np.isfinite(last)] = last[np.isfinite(last)]
    return out


def window_steps(c: RankContext, idx: np.ndarray, starts: np.ndarray, ends: np.ndarray, dev_end: np.ndarray,
                 gpu_side: np.ndarray) -> dict:
    """A window's steps for features/windows.py (O(steps)): their names, starts, host ends and device ends
    (us, the window's time base), the GPU-side ProfilerStep ranges' ends by name (a range may lie in another
    window than its CPU step), and the window's first start and last end (wall time)."""
    t = c.t
    ranges = np.flatnonzero(c.name_mask(N.is_profiler_step) & gpu_side)
    by_name: dict[str, float] = {}
    for code, end in zip(t.name[ranges].tolist(), c.end[ranges].tolist()):
        name = t.names[code]
        by_name[name] = max(by_name.get(name, -np.inf), end)
    return {"names": [t.name_of(int(i)) for i in idx.tolist()], "starts": np.asarray(starts, dtype=np.float64),
            "ends": np.asarray(ends, dtype=np.float64), "dev_end": np.asarray(dev_end, dtype=np.float64),
            "ranges": by_name, "t0": c.t0, "t1": c.t1}
