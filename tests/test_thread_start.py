"""zoomer_ar.threads.start: a SIGTERM that arrives while a helper thread starts is delivered once
start() has returned, so the cleanup can join the thread (the trace commands' SIGTERM test saw
"internal error: RuntimeError: cannot join thread before it is started" under CI load)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from zoomer_ar import threads


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs pthread_sigmask")
def test_a_signal_during_start_is_delivered_after_it(monkeypatch):
    seen: list[str] = []

    class Stop(Exception):
        pass

    def handler(signum, frame):
        seen.append("handler")
        raise Stop

    real_start = threading.Thread.start

    def start_then_signal(self):  # the signal lands inside start(), as under load
        os.kill(os.getpid(), signal.SIGTERM)
        seen.append("kill sent")
        real_start(self)
        seen.append("started")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        t = threading.Thread(target=lambda: None)
        monkeypatch.setattr(threading.Thread, "start", start_then_signal)
        with pytest.raises(Stop):
            threads.start(t)
        monkeypatch.undo()
        t.join(5)  # joinable: start() ran to its end before the handler raised
        assert seen == ["kill sent", "started", "handler"] and not t.is_alive()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # the mask is restored
