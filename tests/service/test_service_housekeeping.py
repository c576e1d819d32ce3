"""Job folders nothing else removes: swept by `zoomer-ar serve` at start-up (zoomer_ar.service.housekeeping).

A real server is SIGKILLed while an upload is arriving (its `jobs/<id>/upload` is partly written and no job
row exists); the next server started on the same data folder removes that folder, with one log line, and the
inputs a killed worker left behind after completing its job; it keeps queued jobs' folders, a folder written
just now (an upload perhaps still arriving on another server sharing the folder) and folders whose names are
not job ids.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

from service_testutil import Server, upload

from zoomer_ar.service import queue as Q
from zoomer_ar.service.auth import ensure_team
from zoomer_ar.store.db import open_store

READ_TIMEOUT = 1.0  # a folder without a job is stale 2 s after its last write


def _start(root: Path) -> Server:
    (root / "port").unlink(missing_ok=True)  # the next server writes its own
    return Server(root, args=("--read-timeout", str(READ_TIMEOUT), "--min-body-rate", "0"), embedded_workers=0)


def _partial_upload(srv: Server, token: str) -> tuple[socket.socket, Path]:
    """A multipart upload whose body stops short; returns the socket and the upload folder being written."""
    before = set((srv.data / "jobs").iterdir())
    head = (b'--B\r\nContent-Disposition: form-data; name="trace"; filename="t.json"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n")
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode()
                 + b"\r\nContent-Type: multipart/form-data; boundary=B\r\nContent-Length: 50000000\r\n\r\n"
                 + head + b"{" * (256 << 10))
    deadline = time.monotonic() + 20
    while True:
        new = [p for p in (srv.data / "jobs").iterdir() if p not in before]
        if new and (new[0] / "upload" / "trace").is_file() and (new[0] / "upload" / "trace").stat().st_size:
            return sock, new[0]
        assert time.monotonic() < deadline, srv.logs()
        time.sleep(0.05)


def _done_job_left_behind(db: str, jobs: Path) -> Path:
    """A job completed by a worker killed before it removed the job's inputs (the queue's own calls)."""
    eng = open_store(db)
    job_id = Q.new_job_id()
    folder = jobs / job_id
    (folder / "input" / "trace").mkdir(parents=True)
    (folder / "input" / "trace" / "t.json").write_text("{}")
    Q.insert_job(eng, job_id=job_id, team_id=ensure_team(eng, "ops"), kind="analyze", name="left", params={},
                 input_dir=str(folder / "input"))
    claim = Q.claim(eng, "killed-worker", 30)
    assert claim is not None and claim.job_id == job_id
    assert Q.complete(eng, claim, result={}, artifacts={})
    return folder


def test_restart_sweeps_a_killed_upload_and_keeps_live_folders(tmp_path):
    root = tmp_path / "srv"
    first = _start(root)
    jobs = first.data / "jobs"
    try:
        token = first.token("ops")
        done_left = _done_job_left_behind(first.db, jobs)
        with first.client(token) as c:
            r = upload(c, trace=b'{"traceEvents": []}', names={"trace": "queued.json"})
            assert r.status_code == 202, r.text
        queued = jobs / r.json()["id"]
        sock, killed_upload = _partial_upload(first, token)
        first.proc.kill()  # SIGKILL: the handler never removes what it wrote
        first.proc.wait(timeout=30)
        sock.close()
    finally:
        first.stop()
    assert (killed_upload / "upload" / "trace").is_file()
    time.sleep(2 * READ_TIMEOUT + 0.5)
    fresh = jobs / uuid.uuid4().hex  # written just now: perhaps an upload arriving on another server
    (fresh / "upload").mkdir(parents=True)
    (fresh / "upload" / "trace").write_bytes(b"{")
    # "just now" whatever the second server's start-up takes (seconds on a loaded 2-core CI machine, past the
    # 2 s a folder stays fresh here): its writes are dated a minute ahead, as a write still going on would be
    ahead = time.time() + 60
    for p in (fresh / "upload" / "trace", fresh / "upload", fresh):
        os.utime(p, (ahead, ahead))
    other = jobs / "not-a-job"
    other.mkdir()

    second = _start(root)
    try:
        deadline = time.monotonic() + 30
        while killed_upload.exists() or done_left.exists():
            assert time.monotonic() < deadline, second.logs()
            time.sleep(0.1)
        assert queued.is_dir() and fresh.is_dir() and other.is_dir()
        log = second.log.read_text(errors="replace")
        lines = [line for line in log.splitlines() if "housekeeping" in line]
        assert sum(killed_upload.name in line and "an upload that never finished" in line for line in lines) == 1, log
        assert sum(done_left.name in line and "inputs of a done job" in line for line in lines) == 1, log
        assert len(lines) == 2, lines
        with second.client(token) as c:  # the queued job is intact
            assert c.get(f"/v1/jobs/{queued.name}").json()["state"] == "queued"
    finally:
        second.stop()
    assert os.listdir(queued / "input")
