"""`zoomer-ar serve` stopped with SIGTERM (systemd, Kubernetes, `kill`) or SIGINT: it stops taking requests, lets its
embedded workers finish the job they hold, waits for them, then exits by that signal (as uvicorn does); no worker is
left running on its own.

A real server and its embedded worker, slowed by the worker's test hook (ZOOMER_SERVICE_TEST_DELAY_S) so that the
signal lands while the job runs.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
from pathlib import Path

import pytest

from service_testutil import EXAMPLE_DL, Server, trace_file, unique_trace, upload, wait_job

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_server_waits_for_its_workers_job_then_exits(tmp_path, sig):
    # before: uvicorn re-raised the SIGTERM once it had shut down, which killed `serve` at once: its workers were
    # neither stopped nor waited for, and went on alone until their job ended
    srv = Server(tmp_path / "srv", env={"ZOOMER_SERVICE_TEST_DELAY_S": "5"})
    try:
        with srv.client(srv.token("ops")) as c:
            r = upload(c, trace=unique_trace(trace_file(EXAMPLE_DL)))
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            wait_job(c, job_id, states=("running",), server=srv)
        workers = _children(srv.proc.pid)
        assert len(workers) == 1, workers
        srv.proc.send_signal(sig)
        assert srv.proc.wait(timeout=120) == -sig, srv.logs()
        assert not any(_alive(w) for w in workers), "a worker outlived its server"
        store = sqlite3.connect(srv.root / "store.db")
        try:
            assert store.execute("SELECT state FROM service_jobs WHERE id = ?", (job_id,)).fetchone() == ("done",)
        finally:
            store.close()
    finally:
        srv.stop()
