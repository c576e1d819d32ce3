"""Store URLs of a database the store does not run on, or a driver that is missing: the advice names what
is wrong. The store runs on SQLite and PostgreSQL only (the schema and the writers' upserts are theirs);
a mysql:// URL used to end in "No module named 'MySQLdb' (install psycopg[binary])", exit 1."""

from __future__ import annotations

import importlib.util

import pytest
from store_support import make_analysis

from zoomer_ar.cli import main

ARGVS = [["digest"], ["history", "x"], ["record", "{findings}"], ["db", "upgrade"], ["worker", "--exit-when-idle"]]


@pytest.mark.parametrize("url", ["mysql://u:secret@h/db", "mysql+pymysql://h/db", "mariadb://h/db", "mssql://h/db",
                                 "oracle://h/db"])
@pytest.mark.parametrize("argv", ARGVS, ids=lambda a: a[0])
def test_a_database_the_store_does_not_run_on_is_one_line_exit_2(tmp_path, capsys, url, argv):
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("j").model_dump_json())
    assert main([a.format(findings=f) for a in argv] + ["--db", url, *(["--data", str(tmp_path)] if argv[0] == "worker" else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    backend = url.split(":")[0].split("+")[0]
    assert len(err) == 1, err
    assert f"{backend} is not supported: the store runs on SQLite or PostgreSQL" in err[0], err
    assert "psycopg" not in err[0] and "secret" not in err[0]


def test_an_asynchronous_postgresql_driver_is_one_line_exit_2(capsys):
    assert main(["history", "x", "--db", "postgresql+asyncpg://h/db"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("zoomer-ar: error: postgresql+asyncpg://h/db: the asyncpg driver is asynchronous; use "
                   "postgresql://user@host/db, which uses psycopg 3")


@pytest.mark.skipif(importlib.util.find_spec("psycopg2") is not None, reason="psycopg2 is installed here")
def test_a_missing_postgresql_driver_is_named(capsys):
    assert main(["history", "x", "--db", "postgresql+psycopg2://h/db"]) == 1
    err = capsys.readouterr().err.strip()
    assert "No module named 'psycopg2'" in err and "install the psycopg2 driver" in err
    assert "psycopg[binary]" not in err and len(err.splitlines()) == 1
