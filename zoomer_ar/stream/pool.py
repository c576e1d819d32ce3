"""Rank files handled in worker processes, with their progress bars kept in the main process.

Used by the streaming reader (each rank file read in its own process: stream/load.py) and by
`analyze --steps` (each rank file cut to the steps in its own process: step_window.py). Workers are
spawned (never forked: the main process may hold threads) with the current directory off their
import path (children.no_cwd_imports). Each worker writes the bytes it has read of its file into
shared memory, and the main process hands them to the file's progress callback (the CLI's bars)
while it waits."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..children import no_cwd_imports
from ..load.reader import Progress
from ..sigterm import sigterm_unwinds

_PROGRESS = None  # a worker process's share of the bytes read (see Bars): done, total per file


def env_workers(name: str = "ZOOMER_STREAM_WORKERS") -> int:
    """Worker processes: the variable's value where it is a whole number (0 or less: one), else the
    CPU count."""
    try:
        return max(1, int(os.environ.get(name, "")))
    except ValueError:
        return os.cpu_count() or 1


def _init_worker(shared) -> None:
    global _PROGRESS
    _PROGRESS = shared


def shared_progress(slot: int | None) -> Progress | None:
    """The progress callback of a worker's file: its bytes read, written where the main process looks."""
    shared = _PROGRESS
    if slot is None or shared is None:
        return None

    def progress(done: int, total: int) -> None:
        shared[2 * slot + 1] = total
        shared[2 * slot] = done

    return progress


class Bars:
    """Progress of files handled in worker processes (see the module's docstring)."""

    def __init__(self, ctx, files: list[Path], progress_factory: Callable[[Path], Progress | None] | None) -> None:
        self.bars = [progress_factory(f) if progress_factory else None for f in files]
        self.shared = ctx.Array("q", 2 * len(files), lock=False) if any(self.bars) else None
        self.shown = [(-1, -1)] * len(files)

    def slot(self, i: int) -> int | None:
        return i if self.bars[i] is not None else None

    def show(self, finished: set[int] = frozenset()) -> None:
        """Pass on what the workers report; a finished file's bar is completed (its last report may
        not have come, or it stopped early: a refused file)."""
        if self.shared is None:
            return
        for i, bar in enumerate(self.bars):
            if bar is None:
                continue
            done, total = self.shared[2 * i], self.shared[2 * i + 1]
            if i in finished:
                total = max(total, done, 1)
                done = total
            if (done, total) != self.shown[i] and total > 0:
                self.shown[i] = (done, total)
                bar(done, total)


def _terminate(pool: cf.ProcessPoolExecutor) -> None:
    """Stop the workers now (their files are read-only inputs; partial outputs are the caller's to
    remove): without it, leaving the pool waits for every file already queued to a worker."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(5)  # gone before the caller removes the folder they wrote into
    pool.shutdown(wait=False, cancel_futures=True)


def run_pool(worker: Callable[..., Any], files: list[Path], args: list[tuple], n_workers: int,
             progress_factory: Callable[[Path], Progress | None] | None = None) -> list[Any]:
    """worker(*args[i], slot) for each file in `n_workers` spawned processes; the results in the
    files' order. `worker` is a module-level function; it passes shared_progress(slot) to its reads."""
    ctx = mp.get_context("spawn")  # no fork of a process that may hold threads
    with no_cwd_imports(), sigterm_unwinds():  # everything that may start a helper process in here
        bars = Bars(ctx, files, progress_factory)
        with cf.ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx, initializer=_init_worker,
                                    initargs=(bars.shared,)) as pool:
            try:
                futures = [pool.submit(worker, *a, bars.slot(i)) for i, a in enumerate(args)]
                index = {fut: i for i, fut in enumerate(futures)}
                finished: set[int] = set()
                pending = set(futures)
                while pending:
                    done, pending = cf.wait(pending, timeout=0.2 if bars.shared is not None else None)
                    finished |= {index[fut] for fut in done}
                    bars.show(finished)
                return [fut.result() for fut in futures]
            except BaseException:  # Ctrl-C, SIGTERM: stop at once, not after the files queued to the workers
                _terminate(pool)
                raise
