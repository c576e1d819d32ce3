"""Regression tests for the service audit: cross-team verdicts, team/job name separators, runs of failed jobs,
Markdown escaping, nested rank archives, non-JSON verdict bodies, NaN metadata, `token revoke` exit codes.

HTTP tests run against a real `zoomer-ar serve` (subprocess, SQLite store); the worker tests run a real
Worker in-process on SQLite and, with ZOOMER_TEST_PG_URL, on PostgreSQL.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from zoomer_ar.store.db import open_store, read_session, write_session
from zoomer_ar.store.orm import Analysis, Finding, Job, Trace, Verdict
from zoomer_ar.store.service_tables import ServiceJob

from service_testutil import (  # db_url: a fixture, the store on SQLite and PostgreSQL
    db_url,  # noqa: F401
    EXAMPLE_DL,
    Server,
    tar_gz,
    trace_file,
    unique_trace,
    upload,
    wait_job,
    zoomer,
)

SMALL_TRACE = trace_file(EXAMPLE_DL)
XSS_JOB = "<img src=x onerror=alert(1)>"
XSS_OWNER = "<script>alert('owner')</script>"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("audit"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tokens(server):
    return {"alpha": server.token("alpha", "ann"), "beta": server.token("beta", "ben")}


def _count(db: str, table) -> int:  # noqa: ANN001
    with read_session(open_store(db)) as s:
        return s.execute(select(func.count()).select_from(table)).scalar_one()


# --- 1. verdicts only on runs the caller's team recorded -------------------------------------------------


def test_verdict_on_another_teams_trace_is_409(server, tokens):
    data = unique_trace(SMALL_TRACE)
    with server.client(tokens["alpha"]) as a, server.client(tokens["beta"]) as b:
        mine = wait_job(a, upload(a, trace=data, names={"trace": "shared.json.gz"}, job="owned").json()["id"],
                        server=server)
        assert mine["state"] == "done" and mine["result"]["recorded"] is True, mine
        # team beta uploads the same bytes: once with record=false, once recorded (refused: alpha's run stands)
        unrec = wait_job(b, upload(b, trace=data, names={"trace": "shared.json.gz"}, record="false").json()["id"],
                         server=server)
        again = wait_job(b, upload(b, trace=data, names={"trace": "shared.json.gz"}, job="mine-too").json()["id"],
                         server=server)
        assert unrec["state"] == again["state"] == "done"
        assert again["result"]["recorded"] is False and "another team" in " ".join(again["result"]["notes"])
        for job in (unrec, again):
            r = b.post("/v1/verdicts", json={"job_id": job["id"], "pattern": "dataloader-bound", "label": "negative"})
            assert r.status_code == 409, r.text
            assert "no recorded analysis of your team" in r.json()["detail"]
        # the owner can still label its run
        ok = a.post("/v1/verdicts", json={"job_id": mine["id"], "pattern": "dataloader-bound", "label": "positive"})
        assert ok.status_code == 201, ok.text
    with read_session(open_store(server.db)) as s:
        authors = set(s.execute(select(Verdict.author)).scalars())
    assert not any(a.startswith("beta/") for a in authors), authors


def test_verdict_needs_the_run_to_belong_to_the_callers_team(server, tokens):
    """Even a job pointing at a run (analysis_id) is refused when that run's store job is another team's."""
    with server.client(tokens["alpha"]) as a, server.client(tokens["beta"]) as b:
        theirs = wait_job(a, upload(a, trace=unique_trace(SMALL_TRACE), names={"trace": "t.json.gz"},
                                    job="theirs").json()["id"], server=server)
        mine = wait_job(b, upload(b, trace=unique_trace(SMALL_TRACE), names={"trace": "t.json.gz"},
                                  record="false").json()["id"], server=server)
        engine = open_store(server.db)
        with write_session(engine) as s:
            s.execute(update(ServiceJob).where(ServiceJob.id == mine["id"])
                      .values(analysis_id=theirs["result"]["analysis_id"]))
        r = b.post("/v1/verdicts", json={"job_id": mine["id"], "pattern": "dataloader-bound", "label": "negative"})
        assert r.status_code == 409 and "your team" in r.json()["detail"], r.text


# --- 2. team and job names cannot collide through '/' ---------------------------------------------------


@pytest.mark.parametrize("team", ["ml/resnet", "a\\b", "two words", "tab\tteam", "../x", "-lead", "x" * 65])
def test_team_names_with_separators_are_refused(server, team):
    from zoomer_ar.service.auth import create_token, ensure_team

    engine = open_store(server.db)
    with pytest.raises(ValueError, match="not allowed"):
        ensure_team(engine, team)
    with pytest.raises(ValueError):
        create_token(engine, team)
    out = zoomer("token", "create", "--team", team, "--db", server.db)
    assert out.returncode == 2 and "not allowed" in out.stderr and not out.stdout.strip(), out


@pytest.mark.parametrize("job", ["resnet/x", "a\\b", "line\nbreak", "nul\x00", " padded"])
def test_job_names_with_separators_are_422(server, tokens, job):
    with server.client(tokens["alpha"]) as c:
        r = upload(c, trace=SMALL_TRACE, job=job)
    assert r.status_code == 422 and r.json()["detail"].startswith("job:"), r.text


def test_a_job_cannot_be_taken_over_by_another_team(server, tokens, tmp_path):
    """A store job `alpha/x` that belongs to another team (recorded from the CLI) is not handed to team alpha."""
    from zoomer_ar.analyze import analyze_path
    from zoomer_ar.store.record import RecordOptions, record_analysis

    trace = tmp_path / "cli-run.json.gz"
    trace.write_bytes(unique_trace(SMALL_TRACE))
    record_analysis(analyze_path(trace), RecordOptions(job="alpha/takeover", team="gamma", owner="gus",
                                                          gpu_hour_cost=1.0, week="2026-W10"), db=server.db)
    with server.client(tokens["alpha"]) as c:
        body = wait_job(c, upload(c, trace=unique_trace(SMALL_TRACE), names={"trace": "t.json.gz"}, job="takeover",
                                  owner="mallory", gpu_hour_cost="9").json()["id"], server=server)
    assert body["state"] == "done" and body["result"]["recorded"] is False, body
    assert "belongs to another team" in " ".join(body["result"]["notes"])
    with read_session(open_store(server.db)) as s:
        job = s.execute(select(Job).where(Job.name == "alpha/takeover")).scalar_one()
        runs = s.execute(select(func.count()).select_from(Analysis).where(Analysis.job_id == job.id)).scalar_one()
    assert (job.team, job.owner, job.gpu_hour_cost, runs) == ("gamma", "gus", 1.0, 1)


def test_report_name_with_slash_becomes_one_store_job(server, tokens):
    with server.client(tokens["alpha"]) as c:
        body = wait_job(c, upload(c, trace=unique_trace(SMALL_TRACE), names={"trace": "t.json.gz"},
                                  name="resnet/exp 1").json()["id"], server=server)
    assert body["state"] == "done" and body["result"]["store_job"] == "alpha/resnet_exp 1", body


# --- 4. Markdown digest and report escape user text ---------------------------------------------------


def test_markdown_digest_and_report_escape_names(server, tokens):
    with server.client(tokens["alpha"]) as c:
        body = wait_job(c, upload(c, trace=unique_trace(SMALL_TRACE), names={"trace": "t.json.gz"}, job=XSS_JOB,
                                  name=XSS_JOB, owner=XSS_OWNER, week="2026-W20").json()["id"], server=server)
        assert body["state"] == "done" and body["result"]["recorded"] is True, body
        md = c.get("/v1/digest", params={"format": "md", "week": "2026-W20"})
        assert md.status_code == 200
        report = c.get(f"/v1/jobs/{body['id']}/report.md").text
    for text in (md.text, report):
        low = text.lower()
        assert "<img" not in low and "<script" not in low, text
    assert "&lt;img src=x onerror=alert(1)&gt;" in md.text and "&lt;script&gt;" in md.text
    assert report.splitlines()[0] == "# Zoomer AR report: &lt;img src=x onerror=alert(1)&gt;"
    cli = zoomer("digest", "--db", server.db, "--week", "2026-W20", "--format", "md")
    assert cli.returncode == 0 and "<img" not in cli.stdout and "<script" not in cli.stdout.lower(), cli
    hist = zoomer("history", f"alpha/{XSS_JOB}", "--db", server.db, "--format", "md")
    assert hist.returncode == 0 and "<img" not in hist.stdout and "&lt;img" in hist.stdout, hist


# --- 5. rank archives must hold rank traces ------------------------------------------------------------


def _nested() -> bytes:
    return tar_gz({"inner.tar.gz": tar_gz({"rank-0.json": SMALL_TRACE.read_bytes()})})


@pytest.mark.parametrize("data,filename", [
    (_nested(), "nested.tar.gz"),
    (tar_gz({"run/inner.gz": gzip.compress(b"PK\x03\x04 not json")}), "zipgz.tar.gz"),
    (tar_gz({"job.json": b"{}"}), "jobonly.tar.gz"),
    (tar_gz({"a/rank-0.json.gz": SMALL_TRACE.read_bytes(), "b/notes.txt": b"x"}), "nested-dirs.tar.gz"),
])
def test_rank_archive_without_rank_traces_is_400(server, tokens, data, filename):
    with server.client(tokens["alpha"]) as c:
        r = upload(c, ranks=data, names={"ranks": filename})
    assert r.status_code == 400, r.text
    assert r.json()["detail"].startswith("rank archive: no trace files"), r.text


def test_rank_archive_with_gzip_json_named_gz_is_accepted(server, tokens):
    raw = gzip.decompress(unique_trace(SMALL_TRACE))
    with server.client(tokens["alpha"]) as c:
        r = upload(c, ranks=tar_gz({"run/rank-0.gz": gzip.compress(raw), "run/job.json": b"{}"}),
                   names={"ranks": "run.tar.gz"}, record="false")
        assert r.status_code == 202, r.text
        assert wait_job(c, r.json()["id"], server=server)["state"] == "done"


# --- 8. a verdict body that is not JSON is 400 -------------------------------------------------------


@pytest.mark.parametrize("content,ctype", [
    (b"not json", "application/json"),
    (b"{\"job_id\": ", "application/json"),
    (b"", "application/json"),
    (b"job_id=1", "application/x-www-form-urlencoded"),
    (b"hello", "text/plain"),
])
def test_verdict_body_not_json_is_400(server, tokens, content, ctype):
    with server.client(tokens["alpha"]) as c:
        r = c.post("/v1/verdicts", content=content, headers={"Content-Type": ctype})
    assert r.status_code == 400, r.text
    assert "not JSON" in r.json()["detail"]


def test_verdict_json_of_the_wrong_shape_is_still_422(server, tokens):
    with server.client(tokens["alpha"]) as c:
        assert c.post("/v1/verdicts", json=[1, 2]).status_code == 422
        assert c.post("/v1/verdicts", json={"job_id": "x"}).status_code == 422
    from zoomer_ar.service.app import openapi_json

    doc = json.loads(openapi_json())["paths"]["/v1/verdicts"]["post"]["responses"]
    assert doc["400"]["description"] == "The body is not JSON"


# --- 9. NaN metadata and token revoke -----------------------------------------------------------------


@pytest.mark.parametrize("field,value", [("gpu_hours", "nan"), ("gpu_hours", "inf"), ("gpu_hour_cost", "NaN"),
                                         ("gpu_hour_cost", "-inf")])
def test_non_finite_numbers_say_so(server, tokens, field, value):
    with server.client(tokens["alpha"]) as c:
        r = upload(c, trace=SMALL_TRACE, **{field: value})
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(f"{field}:") and "must be a finite number" in r.json()["detail"], r.text


def test_token_revoke_unknown_id_exits_2(server):
    out = zoomer("token", "revoke", "999999", "--db", server.db)
    assert out.returncode == 2 and "no token #999999" in out.stderr, out
    from zoomer_ar.service.auth import create_token

    _tok, tid = create_token(open_store(server.db), "alpha", "short-lived")
    assert zoomer("token", "revoke", str(tid), "--db", server.db).returncode == 0
    again = zoomer("token", "revoke", str(tid), "--db", server.db)
    assert again.returncode == 2 and "already revoked" in again.stderr, again


def test_token_revoke_of_an_id_no_store_integer_holds_exits_2(tmp_path):
    """`token revoke 99999999999999999999999` was an internal error (OverflowError from SQLite, exit 1); it is
    an unknown token like any other: one line, exit 2."""
    out = zoomer("token", "revoke", "99999999999999999999999", "--db", f"sqlite:///{tmp_path / 'store.db'}")
    assert out.returncode == 2 and "no token #99999999999999999999999" in out.stderr, out
    assert "internal error" not in out.stderr


def test_token_name_with_a_control_character_is_refused(tmp_path):
    """`token create --name "a<TAB>b<NEWLINE>c"` was stored as given, and `token list` (one tab-separated line
    per token) printed it as extra columns and a broken line; now such a name is a usage error, exit 2, and
    nothing is stored."""
    db = f"sqlite:///{tmp_path / 'store.db'}"
    for name in ("a\tb", "a\nb", "a\x1bb"):
        out = zoomer("token", "create", "--team", "ml", "--name", name, "--db", db)
        assert out.returncode == 2 and "--name" in out.stderr and "control character" in out.stderr, out
    listed = zoomer("token", "list", "--db", db)
    assert listed.returncode == 0 and listed.stdout == "", listed


# --- 3. a job that fails after recording leaves nothing in the store -------------------------------------




class _Crash(BaseException):
    """A worker dying mid-job (nothing after it runs)."""


def _queue(engine, root: Path, team: str, n: int = 1, *, data: bytes | None = None, max_attempts: int = 3,  # noqa: ANN001
           week: str = "2026-W41") -> list[str]:
    from zoomer_ar.service import queue as Q
    from zoomer_ar.service.auth import ensure_team

    tid = ensure_team(engine, team)
    data = data or unique_trace(SMALL_TRACE)
    ids = []
    for _ in range(n):
        jid = Q.new_job_id()
        inp = root / "jobs" / jid / "input"
        (inp / "trace").mkdir(parents=True)
        (inp / "trace" / "t.json.gz").write_bytes(data)
        Q.insert_job(engine, job_id=jid, team_id=tid, kind="analyze", name="t", input_dir=str(inp),
                     max_attempts=max_attempts,
                     params={"input": "trace", "path": "trace/t.json.gz", "gpu_hours": 100, "gpu_hour_cost": 2,
                             "week": week, "record": True, "job": "fails"})
        ids.append(jid)
        time.sleep(0.01)  # distinct queued_at: claimed in this order
    return ids


def _store_rows(engine) -> dict[str, int]:  # noqa: ANN001
    with read_session(engine) as s:
        return {t.__tablename__: s.execute(select(func.count()).select_from(t)).scalar_one()
                for t in (Job, Trace, Analysis, Finding)}


def test_job_failing_after_recording_leaves_no_run(db_url, tmp_path, monkeypatch):
    import zoomer_ar.analyze_cli as ac
    from zoomer_ar.service import queue as Q
    from zoomer_ar.service.config import Settings
    from zoomer_ar.service.worker import Worker
    from zoomer_ar.store.digest import build_digest

    engine = open_store(db_url)
    (jid,) = _queue(engine, tmp_path, "ml")

    def boom(*_a, **_k):
        raise RuntimeError("simulated render failure")

    monkeypatch.setattr(ac, "write_fix_outputs", boom)
    Worker(Settings(db=db_url, data_dir=tmp_path), engine=engine).run(exit_when_idle=True)
    job = Q.get_job(engine, jid, None)
    assert job.state == "failed" and "simulated render failure" in job.error and job.analysis_id is None
    assert _store_rows(engine) == {"jobs": 0, "traces": 0, "analyses": 0, "findings": 0}
    d = build_digest(engine, week="2026-W41")
    assert d.runs == 0 and d.gpu_hours == 0 and not d.jobs


def test_abandoned_job_run_is_undone_unless_a_finished_job_links_it(db_url, tmp_path, monkeypatch):
    """Worker killed after recording (here its job's analysis process, which dies without a word: the worker
    leaves the job to its lease, as if it had died itself): the job is abandoned at its next claim and its run
    deleted; a run that a finished job of the same team links to stays."""
    import zoomer_ar.analyze_cli as ac
    from zoomer_ar.service import queue as Q
    from zoomer_ar.service.config import Settings
    from zoomer_ar.service.worker import Worker

    engine = open_store(db_url)
    settings = Settings(db=db_url, data_dir=tmp_path, lease_s=1.0)
    real = ac.write_fix_outputs

    def crash(*_a, **_k):
        raise _Crash()

    # a) killed after recording, max_attempts=1: the next claim abandons the job and undoes its run
    (lone,) = _queue(engine, tmp_path, "ml", max_attempts=1)
    monkeypatch.setattr(ac, "write_fix_outputs", crash)
    w = Worker(settings, engine=engine)
    assert w.run_once() == "died"
    assert Q.get_job(engine, lone, None).analysis_id is not None and _store_rows(engine)["analyses"] == 1
    time.sleep(1.5)  # the lease expires
    assert Q.claim(engine, "w2", 1.0) is None
    job = Q.get_job(engine, lone, None)
    assert job.state == "failed" and job.error.startswith("abandoned") and job.analysis_id is None
    assert _store_rows(engine)["analyses"] == 0

    # b) job 1 records then dies; job 2 (same team, same bytes) finishes linking that run; job 1 then fails
    data = unique_trace(SMALL_TRACE)
    first, second = _queue(engine, tmp_path, "ml", 2, data=data)
    assert w.run_once() == "died"
    monkeypatch.setattr(ac, "write_fix_outputs", real)
    assert w.run_once() == "done"
    done = Q.get_job(engine, second, None)
    assert done.analysis_id == Q.get_job(engine, first, None).analysis_id is not None
    time.sleep(1.5)
    c = Q.claim(engine, "w3", 30.0)
    assert c is not None and c.job_id == first
    assert Q.fail(engine, c, "failed later")
    assert Q.get_job(engine, first, None).analysis_id is None
    assert _store_rows(engine)["analyses"] == 1, "the finished job's run stays"
    assert Q.recorded_trace_of_team(engine, done.analysis_id, "ml") is not None


def test_recording_is_rolled_back_when_the_lease_is_lost(db_url, tmp_path):
    from zoomer_ar.service import queue as Q
    from zoomer_ar.service.config import Settings
    from zoomer_ar.service.worker import Worker

    engine = open_store(db_url)
    (jid,) = _queue(engine, tmp_path, "ml")
    w = Worker(Settings(db=db_url, data_dir=tmp_path), engine=engine)
    c = Q.claim(engine, w.id, 30.0)
    with write_session(engine) as s:  # another worker took the job over
        s.execute(update(ServiceJob).where(ServiceJob.id == jid).values(lease_token="f" * 32))
    assert w.process(c) == "lost"
    assert _store_rows(engine)["analyses"] == 0
    assert Q.get_job(engine, jid, None).analysis_id is None


# --- 6. --db that is not SQLite (token commands) -----------------------------------------------------


def test_token_commands_on_a_file_that_is_not_a_store(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"garbage\n" * 100)
    for args in (("token", "list"), ("token", "create", "--team", "x"), ("token", "revoke", "1")):
        out = zoomer(*args, "--db", str(junk), timeout=60)
        assert out.returncode == 2, out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and str(junk) in lines[0] and "not a SQLite database" in lines[0], out
    assert junk.read_bytes() == b"garbage\n" * 100


def _analyses(engine) -> set[int]:  # noqa: ANN001
    with read_session(engine) as s:
        return set(s.execute(select(Analysis.id)).scalars())


def test_run_reused_by_a_running_job_survives_its_recorders_failure(db_url, tmp_path, monkeypatch):
    """Job 1 records the trace and dies; job 2 (same bytes) finds the run recorded and renders its reports; job 1
    then fails. The run stays (job 2 relies on it and inherits it); had job 2 failed too, it would go."""
    import zoomer_ar.analyze_cli as ac
    from zoomer_ar.service import queue as Q
    from zoomer_ar.service.config import Settings
    from zoomer_ar.service.worker import run_analyze
    from zoomer_ar.store.digest import build_digest

    engine = open_store(db_url)
    settings = Settings(db=db_url, data_dir=tmp_path)
    real = ac.write_fix_outputs
    for second_fails in (False, True):
        first, second = _queue(engine, tmp_path, "ml", 2, data=unique_trace(SMALL_TRACE))
        c1 = Q.claim(engine, "w1", 60.0)
        monkeypatch.setattr(ac, "write_fix_outputs", lambda *_a, **_k: (_ for _ in ()).throw(_Crash()))
        with pytest.raises(_Crash):
            run_analyze(c1, settings, engine)
        run = Q.get_job(engine, first, None).analysis_id
        assert run is not None and run in _analyses(engine)
        monkeypatch.setattr(ac, "write_fix_outputs", real)
        c2 = Q.claim(engine, "w2", 60.0)
        assert c2.job_id == second
        summary, artifacts, chash, aid = run_analyze(c2, settings, engine)
        assert aid == run and summary["recorded"]
        assert Q.fail(engine, c1, "render failed")  # the recorder fails while job 2 still runs
        assert run in _analyses(engine)  # the old code deleted it here: job 2 then pointed at nothing
        assert Q.get_job(engine, first, None).analysis_id is None
        assert Q.get_job(engine, second, None).analysis_id == run  # job 2 inherited the run
        if second_fails:
            assert Q.fail(engine, c2, "failed too")
            assert run not in _analyses(engine)
        else:
            assert Q.complete(engine, c2, result=summary, artifacts=artifacts, content_hash=chash, analysis_id=aid)
            assert run in _analyses(engine) and Q.get_job(engine, second, None).analysis_id == run
            assert build_digest(engine, week="2026-W41").runs == 1


def test_run_gone_before_the_reusing_job_links_it_is_recorded_again(db_url, tmp_path, monkeypatch):
    """Job 1's run vanishes (job 1 fails) between job 2 finding it recorded and holding on to it: job 2 records
    the trace itself and its reports point at a run that exists."""
    import zoomer_ar.analyze_cli as ac
    from zoomer_ar.service import queue as Q
    from zoomer_ar.service.config import Settings
    from zoomer_ar.service.worker import run_analyze

    engine = open_store(db_url)
    settings = Settings(db=db_url, data_dir=tmp_path)
    first, second = _queue(engine, tmp_path, "ml", 2, data=unique_trace(SMALL_TRACE))
    c1 = Q.claim(engine, "w1", 60.0)
    real_out = ac.write_fix_outputs
    monkeypatch.setattr(ac, "write_fix_outputs", lambda *_a, **_k: (_ for _ in ()).throw(_Crash()))
    with pytest.raises(_Crash):
        run_analyze(c1, settings, engine)
    old = Q.get_job(engine, first, None).analysis_id
    monkeypatch.setattr(ac, "write_fix_outputs", real_out)
    real_link = Q.link_recorded
    calls = []

    def fail_first_then_link(*a, **k):
        calls.append(a[2])
        if len(calls) == 1:
            assert Q.fail(engine, c1, "render failed")  # no job relies on the run yet: it goes
            assert old not in _analyses(engine)
        return real_link(*a, **k)

    monkeypatch.setattr(Q, "link_recorded", fail_first_then_link)
    c2 = Q.claim(engine, "w2", 60.0)
    summary, artifacts, chash, aid = run_analyze(c2, settings, engine)
    assert calls == [old] and aid is not None and aid in _analyses(engine)  # (SQLite may reuse the id)
    assert Q.get_job(engine, second, None).analysis_id == aid  # job 2 recorded it: its own failure would undo it
    assert Q.complete(engine, c2, result=summary, artifacts=artifacts, content_hash=chash, analysis_id=aid)
