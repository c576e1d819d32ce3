"""`batch` whose store is lost mid-batch (a PostgreSQL database dropped, a SQLite file deleted or locked by another
process): it failed each remaining trace after its analysis, one by one (a locked file: a minute's wait each), and a
deleted SQLite file took every later run with it while each was reported "recorded". Now the loss is said once,
the batch goes on analysing and writing the reports, and ends non-zero with one line naming the store."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import make_url

from zoomer_ar.cli import main
from zoomer_ar.store.db import dispose_engine, open_store, resolve_url
from zoomer_ar.store.orm import Analysis

from store_support import REPO, pg_server_url, pg_url  # noqa: F401 - fixtures

distributed = pytest.importorskip("distributed")

EXAMPLES = REPO / "examples" / "traces"
TRACES = [EXAMPLES / "sync_point", EXAMPLES / "dataloader_bound", EXAMPLES / "clean"]


@pytest.fixture(scope="module")
def cluster():
    c = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
                                  scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
    yield c
    c.close()


def _batch_losing_the_store_after_the_first(db: str, out: Path, cluster, lose) -> tuple:  # noqa: ANN001
    from zoomer_ar.service.batch import describe, run_batch

    lines: list[str] = []

    def on_result(r, done, total):  # noqa: ANN001
        lines.append(describe(r))
        if done == 1:
            lose()

    result = run_batch([str(p) for p in TRACES], db=db, out_dir=out, cluster=cluster, on_result=on_result)
    return result, lines


def _check_went_on_without_the_store(result, lines: list[str], out: Path, named: str) -> None:  # noqa: ANN001
    assert [r.ok for r in result.results] == [True, True, True], lines
    assert [r.recorded is not None for r in result.results].count(True) == 1, lines  # the first only
    assert result.store_lost is not None and named in result.store_lost, result.store_lost
    assert sum(named in line for line in lines) == 1, lines  # said once
    assert all("not recorded (the store was lost)" in line for line in lines[2:]), lines
    assert sorted(p.name for p in out.iterdir()) == ["clean", "dataloader_bound", "sync_point"]  # every report
    assert all((out / d / "report.html").is_file() for d in ("clean", "dataloader_bound", "sync_point"))


def test_a_sqlite_store_deleted_mid_batch_is_said_not_silently_written_into(tmp_path, cluster):
    db = tmp_path / "store.db"

    def delete() -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)

    try:
        result, lines = _batch_losing_the_store_after_the_first(str(db), tmp_path / "out", cluster, delete)
    finally:
        dispose_engine(str(db))
    _check_went_on_without_the_store(result, lines, tmp_path / "out", str(db))
    assert "was deleted during the batch" in result.store_lost


def test_a_postgresql_database_dropped_mid_batch(pg_url, tmp_path, cluster):
    url = make_url(resolve_url(pg_url))

    def drop() -> None:
        admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE "{url.database}" WITH (FORCE)')
        admin.dispose()

    result, lines = _batch_losing_the_store_after_the_first(pg_url, tmp_path / "out", cluster, drop)
    _check_went_on_without_the_store(result, lines, tmp_path / "out", f"/{url.database}")
    assert f'database "{url.database}" does not exist' in result.store_lost


def test_batch_with_a_store_locked_by_another_process_waits_once_and_exits_1(tmp_path, monkeypatch, capsys):
    """Each trace waited the whole busy timeout (a minute) and failed: exit 2, nothing analysed counted; now the
    first wait marks the store lost, the others are analysed and reported, exit 1 with one line naming the store."""
    import zoomer_ar.store.db as store_db

    db = tmp_path / "store.db"
    open_store(str(db))
    dispose_engine(str(db))
    monkeypatch.setattr(store_db, "SQLITE_BUSY_TIMEOUT_S", 1.0)  # a minute in real use
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process writing, for longer than the batch
    try:
        rc = main(["batch", *map(str, TRACES[:2]), "--db", str(db), "--out", str(tmp_path / "out"), "--no-progress",
                   "--workers", "1"])
    finally:
        holder.rollback()
        holder.close()
        dispose_engine(str(db))
    captured = capsys.readouterr()
    assert rc == 1, captured.out + captured.err
    assert "batch: 2 analysed, 0 failed" in captured.out, captured.out
    lost = [line for line in captured.out.splitlines() if line.startswith("  store lost: ")]
    assert len(lost) == 1 and str(db) in lost[0] and "locked by another process" in lost[0], captured.out
    assert lost[0].endswith("2 analysed traces not recorded (their reports were written)"), lost[0]
    assert captured.err.count("locked by another process") == 1, captured.err
    assert sorted(os.listdir(tmp_path / "out")) == ["dataloader_bound", "sync_point"]
    with open_store(str(db)).connect() as c:
        assert c.execute(select(func.count()).select_from(Analysis)).scalar() == 0
    dispose_engine(str(db))
