"""Starting helper threads so that a signal cannot leave one half-started.

A SIGTERM handler that raises (the trace commands unwind on SIGTERM like on Ctrl-C) or a Ctrl-C can
land inside ``Thread.start()``, after the thread runs but before ``start()`` returns; the cleanup
that then joins it failed with "cannot join thread before it is started" (exit 1, "internal error",
instead of the interruption's own exit). :func:`start`, in the main thread, holds SIGINT and
SIGTERM back while ``start()`` runs (a stand-in handler notes them) and then hands a signal that
came meanwhile to the handler it was meant for, once the thread is started and joinable. (Blocking
the signals with pthread_sigmask is not enough: another thread that has them unblocked receives
them, and Python runs the handler in the main thread all the same.)
"""

from __future__ import annotations

import signal
import threading

_DEFERRED = (signal.SIGINT, signal.SIGTERM)


def start(thread: threading.Thread) -> threading.Thread:
    """``thread.start()``, with SIGINT and SIGTERM handled only once it has returned."""
    if threading.current_thread() is not threading.main_thread():  # handlers are the main thread's
        thread.start()
        return thread
    pending: list[tuple[int, object]] = []
    saved: dict[int, object] = {}
    try:
        for signum in _DEFERRED:
            saved[signum] = signal.signal(signum, lambda n, f: pending.append((n, f)))
    except (ValueError, OSError):  # cannot set handlers here: start as is
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        thread.start()
        return thread
    try:
        thread.start()
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    if pending:
        signum, frame = pending[0]
        handler = saved[signum]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:
            signal.raise_signal(signum)  # the default action (terminate), now
    return thread
