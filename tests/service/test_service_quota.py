"""Per-team quotas on a real server: a team at its limit of queued and running jobs (ZOOMER_SERVICE_MAX_TEAM_JOBS)
or of their bytes on disk (ZOOMER_SERVICE_MAX_TEAM_MB) is answered 429 with the limit named, other teams are not
affected, and the team uploads again once its jobs are done; concurrent uploads never pass the limit."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from service_testutil import EXAMPLE_DL, Server, trace_file, unique_trace, upload, wait_job

SMALL_TRACE = trace_file(EXAMPLE_DL)  # 285 KB


def _jobs_on_disk(server) -> set[str]:
    d = server.data / "jobs"
    return {p.name for p in d.iterdir()} if d.exists() else set()


def _queued(server, team_id_name: str) -> int:
    from sqlalchemy import func, select

    from zoomer_ar.store.db import open_store, read_session
    from zoomer_ar.store.service_tables import ServiceJob, ServiceTeam

    with read_session(open_store(server.db)) as s:
        return s.execute(select(func.count()).select_from(ServiceJob).join(ServiceTeam)
                         .where(ServiceTeam.name == team_id_name, ServiceJob.state.in_(("queued", "running")))
                         ).scalar_one()


@pytest.fixture(scope="module")
def jobs_server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("quota-jobs"), embedded_workers=0,
               env={"ZOOMER_SERVICE_MAX_TEAM_JOBS": "2", "ZOOMER_SERVICE_MAX_TEAM_MB": "0"})
    yield s
    s.stop()


def test_a_team_at_its_job_limit_gets_429_naming_the_limit_and_others_do_not(jobs_server):
    server = jobs_server
    greedy, other = server.token("greedy"), server.token("other")
    with server.client(greedy) as c:
        ids = []
        for _ in range(2):
            r = upload(c, trace=unique_trace(SMALL_TRACE), names={"trace": "t.json.gz"})
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
        on_disk = _jobs_on_disk(server)
        r = upload(c, trace=unique_trace(SMALL_TRACE), names={"trace": "t.json.gz"})
        assert r.status_code == 429, r.text
        detail = r.json()["detail"]
        assert "team greedy has 2 jobs queued or running" in detail and "--max-team-jobs" in detail, detail
        assert "limit per team is 2" in detail, detail
        assert r.headers.get("retry-after") == "30"
        assert _jobs_on_disk(server) == on_disk  # the refused upload left nothing
    with server.client(other) as c:
        r = upload(c, trace=unique_trace(SMALL_TRACE), names={"trace": "t.json.gz"})
        assert r.status_code == 202, r.text
        other_id = r.json()["id"]
    # once its jobs are done, the team uploads again
    w = server.worker()
    try:
        with server.client(greedy) as c:
            for jid in ids:
                assert wait_job(c, jid, server=server)["state"] == "done"
            r = upload(c, trace=unique_trace(SMALL_TRACE), names={"trace": "t.json.gz"})
            assert r.status_code == 202, r.text
            wait_job(c, r.json()["id"], server=server)
        with server.client(other) as c:
            wait_job(c, other_id, server=server)
    finally:
        w.stop()


def test_concurrent_uploads_of_one_team_never_pass_the_limit(jobs_server):
    server = jobs_server
    tok = server.token("burst")
    payloads = [unique_trace(SMALL_TRACE) for _ in range(8)]

    def one(data: bytes) -> int:
        with server.client(tok) as c:
            return upload(c, trace=data, names={"trace": "t.json.gz"}).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(one, payloads))
    assert sorted(set(codes)) == [202, 429], codes
    assert codes.count(202) <= 2, codes
    assert _queued(server, "burst") == codes.count(202)


@pytest.fixture(scope="module")
def bytes_server(tmp_path_factory):
    size = len(unique_trace(SMALL_TRACE))
    mb = (2.5 * size) / (1 << 20)  # room for two of these traces, not three
    s = Server(tmp_path_factory.mktemp("quota-bytes"), embedded_workers=0,
               env={"ZOOMER_SERVICE_MAX_TEAM_JOBS": "0", "ZOOMER_SERVICE_MAX_TEAM_MB": f"{mb:.4f}"})
    yield s
    s.stop()


def test_a_team_at_its_disk_limit_gets_429_and_a_job_over_the_limit_alone_413(bytes_server):
    server = bytes_server
    tok = server.token("disk")
    with server.client(tok) as c:
        for _ in range(2):
            r = upload(c, trace=unique_trace(SMALL_TRACE), names={"trace": "t.json.gz"})
            assert r.status_code == 202, r.text
        on_disk = _jobs_on_disk(server)
        r = upload(c, trace=unique_trace(SMALL_TRACE), names={"trace": "t.json.gz"})
        assert r.status_code == 429, r.text
        detail = r.json()["detail"]
        assert "team disk's queued and running jobs take" in detail and "--max-team-mb" in detail, detail
        assert _jobs_on_disk(server) == on_disk
    with server.client(server.token("big")) as c:
        huge = unique_trace(SMALL_TRACE) + unique_trace(SMALL_TRACE) + unique_trace(SMALL_TRACE)
        r = upload(c, trace=huge, names={"trace": "t.json.gz"})
        assert r.status_code == 413, r.text
        assert "by themselves" in r.json()["detail"] and "--max-team-mb" in r.json()["detail"]


@pytest.mark.parametrize(("args", "env", "says"), [
    (("--max-team-jobs", "-1"), {}, "--max-team-jobs"),
    ((), {"ZOOMER_SERVICE_MAX_TEAM_JOBS": "-3"}, "ZOOMER_SERVICE_MAX_TEAM_JOBS"),
    ((), {"ZOOMER_SERVICE_MAX_TEAM_MB": "lots"}, "ZOOMER_SERVICE_MAX_TEAM_MB"),
])
def test_bad_team_limits_are_one_line_and_exit_2(tmp_path, args, env, says):
    from service_testutil import zoomer

    r = zoomer("serve", "--port", "0", "--db", f"sqlite:///{tmp_path / 's.db'}", "--data", str(tmp_path / "d"),
               *args, env=env, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
