"""Fixtures and builders for the store tests (imported by the test modules; tests/store has no conftest).

`store_url` runs a test once on SQLite and once on a real PostgreSQL server, each in a fresh database.
PostgreSQL comes from ZOOMER_TEST_PG_URL, else from `.ci/start-postgres`; when neither works the
PostgreSQL variant is skipped locally with the reason, and fails under CI (env CI set).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from zoomer_ar.models import Analysis, Bottleneck, Evidence, Finding, Impact, JobInfo, RankInfo

REPO = Path(__file__).resolve().parents[2]
START_PG = REPO / ".ci" / "start-postgres"
TRACES = Path(os.environ.get("ZOOMER_SHARED_TRACES", REPO.parent / "shared" / "traces"))


def _pg_server() -> tuple[str | None, str]:
    url = os.environ.get("ZOOMER_TEST_PG_URL")
    if url:
        return url, ""
    if not START_PG.is_file():
        return None, f"ZOOMER_TEST_PG_URL is not set and {START_PG} is missing"
    try:
        out = subprocess.run(["bash", str(START_PG), "--url"], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"ZOOMER_TEST_PG_URL is not set and .ci/start-postgres failed: {exc}"
    if out.returncode != 0 or not out.stdout.strip():
        tail = " ".join(out.stderr.strip().splitlines()[-3:])
        return None, f"ZOOMER_TEST_PG_URL is not set and .ci/start-postgres failed (exit {out.returncode}): {tail}"
    return out.stdout.strip().splitlines()[-1], ""


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    url, reason = _pg_server()
    if url is None:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is required in CI: {reason}")
        pytest.skip(f"PostgreSQL variant skipped: {reason}")
    return url


def _with_database(url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    from zoomer_ar.store.db import resolve_url

    return make_url(resolve_url(url)).set(database=name).render_as_string(hide_password=False)


@pytest.fixture
def pg_url(pg_server_url):
    """A fresh, empty PostgreSQL database for one test (dropped afterwards)."""
    with fresh_pg_database(pg_server_url, f"zt_{uuid.uuid4().hex[:16]}") as url:
        yield url


@contextlib.contextmanager
def fresh_pg_database(pg_server_url: str, name: str, options: str = "", skip_if_refused: str = ""):
    """A PostgreSQL database `name` created with `options` (after CREATE DATABASE), its URL yielded, dropped
    afterwards; where the server refuses it and `skip_if_refused` is given, the test is skipped with that reason."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import DBAPIError

    from zoomer_ar.store.db import dispose_engine, resolve_url

    admin = create_engine(resolve_url(pg_server_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.exec_driver_sql(f'CREATE DATABASE "{name}" {options}'.rstrip())
    except DBAPIError as exc:
        admin.dispose()
        if not skip_if_refused:
            raise
        pytest.skip(f"{skip_if_refused}: {str(exc.orig).splitlines()[0]}")
    url = _with_database(pg_server_url, name)
    try:
        yield url
    finally:
        dispose_engine(url)
        with admin.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path):
    from zoomer_ar.store.db import dispose_engine

    url = "sqlite:///" + str(tmp_path / "store.db")
    yield url
    dispose_engine(url)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request) -> str:
    """The same test on both databases."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def make_analysis(
    name: str = "job",
    *,
    key: str | None = None,
    findings: dict[str, float] | None = None,
    wall_ms: float = 1000.0,
    world_size: int = 1,
    has_accelerator: bool = True,
    phases: dict[str, float] | None = None,
    start_unix_s: float | None = None,
    tool_version: str = "0.1.0",
    devices: tuple[str, ...] = ("NVIDIA H100 80GB HBM3",),
) -> Analysis:
    """A small synthetic Analysis: findings are {pattern: pct_of_step}; `key` makes the content hash."""
    sha = hashlib.sha256((key or f"{name}-{uuid.uuid4().hex}").encode()).hexdigest()
    phases = phases or {"dataloader": 10.0, "forward": 30.0, "backward": 40.0, "optimizer": 5.0,
                        "communication": 5.0, "idle": 10.0}
    features = {
        "world_size": world_size, "n_ranks": 1, "has_gpu": has_accelerator, "has_accelerator": has_accelerator,
        "wall_ms": wall_ms, "step_ms": wall_ms / 10, "profiler_steps": 10,
        "phase_basis": "gpu" if has_accelerator else "host", "trace_start_unix_s": start_unix_s,
    }
    features |= {f"phase_{p}_pct": v for p, v in phases.items()}
    fs = []
    for pattern, pct in (findings or {}).items():
        fs.append(Finding(
            pattern=pattern, title=pattern, severity="medium", confidence=0.9,
            impact=Impact(ms_per_step=pct, pct_of_step=pct, gpu_hours_per_1000_steps=0.001),
            evidence=Evidence(figures={"x": 1.0}), recommendation="fix it",
        ))
    return Analysis(
        tool_version=tool_version, feature_schema_version="1.0.0",
        job=JobInfo(name=name, path=f"/traces/{name}.json.gz", world_size=world_size, ranks=[
            RankInfo(path=f"/traces/{name}.json.gz", rank=0, rank_source="default", sha256=sha, size_bytes=1234,
                     n_events=100, devices=list(devices))]),
        features=features, bottleneck=Bottleneck(type="unknown", shares={}, summary=""), findings=fs,
    )
