"""Cancelling jobs and the time limit per job, on a real server and real workers (SQLite, and PostgreSQL where
ZOOMER_TEST_PG_URL is set: required under CI).

- a queued job cancelled (POST /v1/jobs/{id}/cancel) is never claimed, its uploads are gone at once; cancelling
  it again answers it as it is; a done or failed job answers 409 in one line; another team's job 404;
- a running job's analysis process is killed by its worker (the test hook ZOOMER_SERVICE_TEST_ANALYSIS_DELAY_S
  holds a real analysis process before it analyses), the job ends `cancelled`, its scratch folder and uploads
  gone, and the same worker goes on to its next job, which runs past `--job-timeout` and fails "timed out after
  N s";
- a real analysis (a 54 MB trace) stopped by a tiny ZOOMER_SERVICE_JOB_TIMEOUT_S, without any hook;
- the queue: cancels racing claims from two threads never let a cancelled job be claimed, and a claimed job
  whose cancel was asked can no longer complete.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from service_testutil import (
    EXAMPLE_DL,
    SHARED_TRACES,
    Server,
    alive,
    db_url,  # noqa: F401 - fixture
    server_on,
    shared_trace,
    trace_file,
    unique_trace,
    upload,
    wait_job,
)
from sqlalchemy import func, select

from zoomer_ar.service import queue as Q
from zoomer_ar.service.auth import ensure_team
from zoomer_ar.store.db import open_store, read_session
from zoomer_ar.store.orm import Analysis

NOT_A_TRACE = b'{"not": "a trace"}'
BIG_TRACE = SHARED_TRACES / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request, tmp_path):
    with server_on(request.param, tmp_path / "srv", embedded_workers=0) as s:
        yield s


def _scratch(srv: Server, job_id: str) -> list[Path]:
    tmp = srv.data / "tmp"
    return sorted(tmp.glob(f"{job_id}-*")) if tmp.is_dir() else []


def _analyses(db: str) -> int:
    with read_session(open_store(db)) as s:
        return s.execute(select(func.count()).select_from(Analysis)).scalar_one()


def test_cancel_a_queued_job(tmp_path):
    srv = Server(tmp_path / "srv", embedded_workers=0)
    try:
        mine, theirs = srv.client(srv.token("ops")), srv.client(srv.token("other"))
        job = upload(mine, trace=trace_file(EXAMPLE_DL)).json()["id"]
        assert (srv.data / "jobs" / job).is_dir()
        assert theirs.post(f"/v1/jobs/{job}/cancel").status_code == 404  # another team's: as if it did not exist
        assert mine.post("/v1/jobs/" + "0" * 32 + "/cancel").status_code == 404
        r = mine.post(f"/v1/jobs/{job}/cancel")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["state"] == "cancelled" and body["error"] == Q.CANCELLED_QUEUED and body["attempts"] == 0
        assert body["cancel_requested_at"] is not None and body["finished_at"] >= body["queued_at"]
        assert not (srv.data / "jobs" / job).exists()  # its uploads go at once
        again = mine.post(f"/v1/jobs/{job}/cancel")
        assert again.status_code == 200 and again.json()["finished_at"] == body["finished_at"]
        r = mine.get(f"/v1/jobs/{job}/findings")
        assert r.status_code == 409 and r.json()["detail"] == f"job {job} is cancelled: {Q.CANCELLED_QUEUED}"

        # a worker never claims it; it runs the next job
        done = upload(mine, trace=unique_trace(trace_file(EXAMPLE_DL)), names={"trace": "dl.json.gz"}).json()["id"]
        failed = upload(mine, trace=NOT_A_TRACE, names={"trace": "bad.json"}).json()["id"]
        w = srv.worker()
        assert wait_job(mine, done, server=srv)["state"] == "done"
        assert wait_job(mine, failed, server=srv)["state"] == "failed"
        got = mine.get(f"/v1/jobs/{job}").json()
        assert got["state"] == "cancelled" and got["attempts"] == 0 and got["worker"] is None, got
        assert job not in w.logs()

        for finished, state in ((done, "done"), (failed, "failed")):
            r = mine.post(f"/v1/jobs/{finished}/cancel")
            assert r.status_code == 409, r.text
            assert r.json()["detail"] == f"job {finished} is {state}: only a queued or running job can be cancelled"
        listed = mine.get("/v1/jobs", params={"state": "cancelled"}).json()
        assert [j["id"] for j in listed["jobs"]] == [job] and listed["next"] is None
        r = mine.delete(f"/v1/jobs/{job}")
        assert r.status_code == 204, r.text
        assert mine.get(f"/v1/jobs/{job}").status_code == 404
        assert mine.post(f"/v1/jobs/{job}/cancel").status_code == 404
        assert mine.post("/v1/jobs/nope/cancel").status_code == 422
        mine.close()
        theirs.close()
    finally:
        srv.stop()


def test_queued_job_delete_says_to_cancel_it(tmp_path):
    srv = Server(tmp_path / "srv", embedded_workers=0)
    try:
        with srv.client(srv.token("ops")) as c:
            job = upload(c, trace=NOT_A_TRACE, names={"trace": "bad.json"}).json()["id"]
            r = c.delete(f"/v1/jobs/{job}")
            assert r.status_code == 409, r.text
            detail = r.json()["detail"]
            assert "is queued" in detail and f"POST /v1/jobs/{job}/cancel" in detail and "\n" not in detail
    finally:
        srv.stop()


def test_cancel_a_running_job_then_the_time_limit(server):
    """One worker (time limit 6 s) whose analysis processes wait 60 s before analysing: the first job is cancelled
    while it runs, the second runs past the limit."""
    srv = server
    w = srv.worker(args=("--job-timeout", "6"), env={"ZOOMER_SERVICE_TEST_ANALYSIS_DELAY_S": "60"})
    with srv.client(srv.token("ops")) as c:
        job = upload(c, trace=unique_trace(trace_file(EXAMPLE_DL)), names={"trace": "dl.json.gz"}).json()["id"]
        wait_job(c, job, states=("running",), server=srv)
        deadline = time.monotonic() + 30
        while not any((p / "analysis-delay").is_file() for p in _scratch(srv, job)):
            assert time.monotonic() < deadline, srv.logs()
            time.sleep(0.05)
        (folder,) = _scratch(srv, job)
        child = int((folder / "analysis-delay").read_text())
        assert child != w.pid and alive(child)

        r = c.post(f"/v1/jobs/{job}/cancel")
        asked = time.monotonic()
        assert r.status_code == 202, r.text
        assert r.json()["state"] == "running" and r.json()["cancel_requested_at"] is not None
        again = c.post(f"/v1/jobs/{job}/cancel")  # asked again: still running (202), or the worker has stopped it
        assert (again.status_code, again.json()["state"]) in ((202, "running"), (200, "cancelled")), again.text
        got = wait_job(c, job, states=("cancelled",), timeout=20, server=srv)
        took = time.monotonic() - asked
        assert took < 5, took  # the worker reads the flag every --poll (0.2 s)
        assert got["error"] == Q.CANCELLED_RUNNING and got["attempts"] == 1 and got["result"] is None, got
        assert not alive(child), "the analysis process was stopped"
        assert _scratch(srv, job) == [] and not (srv.data / "jobs" / job).exists()  # nothing left on disk
        assert c.post(f"/v1/jobs/{job}/cancel").status_code == 200
        assert c.get(f"/v1/jobs/{job}/report.html").status_code == 409

        # the same worker goes on: its next job runs past the limit
        slow = upload(c, trace=unique_trace(trace_file(EXAMPLE_DL)), names={"trace": "slow.json.gz"}).json()["id"]
        got = wait_job(c, slow, timeout=60, server=srv)
        assert got["state"] == "failed" and got["attempts"] == 1, got
        assert got["error"].startswith("timed out after 6 s: the server's limit per job (--job-timeout"), got
        assert "\n" not in got["error"] and str(srv.root) not in got["error"]
        assert 6 <= got["finished_at"] - got["started_at"] < 15, got
        assert _scratch(srv, slow) == []
        assert (srv.data / "jobs" / slow).is_dir()  # a failed job's uploads are kept for inspection
        assert c.post(f"/v1/jobs/{slow}/cancel").status_code == 409
    assert w.proc.poll() is None, w.logs()
    assert _analyses(srv.db) == 0
    assert "Traceback" not in w.logs(), w.logs()


def test_time_limit_stops_a_real_analysis(tmp_path):
    """No hook: a 54 MB trace (over half a second to analyse) and a limit of 0.05 s from the environment."""
    trace = shared_trace(BIG_TRACE)
    srv = Server(tmp_path / "srv", embedded_workers=0)
    try:
        w = srv.worker(env={"ZOOMER_SERVICE_JOB_TIMEOUT_S": "0.05"})
        with srv.client(srv.token("ops")) as c:
            job = upload(c, trace=trace).json()["id"]
            got = wait_job(c, job, timeout=60, server=srv)
            assert got["state"] == "failed", got
            assert got["error"].startswith("timed out after 0.05 s: "), got
            assert _scratch(srv, job) == [] and (srv.data / "jobs" / job).is_dir()
        assert "stopped at its time limit of 0.05 s" in w.logs()
        assert _analyses(srv.db) == 0
    finally:
        srv.stop()


def test_cancels_racing_claims_never_lose_a_job(db_url, tmp_path):
    """40 queued jobs; two threads claim as fast as they can while a third cancels every job. Each job ends either
    cancelled without ever being claimed, or claimed with its cancel asked: then its worker can no longer complete
    it (nor record or fail it), and it ends cancelled under its lease. 5 jobs are claimed and 5 others cancelled
    before the race, so both ways are checked however the 30 raced ones fall (a loaded machine saw all 40 claimed
    first)."""
    engine = open_store(db_url)
    team = ensure_team(engine, "ops")
    ids = []
    for _ in range(40):
        jid = Q.new_job_id()
        Q.insert_job(engine, job_id=jid, team_id=team, kind="analyze", name="r", params={}, input_dir=None)
        ids.append(jid)
    claims: dict[str, list[Q.Claim]] = {}
    lock = threading.Lock()
    go = threading.Event()

    def claimer(name: str) -> None:
        go.wait()
        while True:
            c = Q.claim(engine, name, 60.0)
            if c is None:
                return
            with lock:
                claims.setdefault(c.job_id, []).append(c)

    def canceller() -> None:
        go.wait()
        for jid in reversed(ids):  # newest first: the claims (oldest first) and the cancels meet midway
            assert Q.request_cancel(engine, jid, team) is not None

    for _ in range(5):  # claimed before the race
        c = Q.claim(engine, "w0", 60.0)
        claims[c.job_id] = [c]
    claimed_first = set(claims)
    cancelled_first = [jid for jid in reversed(ids) if jid not in claimed_first][:5]
    for jid in cancelled_first:  # cancelled before the race: never claimed
        assert Q.request_cancel(engine, jid, team) is not None
    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(2)] + [threading.Thread(target=canceller)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(timeout=120)
    assert all(len(cs) == 1 for cs in claims.values()), "claimed once at most"
    assert claimed_first <= set(claims) and not set(cancelled_first) & set(claims), "both ways taken"
    for jid in ids:
        job = Q.get_job(engine, jid, None)
        assert job.cancel_requested_at is not None
        if jid in claims:
            c = claims[jid][0]
            assert job.state == Q.RUNNING and job.attempts == 1, (jid, job.state)
            assert not Q.complete(engine, c, result={}, artifacts={})  # its cancel came first
            assert not Q.fail(engine, c, "boom")
            assert Q.cancel_requested(engine, c) is True
            assert Q.finish_cancelled(engine, c)
            assert Q.get_job(engine, jid, None).error == Q.CANCELLED_RUNNING
        else:
            assert job.state == Q.CANCELLED and job.attempts == 0 and job.started_at is None, (jid, job.state)
    assert {Q.get_job(engine, j, None).state for j in ids} == {Q.CANCELLED}
    assert Q.claim(engine, "late", 60.0) is None
    with pytest.raises(Q.NotCancellable):
        done = Q.new_job_id()
        Q.insert_job(engine, job_id=done, team_id=team, kind="analyze", name="d", params={}, input_dir=None)
        c = Q.claim(engine, "w", 60.0)
        assert Q.complete(engine, c, result={}, artifacts={})
        Q.request_cancel(engine, done, team)


def test_running_job_whose_worker_died_is_cancelled_by_the_next_claim(db_url):
    engine = open_store(db_url)
    team = ensure_team(engine, "ops")
    jid = Q.new_job_id()
    Q.insert_job(engine, job_id=jid, team_id=team, kind="analyze", name="r", params={}, input_dir=None)
    c = Q.claim(engine, "dies", 0.5)
    assert Q.request_cancel(engine, jid, team).state == Q.RUNNING  # asked; its worker never sees it
    time.sleep(0.7)  # its lease runs out
    assert Q.claim(engine, "next", 60.0) is None
    job = Q.get_job(engine, jid, None)
    assert job.state == Q.CANCELLED and job.error == Q.CANCELLED_RUNNING and job.attempts == 1
    assert not Q.finish_cancelled(engine, c)  # the dead worker's lease is gone
