"""Seed a store with one million findings and time the weekly digest on SQLite and PostgreSQL.

    python benchmarks/bench_digest.py                       # 1,000,000 findings, SQLite + PostgreSQL
    python benchmarks/bench_digest.py --findings 200000 --pg none
    python benchmarks/bench_digest.py --pg postgresql://user@host/db   # default: $ZOOMER_TEST_PG_URL, else .ci/start-postgres

The seeded fleet: 5,000 jobs in 25 teams (200 owners), one recorded run per job per week over 50
weeks, 2 to 6 findings per run (4 on average) drawn from the pattern catalogue with a skew. The
digest is built for the last week (it aggregates that week, the 4 weeks before for the trend and 12
for the chart); "cold" is the first call on a fresh connection pool, "warm" the median of the
repeats. Figures are printed, never invented: docs/store.md quotes this script's output.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from zoomer_ar.models import PATTERN_IDS  # noqa: E402
from zoomer_ar.store import weeks as W  # noqa: E402
from zoomer_ar.store.db import dispose_engine, open_store, resolve_url  # noqa: E402
from zoomer_ar.store.digest import build_digest  # noqa: E402

LAST_WEEK = "2026-W48"
TEAMS = 25
OWNERS = 200


def plan(n_findings: int, weeks: int, seed: int = 7):
    """Arrays describing jobs, runs (analyses) and findings."""
    rng = np.random.default_rng(seed)
    per_run = 4
    runs = n_findings // per_run
    jobs = max(1, runs // weeks)
    week_labels = W.previous(LAST_WEEK, weeks - 1) + [LAST_WEEK]
    run_job = np.repeat(np.arange(jobs), weeks)[:runs]
    run_week = np.tile(np.arange(weeks), jobs)[:runs]
    k = rng.integers(2, 7, size=runs)  # 2..6 findings per run
    # trim/pad to exactly n_findings
    total = int(k.sum())
    while total != n_findings:
        i = int(rng.integers(0, runs))
        if total > n_findings and k[i] > 1:
            k[i] -= 1
            total -= 1
        elif total < n_findings and k[i] < 16:
            k[i] += 1
            total += 1
    weights = 1.0 / np.arange(1, len(PATTERN_IDS) + 1)
    weights /= weights.sum()
    f_run = np.repeat(np.arange(runs), k)
    f_ord = np.concatenate([np.arange(x) for x in k]) if runs else np.empty(0, int)
    f_pat = rng.choice(len(PATTERN_IDS), size=n_findings, p=weights)
    f_pct = np.round(rng.gamma(1.5, 4.0, size=n_findings), 3)
    gpu_hours = np.round(rng.lognormal(4.0, 1.0, size=runs), 3)
    price = np.round(rng.choice([1.2, 2.0, 2.5, 3.5], size=jobs), 2)
    return {
        "jobs": jobs, "runs": runs, "weeks": week_labels, "run_job": run_job, "run_week": run_week,
        "f_run": f_run, "f_ord": f_ord, "f_pat": f_pat, "f_pct": f_pct, "gpu_hours": gpu_hours, "price": price,
    }


def rows(p):
    now = datetime(2026, 11, 30, tzinfo=UTC)
    jobs = [(j + 1, f"job-{j:05d}", f"team-{j % TEAMS:02d}", f"owner-{j % OWNERS:03d}", "NVIDIA H100", 8,
             float(p["price"][j]), now, now) for j in range(p["jobs"])]
    traces = [(r + 1, f"{r:064x}", 1000, 1, 8, "[]", now) for r in range(p["runs"])]
    wk = p["weeks"]
    starts = {w: W.week_start(w) + timedelta(hours=12) for w in wk}
    price = [float(p["price"][int(p["run_job"][r])]) for r in range(p["runs"])]
    analyses = [
        (r + 1, r + 1, int(p["run_job"][r]) + 1, wk[int(p["run_week"][r])], starts[wk[int(p["run_week"][r])]], "0.1.0",
         "1.0", "1.0.0", 8, float(p["gpu_hours"][r]), "option", price[r], float(p["gpu_hours"][r]) * price[r],
         1000.0, 100.0, 10, "compute-bound", "gpu", 10.0, 30.0, 40.0, 5.0, 5.0, 10.0, "{}", "[]", now)
        for r in range(p["runs"])
    ]
    run_week = [wk[int(x)] for x in p["run_week"]]
    findings = []
    for i in range(len(p["f_run"])):
        r = int(p["f_run"][i])
        pct = float(p["f_pct"][i])
        wasted = pct / 100.0 * float(p["gpu_hours"][r])
        findings.append((r + 1, int(p["run_job"][r]) + 1, run_week[r], int(p["f_ord"][i]), PATTERN_IDS[int(p["f_pat"][i])],
                         "t", "medium", 0.9, pct, pct, 0.001, wasted, wasted * price[r], wasted, wasted * price[r],
                         "rules"))  # counted = wasted: the synthetic findings are not combined (a benchmark of the SQL)
    return jobs, traces, analyses, findings


JOB_COLS = "id, name, team, owner, gpu_type, gpu_count, gpu_hour_cost, created_at, updated_at"
TRACE_COLS = "id, content_hash, size_bytes, n_ranks, world_size, rank_hashes, created_at"
ANALYSIS_COLS = ("id, trace_id, job_id, week, recorded_at, tool_version, findings_schema_version, feature_schema_version, "
                 "gpu_count, gpu_hours, gpu_hours_source, gpu_hour_cost, usd, wall_ms, step_ms, profiler_steps, bottleneck, "
                 "phase_basis, phase_dataloader_pct, phase_forward_pct, phase_backward_pct, phase_optimizer_pct, "
                 "phase_communication_pct, phase_idle_pct, features, notes, created_at")
FINDING_COLS = ("analysis_id, job_id, week, ordinal, pattern, title, severity, confidence, ms_per_step, pct_of_step, "
                "gpu_hours_per_1000_steps, wasted_gpu_hours, wasted_usd, counted_gpu_hours, counted_usd, detected_by")


def seed_sqlite(engine, data) -> None:
    raw = engine.raw_connection()
    try:
        cur = raw.driver_connection.cursor()
        cur.execute("BEGIN IMMEDIATE")
        for table, cols, values in zip(("jobs", "traces", "analyses", "findings"),
                                       (JOB_COLS, TRACE_COLS, ANALYSIS_COLS, FINDING_COLS), data):
            marks = ", ".join("?" * len(cols.split(",")))
            cur.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", values)
        cur.execute("COMMIT")
        cur.execute("ANALYZE")
    finally:
        raw.close()


def seed_pg(engine, data) -> None:
    raw = engine.raw_connection()
    try:
        conn = raw.driver_connection
        with conn.cursor() as cur:
            for table, cols, values in zip(("jobs", "traces", "analyses", "findings"),
                                           (JOB_COLS, TRACE_COLS, ANALYSIS_COLS, FINDING_COLS), data):
                with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as cp:
                    for row in values:
                        cp.write_row(row)
            for table in ("jobs", "traces", "analyses"):
                cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE")
        conn.autocommit = False
    finally:
        raw.close()


def time_digest(url: str, repeat: int, team: str | None = None) -> tuple[float, float, object]:
    dispose_engine(url)
    engine = open_store(url)
    t = time.perf_counter()
    d = build_digest(engine, week=LAST_WEEK, team=team)
    cold = time.perf_counter() - t
    warm = []
    for _ in range(repeat):
        t = time.perf_counter()
        build_digest(engine, week=LAST_WEEK, team=team)
        warm.append(time.perf_counter() - t)
    return cold, statistics.median(warm), d


def bench(name: str, url: str, data, p, repeat: int) -> None:
    engine = open_store(url)
    t = time.perf_counter()
    (seed_pg if engine.dialect.name == "postgresql" else seed_sqlite)(engine, data)
    seeded = time.perf_counter() - t
    with engine.connect() as c:
        n = c.exec_driver_sql("SELECT count(*) FROM findings").scalar()
        n_week = c.exec_driver_sql(f"SELECT count(*) FROM findings WHERE week = '{LAST_WEEK}'").scalar()
    print(f"{name}: seeded {n:,} findings ({p['runs']:,} analyses, {p['jobs']:,} jobs, {len(p['weeks'])} weeks; "
          f"{n_week:,} findings in {LAST_WEEK}) in {seeded:.1f} s")
    cold, warm, d = time_digest(url, repeat)
    print(f"{name}: digest {LAST_WEEK} (all teams): cold {cold * 1000:.0f} ms, warm median {warm * 1000:.0f} ms "
          f"(of {repeat}); {len(d.patterns)} patterns, {d.wasted_gpu_hours:,.0f} wasted GPU-h")
    cold, warm, d = time_digest(url, repeat, team="team-03")
    print(f"{name}: digest {LAST_WEEK} --team team-03: cold {cold * 1000:.0f} ms, warm median {warm * 1000:.0f} ms "
          f"(of {repeat}); {d.jobs_recorded} jobs")


def pg_url(arg: str) -> str | None:
    if arg == "none":
        return None
    if arg != "auto":
        return arg
    if os.environ.get("ZOOMER_TEST_PG_URL"):
        return os.environ["ZOOMER_TEST_PG_URL"]
    out = subprocess.run(["bash", str(REPO / ".ci" / "start-postgres"), "--url"], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"postgresql: skipped ({out.stderr.strip().splitlines()[-1] if out.stderr.strip() else 'no server'})")
        return None
    return out.stdout.strip().splitlines()[-1]


def fresh_pg_database(url: str) -> str:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    name = f"zoomer_bench_{os.getpid()}"
    admin = create_engine(resolve_url(url), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    return make_url(resolve_url(url)).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(url: str, bench_url: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    dispose_engine(bench_url)
    admin = create_engine(resolve_url(url), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{make_url(bench_url).database}" WITH (FORCE)')
    admin.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--findings", type=int, default=1_000_000)
    ap.add_argument("--weeks", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sqlite", default=None, help="SQLite file (default: a temporary one)")
    ap.add_argument("--pg", default="auto", help="PostgreSQL URL, 'auto' ($ZOOMER_TEST_PG_URL or .ci/start-postgres), or 'none'")
    ap.add_argument("--no-sqlite", action="store_true")
    args = ap.parse_args()

    t = time.perf_counter()
    p = plan(args.findings, args.weeks)
    data = rows(p)
    print(f"generated {len(data[3]):,} findings in {time.perf_counter() - t:.1f} s "
          f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")
    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            path = args.sqlite or str(Path(tmp) / "bench.db")
            if os.path.exists(path):
                os.unlink(path)
            url = "sqlite:///" + path
            bench("sqlite", url, data, p, args.repeat)
            dispose_engine(url)
    url = pg_url(args.pg)
    if url:
        bench_url = fresh_pg_database(url)
        try:
            bench("postgresql", bench_url, data, p, args.repeat)
        finally:
            drop_pg_database(url, bench_url)


if __name__ == "__main__":
    main()
