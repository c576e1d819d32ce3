"""Store schema: Alembic migrations create what the ORM models describe; URLs, weeks."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from zoomer_ar.store import db as D
from zoomer_ar.store import weeks as W
from zoomer_ar.store.orm import Base

from store_support import pg_server_url, pg_url, sqlite_url, store_url  # noqa: F401 - fixtures

TABLES = {"jobs", "traces", "models", "analyses", "findings", "verdicts", "alembic_version"}


def test_migrations_create_every_table_and_index(store_url):
    engine = D.open_store(store_url)
    insp = inspect(engine)
    assert TABLES <= set(insp.get_table_names())
    assert D.current_revision(engine) == D.head_revision()
    idx = {i["name"] for i in insp.get_indexes("findings")}
    assert {"ix_findings_week_pattern", "ix_findings_job_week_pattern", "ix_findings_analysis_id"} <= idx
    uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints("analyses")}
    assert ("trace_id",) in uniques
    assert ("content_hash",) in {tuple(u["column_names"]) for u in insp.get_unique_constraints("traces")}


def test_orm_models_match_the_migrations(store_url):
    """Autogenerate finds nothing to do: the migrations and orm.py describe the same schema."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = D.open_store(store_url)
    with engine.connect() as conn:
        mc = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(mc, Base.metadata)
    assert diff == []


def test_upgrade_is_idempotent(store_url):
    engine = D.open_store(store_url)
    D.upgrade(engine)
    D.upgrade(engine)
    assert D.current_revision(engine) == D.head_revision()


def test_sqlite_is_in_wal_mode_with_a_busy_timeout(sqlite_url):
    engine = D.open_store(sqlite_url)
    with engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 30000
        assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_url_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("ZOOMER_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    if D.sys.platform.startswith("linux"):
        assert D.resolve_url(None) == f"sqlite:///{tmp_path}/zoomer-ar/zoomer.db"
    monkeypatch.setenv("ZOOMER_DB", "postgresql://u:secret@db.example/zoomer")
    assert D.resolve_url(None) == "postgresql+psycopg://u:secret@db.example/zoomer"
    assert "secret" not in D.redact(D.resolve_url(None))
    assert D.resolve_url("postgres://h/x") == "postgresql+psycopg://h/x"
    assert D.resolve_url(str(tmp_path / "a.db")) == f"sqlite:///{tmp_path}/a.db"
    assert D.resolve_url("sqlite:///x.db") == "sqlite:///x.db"


def test_default_store_is_created_in_the_user_data_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("ZOOMER_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    if not D.sys.platform.startswith("linux"):
        pytest.skip("XDG layout is Linux's")
    try:
        D.open_store(None)
        assert (tmp_path / "zoomer-ar" / "zoomer.db").is_file()
    finally:
        D.dispose_engine(None)


def test_unreachable_store_is_a_one_line_error(tmp_path):
    from zoomer_ar.cli import main

    rc = main(["digest", "--db", "postgresql://nobody@127.0.0.1:1/none"])
    assert rc == 1


@pytest.mark.parametrize("text,week", [("2026-W48", "2026-W48"), ("2026W48", "2026-W48"), ("2026-w5", "2026-W05"),
                                       ("2020-W53", "2020-W53")])
def test_parse_week(text, week):
    assert W.parse_week(text) == week


@pytest.mark.parametrize("text", ["2026-48", "2026-W54", "2021-W53", "last week", ""])
def test_parse_week_rejects(text):
    with pytest.raises(W.WeekError):
        W.parse_week(text)


def test_week_arithmetic():
    assert W.previous("2026-W02", 4) == ["2025-W50", "2025-W51", "2025-W52", "2026-W01"]
    assert W.shift("2020-W53", 1) == "2021-W01"
    assert W.week_of(W.week_start("2026-W48")) == "2026-W48"
    assert W.week_start("2026-W48").weekday() == 0
    assert W.week_of(W.parse_time("2026-11-24")) == "2026-W48"
    # labels sort as text in time order
    weeks = [W.shift("2025-W40", k) for k in range(30)]
    assert weeks == sorted(weeks)


def test_migrations_ship_with_the_package():
    root = Path(D.MIGRATIONS_DIR)
    assert (root / "env.py").is_file() and list((root / "versions").glob("0001_*.py"))
