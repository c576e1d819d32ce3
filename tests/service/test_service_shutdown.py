"""Starting and stopping `zoomer-ar serve`.

Stopped with SIGTERM (systemd, Kubernetes, `kill`) or SIGINT: it stops taking requests, lets its
embedded workers finish the job they hold, waits for them, then exits by that signal (as uvicorn does); no worker is
left running on its own.

A real server and its embedded worker, slowed by the worker's test hook (ZOOMER_SERVICE_TEST_DELAY_S) so that the
signal lands while the job runs.
"""

from __future__ import annotations

import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from service_testutil import EXAMPLE_DL, Server, alive, trace_file, unique_trace, upload, wait_job, zoomer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


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
        assert not any(alive(w) for w in workers), "a worker outlived its server"
        store = sqlite3.connect(srv.root / "store.db")
        try:
            assert store.execute("SELECT state FROM service_jobs WHERE id = ?", (job_id,)).fetchone() == ("done",)
        finally:
            store.close()
    finally:
        srv.stop()


def test_a_port_file_that_cannot_be_written_exits_2_before_any_worker_starts(tmp_path):
    # before: an internal error (exit 1, "FileExistsError: [Errno 17] File exists: ...") after the embedded worker
    # had been started
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = zoomer("serve", "--port", "0", "--data", str(tmp_path / "d"), "--db", f"sqlite:///{tmp_path}/s.db",
               "--port-file", str(blocker / "port"), timeout=120)
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last == f"Error: Invalid value for --port-file: cannot write {blocker / 'port'}: File exists ({blocker})", last
    assert "Traceback" not in r.stderr and "zoomer-ar worker" not in r.stderr, r.stderr


def test_an_upload_cut_off_by_the_stop_is_a_json_503_and_leaves_nothing(tmp_path):
    # uvicorn gives requests in flight 10 s when stopping, then cancels them: an upload still arriving was answered
    # a plain-text 500 'Internal Server Error' (and a stack trace in the log); it is now the API's JSON 503, with
    # Retry-After, and its folder is removed
    import json
    import socket

    srv = Server(tmp_path / "srv", embedded_workers=0)
    try:
        token = srv.token("ops")
        jobs = srv.data / "jobs"
        with socket.create_connection(("127.0.0.1", srv.port), timeout=120) as sock:
            part = b'--b\r\nContent-Disposition: form-data; name="trace"; filename="slow.json"\r\n\r\n{' + b" " * 100_000
            sock.sendall(f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                         "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 5000000\r\n\r\n".encode()
                         + part)
            while not (jobs.is_dir() and any(jobs.iterdir())):  # the upload is being written
                assert srv.proc.poll() is None, srv.logs()
                time.sleep(0.1)
            srv.proc.send_signal(signal.SIGTERM)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer
        headers = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
        assert headers[b"content-type"] == b"application/json" and int(headers[b"retry-after"]) > 0, answer
        assert json.loads(body)["detail"].startswith("the server is stopping: this request was cut off"), body
        srv.proc.wait(timeout=120)
        assert list(jobs.iterdir()) == [], "the cut-off upload left its folder"
        log = srv.log.read_text(errors="replace")
        assert "POST /v1/jobs cut off: the server is stopping" in log and "Exception in ASGI application" not in log
    finally:
        srv.stop()
