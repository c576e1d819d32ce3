"""The error a failed job shows its client when the server ran out of space: one line, no server paths.

A worker on a full disk fails at one of three steps: recording the run in the store (StoreFullError),
writing the reports into its scratch folder (OutputError, or an OSError making the folder), or storing the
results with the job (the store refusing the transaction). Each said as it is, the job failed, and its
recording undone (queue.fail): nothing half-written is kept or served. A job that runs past the time limit
per job is stopped and failed with `timed_out_error`, in the same style.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from ..errors import OutputError
from ..store.db import StoreFullError, disk_full_reason
from .disk import DISK_FULL_ERRNOS, is_disk_full, os_reason

_DISK_FULL_REASONS = frozenset(os.strerror(e) for e in DISK_FULL_ERRNOS)
AGAIN = "nothing of its results was kept; upload it again later"


def disk_full_error(exc: BaseException, engine: Engine) -> str | None:
    """The job's one-line error when `exc` is the server's disk (or storage limit) being full, else None."""
    if isinstance(exc, StoreFullError):
        return f"the server's disk is full: this job's run could not be recorded in the store ({exc.reason}); {AGAIN}"
    if isinstance(exc, DBAPIError):
        reason = disk_full_reason(engine, exc)
        if reason is not None:
            return f"the server's disk is full: this job's results could not be stored ({reason}); {AGAIN}"
        return None
    if isinstance(exc, OutputError) and exc.reason in _DISK_FULL_REASONS:
        return (f"the server's disk is full: this job's {Path(exc.path).name} could not be written ({exc.reason}); "
                f"{AGAIN}")
    if is_disk_full(exc):
        assert isinstance(exc, OSError)
        return f"the server's disk is full: this job's reports could not be written ({os_reason(exc)}); {AGAIN}"
    return None


def timed_out_error(limit_s: float) -> str:
    """The job's one-line error when it ran past the workers' time limit per job (`--job-timeout`) and was stopped."""
    return (f"timed out after {limit_s:g} s: the server's limit per job (--job-timeout, ZOOMER_SERVICE_JOB_TIMEOUT_S); "
            "its analysis was stopped and nothing of its results was kept")


__all__ = ["disk_full_error", "timed_out_error"]
