"""Vectorised interval arithmetic on (start, end) arrays (microseconds)."""

from __future__ import annotations

import numpy as np


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge overlapping intervals; returns sorted disjoint (starts, ends)."""
    if starts.size == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = ends[order]
    del order
    np.maximum.accumulate(e, out=e)  # e[i]: the latest end among intervals 0..i (non-decreasing)
    # a new block starts where the interval begins after everything before it has ended
    new_block = np.empty(s.size, dtype=bool)
    new_block[0] = True
    np.greater(s[1:], e[:-1], out=new_block[1:])
    out_s = s[new_block]
    # a block's end is the running end at its last interval (the running end never decreases)
    last = np.empty(s.size, dtype=bool)
    last[:-1] = new_block[1:]
    last[-1] = True
    out_e = e[last]
    del s, e, new_block, last
    out_e = np.maximum(out_e, out_s)
    return out_s, out_e


def total(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals."""
    s, e = union(starts, ends)
    return float((e - s).sum())


def intersection_total(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Total length of the intersection of two disjoint sorted interval sets (outputs of `union`)."""
    return float(overlap_with(a[0], a[1], b).sum())


def overlap_with(
    starts: np.ndarray, ends: np.ndarray, cover: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """Per interval [starts[i], ends[i]]: how much of it is covered by the disjoint sorted set `cover`."""
    c_s, c_e = cover
    if c_s.size == 0 or starts.size == 0:
        return np.zeros(starts.size)
    cum = np.concatenate([[0.0], np.cumsum(c_e - c_s)])

    def covered_until(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(c_s, t, side="right")
        km1 = np.maximum(k - 1, 0)
        partial = np.minimum(np.clip(t - c_s[km1], 0, None), c_e[km1] - c_s[km1])
        return np.where(k > 0, cum[km1] + partial, 0.0)

    return covered_until(ends) - covered_until(starts)


def contained(starts: np.ndarray, ends: np.ndarray, durs: np.ndarray, cover: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per interval: does the disjoint sorted set `cover` hold it (99.9% of its length covered)? An
    interval of zero length is held when its point lies in (or on the edge of) a segment: a coverage
    test alone says yes to it anywhere (0 >= 0)."""
    held = overlap_with(starts, ends, cover) >= durs * 0.999
    point = durs <= 0
    if point.any():
        c_s, c_e = cover
        if c_s.size == 0:
            held[point] = False
        else:
            k = np.searchsorted(c_s, starts[point], side="right") - 1
            held[point] = (k >= 0) & (starts[point] <= c_e[np.maximum(k, 0)])
    return held


def gaps(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gaps between consecutive disjoint sorted intervals."""
    if s.size < 2:
        return np.empty(0), np.empty(0)
    return e[:-1], s[1:]
