"""Memory growth across steps, from the profiler's `[memory]` events."""

from __future__ import annotations

import numpy as np

from ..load.columns import PH_INSTANT
from ..models import EvidenceEvent
from .context import RankContext, RankFeatures


def memory_features(c: RankContext, rf: RankFeatures, step_starts: np.ndarray, step_ends: np.ndarray) -> None:
    t = c.t
    v = rf.v
    mem = np.flatnonzero((t.ph == PH_INSTANT) & t.mask_name_in("[memory]"))
    v["memory_events"] = int(mem.size)
    tot = t.total_allocated[mem]
    ok = ~np.isnan(tot)
    mem, tot = mem[ok], tot[ok]
    if mem.size == 0:
        return
    v["memory_peak_bytes"] = float(tot.max())
    if c.window is not None:
        v["_w_memory"] = window_memory(c, mem, tot, step_starts, step_ends)
    if step_ends.size < 3:
        return
    best = None
    for dev in np.unique(t.device[mem]):
        sel = t.device[mem] == dev
        m_ts, m_tot = t.ts[mem][sel], tot[sel]
        order = np.argsort(m_ts, kind="stable")
        m_ts, m_tot = m_ts[order], m_tot[order]
        k = np.searchsorted(m_ts, step_ends, side="right") - 1
        valid = k >= 0
        if valid.sum() < 3:
            continue
        level = m_tot[k[valid]]
        slope = float(np.polyfit(np.arange(level.size), level, 1)[0])
        growth = 100.0 * (level[-1] - level[0]) / max(level[0], 1.0)
        mono = bool(np.all(np.diff(level) >= -1024))
        if best is None or slope > best[0]:
            best = (slope, growth, mono, int(dev))
    if best:
        v["memory_growth_bytes_per_step"], v["memory_growth_pct"], v["memory_growth_monotonic"], dev = best
        # where the memory is allocated: the Python frames around the largest allocation of the last step
        last = (t.ts[mem] >= step_starts[-1]) & (t.ts[mem] <= step_ends[-1]) & (t.device[mem] == dev)
        allocs = mem[last & (t.nbytes[mem] > 0)]
        frames = c.frames.frames_for(int(allocs[np.argmax(t.nbytes[allocs])])) if allocs.size else []
        rf.evidence["memory"] = [
            EvidenceEvent(
                name=f"allocated memory at step ends ({'host memory' if dev < 0 else f'device {dev}'})",  # Kineto: Device Id -1 is the CPU
                rank=t.rank,
                ts_ms=round((float(step_ends[0]) - c.t0) / 1000.0, 4),
                dur_ms=round(float(step_ends[-1] - step_ends[0]) / 1000.0, 4),
                category="[memory]",
                detail=f"grows {best[0] / 2**20:.2f} MiB per step ({best[1]:.1f}% over the window)",
                frames=frames,
            )
        ]


def window_memory(c: RankContext, mem: np.ndarray, tot: np.ndarray, step_starts: np.ndarray,
                  step_ends: np.ndarray) -> dict[int, dict]:
    """Per device, what features/windows.py needs to measure the rank's growth (O(steps)): the allocated
    bytes at each of the window's step ends (NaN where no memory event of the window precedes it: an earlier
    window's last level holds there), the window's last event (ts, level), and in the last window the frames
    of the largest allocation of its last step (the evidence's)."""
    t = c.t
    out: dict[int, dict] = {}
    for dev in np.unique(t.device[mem]).tolist():
        sel = t.device[mem] == dev
        m_ts, m_tot = t.ts[mem][sel], tot[sel]
        order = np.argsort(m_ts, kind="stable")
        m_ts, m_tot = m_ts[order], m_tot[order]
        k = np.searchsorted(m_ts, step_ends, side="right") - 1
        levels = np.where(k >= 0, m_tot[np.maximum(k, 0)], np.nan)
        frames = []
        if c.last_window and step_ends.size:
            last = (t.ts[mem] >= step_starts[-1]) & (t.ts[mem] <= step_ends[-1]) & (t.device[mem] == dev)
            allocs = mem[last & (t.nbytes[mem] > 0)]
            frames = c.frames.frames_for(int(allocs[np.argmax(t.nbytes[allocs])])) if allocs.size else []
        out[int(dev)] = {"levels": levels, "last": (float(m_ts[-1]), float(m_tot[-1])), "frames": frames}
    return out
