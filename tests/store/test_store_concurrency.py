"""Several processes recording at once into a fresh store lose nothing and duplicate nothing.

Each process records the same shared analyses (only one of them may win each) and its own
analyses, starting together on an empty database (so the migrations race too). Run on SQLite
(WAL, busy timeout, BEGIN IMMEDIATE, retries) and PostgreSQL (ON CONFLICT on unique keys, retries).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from zoomer_ar.store.db import open_store, read_session
from zoomer_ar.store.digest import build_digest
from zoomer_ar.store.orm import Analysis, Finding, Job, Trace

from store_support import REPO, make_analysis, pg_server_url, pg_url, sqlite_url, store_url  # noqa: F401

PROCESSES = 6
SHARED = 4
OWN = 5

CHILD = r"""
import json, os, sys, time
from pathlib import Path
from zoomer_ar.models import Analysis
from zoomer_ar.store.record import RecordOptions, record_analysis

url, go, plan = sys.argv[1], Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text())
deadline = time.time() + 60
while not go.exists() and time.time() < deadline:
    time.sleep(0.002)
out = []
for item in plan:
    a = Analysis.model_validate_json(Path(item["file"]).read_text())
    r = record_analysis(a, RecordOptions(job=item["job"], team=item["team"], gpu_hours=item["gpu_hours"],
                                         gpu_hour_cost=2.0, week=item["week"]), db=url)
    out.append([item["file"], r.status, r.analysis_id])
print(json.dumps(out))
"""


def _write(tmp: Path, name: str, a) -> str:
    p = tmp / f"{name}.json"
    p.write_text(a.model_dump_json())
    return str(p)


@pytest.mark.parametrize("via", ["api"])
def test_concurrent_recorders_lose_nothing(store_url, tmp_path, via):
    shared = [_write(tmp_path, f"shared{i}", make_analysis(f"shared{i}", findings={"idle-gpu": 10.0 + i, "sync-point": 2.0}))
              for i in range(SHARED)]
    plans = []
    for p in range(PROCESSES):
        own = [_write(tmp_path, f"p{p}-{k}", make_analysis(f"p{p}", findings={"launch-bound": 5.0, "extra-copy": 1.0 + k}))
               for k in range(OWN)]
        items = [{"file": f, "job": "shared-job", "team": "core", "gpu_hours": 10.0, "week": "2026-W48"} for f in shared]
        items += [{"file": f, "job": f"job-{p}", "team": "core", "gpu_hours": 1.0, "week": "2026-W48"} for f in own]
        # interleave so shared and own writes contend
        items = items[p % len(items):] + items[: p % len(items)]
        plan = tmp_path / f"plan{p}.json"
        plan.write_text(json.dumps(items))
        plans.append(plan)
    go = tmp_path / "go"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, str(script), store_url, str(go), str(plan)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for plan in plans]
    time.sleep(1.5)  # let them import, then release them together
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results.extend(json.loads(out.strip().splitlines()[-1]))

    # every shared analysis was recorded exactly once; every other recorder saw it as existing
    for f in shared:
        statuses = sorted(s for file, s, _ in results if file == f)
        assert statuses.count("recorded") == 1 and statuses.count("exists") == PROCESSES - 1, (f, statuses)
        assert len({aid for file, _, aid in results if file == f}) == 1
    assert all(s == "recorded" for file, s, _ in results if file not in shared)

    engine = open_store(store_url)
    with read_session(engine) as s:
        n = {t.__tablename__: s.execute(select(func.count()).select_from(t)).scalar_one()
             for t in (Job, Trace, Analysis, Finding)}
    assert n == {"jobs": 1 + PROCESSES, "traces": SHARED + PROCESSES * OWN,
                 "analyses": SHARED + PROCESSES * OWN, "findings": 2 * (SHARED + PROCESSES * OWN)}
    d = build_digest(engine, week="2026-W48")
    got = {p.pattern: p.wasted_gpu_hours for p in d.patterns}
    assert got["idle-gpu"] == pytest.approx(sum((10.0 + i) / 100 * 10.0 for i in range(SHARED)))
    assert got["sync-point"] == pytest.approx(SHARED * 0.02 * 10.0)
    assert got["launch-bound"] == pytest.approx(PROCESSES * OWN * 0.05)
    assert got["extra-copy"] == pytest.approx(PROCESSES * sum((1.0 + k) / 100 for k in range(OWN)))
    assert d.gpu_hours == pytest.approx(SHARED * 10.0 + PROCESSES * OWN * 1.0)
