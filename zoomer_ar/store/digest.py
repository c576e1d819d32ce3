"""The weekly digest: where the week's GPU-hours and dollars were wasted, computed in SQL.

Definitions (docs/store.md):
- A finding's wasted GPU-hours = impact.pct_of_step / 100 x the GPU-hours of the analysis it
  belongs to (stored as findings.wasted_gpu_hours at record time). A job recorded once a week with
  `--gpu-hours H` wastes pct/100 x H on that pattern that week; several runs in a week add up.
- Dollars = wasted GPU-hours x the run's hourly price (recorded with it, else the job's current
  price, else 0).
- Trend: the same sums for each of the four previous weeks.
- New vs recurring: per (job, pattern); a pattern is "new" in the digest when no job had it in the
  previous four weeks.
- Resolved: a (job, pattern) seen in the previous four weeks whose job was recorded this week
  without it.

Every figure is one aggregate query (GROUP BY in the database, over the week/pattern and
job/pattern/week indexes); Python only touches the aggregated rows (patterns x weeks, top jobs).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from sqlalchemy import Engine, and_, case, distinct, exists, func, select, true
from sqlalchemy.orm import aliased

from ..features.phases import PHASES
from . import weeks as W
from .db import open_store
from .orm import Analysis, Finding, Job

TREND_WEEKS = 4
CHART_WEEKS = 12
SPARK = "▁▂▃▄▅▆▇█"


class PatternRow(BaseModel):
    pattern: str
    wasted_gpu_hours: float
    wasted_usd: float
    findings: int
    jobs: int
    new_jobs: int = 0
    recurring_jobs: int = 0
    status: str = "new"  # new | recurring
    trend_gpu_hours: list[float] = Field(default_factory=list, description="previous four weeks, oldest first")
    change_pct: float | None = None
    sparkline: str = ""


class JobRow(BaseModel):
    job: str
    team: str | None
    owner: str | None
    runs: int
    gpu_hours: float
    usd: float
    wasted_gpu_hours: float
    wasted_usd: float
    top_pattern: str | None = None


class OwnerRow(BaseModel):
    owner: str
    jobs: int
    gpu_hours: float
    usd: float
    wasted_gpu_hours: float
    wasted_usd: float


class ResolvedRow(BaseModel):
    job: str
    team: str | None
    owner: str | None
    pattern: str
    last_seen: str
    wasted_gpu_hours_before: float
    wasted_usd_before: float


class WeekPoint(BaseModel):
    week: str
    gpu_hours: float
    usd: float
    wasted_gpu_hours: float
    wasted_usd: float


class PhaseRow(BaseModel):
    phase: str
    gpu_hours: float
    usd: float
    pct: float


class Digest(BaseModel):
    week: str
    team: str | None
    generated_at: datetime
    trend_weeks: list[str]
    jobs_recorded: int
    runs: int
    findings: int
    gpu_hours: float
    usd: float
    wasted_gpu_hours: float
    wasted_usd: float
    patterns: list[PatternRow]
    jobs: list[JobRow]
    owners: list[OwnerRow]
    resolved: list[ResolvedRow]
    resolved_total: int
    series: list[WeekPoint]
    phases: list[PhaseRow]
    sparkline: str


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    top = max(values)
    if top <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, int(round(v / top * (len(SPARK) - 1))))] for v in values)


def _price():
    return func.coalesce(Analysis.gpu_hour_cost, Job.gpu_hour_cost, 0.0)


def latest_week(engine: Engine, team: str | None = None) -> str | None:
    q = select(func.max(Analysis.week)).join(Job, Job.id == Analysis.job_id)
    if team:
        q = q.where(Job.team == team)
    with engine.connect() as c:
        return c.execute(q).scalar()


def build_digest(db: str | Engine | None = None, *, week: str | None = None, team: str | None = None,
                 top: int = 10) -> Digest:
    engine = db if isinstance(db, Engine) else open_store(db)
    week = W.parse_week(week) if week else (latest_week(engine, team) or W.week_of(W.now()))
    trend = W.previous(week, TREND_WEEKS)
    chart = W.previous(week, CHART_WEEKS - 1) + [week]
    team_f = (Job.team == team) if team else true()
    usd = Finding.wasted_gpu_hours * _price()

    with engine.connect() as c:
        # waste per pattern per week over the chart window (covers the trend weeks)
        by_pw = c.execute(
            select(Finding.week, Finding.pattern, func.sum(Finding.wasted_gpu_hours), func.sum(usd),
                   func.count(), func.count(distinct(Finding.job_id)))
            .select_from(Finding).join(Analysis, Analysis.id == Finding.analysis_id).join(Job, Job.id == Finding.job_id)
            .where(Finding.week >= chart[0], Finding.week <= week, team_f)
            .group_by(Finding.week, Finding.pattern)
        ).all()
        # GPU-hours and dollars per week (all recorded runs, wasteful or not)
        by_w = {r[0]: r[1:] for r in c.execute(
            select(Analysis.week, func.sum(Analysis.gpu_hours), func.sum(Analysis.gpu_hours * _price()),
                   func.count(), func.count(distinct(Analysis.job_id)))
            .join(Job, Job.id == Analysis.job_id)
            .where(Analysis.week >= chart[0], Analysis.week <= week, team_f)
            .group_by(Analysis.week)
        ).all()}

        # new vs recurring per (job, pattern) this week, summed per pattern
        prev = aliased(Finding)
        seen_before = exists().where(and_(prev.job_id == Finding.job_id, prev.pattern == Finding.pattern,
                                          prev.week >= trend[0], prev.week < week))
        per_jp = (
            select(Finding.pattern.label("pattern"), Finding.job_id.label("job_id"),
                   case((seen_before, 1), else_=0).label("recurring"))
            .join(Job, Job.id == Finding.job_id)
            .where(Finding.week == week, team_f)
            .group_by(Finding.pattern, Finding.job_id)
        ).subquery()
        status = {r[0]: (int(r[1]), int(r[2])) for r in c.execute(
            select(per_jp.c.pattern, func.sum(1 - per_jp.c.recurring), func.sum(per_jp.c.recurring))
            .group_by(per_jp.c.pattern)
        ).all()}

        # costliest jobs: spend from analyses, waste from findings, both aggregated in SQL
        spend = (
            select(Analysis.job_id.label("job_id"), func.count().label("runs"),
                   func.sum(Analysis.gpu_hours).label("gpu_hours"),
                   func.sum(Analysis.gpu_hours * _price()).label("usd"))
            .join(Job, Job.id == Analysis.job_id).where(Analysis.week == week, team_f)
            .group_by(Analysis.job_id)
        ).subquery()
        waste = (
            select(Finding.job_id.label("job_id"), func.sum(Finding.wasted_gpu_hours).label("wgh"),
                   func.sum(usd).label("wusd"))
            .join(Analysis, Analysis.id == Finding.analysis_id).join(Job, Job.id == Finding.job_id)
            .where(Finding.week == week, team_f).group_by(Finding.job_id)
        ).subquery()
        wgh = func.coalesce(waste.c.wgh, 0.0)
        wusd = func.coalesce(waste.c.wusd, 0.0)
        job_rows = c.execute(
            select(Job.id, Job.name, Job.team, Job.owner, spend.c.runs, spend.c.gpu_hours, spend.c.usd, wgh, wusd)
            .select_from(spend).join(Job, Job.id == spend.c.job_id).outerjoin(waste, waste.c.job_id == spend.c.job_id)
            .order_by(wusd.desc(), wgh.desc(), spend.c.usd.desc(), Job.name).limit(top)
        ).all()
        top_pattern: dict[int, str] = {}
        if job_rows:
            best: dict[int, float] = {}
            for jid, pat, h in c.execute(
                select(Finding.job_id, Finding.pattern, func.sum(Finding.wasted_gpu_hours))
                .where(Finding.week == week, Finding.job_id.in_([r[0] for r in job_rows]))
                .group_by(Finding.job_id, Finding.pattern)
            ).all():
                if h > best.get(jid, -1.0):
                    best[jid], top_pattern[jid] = h, pat
        owner = func.coalesce(Job.owner, "(no owner)")
        owner_rows = c.execute(
            select(owner, func.count(distinct(Job.id)), func.sum(spend.c.gpu_hours), func.sum(spend.c.usd),
                   func.sum(wgh), func.sum(wusd))
            .select_from(spend).join(Job, Job.id == spend.c.job_id).outerjoin(waste, waste.c.job_id == spend.c.job_id)
            .group_by(owner).order_by(func.sum(wusd).desc(), func.sum(wgh).desc(), owner).limit(top)
        ).all()

        # resolved: (job, pattern) seen in the previous four weeks, job recorded this week without it
        cur = aliased(Finding)
        gone = ~exists().where(and_(cur.job_id == Finding.job_id, cur.pattern == Finding.pattern, cur.week == week))
        recorded_now = select(Analysis.job_id).where(Analysis.week == week)
        resolved_q = (
            select(Job.name, Job.team, Job.owner, Finding.pattern, func.max(Finding.week),
                   func.sum(Finding.wasted_gpu_hours), func.sum(usd))
            .select_from(Finding).join(Analysis, Analysis.id == Finding.analysis_id).join(Job, Job.id == Finding.job_id)
            .where(Finding.week >= trend[0], Finding.week < week, Finding.job_id.in_(recorded_now), gone, team_f)
            .group_by(Job.name, Job.team, Job.owner, Finding.pattern)
        )
        resolved_total = c.execute(select(func.count()).select_from(resolved_q.subquery())).scalar_one()
        resolved = c.execute(resolved_q.order_by(func.sum(usd).desc(), func.sum(Finding.wasted_gpu_hours).desc(),
                                                 Job.name, Finding.pattern).limit(top)).all()

        # phases: each run's GPU-hours x its phase shares
        phase_cols = [getattr(Analysis, f"phase_{p}_pct") for p in PHASES]
        ph = c.execute(
            select(*[func.sum(Analysis.gpu_hours * func.coalesce(col, 0.0) / 100.0) for col in phase_cols],
                   *[func.sum(Analysis.gpu_hours * _price() * func.coalesce(col, 0.0) / 100.0) for col in phase_cols])
            .join(Job, Job.id == Analysis.job_id).where(Analysis.week == week, team_f)
        ).one()

    # ---- assemble (rows here are aggregates: patterns x weeks, top-N jobs)
    cells: dict[tuple[str, str], tuple] = {(r[0], r[1]): r[2:] for r in by_pw}
    patterns = []
    for (wk, pat), (gh, us, nf, nj) in cells.items():
        if wk != week:
            continue
        hist = [float(cells.get((t, pat), (0.0,))[0] or 0.0) for t in trend]
        base = sum(hist) / len(hist)
        new_jobs, rec_jobs = status.get(pat, (nj, 0))
        patterns.append(PatternRow(
            pattern=pat, wasted_gpu_hours=float(gh or 0.0), wasted_usd=float(us or 0.0), findings=int(nf), jobs=int(nj),
            new_jobs=new_jobs, recurring_jobs=rec_jobs, status="recurring" if rec_jobs else "new",
            trend_gpu_hours=hist, change_pct=(100.0 * (float(gh or 0.0) - base) / base) if base > 0 else None,
            sparkline=sparkline(hist + [float(gh or 0.0)]),
        ))
    patterns.sort(key=lambda p: (-p.wasted_usd, -p.wasted_gpu_hours, p.pattern))
    series = []
    for wk in chart:
        gh, us, _runs, _jobs = by_w.get(wk, (0.0, 0.0, 0, 0))
        wgh_ = sum(float(v[0] or 0.0) for (w_, _p), v in cells.items() if w_ == wk)
        wus_ = sum(float(v[1] or 0.0) for (w_, _p), v in cells.items() if w_ == wk)
        series.append(WeekPoint(week=wk, gpu_hours=float(gh or 0.0), usd=float(us or 0.0), wasted_gpu_hours=wgh_,
                                wasted_usd=wus_))
    this = by_w.get(week, (0.0, 0.0, 0, 0))
    total_gh = float(this[0] or 0.0)
    phases = [
        PhaseRow(phase=p, gpu_hours=float(ph[i] or 0.0), usd=float(ph[len(PHASES) + i] or 0.0),
                 pct=100.0 * float(ph[i] or 0.0) / total_gh if total_gh > 0 else 0.0)
        for i, p in enumerate(PHASES)
    ]
    return Digest(
        week=week, team=team, generated_at=W.now(), trend_weeks=trend,
        jobs_recorded=int(this[3] or 0), runs=int(this[2] or 0), findings=sum(p.findings for p in patterns),
        gpu_hours=total_gh, usd=float(this[1] or 0.0),
        wasted_gpu_hours=sum(p.wasted_gpu_hours for p in patterns), wasted_usd=sum(p.wasted_usd for p in patterns),
        patterns=patterns,
        jobs=[JobRow(job=r[1], team=r[2], owner=r[3], runs=int(r[4]), gpu_hours=float(r[5] or 0.0), usd=float(r[6] or 0.0),
                     wasted_gpu_hours=float(r[7] or 0.0), wasted_usd=float(r[8] or 0.0), top_pattern=top_pattern.get(r[0]))
              for r in job_rows],
        owners=[OwnerRow(owner=r[0], jobs=int(r[1]), gpu_hours=float(r[2] or 0.0), usd=float(r[3] or 0.0),
                         wasted_gpu_hours=float(r[4] or 0.0), wasted_usd=float(r[5] or 0.0)) for r in owner_rows],
        resolved=[ResolvedRow(job=r[0], team=r[1], owner=r[2], pattern=r[3], last_seen=r[4],
                              wasted_gpu_hours_before=float(r[5] or 0.0), wasted_usd_before=float(r[6] or 0.0))
                  for r in resolved],
        resolved_total=int(resolved_total),
        series=series, phases=phases, sparkline=sparkline([p.wasted_gpu_hours for p in series]),
    )
