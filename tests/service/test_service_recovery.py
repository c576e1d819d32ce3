"""A worker SIGKILLed in the middle of a job: its lease expires and another worker finishes the job, once.

The first worker is slowed by the worker's test hook (ZOOMER_SERVICE_TEST_DELAY_S: it claims the job,
heartbeats, and waits before analysing), so the kill lands mid-job. Runs on SQLite, and on PostgreSQL
(ZOOMER_TEST_PG_URL; required under CI, skipped with the reason otherwise).
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from zoomer_ar.store.db import open_store, read_session
from zoomer_ar.store.orm import Analysis
from zoomer_ar.store.service_tables import ServiceArtifact

from service_testutil import EXAMPLE_DL, server_on, trace_file, unique_trace, upload, wait_job

LEASE = 2.0


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request, tmp_path):
    with server_on(request.param, tmp_path / "srv", embedded_workers=0, args=("--lease", str(LEASE))) as s:
        yield s


def test_killed_worker_job_is_recovered_by_another(server):
    tok = server.token("vision")
    slow = server.worker(lease=LEASE, delay=120, name="slow")
    with server.client(tok) as c:
        r = upload(c, trace=unique_trace(trace_file(EXAMPLE_DL)), names={"trace": "recover.json.gz"}, job="recover")
        assert r.status_code == 202, r.text
        jid = r.json()["id"]
        running = wait_job(c, jid, states=("running",), timeout=120, server=server)
        assert running["attempts"] == 1 and f":{slow.pid}:" in running["worker"], running
        rescuer = server.worker(lease=LEASE, name="rescuer")
        time.sleep(3 * LEASE)  # heartbeats extend the lease: the job stays with the live worker
        still = c.get(f"/v1/jobs/{jid}").json()
        assert still["state"] == "running" and still["attempts"] == 1 and f":{slow.pid}:" in still["worker"], still
        slow.kill()  # SIGKILL mid-job: no cleanup, no result
        done = wait_job(c, jid, timeout=180, server=server)
        assert done["state"] == "done", (done, server.logs())
        assert done["attempts"] == 2, done
        assert f":{rescuer.pid}:" in done["worker"] and done["result"]["worker"] == done["worker"]
        assert c.get(f"/v1/jobs/{jid}/report.html").status_code == 200
        # finished once: one recorded analysis, one set of artifacts; a finished job is never claimed again
        time.sleep(LEASE * 1.5)
        again = c.get(f"/v1/jobs/{jid}").json()
        assert again["state"] == "done" and again["attempts"] == 2 and again["finished_at"] == done["finished_at"]
    engine = open_store(server.db)
    with read_session(engine) as s:
        assert s.execute(select(func.count()).select_from(Analysis)).scalar_one() == 1
        names = s.execute(select(ServiceArtifact.name).where(ServiceArtifact.job_id == jid)).scalars().all()
    assert sorted(names) == sorted(set(names)) and "findings.json" in names
    assert "claimed by" in rescuer.logs() and "attempt 2" in rescuer.logs()
