"""The weekly digest: where the week's GPU-hours (accelerator-hours of MTIA jobs: devices.py) and dollars were wasted, computed in SQL.

Definitions (docs/store.md):
- A finding's wasted GPU-hours = impact.pct_of_step / 100 x the GPU-hours of the analysis it
  belongs to (stored as findings.wasted_gpu_hours at record time). A job recorded once a week with
  `--gpu-hours H` wastes pct/100 x H on that pattern that week; several runs in a week add up.
- Dollars = wasted GPU-hours x the run's hourly price: the one in effect when it was recorded
  (--gpu-hour-cost, else the job's stored price); runs recorded before their job had any price take
  the job's first price when it is set; $0 while none is known.
- Totals (the week's waste, each job's and owner's, the weekly series) sum findings.counted_gpu_hours
  / counted_usd: a finding within another of the same analysis (launch-bound, sync-point and
  dataloader-bound are parts of idle-gpu's idle time; zoomer_ar/detect/combine.py) counts once.
  Per-pattern rows and resolved rows sum each pattern's own waste.
- Trend: the same sums for each of the four previous weeks.
- New vs recurring: per (job, pattern); a pattern is "new" in the digest when no job had it in the
  previous four weeks.
- Resolved: a (job, pattern) seen in the previous four weeks whose job was recorded this week
  without it.

Every figure is one aggregate query (GROUP BY in the database; findings carry their job, week,
wasted GPU-hours and dollars, so the waste aggregates read the covering index
ix_findings_week_pattern alone); Python only touches the aggregated rows (patterns x weeks, top jobs).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from sqlalchemy import Engine, case, distinct, func, select

from ..features.phases import PHASES
from . import devices
from . import weeks as W
from .db import open_store
from .names import canonical
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
    device: str = devices.GPU  # what its GPU-hours are hours of: "GPU", "accelerator" (MTIA) or "GPU/accelerator"


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
    device: str = devices.GPU


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
    device: str = Field(devices.GPU, description="what the digest's GPU-hours are hours of, over its twelve weeks: "
                                                 "GPU, accelerator (MTIA) or GPU/accelerator (both, added up)")
    hours_unit: str = Field("GPU-hours", description="the unit of every gpu_hours figure (the keys keep their names)")


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    top = max(values)
    if top <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, int(round(v / top * (len(SPARK) - 1))))] for v in values)


def by_text(col, engine: Engine):  # noqa: ANN001, ANN201 - a column or expression, and it ordered by its bytes
    """`col` to order by as text in code-point order, the same on both stores: SQLite compares bytes, PostgreSQL by
    the database's collation (en_US or ICU: alice, Bob, Zed; SQLite: Bob, Zed, alice), so rows of equal waste
    came in another order, and another top-N was cut from them, on PostgreSQL."""
    return col.collate("C") if engine.dialect.name == "postgresql" else col


def latest_week(engine: Engine, team: str | None = None) -> str | None:
    q = select(func.max(Analysis.week))
    if team:
        q = q.where(Analysis.job_id.in_(select(Job.id).where(Job.team == canonical(team))))
    with engine.connect() as c:
        return c.execute(q).scalar()


def build_digest(db: str | Engine | None = None, *, week: str | None = None, team: str | None = None,
                 top: int = 10) -> Digest:
    engine = db if isinstance(db, Engine) else open_store(db)
    team = canonical(team)
    week = W.parse_week(week) if week else (latest_week(engine, team) or W.week_of(W.now()))
    trend = W.previous(week, TREND_WEEKS)
    chart = W.previous(week, CHART_WEEKS - 1) + [week]
    team_jobs = select(Job.id).where(Job.team == team) if team else None

    def scoped(q, job_col):  # noqa: ANN001, ANN202 - the team filter as a semi-join on the small jobs table
        return q.where(job_col.in_(team_jobs)) if team_jobs is not None else q

    F, A = Finding, Analysis
    with engine.connect() as c:
        # waste per pattern per week over the trend window (index-only on ix_findings_week_pattern)
        by_pw = c.execute(scoped(
            select(F.week, F.pattern, func.sum(F.wasted_gpu_hours), func.sum(F.wasted_usd), func.count(),
                   func.count(distinct(F.job_id)))
            .where(F.week >= trend[0], F.week <= week), F.job_id).group_by(F.week, F.pattern)
        ).all()
        # waste per week over the chart window
        waste_w = {r[0]: (float(r[1] or 0.0), float(r[2] or 0.0)) for r in c.execute(scoped(
            select(F.week, func.sum(F.counted_gpu_hours), func.sum(F.counted_usd))
            .where(F.week >= chart[0], F.week <= week), F.job_id).group_by(F.week)
        ).all()}
        # GPU-hours and dollars per week (all recorded runs, wasteful or not)
        by_w = {r[0]: r[1:] for r in c.execute(scoped(
            select(A.week, func.sum(A.gpu_hours), func.sum(A.usd), func.count(), func.count(distinct(A.job_id)))
            .where(A.week >= chart[0], A.week <= week), A.job_id).group_by(A.week)
        ).all()}

        # new vs recurring per (job, pattern) present this week, summed per pattern
        per_jp = scoped(
            select(F.pattern.label("pattern"), F.job_id.label("job_id"),
                   func.max(case((F.week < week, 1), else_=0)).label("recurring"))
            .where(F.week >= trend[0], F.week <= week), F.job_id
        ).group_by(F.pattern, F.job_id).having(func.max(case((F.week == week, 1), else_=0)) == 1).subquery()
        status = {r[0]: (int(r[1]), int(r[2])) for r in c.execute(
            select(per_jp.c.pattern, func.sum(1 - per_jp.c.recurring), func.sum(per_jp.c.recurring))
            .group_by(per_jp.c.pattern)
        ).all()}

        # costliest jobs and owners: spend from analyses, waste from findings, each aggregated per job
        spend = scoped(
            select(A.job_id.label("job_id"), func.count().label("runs"), func.sum(A.gpu_hours).label("gpu_hours"),
                   func.sum(A.usd).label("usd")).where(A.week == week), A.job_id
        ).group_by(A.job_id).subquery()
        waste = scoped(
            select(F.job_id.label("job_id"), func.sum(F.counted_gpu_hours).label("wgh"),
                   func.sum(F.counted_usd).label("wusd")).where(F.week == week), F.job_id
        ).group_by(F.job_id).subquery()
        wgh = func.coalesce(waste.c.wgh, 0.0)
        wusd = func.coalesce(waste.c.wusd, 0.0)
        job_rows = c.execute(
            select(Job.id, Job.name, Job.team, Job.owner, spend.c.runs, spend.c.gpu_hours, spend.c.usd, wgh, wusd)
            .select_from(spend).join(Job, Job.id == spend.c.job_id).outerjoin(waste, waste.c.job_id == spend.c.job_id)
            .order_by(wusd.desc(), wgh.desc(), spend.c.usd.desc(), by_text(Job.name, engine)).limit(top)
        ).all()
        top_pattern: dict[int, str] = {}
        if job_rows:
            best: dict[int, float] = {}
            for jid, pat, h in c.execute(
                select(F.job_id, F.pattern, func.sum(F.wasted_gpu_hours))
                .where(F.week == week, F.job_id.in_([r[0] for r in job_rows]))
                .group_by(F.job_id, F.pattern)
            ).all():
                # equal waste: the first pattern by name (rows come in the plan's order: hash order on PostgreSQL)
                if h > best.get(jid, -1.0) or (h == best[jid] and pat < top_pattern[jid]):
                    best[jid], top_pattern[jid] = h, pat
        owner = func.coalesce(Job.owner, "(no owner)")
        owner_rows = c.execute(
            select(owner, func.count(distinct(Job.id)), func.sum(spend.c.gpu_hours), func.sum(spend.c.usd),
                   func.sum(wgh), func.sum(wusd))
            .select_from(spend).join(Job, Job.id == spend.c.job_id).outerjoin(waste, waste.c.job_id == spend.c.job_id)
            .group_by(owner).order_by(func.sum(wusd).desc(), func.sum(wgh).desc(), by_text(owner, engine)).limit(top)
        ).all()

        # resolved: (job, pattern) seen in the previous four weeks, job recorded this week without it.
        # One GROUP BY over the five weeks (no anti-join: planners misestimate those), names joined after.
        before = F.week < week
        agg = scoped(
            select(F.job_id.label("job_id"), F.pattern.label("pattern"), func.max(F.week).label("last_seen"),
                   func.sum(case((before, F.wasted_gpu_hours), else_=0.0)).label("wgh"),
                   func.sum(case((before, F.wasted_usd), else_=0.0)).label("wusd"))
            .where(F.week >= trend[0], F.week <= week, F.job_id.in_(select(A.job_id).where(A.week == week))), F.job_id
        ).group_by(F.job_id, F.pattern).having(func.max(case((F.week == week, 1), else_=0)) == 0).subquery()
        resolved = c.execute(
            select(Job.name, Job.team, Job.owner, agg.c.pattern, agg.c.last_seen, agg.c.wgh, agg.c.wusd,
                   func.count().over(), Job.id)
            .select_from(agg).join(Job, Job.id == agg.c.job_id)
            .order_by(agg.c.wusd.desc(), agg.c.wgh.desc(), by_text(Job.name, engine), by_text(agg.c.pattern, engine))
            .limit(top)
        ).all()
        resolved_total = resolved[0][7] if resolved else 0

        # what the hours are hours of: the whole digest's runs (chart window), and each listed job's
        acc = devices.accelerator_only()
        any_acc, all_acc = c.execute(scoped(
            select(func.max(acc), func.min(acc)).where(A.week >= chart[0], A.week <= week), A.job_id)
        ).one()
        listed = {r[0] for r in job_rows} | {r[8] for r in resolved}
        job_device = {jid: devices.noun(hi, lo) for jid, hi, lo in c.execute(
            select(A.job_id, func.max(acc), func.min(acc))
            .where(A.week >= chart[0], A.week <= week, A.job_id.in_(sorted(listed))).group_by(A.job_id)
        ).all()} if listed else {}

        # phases: each run's GPU-hours (and dollars) x its phase shares
        phase_cols = [getattr(A, f"phase_{p}_pct") for p in PHASES]
        ph = c.execute(scoped(
            select(*[func.sum(A.gpu_hours * func.coalesce(col, 0.0) / 100.0) for col in phase_cols],
                   *[func.sum(A.usd * func.coalesce(col, 0.0) / 100.0) for col in phase_cols])
            .where(A.week == week), A.job_id)
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
        wgh_, wus_ = waste_w.get(wk, (0.0, 0.0))
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
        wasted_gpu_hours=waste_w.get(week, (0.0, 0.0))[0], wasted_usd=waste_w.get(week, (0.0, 0.0))[1],
        patterns=patterns,
        jobs=[JobRow(job=r[1], team=r[2], owner=r[3], runs=int(r[4]), gpu_hours=float(r[5] or 0.0), usd=float(r[6] or 0.0),
                     wasted_gpu_hours=float(r[7] or 0.0), wasted_usd=float(r[8] or 0.0), top_pattern=top_pattern.get(r[0]),
                     device=job_device.get(r[0], devices.GPU))
              for r in job_rows],
        owners=[OwnerRow(owner=r[0], jobs=int(r[1]), gpu_hours=float(r[2] or 0.0), usd=float(r[3] or 0.0),
                         wasted_gpu_hours=float(r[4] or 0.0), wasted_usd=float(r[5] or 0.0)) for r in owner_rows],
        resolved=[ResolvedRow(job=r[0], team=r[1], owner=r[2], pattern=r[3], last_seen=r[4],
                              wasted_gpu_hours_before=float(r[5] or 0.0), wasted_usd_before=float(r[6] or 0.0),
                              device=job_device.get(r[8], devices.GPU))
                  for r in resolved],
        resolved_total=int(resolved_total),
        series=series, phases=phases, sparkline=sparkline([p.wasted_gpu_hours for p in series]),
        device=devices.noun(any_acc, all_acc), hours_unit=devices.hours_unit(devices.noun(any_acc, all_acc)),
    )
