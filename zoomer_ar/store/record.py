"""Recording analyses: idempotent by trace content, safe with many recorders at once.

One transaction per recording: look the content up first; when it is new, upsert the job (by
name), upsert the trace (by content hash), insert the analysis (one per trace: unique trace_id)
and its findings. Re-recording the same content returns the existing analysis and changes nothing
(not the job, its team, owner or price), unless the tool, feature-schema, findings-schema or model
version differs: then the analysis is refreshed in place (same id, week and job).
A job's team, once set, never changes: recording a job under another team is refused
(JobTeamConflict), so a job cannot be taken over by another team.
Concurrent recorders: SQLite serialises writers (BEGIN IMMEDIATE, busy timeout, retries);
PostgreSQL uses INSERT ... ON CONFLICT on the unique keys, and whole-transaction retries (a
recorder that loses the race for the same content rolls back and finds the winner's run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Integer, String, delete, exists, func, literal, select, update
from sqlalchemy.orm import Session

from ..detect.combine import counted_shares
from ..errors import InputError
from ..features.phases import PHASES
from ..features.schema import FeatureVector
from ..models import Analysis
from . import weeks as W
from .cost import cost_attribution, default_gpus, gpu_hours_basis, profiled_gpu_hours
from .db import StoreError, open_store, store_errors, with_retry, write_session
from .names import canonical
from .orm import Analysis as AnalysisRow
from .orm import Finding as FindingRow
from .orm import Job, Model, Trace, Verdict


class JobTeamConflict(StoreError):
    """The job is recorded under another team; a job's team never changes (exit 2: bad input)."""

    exit_code = 2

    def __init__(self, job: str, team: str, requested: str):
        self.job, self.team, self.requested = job, team, requested
        super().__init__(f"job {job!r} belongs to team {team!r}; it cannot be recorded for team {requested!r} "
                         "(a job's team never changes: use another job name)")

    def __reduce__(self):
        return (type(self), (self.job, self.team, self.requested))


class _LostRace(Exception):
    """A concurrent recorder recorded the same content first: roll back and look again."""


@dataclass
class RecordOptions:
    """What `analyze --record` / `zoomer-ar record` add to an analysis. None = keep/derive."""

    job: str | None = None
    team: str | None = None
    owner: str | None = None
    gpu_type: str | None = None
    gpus: int | None = None
    gpu_hours: float | None = None
    gpu_hour_cost: float | None = None
    week: str | None = None
    recorded_at: datetime | None = None
    model_version: str | None = None


@dataclass
class RecordResult:
    analysis_id: int
    job_id: int
    trace_id: int
    job: str
    week: str
    recorded_at: datetime
    status: str  # "recorded" | "exists" | "refreshed"
    gpus: int
    gpu_hours: float
    gpu_hour_cost: float | None
    cost: dict[str, Any] = field(default_factory=dict)

    @property
    def created(self) -> bool:
        return self.status == "recorded"


def content_hash(analysis: Analysis) -> str:
    """The file's sha256 for one rank; sha256 of the sorted rank hashes for a rank set."""
    hashes = sorted(r.sha256 for r in analysis.job.ranks)
    if len(hashes) == 1:
        return hashes[0]
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()


def _clean(v: Any) -> Any:
    """`v` as both stores keep it: non-finite floats as None, and NUL characters (which PostgreSQL refuses in
    text and JSON, and SQLite would keep) as U+FFFD, in strings and dict keys at any depth."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return v.replace("\x00", "\ufffd") if "\x00" in v else v
    if isinstance(v, dict):
        return {_clean(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


INT32_MAX = 2**31 - 1  # INTEGER columns (counts: GPUs, ranks, world size, profiler steps)
INT64_MAX = 2**63 - 1  # BIGINT (trace bytes)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def unrecordable(analysis: Analysis, opts: RecordOptions | None = None) -> str | None:
    """Why the store cannot hold `analysis` (None when it can), the same on SQLite and PostgreSQL: a count past
    its integer columns, or a figure the store reads (features wall_ms, step_ms, profiler_steps, world_size,
    phase shares, trace_start_unix_s) that is not a number. analyze never writes these; a findings.json may."""
    def count(where: str, v: Any, top: int = INT32_MAX) -> str | None:
        if v is None:
            return None
        if not _number(v) or not 0 <= v <= top:  # NaN and infinity fail the range too
            return f"{where}: {v!r} is not a count from 0 to {top:,}"
        return None

    feats = analysis.features
    problems = [
        _unprintable_job_name(opts.job if opts and opts.job else analysis.job.name),
        count("--gpus", opts.gpus if opts else None),
        count("job.world_size", analysis.job.world_size),
        count("job.ranks: size_bytes (their sum)", sum(r.size_bytes for r in analysis.job.ranks), INT64_MAX),
        count("features.world_size", feats.get("world_size")),
        count("features.profiler_steps", feats.get("profiler_steps")),
    ]
    for key in ("wall_ms", "step_ms", "trace_start_unix_s", *(f"phase_{p}_pct" for p in PHASES)):
        v = feats.get(key)
        if v is not None and not _number(v):
            problems.append(f"features.{key}: {v!r} is not a number")
    start = feats.get("trace_start_unix_s")
    if _number(start):
        try:
            datetime.fromtimestamp(start, tz=W.UTC)
        except (OverflowError, ValueError, OSError):
            problems.append(f"features.trace_start_unix_s: {start!r} is not a time (seconds since 1970)")
    return next((p for p in problems if p), None)


def _unprintable_job_name(name: str | None) -> str | None:
    """Why the job name cannot be stored: a control or format character (a newline, NUL, ESC... from the trace's
    name, analyze's --name or a findings.json) would break every report, digest and history line; --job, --team
    and --owner are refused the same way on the command line (options.check_name)."""
    from ..service.names import bad_chars

    bad = bad_chars(name or "")
    if not bad:
        return None
    return (f"job name {name!r} holds a control character ({', '.join(repr(c) for c in bad)}): rename the trace, "
            "or name the job (--job of record and analyze --record)")


def stored_features(analysis: Analysis) -> dict[str, Any]:
    """The FeatureVector fields (no per-rank detail, no cost section)."""
    return _clean({k: analysis.features.get(k) for k in FeatureVector.model_fields if k in analysis.features})


def resolve_when(analysis: Analysis, week: str | None, recorded_at: datetime | None) -> tuple[str, datetime]:
    """The recorded week and time: --week, else --recorded-at, else the trace's start time, else now.

    The time is --recorded-at, else the trace start, else now; moved to Monday 00:00 UTC of --week
    when it falls outside it.
    """
    start = analysis.features.get("trace_start_unix_s")
    trace_time = datetime.fromtimestamp(start, tz=W.UTC) if isinstance(start, (int, float)) else None
    when = recorded_at or trace_time or W.now()
    if week is None:
        return W.week_of(when), when
    week = W.parse_week(week)
    if not W.in_week(when, week):
        when = W.week_start(week)
    return week, when


def _insert(session: Session):
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert


def _upsert_job(session: Session, name: str, opts: RecordOptions, derived_type: str | None, derived_gpus: int):
    """Insert the job or update its attributes; its team is only ever set once (JobTeamConflict otherwise).

    The caller's transaction rolls back on JobTeamConflict, so a refused recording changes nothing."""
    insert = _insert(session)
    ins = insert(Job).values(
        name=name, team=opts.team, owner=opts.owner, gpu_type=opts.gpu_type or derived_type,
        gpu_count=opts.gpus if opts.gpus is not None else derived_gpus, gpu_hour_cost=opts.gpu_hour_cost,
    )
    ex = ins.excluded
    stmt = ins.on_conflict_do_update(
        index_elements=[Job.name],
        set_={
            "team": func.coalesce(Job.team, ex.team),  # the stored team wins: a job is never handed to another team
            "owner": func.coalesce(ex.owner, Job.owner),
            "gpu_type": func.coalesce(literal(opts.gpu_type, String), Job.gpu_type, ex.gpu_type),
            "gpu_count": func.coalesce(literal(opts.gpus, Integer), Job.gpu_count, ex.gpu_count),
            "gpu_hour_cost": func.coalesce(ex.gpu_hour_cost, Job.gpu_hour_cost),
            "updated_at": func.now(),
        },
    ).returning(Job.id, Job.gpu_count, Job.gpu_hour_cost, Job.team)
    job_id, gpus, price, team = session.execute(stmt).one()
    if opts.team is not None and team is not None and team != opts.team:
        raise JobTeamConflict(name, team, opts.team)
    return job_id, gpus, price


def _upsert_trace(session: Session, analysis: Analysis, chash: str, started: datetime | None) -> int:
    insert = _insert(session)
    ranks = analysis.job.ranks
    stmt = insert(Trace).values(
        content_hash=chash, size_bytes=sum(r.size_bytes for r in ranks), n_ranks=len(ranks),
        world_size=analysis.job.world_size, rank_hashes=_clean(sorted(r.sha256 for r in ranks)),
        path=_clean(analysis.job.path), started_at=started,
    ).on_conflict_do_nothing(index_elements=[Trace.content_hash])
    session.execute(stmt)
    return session.execute(select(Trace.id).where(Trace.content_hash == chash)).scalar_one()


def _model_id(session: Session, version: str | None, feature_schema: str) -> int | None:
    if not version:
        return None
    insert = _insert(session)
    session.execute(
        insert(Model).values(name="zoomer-ar", version=version, feature_schema_version=feature_schema, metrics={})
        .on_conflict_do_nothing(index_elements=[Model.name, Model.version])
    )
    return session.execute(select(Model.id).where(Model.name == "zoomer-ar", Model.version == version)).scalar_one()


def _analysis_values(analysis: Analysis, *, feats: dict[str, Any], gpus: int, gpu_hours: float, source: str,
                     price: float | None, model_version: str | None, model_id: int | None) -> dict[str, Any]:
    values = {
        "tool_version": analysis.tool_version,
        "findings_schema_version": analysis.schema_version,
        "feature_schema_version": analysis.feature_schema_version,
        "model_version": model_version,
        "model_id": model_id,
        "gpu_count": gpus,
        "gpu_hours": gpu_hours,
        "gpu_hours_source": source,
        "gpu_hour_cost": price,
        "usd": gpu_hours * (price or 0.0),
        "wall_ms": float(feats.get("wall_ms") or 0.0),
        "step_ms": float(feats.get("step_ms") or 0.0),
        "profiler_steps": int(feats.get("profiler_steps") or 0),
        "bottleneck": analysis.bottleneck.type,
        "phase_basis": feats.get("phase_basis"),
        "features": feats,
        "notes": list(analysis.notes),
    }
    for p in PHASES:
        values[f"phase_{p}_pct"] = feats.get(f"phase_{p}_pct")
    return _clean(values)


def _finding_rows(analysis: Analysis, analysis_id: int, job_id: int, week: str, gpu_hours: float,
                  price: float | None) -> list[dict]:
    rows = []
    shares = counted_shares(analysis.findings)
    for i, f in enumerate(analysis.findings):
        wasted = f.impact.pct_of_step / 100.0 * gpu_hours
        counted = wasted * shares[i]
        rows.append({
            "analysis_id": analysis_id, "job_id": job_id, "week": week, "ordinal": i, "pattern": f.pattern,
            "title": f.title, "severity": f.severity, "confidence": f.confidence,
            "ms_per_step": f.impact.ms_per_step, "pct_of_step": f.impact.pct_of_step,
            "gpu_hours_per_1000_steps": f.impact.gpu_hours_per_1000_steps,
            "wasted_gpu_hours": wasted, "wasted_usd": wasted * (price or 0.0),
            "counted_gpu_hours": counted, "counted_usd": counted * (price or 0.0),
            "detected_by": "+".join(f.detected_by), "figures": dict(f.evidence.figures),
        })
    return _clean(rows)


def _price_unpriced_runs(session: Session, job_id: int, price: float) -> None:
    """A job's first known price also prices its earlier runs recorded without one (later changes do not reprice)."""
    unpriced = select(AnalysisRow.id).where(AnalysisRow.job_id == job_id, AnalysisRow.gpu_hour_cost.is_(None))
    session.execute(update(FindingRow).where(FindingRow.job_id == job_id, FindingRow.analysis_id.in_(unpriced))
                    .values(wasted_usd=FindingRow.wasted_gpu_hours * price,
                            counted_usd=FindingRow.counted_gpu_hours * price))
    session.execute(update(AnalysisRow).where(AnalysisRow.job_id == job_id, AnalysisRow.gpu_hour_cost.is_(None))
                    .values(gpu_hour_cost=price, usd=AnalysisRow.gpu_hours * price))


def _existing(session: Session, chash: str, *, lock: bool = False):
    q = (select(AnalysisRow, Job.name).join(Trace, Trace.id == AnalysisRow.trace_id)
         .join(Job, Job.id == AnalysisRow.job_id).where(Trace.content_hash == chash))
    if lock and session.get_bind().dialect.name == "postgresql":
        q = q.with_for_update(of=AnalysisRow)
    return session.execute(q).first()


def _same_versions(row: AnalysisRow, analysis: Analysis, model_version: str | None) -> bool:
    return (row.tool_version, row.feature_schema_version, row.findings_schema_version, row.model_version) == (
        analysis.tool_version, analysis.feature_schema_version, analysis.schema_version, model_version)


def _result(row: AnalysisRow, job_name: str, status: str, analysis: Analysis) -> RecordResult:
    cost = cost_attribution(analysis.features, analysis.findings, gpus=row.gpu_count, gpu_hours=row.gpu_hours,
                            gpu_hour_cost=row.gpu_hour_cost)
    cost["gpu_hours_source"] = row.gpu_hours_source
    if row.gpu_hours_source != "option":
        cost["gpu_hours_basis"] = gpu_hours_basis(analysis.features, row.gpu_count, wall=False)
    return RecordResult(
        analysis_id=row.id, job_id=row.job_id, trace_id=row.trace_id, job=job_name, week=row.week,
        recorded_at=W.utc(row.recorded_at), status=status, gpus=row.gpu_count, gpu_hours=row.gpu_hours,
        gpu_hour_cost=row.gpu_hour_cost, cost=cost,
    )


def record_analysis(analysis: Analysis, opts: RecordOptions | None = None, *, db: str | Engine | None = None,
                    on_recorded: Callable[[Session, RecordResult], None] | None = None) -> RecordResult:
    """Store an analysis (see the module docstring). `db`: an engine, a URL/path, or None for the default store.

    `on_recorded(session, result)` runs inside the recording transaction when a new run was recorded
    (status "recorded"): what it writes commits with the run, and an exception from it rolls the
    recording back (the service marks its job this way; see zoomer_ar.service.queue).
    Raises JobTeamConflict (nothing written) when the job belongs to another team.
    """
    opts = opts or RecordOptions()
    problem = unrecordable(analysis, opts)
    if problem:
        raise InputError(analysis.job.path or None, f"cannot be recorded: {problem}")
    engine = db if isinstance(db, Engine) else open_store(db)
    chash = content_hash(analysis)
    week, when = resolve_when(analysis, opts.week, opts.recorded_at)
    feats = stored_features(analysis)
    opts = dataclasses.replace(opts, job=canonical(_clean(opts.job)), team=canonical(_clean(opts.team)),
                               owner=canonical(_clean(opts.owner)), gpu_type=canonical(_clean(opts.gpu_type)),
                               model_version=_clean(opts.model_version))
    name = opts.job or canonical(_clean(analysis.job.name))
    devices = [d for r in analysis.job.ranks for d in r.devices]
    derived_type = canonical(_clean(devices[0])) if devices else None
    derived_gpus = default_gpus(analysis.features)
    model_version = opts.model_version or _clean(getattr(analysis, "model_version", None))
    start = analysis.features.get("trace_start_unix_s")
    started = datetime.fromtimestamp(start, tz=W.UTC) if isinstance(start, (int, float)) else None

    # fast path: this content is already recorded with the same versions (no write, no lock)
    with store_errors(engine, "record into"), Session(engine) as s:  # a damaged SQLite page: one line, exit 2
        hit = _existing(s, chash)
        if hit is not None and _same_versions(hit[0], analysis, model_version):
            return _result(hit[0], hit[1], "exists", analysis)

    def refresh(s: Session, row: AnalysisRow) -> AnalysisRow:
        # newer tool/schema/model: refresh in place, keeping the job, week, GPU-hours and price it was recorded with
        model_id = _model_id(s, model_version, analysis.feature_schema_version)
        values = _analysis_values(analysis, feats=feats, gpus=row.gpu_count, gpu_hours=row.gpu_hours,
                                  source=row.gpu_hours_source, price=row.gpu_hour_cost, model_version=model_version,
                                  model_id=model_id)
        values["usd"] = row.usd
        s.execute(update(AnalysisRow).where(AnalysisRow.id == row.id).values(**values))
        s.execute(delete(FindingRow).where(FindingRow.analysis_id == row.id))
        rows = _finding_rows(analysis, row.id, row.job_id, row.week, row.gpu_hours, row.gpu_hour_cost)
        if rows:
            s.execute(FindingRow.__table__.insert(), rows)
        s.expire(row)
        return s.get(AnalysisRow, row.id)

    def tx() -> RecordResult:
        with write_session(engine) as s:
            # already recorded? then nothing of this call's options is applied (not even to the job)
            hit = _existing(s, chash, lock=True)
            if hit is not None:
                row, job_name = hit
                if _same_versions(row, analysis, model_version):
                    return _result(row, job_name, "exists", analysis)
                return _result(refresh(s, row), job_name, "refreshed", analysis)
            job_id, job_gpus, job_price = _upsert_job(s, name, opts, derived_type, derived_gpus)
            if opts.gpu_hour_cost is not None:
                _price_unpriced_runs(s, job_id, opts.gpu_hour_cost)
            trace_id = _upsert_trace(s, analysis, chash, started)
            gpus = opts.gpus if opts.gpus is not None else int(job_gpus if job_gpus is not None else derived_gpus)
            price = opts.gpu_hour_cost if opts.gpu_hour_cost is not None else job_price
            source = "option" if opts.gpu_hours is not None else "profiled"
            hours = float(opts.gpu_hours) if opts.gpu_hours is not None else profiled_gpu_hours(analysis.features, gpus)
            model_id = _model_id(s, model_version, analysis.feature_schema_version)
            values = _analysis_values(analysis, feats=feats, gpus=gpus, gpu_hours=hours, source=source, price=price,
                                      model_version=model_version, model_id=model_id)
            insert = _insert(s)
            new_id = s.execute(
                insert(AnalysisRow).values(trace_id=trace_id, job_id=job_id, week=week, recorded_at=when, **values)
                .on_conflict_do_nothing(index_elements=[AnalysisRow.trace_id]).returning(AnalysisRow.id)
            ).scalar_one_or_none()
            if new_id is None:  # a concurrent recorder won: undo this transaction (job upsert included), look again
                raise _LostRace()
            rows = _finding_rows(analysis, new_id, job_id, week, hours, price)
            if rows:
                s.execute(FindingRow.__table__.insert(), rows)
            row = s.get(AnalysisRow, new_id)
            result = _result(row, name, "recorded", analysis)
            if on_recorded is not None:
                on_recorded(s, result)
            return result

    for _ in range(20):
        try:
            with store_errors(engine, "record into"):  # the server went away (or the disk filled) mid-run: one line
                return with_retry(tx)
        except _LostRace:
            continue
    raise StoreError(f"could not record {chash[:12]}: concurrent recorders kept conflicting")


def check_teams(analyses: list[Analysis], opts: RecordOptions, db: str | Engine | None = None) -> None:
    """JobTeamConflict, before anything is recorded, when one of `analyses` would go to a job of another team
    than opts.team (a batch is refused whole; record_analysis checks each run again in its transaction)."""
    if opts.team is None:
        return
    team = canonical(_clean(opts.team))
    names = {canonical(_clean(opts.job or a.job.name)) for a in analyses}
    engine = db if isinstance(db, Engine) else open_store(db)
    with store_errors(engine, "read from"), Session(engine) as s:
        for name, stored in s.execute(select(Job.name, Job.team).where(Job.name.in_(sorted(names)))).all():
            if stored is not None and stored != team:
                raise JobTeamConflict(name, stored, team)


def forget_analysis(session: Session, analysis_id: int) -> bool:
    """Delete a recorded run (its findings too) inside the caller's transaction, as if it had never been recorded.

    The trace row goes too unless verdicts label it, and the job row unless it has other runs.
    For runs whose recording must be undone (a service job that failed after recording); False if
    there was no such run."""
    got = session.execute(select(AnalysisRow.trace_id, AnalysisRow.job_id)
                          .where(AnalysisRow.id == analysis_id)).first()
    if got is None:
        return False
    trace_id, job_id = got
    session.execute(delete(FindingRow).where(FindingRow.analysis_id == analysis_id))
    session.execute(delete(AnalysisRow).where(AnalysisRow.id == analysis_id))
    session.execute(delete(Trace).where(
        Trace.id == trace_id,
        ~exists(select(Verdict.id).where(Verdict.trace_id == trace_id)),
        ~exists(select(AnalysisRow.id).where(AnalysisRow.trace_id == trace_id)),
    ))
    session.execute(delete(Job).where(Job.id == job_id, ~exists(select(AnalysisRow.id).where(AnalysisRow.job_id == job_id))))
    return True


def add_verdict(content_hash_: str, pattern: str, label: str, *, author: str = "", source: str = "human",
                note: str | None = None, db: str | Engine | None = None) -> int:
    """Label a (trace, pattern) positive or negative; one verdict per author (the latest wins)."""
    if label not in ("positive", "negative"):
        raise ValueError("label must be positive or negative")
    engine = db if isinstance(db, Engine) else open_store(db)

    def tx() -> int:
        with write_session(engine) as s:
            trace_id = s.execute(select(Trace.id).where(Trace.content_hash == content_hash_)).scalar_one_or_none()
            if trace_id is None:
                from .db import StoreError

                raise StoreError(f"no recorded trace with content hash {content_hash_}")
            finding_id = s.execute(
                select(FindingRow.id).join(AnalysisRow, AnalysisRow.id == FindingRow.analysis_id)
                .where(AnalysisRow.trace_id == trace_id, FindingRow.pattern == pattern).limit(1)
            ).scalar_one_or_none()
            insert = _insert(s)
            ins = insert(Verdict).values(trace_id=trace_id, finding_id=finding_id, pattern=pattern, label=label,
                                         author=author, source=source, note=note)
            s.execute(ins.on_conflict_do_update(
                index_elements=[Verdict.trace_id, Verdict.pattern, Verdict.author],
                set_={"label": ins.excluded.label, "note": ins.excluded.note, "source": ins.excluded.source,
                      "finding_id": ins.excluded.finding_id},
            ))
            return s.execute(select(Verdict.id).where(Verdict.trace_id == trace_id, Verdict.pattern == pattern,
                                                      Verdict.author == author)).scalar_one()

    return with_retry(tx)
