"""The job queue, in the store (table service_jobs; zoomer_ar/store/service_tables.py).

- **Claim**: one transaction picks the oldest job that is `queued`, or `running` with an expired
  lease, and moves it to `running` under a fresh lease token. PostgreSQL: `SELECT ... FOR UPDATE
  SKIP LOCKED`, so concurrent workers never wait on nor take the same row. SQLite: the transaction
  takes the write lock up front (`BEGIN IMMEDIATE`), so claims are serialised.
- **Lease**: a claimed job expires `lease_s` after the last heartbeat; the worker's heartbeat
  thread extends it every `lease_s / 3`. A worker that dies stops heartbeating and the job is
  claimed again by another worker (the claim count is `attempts`; past `max_attempts` the job
  fails instead: a trace that kills every worker does not loop forever).
- **Complete**: the results (artifacts) are written in the same transaction that moves the job
  to `done`, and only if the worker still holds the lease (`WHERE lease_token = :mine AND state =
  'running'`). A worker that lost its lease (it stalled past expiry and another worker took the
  job) has its results dropped, so a job is finished exactly once; `done` and `failed` jobs are
  never claimed again.
- **Cancel**: `request_cancel` is one conditional UPDATE per state: a queued job moves to `cancelled` in the
  statement that finds it queued (`WHERE state = 'queued'`), so a worker claiming it at the same moment either
  took it first (the job is running: the cancel is then a request on the running job) or never sees it (the
  claim's own `WHERE state = 'queued'` no longer matches); a running job gets `cancel_requested_at`, which
  its worker reads while the job runs: it stops the job's analysis process and moves the job to `cancelled`
  (`finish_cancelled`). From the request on, the job's lease holder can no longer record, complete or fail
  it (`_mine_uncancelled`); a job whose worker died meanwhile is cancelled by the next claim that finds it.
  Done, failed and cancelled jobs are not changed (NotCancellable for the first two).
- **Recorded runs of failed jobs are undone**: an analysis job records its run in the store before
  it renders its reports (the reports show the recorded cost). The recording transaction also
  sets the job's `analysis_id` (`mark_recorded`, under the lease), so while a job is running its
  `analysis_id` is the run it created. When the job then fails (`fail`), or is abandoned after
  too many claims (`claim`), that run is deleted in the same transaction, unless another job relies
  on it: a finished job that links to it, or a running job that found the trace already recorded
  and said so (`link_recorded`, which sets its `content_hash` while it runs; the oldest such job
  inherits the run, so that it goes if that job fails too). A failed job never counts in the digest
  or a job's history, and a job that reuses a run never loses it to another job's failure.

All times are the database server's clock in epoch seconds (`db_now`), so workers on different
hosts agree on expiry.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, delete, func, insert, or_, select, text, update
from sqlalchemy.orm import Session

from ..store.db import read_session, with_retry, write_session
from ..store.service_tables import ServiceArtifact, ServiceJob, ServiceTeam

QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
STATES = (QUEUED, RUNNING, DONE, FAILED, CANCELLED)
CANCELLED_QUEUED = "cancelled before it ran"
CANCELLED_RUNNING = "cancelled while it ran: its analysis was stopped and nothing of its results was kept"


@dataclass(frozen=True)
class Claim:
    job_id: str
    lease_token: str
    worker: str
    attempt: int
    kind: str
    name: str
    team_id: int
    team: str
    params: dict
    input_dir: str | None


class LeaseLost(Exception):
    """The worker no longer holds the job's lease (it expired and another worker claimed the job)."""


def db_now(s: Session) -> float:
    """The database server's clock, epoch seconds, to the microsecond. SQLite runs in this process:
    its clock is this host's, read here (its julianday('now') keeps milliseconds only, so jobs
    queued within one millisecond tied on queued_at and were claimed in job-id order, not FIFO)."""
    if s.get_bind().dialect.name == "postgresql":
        return float(s.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
    return time.time()


def new_job_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class TeamQuota:
    """What one team may have in the queue at once (0: no limit): its queued and running jobs, and the bytes their
    inputs take on disk (`params["input_bytes"]`, the extracted uploads)."""

    max_jobs: int = 0
    max_bytes: int = 0


class QuotaExceeded(Exception):
    """The team is at a limit of its TeamQuota (HTTP 429); the message names the limit."""


class TooLargeForQuota(QuotaExceeded):
    """One job's inputs alone are over the team's byte limit: it can never be queued (HTTP 413)."""


ACTIVE = (QUEUED, RUNNING)


def _input_bytes(params: dict | None) -> int:
    params = params or {}
    if isinstance(params.get("input_bytes"), int):
        return params["input_bytes"]
    return sum(int(u.get("bytes") or 0) for u in (params.get("uploads") or {}).values() if isinstance(u, dict))


def team_usage(s: Session, team_id: int) -> tuple[int, int]:
    """(queued and running jobs, bytes of their inputs) of a team."""
    rows = s.execute(select(ServiceJob.params).where(ServiceJob.team_id == team_id, ServiceJob.state.in_(ACTIVE))).all()
    return len(rows), sum(_input_bytes(r[0]) for r in rows)


def check_quota(usage: tuple[int, int], team: str, quota: TeamQuota, *, adding_bytes: int = 0,
                uploading: int = 0) -> None:
    """QuotaExceeded (or TooLargeForQuota) when one more job of `adding_bytes` would pass `quota`; `uploading`:
    the team's uploads still arriving, counted as jobs."""
    jobs, used = usage
    if quota.max_jobs and jobs + uploading >= quota.max_jobs:
        busy = f"{jobs} job{'s' if jobs != 1 else ''} queued or running"
        if uploading:
            busy += f" and {uploading} upload{'s' if uploading != 1 else ''} arriving"
        raise QuotaExceeded(f"team {team} has {busy}: the limit per team is {quota.max_jobs} (--max-team-jobs); "
                            "try again when some have finished")
    if quota.max_bytes and adding_bytes > quota.max_bytes:
        raise TooLargeForQuota(f"this job's inputs take {adding_bytes:,} bytes on disk, over the limit per team of "
                               f"{quota.max_bytes:,} bytes (--max-team-mb) by themselves")
    if quota.max_bytes and used + adding_bytes > quota.max_bytes:
        raise QuotaExceeded(f"team {team}'s queued and running jobs take {used:,} bytes on disk; with this job's "
                            f"{adding_bytes:,} that passes the limit per team of {quota.max_bytes:,} bytes "
                            "(--max-team-mb); try again when some have finished")


def usage_of(engine: Engine, team_id: int) -> tuple[int, int]:
    with read_session(engine) as s:
        return team_usage(s, team_id)


def insert_job(engine: Engine, *, job_id: str, team_id: int, kind: str, name: str, params: dict[str, Any],
               input_dir: str | None, max_attempts: int = 3, quota: TeamQuota | None = None) -> None:
    """Queue a job. With `quota`, the team's usage is checked in the same transaction (the team's row locked, so
    two uploads of one team never both take the last place): QuotaExceeded when the job does not fit."""
    def tx() -> None:
        with write_session(engine) as s:
            if quota is not None and (quota.max_jobs or quota.max_bytes):
                team = s.execute(select(ServiceTeam.name).where(ServiceTeam.id == team_id).with_for_update()).scalar_one()
                check_quota(team_usage(s, team_id), team, quota, adding_bytes=_input_bytes(params))
            s.execute(insert(ServiceJob).values(
                id=job_id, team_id=team_id, kind=kind, name=name[:200], state=QUEUED, params=params,
                input_dir=input_dir, attempts=0, max_attempts=max_attempts, queued_at=db_now(s),
            ))

    with_retry(tx)


def claim(engine: Engine, worker: str, lease_s: float, *, kinds: tuple[str, ...] | None = None) -> Claim | None:
    """The next job for `worker` (see the module docstring), or None when the queue is empty."""
    J = ServiceJob

    def tx() -> Claim | None:
        with write_session(engine) as s:
            now = db_now(s)
            while True:
                q = (select(J).where(or_(J.state == QUEUED, and_(J.state == RUNNING, J.lease_expires_at < now)))
                     .order_by(J.queued_at, J.id).limit(1).with_for_update(skip_locked=True))
                if kinds:
                    q = q.where(J.kind.in_(kinds))
                job = s.execute(q).scalar_one_or_none()
                if job is None:
                    return None
                if job.cancel_requested_at is not None:  # its worker died, or gave it back, before it could stop it
                    job.state, job.finished_at, job.lease_token, job.lease_expires_at = CANCELLED, now, None, None
                    job.error = CANCELLED_RUNNING if job.started_at is not None else CANCELLED_QUEUED
                    s.flush()
                    _undo_recording(s, job.id)
                    s.expire(job)
                    continue
                if job.attempts >= job.max_attempts:
                    job.state, job.finished_at, job.lease_token, job.lease_expires_at = FAILED, now, None, None
                    job.error = (f"abandoned: claimed {job.attempts} time{'s' if job.attempts != 1 else ''} and "
                                 "each lease expired without a result (its worker died or was stopped, or the store "
                                 "refused its writes: see the workers' logs)")
                    s.flush()
                    _undo_recording(s, job.id)
                    s.expire(job)
                    continue
                token = uuid.uuid4().hex
                job.state, job.attempts = RUNNING, job.attempts + 1
                job.lease_owner, job.lease_token = worker[:200], token
                job.lease_expires_at, job.heartbeat_at, job.started_at = now + lease_s, now, now
                team = s.execute(select(ServiceTeam.name).where(ServiceTeam.id == job.team_id)).scalar_one()
                return Claim(job_id=job.id, lease_token=token, worker=worker, attempt=job.attempts, kind=job.kind,
                             name=job.name, team_id=job.team_id, team=team, params=dict(job.params or {}),
                             input_dir=job.input_dir)

    return with_retry(tx)


def _mine(c: Claim):
    return and_(ServiceJob.id == c.job_id, ServiceJob.lease_token == c.lease_token, ServiceJob.state == RUNNING)


def _mine_uncancelled(c: Claim):
    """The lease holder's writes of a job's outcome: none once the team asked to cancel it (the job ends cancelled)."""
    return and_(_mine(c), ServiceJob.cancel_requested_at.is_(None))


def mark_recorded(session: Session, c: Claim, analysis_id: int) -> None:
    """In the store's recording transaction: note the run this job created (LeaseLost, rolling the recording
    back, if the worker no longer holds the job)."""
    res = session.execute(update(ServiceJob).where(_mine_uncancelled(c)).values(analysis_id=analysis_id))
    if res.rowcount != 1:
        raise LeaseLost(c.job_id)


def link_recorded(engine: Engine, c: Claim, analysis_id: int, content_hash: str) -> bool:
    """A job whose trace was already recorded (status "exists" or "refreshed") marks, under its lease, that it
    relies on that run: its `content_hash` is set while it runs, which spares the run from the undo of the job
    that recorded it (`_undo_recording`). False when the run is gone (its recorder failed meanwhile): the caller
    records the trace again. The run's row is locked first (as `_undo_recording` locks it), so a link and an
    undo never pass each other."""
    from ..store.orm import Analysis

    def tx() -> bool:
        with write_session(engine) as s:
            held = s.execute(select(Analysis.id).where(Analysis.id == analysis_id).with_for_update()).first()
            if held is None:
                return False
            res = s.execute(update(ServiceJob).where(_mine_uncancelled(c)).values(content_hash=content_hash))
            if res.rowcount != 1:
                raise LeaseLost(c.job_id)
            return True

    return with_retry(tx)


def _undo_recording(s: Session, job_id: str) -> None:
    """The run a failing job recorded (its analysis_id) is deleted, unless another job relies on it: a finished
    job that links to it, or a running job that found it already recorded (`link_recorded`; the oldest such job
    then becomes the run's recorder, so that the run goes if that job fails too)."""
    from ..store.orm import Analysis, Trace
    from ..store.record import forget_analysis

    aid = s.execute(select(ServiceJob.analysis_id).where(ServiceJob.id == job_id)).scalar_one_or_none()
    if aid is None:
        return
    s.execute(update(ServiceJob).where(ServiceJob.id == job_id).values(analysis_id=None))
    held = s.execute(select(Trace.content_hash).join(Analysis, Analysis.trace_id == Trace.id)
                     .where(Analysis.id == aid).with_for_update(of=Analysis)).first()
    if held is None:
        return
    linked = s.execute(select(ServiceJob.id).where(ServiceJob.analysis_id == aid, ServiceJob.state == DONE,
                                                   ServiceJob.id != job_id).limit(1)).first()
    if linked is not None:
        return
    heir = s.execute(select(ServiceJob.id).where(ServiceJob.content_hash == held[0], ServiceJob.state == RUNNING,
                                                 ServiceJob.analysis_id.is_(None), ServiceJob.id != job_id)
                     .order_by(ServiceJob.queued_at, ServiceJob.id).limit(1)).first()
    if heir is not None:
        s.execute(update(ServiceJob).where(ServiceJob.id == heir[0]).values(analysis_id=aid))
        return
    forget_analysis(s, aid)


def recorded_trace_of_team(engine: Engine, analysis_id: int, team: str) -> str | None:
    """The content hash of recorded run `analysis_id` when its store job belongs to `team`; else None."""
    from ..store.orm import Analysis, Job, Trace

    with read_session(engine) as s:
        return s.execute(
            select(Trace.content_hash).join(Analysis, Analysis.trace_id == Trace.id).join(Job, Job.id == Analysis.job_id)
            .where(Analysis.id == analysis_id, Job.team == team)
        ).scalar_one_or_none()


def heartbeat(engine: Engine, c: Claim, lease_s: float) -> bool:
    """Extend the lease; False when it was lost."""
    def tx() -> bool:
        with write_session(engine) as s:
            now = db_now(s)
            res = s.execute(update(ServiceJob).where(_mine(c)).values(lease_expires_at=now + lease_s, heartbeat_at=now))
            return res.rowcount == 1

    return with_retry(tx)


def complete(engine: Engine, c: Claim, *, result: dict[str, Any], artifacts: dict[str, tuple[str, bytes]],
             content_hash: str | None = None, analysis_id: int | None = None) -> bool:
    """Store the artifacts and move the job to done, in one transaction; False (nothing written) if the lease was lost."""
    def tx() -> bool:
        with write_session(engine) as s:
            now = db_now(s)
            res = s.execute(update(ServiceJob).where(_mine_uncancelled(c)).values(
                state=DONE, finished_at=now, result=result, error=None, lease_token=None, lease_expires_at=None,
                content_hash=content_hash, analysis_id=analysis_id,
            ))
            if res.rowcount != 1:
                raise LeaseLost(c.job_id)
            s.execute(delete(ServiceArtifact).where(ServiceArtifact.job_id == c.job_id))
            rows = [{"job_id": c.job_id, "name": name, "media_type": mt, "size_bytes": len(data), "content": data}
                    for name, (mt, data) in sorted(artifacts.items())]
            if rows:
                s.execute(insert(ServiceArtifact), rows)
            return True

    try:
        return with_retry(tx)
    except LeaseLost:
        return False


def fail(engine: Engine, c: Claim, error: str, *, result: dict[str, Any] | None = None) -> bool:
    """Move the job to failed with `error`, undoing the run it recorded (see the module docstring), in one
    transaction; False (nothing changed) if the lease was lost, or the team asked to cancel the job meanwhile
    (it ends cancelled: finish_cancelled)."""
    def tx() -> bool:
        with write_session(engine) as s:
            now = db_now(s)
            res = s.execute(update(ServiceJob).where(_mine_uncancelled(c)).values(
                state=FAILED, finished_at=now, error=error[:4000], result=result, lease_token=None,
                lease_expires_at=None,
            ))
            if res.rowcount != 1:
                return False
            _undo_recording(s, c.job_id)
            return True

    return with_retry(tx)


def release(engine: Engine, c: Claim) -> bool:
    """Give a claimed job back to the queue untouched (a worker stopping before it started)."""
    def tx() -> bool:
        with write_session(engine) as s:
            res = s.execute(update(ServiceJob).where(_mine(c)).values(
                state=QUEUED, attempts=ServiceJob.attempts - 1, lease_owner=None, lease_token=None,
                lease_expires_at=None, started_at=None,
            ))
            return res.rowcount == 1

    return with_retry(tx)


# --- cancellation --------------------------------------------------------------------------------------


class NotCancellable(Exception):
    """The job has finished (done or failed): there is nothing to cancel (HTTP 409); the message says why."""


def request_cancel(engine: Engine, job_id: str, team_id: int) -> ServiceJob | None:
    """Cancel a job of `team_id` (see the module docstring): a queued job is `cancelled` at once; a running one
    gets `cancel_requested_at` (its worker stops it); a cancelled one is left as it is. Returns the job as it is
    now, None when there is no such job (or it is another team's); NotCancellable for a done or failed job.

    Each step is one conditional UPDATE, so a job that moves meanwhile (claimed, finished, given back to the
    queue by a stopping worker) is caught by the next step; three rounds cover any sequence of those moves."""
    J = ServiceJob
    mine = and_(J.id == job_id, J.team_id == team_id)

    def tx() -> ServiceJob | None:
        with write_session(engine) as s:
            now = db_now(s)
            for _ in range(3):
                if s.execute(update(J).where(mine, J.state == QUEUED).values(
                        state=CANCELLED, cancel_requested_at=func.coalesce(J.cancel_requested_at, now),
                        finished_at=now, error=CANCELLED_QUEUED, lease_token=None, lease_expires_at=None,
                )).rowcount == 1:
                    break
                if s.execute(update(J).where(mine, J.state == RUNNING).values(
                        cancel_requested_at=func.coalesce(J.cancel_requested_at, now))).rowcount == 1:
                    break
                state = s.execute(select(J.state).where(mine)).scalar_one_or_none()
                if state is None:
                    return None
                if state in (DONE, FAILED):
                    raise NotCancellable(f"job {job_id} is {state}: only a queued or running job can be cancelled")
                if state == CANCELLED:
                    break
            job = s.execute(select(J).where(mine)).scalar_one_or_none()
            if job is not None:
                s.expunge(job)
            return job

    return with_retry(tx)


def cancel_requested(engine: Engine, c: Claim) -> bool | None:
    """Whether the team asked to cancel the job `c` runs; None when the worker no longer holds it."""
    with read_session(engine) as s:
        row = s.execute(select(ServiceJob.cancel_requested_at).where(_mine(c))).first()
    return None if row is None else row[0] is not None


def finish_cancelled(engine: Engine, c: Claim) -> bool:
    """Move the job `c` runs to cancelled, once its worker has stopped it, undoing the run it recorded (as `fail`
    does), in one transaction; False (nothing changed) if the lease was lost."""
    def tx() -> bool:
        with write_session(engine) as s:
            now = db_now(s)
            res = s.execute(update(ServiceJob).where(_mine(c)).values(
                state=CANCELLED, finished_at=now, error=CANCELLED_RUNNING, result=None, lease_token=None,
                lease_expires_at=None, cancel_requested_at=func.coalesce(ServiceJob.cancel_requested_at, now),
            ))
            if res.rowcount != 1:
                return False
            _undo_recording(s, c.job_id)
            return True

    return with_retry(tx)


# --- deletion and housekeeping --------------------------------------------------------------------------


class NotDeletable(Exception):
    """The job cannot be deleted now (HTTP 409); the message says why."""


def delete_job(engine: Engine, job_id: str, team_id: int) -> ServiceJob | None:
    """Delete a done, failed or cancelled job of `team_id`, with its artifacts, in one transaction; None when there
    is no such job (or it is another team's). NotDeletable for a queued or running job (a worker may hold it:
    cancel it first, `request_cancel`), and for a done
    job whose recorded run is still held by a running job (its recorder: were that job to fail, nothing would keep
    the run that this job reported). The run a job recorded stays in the store (digest, history)."""
    def tx() -> ServiceJob | None:
        with write_session(engine) as s:
            job = s.execute(select(ServiceJob).where(ServiceJob.id == job_id, ServiceJob.team_id == team_id)
                            .with_for_update()).scalar_one_or_none()
            if job is None:
                return None
            if job.state in ACTIVE:
                raise NotDeletable(f"job {job_id} is {job.state}: a job is deleted once it is done, failed or cancelled "
                                   f"(cancel it first: POST /v1/jobs/{job_id}/cancel)")
            if job.analysis_id is not None:
                holder = s.execute(select(ServiceJob.id).where(ServiceJob.analysis_id == job.analysis_id,
                                                               ServiceJob.state == RUNNING).limit(1)).first()
                if holder is not None:
                    raise NotDeletable(f"job {job_id}'s recorded run is still held by running job {holder[0]}; "
                                       "try again when that job has finished")
            s.execute(delete(ServiceArtifact).where(ServiceArtifact.job_id == job_id))
            s.execute(delete(ServiceJob).where(ServiceJob.id == job_id))
            s.expunge(job)
            return job

    return with_retry(tx)


def folder_states(engine: Engine, job_ids: list[str]) -> tuple[dict[str, tuple[str, float | None]], float]:
    """{job id: (state, finished_at)} of those of `job_ids` that are jobs, and the database clock now."""
    out: dict[str, tuple[str, float | None]] = {}
    with read_session(engine) as s:
        now = db_now(s)
        for i in range(0, len(job_ids), 500):
            rows = s.execute(select(ServiceJob.id, ServiceJob.state, ServiceJob.finished_at)
                             .where(ServiceJob.id.in_(job_ids[i:i + 500])))
            out.update({jid: (state, finished) for jid, state, finished in rows})
    return out, now


# --- reads for the API ------------------------------------------------------------------------------


def get_job(engine: Engine, job_id: str, team_id: int | None) -> ServiceJob | None:
    """The job if it exists and belongs to `team_id` (None: any team)."""
    with read_session(engine) as s:
        q = select(ServiceJob).where(ServiceJob.id == job_id)
        if team_id is not None:
            q = q.where(ServiceJob.team_id == team_id)
        return s.execute(q).scalar_one_or_none()


def list_jobs(engine: Engine, team_id: int, *, limit: int = 50, state: str | None = None,
              before: tuple[float, str] | None = None) -> list[ServiceJob]:
    """The team's jobs, newest first: ordered by (queued_at, id) descending, `limit` of them, only those before
    the key `before` (the (queued_at, id) of the last job of the previous page) when given. Keyset paging: a job
    queued meanwhile sorts before the first page and never shifts the later ones, so walking the pages sees
    every job that existed when the walk began exactly once (less those deleted meanwhile)."""
    J = ServiceJob
    with read_session(engine) as s:
        q = select(J).where(J.team_id == team_id).order_by(J.queued_at.desc(), J.id.desc()).limit(limit)
        if state:
            q = q.where(J.state == state)
        if before is not None:
            at, job_id = before
            q = q.where(or_(J.queued_at < at, and_(J.queued_at == at, J.id < job_id)))
        return list(s.execute(q).scalars())


def artifact_names(engine: Engine, job_id: str) -> list[str]:
    with read_session(engine) as s:
        return list(s.execute(select(ServiceArtifact.name).where(ServiceArtifact.job_id == job_id)
                              .order_by(ServiceArtifact.name)).scalars())


def artifact_names_many(engine: Engine, job_ids: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {j: [] for j in job_ids}
    if not job_ids:
        return out
    with read_session(engine) as s:
        for jid, name in s.execute(select(ServiceArtifact.job_id, ServiceArtifact.name)
                                   .where(ServiceArtifact.job_id.in_(job_ids)).order_by(ServiceArtifact.name)):
            out[jid].append(name)
    return out


def get_artifact(engine: Engine, job_id: str, name: str) -> tuple[str, bytes] | None:
    with read_session(engine) as s:
        row = s.execute(select(ServiceArtifact.media_type, ServiceArtifact.content)
                        .where(ServiceArtifact.job_id == job_id, ServiceArtifact.name == name)).first()
    return (row[0], bytes(row[1])) if row is not None else None


def counts(engine: Engine) -> dict[str, int]:
    with read_session(engine) as s:
        rows = s.execute(select(ServiceJob.state, func.count()).group_by(ServiceJob.state)).all()
    out = {k: 0 for k in STATES}
    out.update({k: int(v) for k, v in rows})
    return out
