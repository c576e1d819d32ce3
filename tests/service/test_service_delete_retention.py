"""Failed jobs' uploads do not stay for ever: DELETE /v1/jobs/<id> (done or failed jobs of the caller's team only)
and `--failed-retention-days` (the start-up sweep of zoomer_ar.service.housekeeping), on a real server."""

from __future__ import annotations

import time
from pathlib import Path

from service_testutil import EXAMPLE_DL, Server, trace_file, upload, wait_job
from sqlalchemy import func, select

from zoomer_ar.service import queue as Q
from zoomer_ar.service.auth import ensure_team
from zoomer_ar.service.housekeeping import Retention, sweep
from zoomer_ar.store.db import open_store, read_session
from zoomer_ar.store.orm import Analysis

NOT_A_TRACE = b'{"not": "a trace"}'


def _analyses(db: str) -> int:
    with read_session(open_store(db)) as s:
        return s.execute(select(func.count()).select_from(Analysis)).scalar_one()


def test_delete_only_finished_jobs_of_the_team(tmp_path):
    srv = Server(tmp_path / "srv", embedded_workers=0)
    jobs = srv.data / "jobs"
    try:
        mine, theirs = srv.client(srv.token("ops")), srv.client(srv.token("other"))
        failed = upload(mine, trace=NOT_A_TRACE, names={"trace": "bad.json"}).json()["id"]
        done = upload(mine, trace=trace_file(EXAMPLE_DL)).json()["id"]
        r = mine.delete(f"/v1/jobs/{failed}")
        assert r.status_code == 409 and "is queued" in r.json()["detail"], r.text
        srv.worker(delay=3)  # holds each job 'running' for 3 s
        wait_job(mine, failed, states=("running",), server=srv)
        r = mine.delete(f"/v1/jobs/{failed}")
        assert r.status_code == 409 and "is running" in r.json()["detail"], r.text
        assert wait_job(mine, failed, server=srv)["state"] == "failed"
        assert wait_job(mine, done, server=srv)["state"] == "done"
        assert (jobs / failed / "upload").is_dir() or (jobs / failed / "input").is_dir()  # kept for inspection

        assert theirs.delete(f"/v1/jobs/{failed}").status_code == 404  # another team's: as if it did not exist
        assert (jobs / failed).is_dir()
        r = mine.delete(f"/v1/jobs/{failed}")
        assert r.status_code == 204 and r.content == b"", r.text
        assert not (jobs / failed).exists()
        assert mine.get(f"/v1/jobs/{failed}").status_code == 404
        assert mine.delete(f"/v1/jobs/{failed}").status_code == 404

        recorded = _analyses(srv.db)
        assert recorded >= 1
        assert mine.delete(f"/v1/jobs/{done}").status_code == 204
        assert mine.get(f"/v1/jobs/{done}/findings").status_code == 404
        assert _analyses(srv.db) == recorded  # the run it recorded stays in the store
        assert mine.delete("/v1/jobs/" + "0" * 32).status_code == 404
        assert mine.delete("/v1/jobs/nope").status_code == 422
        mine.close()
        theirs.close()
    finally:
        srv.stop()


def test_failed_uploads_removed_after_the_retention(tmp_path):
    root = tmp_path / "srv"
    srv = Server(root)
    try:
        with srv.client(srv.token("ops")) as c:
            job = upload(c, trace=NOT_A_TRACE, names={"trace": "bad.json"}).json()["id"]
            error = wait_job(c, job, server=srv)["error"]
    finally:
        srv.stop()
    folder = srv.data / "jobs" / job
    assert folder.is_dir()
    time.sleep(1.0)
    (root / "port").unlink()
    srv = Server(root, args=("--failed-retention-days", "0.00001"))  # 0.864 s
    try:
        deadline = time.monotonic() + 30
        while folder.exists():
            assert time.monotonic() < deadline, srv.logs()
            time.sleep(0.1)
        with srv.client(srv.token("ops")) as c:
            got = c.get(f"/v1/jobs/{job}").json()
        assert got["state"] == "failed" and got["error"] == error  # the job and its error stay
        lines = [ln for ln in srv.log.read_text().splitlines() if job in ln and "housekeeping" in ln]
        assert len(lines) == 1 and "the uploads of a job that failed" in lines[0], lines
    finally:
        srv.stop()


def test_retention_zero_keeps_failed_uploads(tmp_path):
    db = f"sqlite:///{tmp_path / 'store.db'}"
    eng = open_store(db)
    jobs = tmp_path / "jobs"
    job_id = Q.new_job_id()
    (jobs / job_id / "input").mkdir(parents=True)
    Q.insert_job(eng, job_id=job_id, team_id=ensure_team(eng, "ops"), kind="analyze", name="f", params={},
                 input_dir=str(jobs / job_id / "input"))
    assert Q.fail(eng, Q.claim(eng, "w", 30), "bad input")
    time.sleep(0.05)
    assert sweep(eng, jobs, Retention(stale_upload_s=60, failed_s=0)) == []
    assert sweep(eng, jobs, Retention(stale_upload_s=60, failed_s=1e6)) == []
    assert [j for j, _ in sweep(eng, jobs, Retention(stale_upload_s=60, failed_s=0.01))] == [job_id]
    assert not Path(jobs / job_id).exists()
