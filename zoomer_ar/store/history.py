"""One job's recorded analyses and findings over time (`zoomer-ar history JOB`)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from sqlalchemy import Engine, func, select

from . import devices
from . import weeks as W
from .db import StoreError, open_store
from .names import canonical
from .orm import Analysis, Finding, Job, Trace


class HistoryFinding(BaseModel):
    pattern: str
    severity: str
    pct_of_step: float
    ms_per_step: float
    wasted_gpu_hours: float
    wasted_usd: float


class HistoryRun(BaseModel):
    analysis_id: int
    week: str
    recorded_at: datetime
    trace_hash: str
    tool_version: str
    gpu_count: int
    gpu_hours: float
    gpu_hour_cost: float | None
    usd: float
    step_ms: float
    findings: list[HistoryFinding] = Field(default_factory=list)
    device: str = devices.GPU  # what its GPU-hours are hours of: "GPU" or "accelerator" (MTIA)


class History(BaseModel):
    job: str
    team: str | None
    owner: str | None
    gpu_type: str | None
    gpu_count: int | None
    gpu_hour_cost: float | None
    runs: list[HistoryRun]
    weeks: list[str]
    patterns: list[str]
    matrix: dict[str, dict[str, float]] = Field(default_factory=dict, description="pattern -> week -> wasted GPU-hours")
    device: str = Field(devices.GPU, description="what the runs' GPU-hours are hours of: GPU, accelerator (MTIA) or "
                                                 "GPU/accelerator (both)")
    hours_unit: str = Field("GPU-hours", description="the unit of every gpu_hours figure (the keys keep their names)")


def job_history(job: str, db: str | Engine | None = None, *, limit: int = 52) -> History:
    engine = db if isinstance(db, Engine) else open_store(db)
    job = canonical(job)
    with engine.connect() as c:
        j = c.execute(select(Job).where(Job.name == job)).first()
        if j is None:
            raise StoreError(f"no recorded job named {job!r}")
        price = func.coalesce(Analysis.gpu_hour_cost, Job.gpu_hour_cost, 0.0)
        runs = c.execute(
            select(Analysis.id, Analysis.week, Analysis.recorded_at, Trace.content_hash, Analysis.tool_version,
                   Analysis.gpu_count, Analysis.gpu_hours, Analysis.gpu_hour_cost, Analysis.gpu_hours * price,
                   Analysis.step_ms, price, devices.accelerator_only())
            .join(Trace, Trace.id == Analysis.trace_id).join(Job, Job.id == Analysis.job_id)
            .where(Analysis.job_id == j.id)
            # runs of one week recorded with --week share its Monday 00:00: the later recorded is the more recent
            .order_by(Analysis.week.desc(), Analysis.recorded_at.desc(), Analysis.id.desc()).limit(limit)
        ).all()
        ids = [r[0] for r in runs]
        fs = c.execute(
            select(Finding.analysis_id, Finding.pattern, Finding.severity, Finding.pct_of_step, Finding.ms_per_step,
                   Finding.wasted_gpu_hours)
            .where(Finding.analysis_id.in_(ids)).order_by(Finding.analysis_id, Finding.ordinal)
        ).all() if ids else []
    by_run: dict[int, list[HistoryFinding]] = {}
    prices = {r[0]: float(r[10] or 0.0) for r in runs}
    for aid, pat, sev, pct, ms, wgh in fs:
        by_run.setdefault(aid, []).append(HistoryFinding(pattern=pat, severity=sev, pct_of_step=pct, ms_per_step=ms,
                                                          wasted_gpu_hours=wgh, wasted_usd=wgh * prices[aid]))
    out_runs = [
        HistoryRun(analysis_id=r[0], week=r[1], recorded_at=W.utc(r[2]), trace_hash=r[3], tool_version=r[4],
                   gpu_count=r[5], gpu_hours=r[6], gpu_hour_cost=r[7], usd=float(r[8] or 0.0), step_ms=r[9],
                   findings=by_run.get(r[0], []), device=devices.noun(r[11], r[11]))
        for r in reversed(runs)  # oldest first
    ]
    weeks = sorted({r.week for r in out_runs})
    matrix: dict[str, dict[str, float]] = {}
    for r in out_runs:
        for f in r.findings:
            matrix.setdefault(f.pattern, {}).setdefault(r.week, 0.0)
            matrix[f.pattern][r.week] += f.wasted_gpu_hours
    patterns = sorted(matrix, key=lambda p: (-sum(matrix[p].values()), p))
    acc = [int(r[11] or 0) for r in runs]
    device = devices.noun(max(acc, default=0), min(acc, default=0))
    return History(job=j.name, team=j.team, owner=j.owner, gpu_type=j.gpu_type, gpu_count=j.gpu_count,
                   gpu_hour_cost=j.gpu_hour_cost, runs=out_runs, weeks=weeks, patterns=patterns, matrix=matrix,
                   device=device, hours_unit=devices.hours_unit(device))
