"""A full disk while an upload is stored: 507 with the reason in one line, nothing of the upload left on disk.

The server runs as a real subprocess under a file-size limit (RLIMIT_FSIZE, set on its pid): a write past it
fails with EFBIG, as a full disk fails with ENOSPC (zoomer_ar.service.disk treats both alike; docs/service.md
shows the same answers measured on a 2 MB tmpfs). No mocks: the server's own writes hit the limit.
"""

from __future__ import annotations

import os
import resource
import sys

import pytest

from service_testutil import (EXAMPLE_DL, Server, create_pg_database, pg_server_url, tar_gz, trace_file, unique_trace,
                              upload, wait_job)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resource.prlimit is Linux's")

LIMIT = 2 << 20  # the SQLite store (~150 KB) and the server's log stay well under it


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("disk-full") / "srv", embedded_workers=0)  # no worker: the server alone writes under the limit
    try:
        _soft, hard = resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (LIMIT, hard))
        yield srv
    finally:
        srv.stop()


def _job_folders(srv: Server) -> set[str]:
    jobs = srv.data / "jobs"
    return {p.name for p in jobs.iterdir()} if jobs.is_dir() else set()


def test_upload_over_the_disk_answers_507_and_keeps_nothing(limited_server):
    srv = limited_server
    before = _job_folders(srv)
    with srv.client(srv.token("ops")) as c:
        r = upload(c, trace=os.urandom(2 * LIMIT), names={"trace": "big.json"})
        assert r.status_code == 507, r.text
        detail = r.json()["detail"]
        assert detail.startswith("the server cannot store the upload: ") and "\n" not in detail
        assert "try again later" in detail and str(srv.data) not in detail  # no server path
        assert _job_folders(srv) == before
        ok = upload(c, trace=b'{"traceEvents": []}', names={"trace": "small.json"})  # the server goes on
        assert ok.status_code == 202, ok.text
    assert "Traceback" not in srv.log.read_text(errors="replace")


def test_archive_extracted_past_the_disk_answers_507_not_400(limited_server):
    srv = limited_server
    rank = os.urandom(LIMIT * 3 // 4).hex().encode()  # 1.5 * LIMIT of text, about 2:1 in gzip: the upload fits
    archive = tar_gz({"rank0.trace.json": rank})
    assert len(archive) < LIMIT < len(rank)
    before = _job_folders(srv)
    with srv.client(srv.token("ops")) as c:
        r = upload(c, ranks=archive, names={"ranks": "ranks.tar.gz"})
        assert r.status_code == 507, r.text
        assert r.json()["detail"].startswith("the server cannot store the rank archive: ")
        assert _job_folders(srv) == before


STORE_LIMIT = 1024  # a tiny upload fits; no page of the SQLite store's WAL does (4 KiB each)


def _set_fsize(pid: int, limit: int) -> None:
    _soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, hard))


def _job_rows(srv: Server) -> list[tuple[str, str]]:
    import sqlite3

    con = sqlite3.connect(srv.root / "store.db")
    try:
        return con.execute("SELECT id, state FROM service_jobs ORDER BY id").fetchall()
    finally:
        con.close()


def test_job_the_store_cannot_take_answers_507_and_leaves_nothing(tmp_path):
    # the upload is stored, then the job's row cannot be written ("database or disk is full", or "disk I/O error"
    # past the file-size limit): one line, 507, no folder, no row; the server goes on once there is space
    srv = Server(tmp_path / "srv", embedded_workers=0)
    try:
        token = srv.token("ops")
        rows = _job_rows(srv)
        _set_fsize(srv.proc.pid, STORE_LIMIT)
        with srv.client(token) as c:
            r = upload(c, trace=b'{"traceEvents": []}', names={"trace": "small.json"})
            assert r.status_code == 507, r.text
            detail = r.json()["detail"]
            assert detail.startswith("the server cannot queue the job: its store could not be written (") and "\n" not in detail
            assert "try again later" in detail and str(srv.root) not in detail  # no server path
            assert _job_folders(srv) == set() and _job_rows(srv) == rows
            _set_fsize(srv.proc.pid, resource.RLIM_INFINITY)
            ok = upload(c, trace=b'{"traceEvents": []}', names={"trace": "small.json"})
            assert ok.status_code == 202, ok.text
            assert [jid for jid, _ in _job_rows(srv)] == sorted([*(j for j, _ in rows), ok.json()["id"]])
    finally:
        srv.stop()


REPORT_LIMIT = 8 << 10  # under the worker's findings.json of the example (about 15 kB)


def test_worker_out_of_space_for_the_reports_fails_the_job_in_one_line(tmp_path):
    # the store is PostgreSQL (no file of the worker's), so the worker's file-size limit hits its reports alone;
    # the job fails with one line naming the full disk (before: "cannot write <server path>/findings.json: File
    # too large"), its recorded run is undone, and no report is served; with room again the next job is done
    url, drop = create_pg_database(pg_server_url())
    srv = Server(tmp_path / "srv", db=url, embedded_workers=0)
    try:
        token = srv.token("ops")
        worker = srv.worker()
        _set_fsize(worker.pid, REPORT_LIMIT)
        with srv.client(token) as c:
            r = upload(c, trace=unique_trace(trace_file(EXAMPLE_DL)), names={"trace": "dl.json.gz"})
            assert r.status_code == 202, r.text
            job = wait_job(c, r.json()["id"], server=srv)
            assert job["state"] == "failed", job
            error = job["error"]
            assert error.startswith("the server's disk is full: this job's findings.json could not be written ("), error
            assert "upload it again later" in error and "\n" not in error
            assert str(srv.root) not in error and "/tmp" not in error  # no server path
            assert job["artifacts"] == [] and c.get(f"/v1/jobs/{job['id']}/report.md").status_code == 409
            assert _recorded_runs(url) == 0  # the run it recorded before its reports was undone
            _set_fsize(worker.pid, resource.RLIM_INFINITY)
            r = upload(c, trace=unique_trace(trace_file(EXAMPLE_DL)), names={"trace": "dl.json.gz"})
            done = wait_job(c, r.json()["id"], server=srv)
            assert done["state"] == "done", done
            assert c.get(f"/v1/jobs/{done['id']}/findings").json()["findings"]
            assert _recorded_runs(url) == 1
    finally:
        srv.stop()
        drop()


def _recorded_runs(url: str) -> int:
    from sqlalchemy import text

    from zoomer_ar.store.db import get_engine

    with get_engine(url).connect() as conn:
        return conn.execute(text("SELECT count(*) FROM analyses")).scalar_one()


def test_worker_on_a_full_store_leaves_the_job_queued_and_says_why_in_one_line(tmp_path):
    # the worker cannot even claim (a claim is a write to the SQLite store, refused past its file-size limit): the
    # job stays queued, untouched, and each retry is one log line naming the full disk (before: two lines, the
    # driver's message and SQLAlchemy's "Background on this error"); with room again, the job is done
    import subprocess
    import threading
    import time

    from service_testutil import PY, REPO, env_for_subprocess

    srv = Server(tmp_path / "srv", embedded_workers=0)
    proc = None
    try:
        with srv.client(srv.token("ops")) as c:
            r = upload(c, trace=trace_file(EXAMPLE_DL))
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            # its log goes through a pipe: a log file would be the worker's own, under the same limit
            proc = subprocess.Popen([PY, "-m", "zoomer_ar.cli", "worker", "--db", srv.db, "--data", str(srv.data),
                                     "--poll", "0.2", "--log-level", "info"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env_for_subprocess(),
                                    cwd=REPO, text=True)
            _set_fsize(proc.pid, STORE_LIMIT)
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
            reader.start()
            deadline = time.monotonic() + 60
            while sum("cannot claim" in ln for ln in lines) < 2:
                assert time.monotonic() < deadline and proc.poll() is None, "".join(lines[-20:])
                time.sleep(0.1)
            claims = [ln for ln in lines if "cannot claim" in ln]
            assert all("cannot claim (the store's disk is full: " in ln for ln in claims), claims
            assert not any("Background on this error" in ln or "Traceback" in ln for ln in lines), "".join(lines)
            assert c.get(f"/v1/jobs/{job_id}").json()["state"] == "queued"
            _set_fsize(proc.pid, resource.RLIM_INFINITY)
            done = wait_job(c, job_id, server=srv)
            assert done["state"] == "done" and done["attempts"] == 1, done
            assert c.get(f"/v1/jobs/{job_id}/findings").json()["findings"]
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        srv.stop()


def test_webhook_delivery_the_store_cannot_take_answers_507(tmp_path):
    # any request whose store write is refused for want of space (here a GitHub delivery queueing a review job) is
    # a 507 in one line, not a 500; GitHub's redelivery of it queues the job once there is room
    import json
    import uuid

    import httpx

    from zoomer_ar.service.webhook import sign

    secret, clone = "hook-secret", tmp_path / "clone"
    clone.mkdir()
    srv = Server(tmp_path / "srv", embedded_workers=0, args=(
        "--webhook-secret", secret, "--webhook-repo", f"acme/trainer={clone}", "--webhook-team", "platform"))
    try:
        srv.token("platform")
        rows = _job_rows(srv)
        body = json.dumps({"action": "opened", "number": 7, "repository": {"full_name": "acme/trainer"},
                           "pull_request": {"number": 7, "base": {"sha": "a" * 40, "ref": "main"},
                                            "head": {"sha": "b" * 40, "ref": "feature"}}}).encode()
        headers = {"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": str(uuid.uuid4()),
                   "Content-Type": "application/json", "X-Hub-Signature-256": sign(secret, body)}
        _set_fsize(srv.proc.pid, STORE_LIMIT)
        r = httpx.post(srv.url + "/v1/github/webhook", content=body, headers=headers, timeout=30)
        assert r.status_code == 507, r.text
        detail = r.json()["detail"]
        assert detail.startswith("the server cannot do this now: its store could not be written (") and "\n" not in detail
        assert str(srv.root) not in detail and _job_rows(srv) == rows
        _set_fsize(srv.proc.pid, resource.RLIM_INFINITY)
        again = httpx.post(srv.url + "/v1/github/webhook", content=body, headers=headers, timeout=30)
        assert again.status_code == 202 and again.json()["status"] == "queued", again.text
    finally:
        srv.stop()


def test_job_the_full_store_cannot_mark_failed_says_the_disk_was_full_not_abandoned(tmp_path):
    # the worker claims the job, then its store fills up: the run cannot be recorded and the job cannot even be
    # marked failed. Once there is room, the job fails saying the store's disk was full (before: the lease ran out
    # and the next claim failed it as "abandoned: ... its worker stopped each time", a wrong lead for the operator)
    import subprocess
    import threading
    import time

    from service_testutil import PY, REPO, env_for_subprocess

    srv = Server(tmp_path / "srv", embedded_workers=0, args=("--max-attempts", "1"))
    proc = None
    try:
        with srv.client(srv.token("ops")) as c:
            r = upload(c, trace=unique_trace(trace_file(EXAMPLE_DL)), names={"trace": "dl.json.gz"})
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            # claims, then waits 8 s before running the job; its log goes through a pipe (a file would be under
            # the limit too); a lease of 1 s, which runs out while the store refuses the heartbeats
            proc = subprocess.Popen([PY, "-m", "zoomer_ar.cli", "worker", "--db", srv.db, "--data", str(srv.data),
                                     "--poll", "0.2", "--lease", "1", "--log-level", "info"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, text=True,
                                    env=env_for_subprocess({"ZOOMER_SERVICE_TEST_DELAY_S": "8"}))
            lines: list[str] = []
            threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
            wait_job(c, job_id, states=("running",), server=srv)
            _set_fsize(proc.pid, STORE_LIMIT)  # from here on the worker's writes to the store are refused
            deadline = time.monotonic() + 120
            while not any("cannot be marked failed" in ln for ln in lines):
                assert time.monotonic() < deadline and proc.poll() is None, "".join(lines[-20:])
                time.sleep(0.2)
            time.sleep(2.0)  # past its lease, which nobody could extend
            _set_fsize(proc.pid, resource.RLIM_INFINITY)
            job = wait_job(c, job_id, server=srv)
            assert job["state"] == "failed", job
            error = job["error"]
            assert error.startswith("the server's disk is full: this job's run could not be recorded in the store ("), (
                error, "".join(lines[-20:]))
            assert "abandoned" not in error and "\n" not in error and str(srv.root) not in error
            assert job["attempts"] == 1 and _job_rows(srv) == [(job_id, "failed")]
            assert not any("Traceback" in ln for ln in lines), "".join(lines)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        srv.stop()
