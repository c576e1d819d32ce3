"""Housekeeping of the job folders (`<data>/jobs/<id>/`): `zoomer-ar serve` sweeps them at start-up, then every
SWEEP_EVERY_S seconds, and logs one line for each folder it removes:

- **an upload that never finished**: a folder with no job row whose newest write is older than
  `Retention.stale_upload_s` (twice the read timeout: an upload still arriving writes at least that often,
  or the read timeout cuts it off and removes its folder itself). A server killed mid-upload (SIGKILL, a
  lost host) leaves such a folder: nothing else would ever remove it.
- **a failed job's uploads**, kept for inspection `Retention.failed_s` after the job failed (database
  clock; 0: kept for ever). The job's row (its error) stays.
- **a finished job's inputs** left behind (its worker was killed after it completed the job, before it
  removed them): a done job never reads them again.
- **a cancelled job's uploads** left behind (the API removes them when it cancels a queued job, the worker
  when it has stopped a running one; a worker killed in between, or a job its next claim cancelled, leaves them).

Queued and running jobs' folders are never touched. Names that are not job ids (32 hex digits) are left alone.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from . import queue as Q

log = logging.getLogger("zoomer_ar.service.housekeeping")

SWEEP_EVERY_S = 600.0
JOB_FOLDER = re.compile(r"^[0-9a-f]{32}$")
DAY = 86_400.0


@dataclass(frozen=True)
class Retention:
    stale_upload_s: float  # a folder without a job, unwritten this long, is an upload that never finished
    failed_s: float = 0.0  # a failed job's uploads are kept this long after it failed; 0: for ever


def last_written(folder: Path) -> float:
    """The newest modification time of the folder and everything in it (epoch seconds; links not followed)."""
    newest = folder.lstat().st_mtime
    for root, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            try:
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
            except OSError:
                continue
    return newest


def _why(folder: Path, row: tuple[str, float | None] | None, db_now: float, keep: Retention) -> str | None:
    """Why `folder` goes, or None when it stays."""
    if row is None:
        age = time.time() - last_written(folder)
        if age < keep.stale_upload_s:
            return None  # perhaps an upload still arriving (here, or on another server sharing the folder)
        return f"an upload that never finished (no job; last written {age:.0f} s ago)"
    state, finished = row
    if state == Q.DONE:
        return "the inputs of a done job, left behind"
    if state == Q.CANCELLED:
        return "the uploads of a cancelled job, left behind"
    if state == Q.FAILED and keep.failed_s > 0 and finished is not None and db_now - finished >= keep.failed_s:
        return (f"the uploads of a job that failed {(db_now - finished) / DAY:.1f} days ago "
                f"(kept {keep.failed_s / DAY:g} days: --failed-retention-days)")
    return None


def sweep(engine: Engine, jobs_dir: Path, keep: Retention) -> list[tuple[str, str]]:
    """Remove the job folders that are no longer wanted (see the module docstring); returns (job id, why) of each."""
    try:
        folders = [p for p in jobs_dir.iterdir() if JOB_FOLDER.match(p.name) and p.is_dir() and not p.is_symlink()]
    except FileNotFoundError:
        return []
    if not folders:
        return []
    rows, db_now = Q.folder_states(engine, [p.name for p in folders])
    removed: list[tuple[str, str]] = []
    for folder in folders:
        try:
            why = _why(folder, rows.get(folder.name), db_now, keep)
        except OSError:  # removed meanwhile (the upload was refused, the job finished)
            continue
        if why is None:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        log.info("removed %s: %s", folder, why)
        removed.append((folder.name, why))
    return removed


async def sweep_forever(engine: Engine, jobs_dir: Path, keep: Retention, every_s: float = SWEEP_EVERY_S) -> None:
    """`sweep` now and then every `every_s` seconds, in a thread (the server's lifespan task); an error is logged,
    never fatal."""
    import asyncio

    from fastapi.concurrency import run_in_threadpool

    while True:
        try:
            await run_in_threadpool(sweep, engine, jobs_dir, keep)
        except Exception:  # noqa: BLE001 - the next sweep tries again; the server goes on
            log.exception("sweep of %s failed", jobs_dir)
        await asyncio.sleep(every_s)


__all__ = ["Retention", "SWEEP_EVERY_S", "last_written", "sweep", "sweep_forever"]
