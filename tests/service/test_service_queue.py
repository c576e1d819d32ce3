"""The job queue in the store: claims never overlap, leases expire and are reclaimed, finished jobs never re-run,
results are written only by the lease holder. Every test runs on SQLite and on PostgreSQL (ZOOMER_TEST_PG_URL;
required under CI, skipped with the reason otherwise)."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest
from sqlalchemy import func, select, update

from zoomer_ar.service import queue as Q
from zoomer_ar.service.auth import authenticate, create_token, ensure_team, hash_token, list_tokens, revoke_token
from zoomer_ar.store.db import open_store, read_session, write_session
from zoomer_ar.store.service_tables import ServiceArtifact, ServiceJob, ServiceToken

from service_testutil import db_url  # noqa: F401 - a fixture: the store, SQLite and PostgreSQL


def _jobs(engine, n: int, team: str = "t", max_attempts: int = 3) -> list[str]:
    tid = ensure_team(engine, team)
    ids = []
    for i in range(n):
        jid = Q.new_job_id()
        Q.insert_job(engine, job_id=jid, team_id=tid, kind="analyze", name=f"j{i}", params={"i": i}, input_dir=None,
                     max_attempts=max_attempts)
        ids.append(jid)
    return ids


def _expire(engine, job_id: str) -> None:
    with write_session(engine) as s:
        s.execute(update(ServiceJob).where(ServiceJob.id == job_id).values(lease_expires_at=0.0))


def test_claims_are_fifo_and_exclusive(db_url):
    from sqlalchemy import event

    engine = open_store(db_url)
    ids = _jobs(engine, 3)
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    a = Q.claim(engine, "wa", 30)
    b = Q.claim(engine, "wb", 30)
    c = Q.claim(engine, "wc", 30)
    assert [a.job_id, b.job_id, c.job_id] == ids
    assert Q.claim(engine, "wd", 30) is None
    assert a.team == "t" and a.attempt == 1 and a.params == {"i": 0}
    assert Q.get_job(engine, a.job_id, None).state == "running"
    claims = [q for q in seen if "FROM service_jobs" in q and "ORDER BY" in q]
    if engine.dialect.name == "postgresql":
        assert claims and all("FOR UPDATE SKIP LOCKED" in q for q in claims), claims
    else:
        assert claims and any(q == "BEGIN IMMEDIATE" for q in seen)  # SQLite: the write lock up front


def test_expired_lease_is_reclaimed_and_the_stale_worker_cannot_finish(db_url):
    engine = open_store(db_url)
    (jid,) = _jobs(engine, 1)
    first = Q.claim(engine, "w1", 30)
    assert Q.heartbeat(engine, first, 30)
    assert Q.claim(engine, "w2", 30) is None  # leased
    _expire(engine, jid)  # w1 died (no heartbeat)
    second = Q.claim(engine, "w2", 30)
    assert second.job_id == jid and second.attempt == 2 and second.lease_token != first.lease_token
    # the first worker comes back: its heartbeat, result and failure are all refused
    assert not Q.heartbeat(engine, first, 30)
    assert not Q.complete(engine, first, result={"by": "w1"}, artifacts={"a.txt": ("text/plain", b"w1")})
    assert not Q.fail(engine, first, "late")
    assert Q.complete(engine, second, result={"by": "w2"}, artifacts={"a.txt": ("text/plain", b"w2")})
    job = Q.get_job(engine, jid, None)
    assert job.state == "done" and job.result == {"by": "w2"} and job.attempts == 2 and job.lease_owner == "w2"
    assert Q.get_artifact(engine, jid, "a.txt") == ("text/plain", b"w2")


def test_finished_jobs_are_never_claimed_again(db_url):
    engine = open_store(db_url)
    done_id, failed_id = _jobs(engine, 2)
    c1 = Q.claim(engine, "w", 30)
    c2 = Q.claim(engine, "w", 30)
    assert Q.complete(engine, c1, result={}, artifacts={})
    assert Q.fail(engine, c2, "bad trace")
    with write_session(engine) as s:  # even with an old lease time on them
        s.execute(update(ServiceJob).values(lease_expires_at=0.0))
    assert Q.claim(engine, "w", 30) is None
    assert not Q.complete(engine, c1, result={}, artifacts={})  # twice: refused
    assert {Q.get_job(engine, done_id, None).state, Q.get_job(engine, failed_id, None).state} == {"done", "failed"}


def test_results_are_atomic_with_the_state_change(db_url):
    engine = open_store(db_url)
    (jid,) = _jobs(engine, 1)
    c = Q.claim(engine, "w", 30)
    bad = {"ok": ("text/plain", b"1"), "x": ("text/plain",)}  # fails after the state update: all of it rolls back
    with pytest.raises(ValueError):
        Q.complete(engine, c, result={}, artifacts=bad)
    assert Q.get_job(engine, jid, None).state == "running"
    with read_session(engine) as s:
        assert s.execute(select(func.count()).select_from(ServiceArtifact)).scalar_one() == 0
    assert Q.complete(engine, c, result={"ok": 1}, artifacts={"x": ("text/plain", b"1")})
    assert Q.artifact_names(engine, jid) == ["x"]


def test_a_job_that_kills_its_workers_fails_after_max_attempts(db_url):
    engine = open_store(db_url)
    (jid,) = _jobs(engine, 1, max_attempts=2)
    for _ in range(2):
        assert Q.claim(engine, "w", 30).job_id == jid
        _expire(engine, jid)
    assert Q.claim(engine, "w", 30) is None
    job = Q.get_job(engine, jid, None)
    assert job.state == "failed" and "claimed 2 times" in job.error


def test_release_puts_the_job_back(db_url):
    engine = open_store(db_url)
    (jid,) = _jobs(engine, 1)
    c = Q.claim(engine, "w", 30)
    assert Q.release(engine, c)
    again = Q.claim(engine, "w2", 30)
    assert again.job_id == jid and again.attempt == 1


def _claimer(url: str, name: str, out, stop_after: float, barrier) -> None:
    from zoomer_ar.service import queue as Q
    from zoomer_ar.store.db import open_store

    engine = open_store(url)
    barrier.wait(timeout=120)  # all claimers start together
    got = []
    deadline = time.monotonic() + stop_after
    while time.monotonic() < deadline:
        c = Q.claim(engine, name, 60)
        if c is None:
            break
        got.append(c.job_id)
        assert Q.complete(engine, c, result={"by": name}, artifacts={"r": ("text/plain", name.encode())})
    out.put((name, got))


def test_concurrent_claimers_in_processes_take_each_job_once(db_url):
    """Four processes drain the queue: every job is claimed and completed exactly once (SKIP LOCKED on
    PostgreSQL). Exactly-once is asserted on every round; that the claimers really overlapped is a
    property of scheduling on a loaded 2-core machine, so a round where one process happened to drain
    everything is repeated (up to 3 rounds) before that check fails."""
    engine = open_store(db_url)
    ctx = mp.get_context("spawn")
    busy, total = 0, 0
    for _round in range(3):
        ids = _jobs(engine, 60)
        total += len(ids)
        out = ctx.Queue()
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_claimer, args=(db_url, f"p{i}", out, 120, barrier)) for i in range(4)]
        for p in procs:
            p.start()
        results = [out.get(timeout=180) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        claimed = [j for _, got in results for j in got]
        assert sorted(claimed) == sorted(ids), "each job claimed exactly once"
        busy = sum(1 for _, got in results if got)
        if busy >= 2:
            break
    assert busy >= 2, "the claimers ran concurrently"
    with read_session(engine) as s:
        states = dict(s.execute(select(ServiceJob.state, func.count()).group_by(ServiceJob.state)).all())
        assert states == {"done": total}
        assert s.execute(select(func.max(ServiceJob.attempts))).scalar_one() == 1


def test_concurrent_claimers_in_threads(db_url):
    engine = open_store(db_url)
    ids = _jobs(engine, 30)
    got: list[str] = []
    lock = threading.Lock()

    def run(name: str) -> None:
        while (c := Q.claim(engine, name, 60)) is not None:
            with lock:
                got.append(c.job_id)
            Q.complete(engine, c, result={}, artifacts={})

    threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(got) == sorted(ids)


def test_tokens_are_stored_hashed_scoped_and_revocable(db_url):
    engine = open_store(db_url)
    tok, tid = create_token(engine, "vision", "ci")
    other, _ = create_token(engine, "speech")
    assert tok.startswith("zat_") and len(tok) > 40
    with read_session(engine) as s:
        stored = s.execute(select(ServiceToken.token_hash, ServiceToken.prefix).where(ServiceToken.id == tid)).one()
    assert stored[0] == hash_token(tok) and tok not in stored and stored[1] == tok[:12]
    who = authenticate(engine, tok)
    assert who.team == "vision" and who.token_name == "ci" and who.author == "vision/ci"
    assert authenticate(engine, other).team == "speech"
    assert authenticate(engine, tok + "x") is None
    assert authenticate(engine, "") is None and authenticate(engine, None) is None
    assert [t["team"] for t in list_tokens(engine, "vision")] == ["vision"]
    assert revoke_token(engine, tid) and not revoke_token(engine, tid)
    assert authenticate(engine, tok) is None


def test_jobs_queued_within_a_millisecond_are_claimed_in_order(db_url):
    """SQLite's julianday('now') keeps milliseconds: jobs queued back to back tied on queued_at and
    were claimed in job-id (random) order. Queued times now keep microseconds."""
    engine = open_store(db_url)
    ids = _jobs(engine, 12)
    with read_session(engine) as s:
        queued = [s.get(ServiceJob, j).queued_at for j in ids]
    assert queued == sorted(queued) and len(set(queued)) == len(queued)
    assert [Q.claim(engine, f"w{k}", 30).job_id for k in range(12)] == ids
