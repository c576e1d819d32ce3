"""A memory budget for the streaming path: a trace whose kept rows would outgrow the machine is
refused with a one-line reason (exit 2) while it is read, not killed by the kernel later.

The streaming analysis keeps the rows the features read (about 120 MB per GB of GPU-dense JSON,
docs/huge-traces.md), so a big enough trace can need more memory than the machine has. The
budget of one rank's process is `ZOOMER_MEMORY_LIMIT_MB` (0: none), else its resident memory at
the start plus 80% of the memory available then, shared by the ranks read in parallel (any other
value, such as a word or a negative number, is refused with exit 2 by check_setting). It is
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


def _setting() -> float | None:
    """ZOOMER_MEMORY_LIMIT_MB as a number of MB (0: no limit); None when unset or not a number of MB."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        limit = float(raw)
    except ValueError:
        return None
    return limit if limit >= 0 and limit != float("inf") else None


def check_setting() -> None:
    """InputError (exit 2, one line) when ZOOMER_MEMORY_LIMIT_MB is set to anything but a number of
    MB: such a value used to be ignored without a word (the default applied). The streaming loader
    calls it before reading (stream.load_job_streaming), and so does budget_mb: no caller falls back to the
    default on a value that is not a number."""
    raw = os.environ.get(ENV, "").strip()
    if raw and _setting() is None:
        raise InputError(None, f"{ENV}={raw!r}: not a number of MB (a positive number, or 0 for no limit)")


def budget_mb(workers: int = 1) -> float | None:
    """The memory one rank's process may use, in MB; None when there is no limit. InputError on a setting
    that is not a number of MB (check_setting)."""
    check_setting()
    limit = _setting()
    if limit is not None:
        return limit if limit > 0 else None
    avail, now = available_mb(), rss_mb()
    if avail is None or now is None:
        return None
    return now + AVAILABLE_SHARE * avail / max(1, workers)


class WindowsNeeded(Exception):
    """A rank's one-pass read outgrew the memory above which `analyze` reads a rank in windows of steps
    instead (stream/windowed.py): the caller starts again that way."""


class MemoryGuard:
    """Wraps the builder's consumer: after each chunk, the process's resident memory against the
    budget (an InputError past it) and, where given, against `switch_mb` MB more than it held when the read
    began (WindowsNeeded past it: what the read itself added, so that a long-lived process holding other
    memory - the service's worker, a test run - does not switch small traces to windows)."""

    def __init__(self, path: Path, limit_mb: float | None, switch_mb: float | None = None) -> None:
        self.path, self.limit_mb = path, limit_mb
        start = rss_mb() if switch_mb is not None else None
        self.switch_mb = start + switch_mb if start is not None and switch_mb is not None else None

    def check(self, events: int) -> None:
        if self.limit_mb is None and self.switch_mb is None:
            return
        now = rss_mb()
        if self.switch_mb is not None and now is not None and now > self.switch_mb:
            raise WindowsNeeded(f"{now:,.0f} MB in use after {events:,} events")
        if self.limit_mb is None:
            return
        if now is not None and now > self.limit_mb:
            raise InputError(
                str(self.path),
                f"analysing this trace needs more memory than allowed here: {now:,.0f} MB in use after "
                f"{events:,} events, limit {self.limit_mb:,.0f} MB ({ENV}; default 80% of the available "
                "memory); analyse a part of it: `zoomer-ar analyze --steps N..M` (a window of steps), "
                "`zoomer-ar trace slice` (steps or a time window) or `zoomer-ar trace sample` (ranks)",
            )

    def wrap(self, consume: Callable[..., Any], count: Callable[[], int]) -> Callable[..., Any]:
        if self.limit_mb is None and self.switch_mb is None:
            return consume

        def guarded(*args: Any) -> Any:
            out = consume(*args)
            self.check(count())
            return out

        return guarded


__all__ = ["ENV", "MemoryGuard", "WindowsNeeded", "budget_mb", "check_setting", "rss_mb"]
