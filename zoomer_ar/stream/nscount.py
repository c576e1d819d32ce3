"""The in-memory loader's nanosecond-timestamp test, decided from counts kept slice by slice."""

from __future__ import annotations

import numpy as np

NS_THRESHOLD = 1e17  # zoomer_ar.load.job.load_trace: median start above this = nanoseconds


class NsCounter:
    """Decides load_trace's nanosecond test, `np.median(starts of complete events) > 1e17`,
    from counts kept slice by slice (how many starts lie above, the largest below, the smallest
    above): the median's rank tells on which side it falls."""

    def __init__(self) -> None:
        self.n = 0
        self.hi = 0
        self.max_lo = -np.inf
        self.min_hi = np.inf

    def add(self, xs: np.ndarray) -> None:
        if not xs.size:
            return
        self.n += xs.size
        above = xs > NS_THRESHOLD
        k = int(np.count_nonzero(above))
        self.hi += k
        if k:
            self.min_hi = min(self.min_hi, float(xs[above].min()))
        if k < xs.size:
            self.max_lo = max(self.max_lo, float(xs[~above].max()))

    def add_counts(self, other: NsCounter) -> None:
        """Count another counter's starts too (the starts of several ranks of one file)."""
        self.n += other.n
        self.hi += other.hi
        self.max_lo = max(self.max_lo, other.max_lo)
        self.min_hi = min(self.min_hi, other.min_hi)

    def nanoseconds(self) -> bool:
        n, lo_count = self.n, self.n - self.hi
        if n == 0:
            return False
        if n % 2:
            return n // 2 >= lo_count
        i, j = n // 2 - 1, n // 2
        if i >= lo_count:
            return True
        if j < lo_count:
            return False
        return float(np.mean(np.array([self.max_lo, self.min_hi]))) > NS_THRESHOLD
