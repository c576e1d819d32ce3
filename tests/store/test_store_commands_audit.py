"""Regression tests for the store's commands as a user meets them: `digest` and `history` on a PostgreSQL
server that goes away."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, event
from sqlalchemy.engine import make_url

from zoomer_ar.cli import main
from zoomer_ar.store.db import dispose_engine, open_store, resolve_url
from zoomer_ar.store.record import RecordOptions, record_analysis

from store_support import make_analysis, pg_server_url, pg_url, sqlite_url, store_url  # noqa: F401 - fixtures


# --- the server goes away while digest or history reads --------------------------------------------------


class ServerGone:
    """Cuts a test database off its server as a crash or a restart does: it accepts no new connection and
    its open connections are dropped (pg_terminate_backend); `restore()` lets connections in again."""

    def __init__(self, url: str):
        self.db = make_url(resolve_url(url)).database
        self.admin = create_engine(resolve_url(url).rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")

    def cut(self) -> None:
        with self.admin.connect() as c:
            c.exec_driver_sql(f'ALTER DATABASE "{self.db}" ALLOW_CONNECTIONS false')
            c.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              f"WHERE datname = '{self.db}' AND pid <> pg_backend_pid()")

    def restore(self) -> None:
        with self.admin.connect() as c:
            c.exec_driver_sql(f'ALTER DATABASE "{self.db}" ALLOW_CONNECTIONS true')
        self.admin.dispose()


@pytest.mark.parametrize("argv", [["digest"], ["digest", "--format", "json", "--team", "vision"],
                                  ["history", "resnet"], ["history", "resnet", "--format", "json"]])
@pytest.mark.parametrize("when", ["before-connecting", "mid-query"])
def test_server_gone_while_reading_is_one_line_exit_1(pg_url, capsys, argv, when):
    """`digest` and `history` on a PostgreSQL server that went away after the store was opened (the pooled
    connection dropped, no new one accepted) or during their queries ended in 'internal error:
    OperationalError: (psycopg.OperationalError) ...' and SQLAlchemy's 'Background on this error' line;
    now one line naming the store, exit 1 (as `record` already did)."""
    for week, pct in (("2026-W47", 30.0), ("2026-W48", 20.0)):
        record_analysis(make_analysis("resnet", findings={"idle-gpu": pct}),
                        RecordOptions(team="vision", gpu_hours=100.0, week=week), db=pg_url)
    engine = open_store(pg_url)  # opened and migrated: the command reuses this engine and its pooled connection
    gone = ServerGone(pg_url)
    statements = []

    def cut_on_second_statement(*_args) -> None:  # noqa: ANN002
        statements.append(1)
        if len(statements) == 2:
            gone.cut()  # the statement about to run meets a dropped connection

    if when == "mid-query":
        event.listen(engine, "before_cursor_execute", cut_on_second_statement)
    else:
        gone.cut()
    capsys.readouterr()
    try:
        rc = main([*argv, "--db", pg_url])
    finally:
        if when == "mid-query":
            event.remove(engine, "before_cursor_execute", cut_on_second_statement)
        gone.restore()
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert "internal error" not in err[0] and "cannot read from the store" in err[0], err
    assert out.out == ""
    dispose_engine(pg_url)
    assert main([*argv, "--db", pg_url]) == 0, "the server back: the same command works"
