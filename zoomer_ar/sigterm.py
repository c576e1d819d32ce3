"""SIGTERM (a job scheduler's stop) unwinds a command like Ctrl-C: SystemExit(143) is raised where the
command is, so its `finally` blocks and context managers run: temporary outputs, the folders made for
them, --steps cuts and worker processes are removed (the default action killed the process and left
them behind). Used by `analyze`, the `trace` commands and the worker pool (stream/pool.py)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def _terminated(signum, frame) -> None:  # noqa: ARG001
    raise SystemExit(128 + signum)


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM raises SystemExit(143). A handler the program has set is left alone
    (the service worker's SIGTERM lets the job finish, then stops), and so are signals outside the
    main thread (signal.signal works only there)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
