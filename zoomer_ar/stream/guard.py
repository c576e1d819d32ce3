"""A memory budget for the streaming path: a trace whose kept rows would outgrow the machine is
refused with a one-line reason (exit 2) while it is read, not killed by the kernel later.

The streaming analysis keeps the rows the features read (about 120 MB per GB of GPU-dense JSON,
docs/huge-traces.md), so a big enough trace can need more memory than the machine has. The
budget of one rank's process is `ZOOMER_MEMORY_LIMIT_MB` (0: none), else its resident memory at
the start plus 80% of the memory available then, shared by the ranks read in parallel. It is
checked after every chunk of events (a read of /proc/self/status); off Linux there is no check.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InputError

ENV = "ZOOMER_MEMORY_LIMIT_MB"
AVAILABLE_SHARE = 0.8


def _proc_kb(path: str, key: str) -> int | None:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_mb() -> float | None:
    kb = _proc_kb("/proc/self/status", "VmRSS")
    return kb / 1024 if kb is not None else None


def available_mb() -> float | None:
    kb = _proc_kb("/proc/meminfo", "MemAvailable")
    return kb / 1024 if kb is not None else None


def budget_mb(workers: int = 1) -> float | None:
    """The memory one rank's process may use, in MB; None when there is no limit."""
    raw = os.environ.get(ENV, "").strip()
    if raw:
        try:
            limit = float(raw)
        except ValueError:
            limit = -1.0
        if limit > 0:
            return limit
        if limit == 0:
            return None
    avail, now = available_mb(), rss_mb()
    if avail is None or now is None:
        return None
    return now + AVAILABLE_SHARE * avail / max(1, workers)


class MemoryGuard:
    """Wraps the builder's consumer: after each chunk, the process's resident memory against the
    budget."""

    def __init__(self, path: Path, limit_mb: float | None) -> None:
        self.path, self.limit_mb = path, limit_mb

    def check(self, events: int) -> None:
        if self.limit_mb is None:
            return
        now = rss_mb()
        if now is not None and now > self.limit_mb:
            raise InputError(
                str(self.path),
                f"analysing this trace needs more memory than allowed here: {now:,.0f} MB in use after "
                f"{events:,} events, limit {self.limit_mb:,.0f} MB ({ENV}; default 80% of the available "
                "memory); analyse a part of it: `zoomer-ar trace slice` (steps or a time window) or "
                "`zoomer-ar trace sample` (ranks)",
            )

    def wrap(self, consume: Callable[..., Any], count: Callable[[], int]) -> Callable[..., Any]:
        if self.limit_mb is None:
            return consume

        def guarded(*args: Any) -> Any:
            out = consume(*args)
            self.check(count())
            return out

        return guarded


__all__ = ["ENV", "MemoryGuard", "budget_mb", "rss_mb"]
