"""Regression tests for the store's commands as a user meets them: `digest` and `history` on a PostgreSQL
server that goes away, control characters in the job, team and owner options."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, event, func, select
from sqlalchemy.engine import make_url

from zoomer_ar.cli import main
from zoomer_ar.store.db import dispose_engine, open_store, read_session, resolve_url
from zoomer_ar.store.orm import Analysis
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
    assert "internal error" not in err[0] and ("cannot read from the store" in err[0]
                                               or "cannot open the store" in err[0]), err
    assert out.out == ""
    dispose_engine(pg_url)
    assert main([*argv, "--db", pg_url]) == 0, "the server back: the same command works"


# --- control characters in the names a user gives ------------------------------------------------------


def _recorded(url: str) -> int:
    with read_session(open_store(url)) as s:
        return s.execute(select(func.count()).select_from(Analysis)).scalar_one()


@pytest.mark.parametrize("option,value,says", [
    ("--job", "resnet\nweek 2026-W01: all clear", "control character ('\\n')"),
    ("--job", "a\x00b", "control character ('\\x00')"),
    ("--team", "vision\x1b[2J", "control character ('\\x1b')"),
    ("--owner", "ana\rmallory", "control character ('\\r')"),
    ("--owner", "ana\u2028bob", "control character ('\\u2028')"),
    ("--gpu-type", "H100\x07", "control character ('\\x07')"),
    ("--team", "", "may not be empty"),
    ("--job", "  ", "may not be empty"),
    ("--team", "vision ", "may not start or end with spaces"),
])
def test_names_with_control_characters_are_refused(store_url, tmp_path, capsys, option, value, says):
    """`record --job 'a<newline>b'` (and --team, --owner with a newline, ESC or another control character)
    was recorded as given, and every report then carried it: history's text lines split, the digest's
    tables broke, a terminal ran the escape sequence; an empty --team was stored as team '' (which the job
    then kept for ever) and `digest --team ''` showed every team. Now each is a usage error naming the option,
    exit 2, before anything is recorded; the service refuses the same characters."""
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("resnet", findings={"idle-gpu": 30.0}).model_dump_json())
    rc = main(["record", str(f), option, value, "--db", store_url])
    err = capsys.readouterr().err
    assert rc == 2 and f"Invalid value for '{option}'" in err and says in err, err
    assert "internal error" not in err
    assert _recorded(store_url) == 0


def test_good_names_are_still_recorded(store_url, tmp_path, capsys):
    """Letters of any script, spaces inside, punctuation: recorded as given."""
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("resnet", findings={"idle-gpu": 30.0}).model_dump_json())
    assert main(["record", str(f), "--job", "résumé 50/ℤ", "--team", "ML Infra", "--owner", "Zoë (on call)",
                 "--db", store_url]) == 0
    capsys.readouterr()
    assert main(["digest", "--team", "ML Infra", "--format", "json", "--db", store_url]) == 0
    job = json.loads(capsys.readouterr().out)["jobs"][0]
    assert (job["job"], job["team"], job["owner"]) == ("résumé 50/ℤ", "ML Infra", "Zoë (on call)")


@pytest.mark.parametrize("argv", [
    ["digest", "--team", ""],
    ["digest", "--team", "a\nb"],
    ["batch", "{trace}", "--team", "vision\n", "--no-progress"],
    ["analyze", "{trace}", "--record", "--owner", "\x1b]0;pwned\x07", "--out", "{out}"],
])
def test_other_commands_refuse_them_before_any_work(sqlite_url, tmp_path, capsys, argv):
    """`digest --team ''` silently meant every team; `batch --team` and `analyze --record --owner` recorded
    control characters like `record` did. Now a usage error, exit 2: no store created, no output folder."""
    from store_support import REPO

    trace, out = REPO / "examples" / "traces" / "clean", tmp_path / "out"
    args = [a.format(trace=trace, out=out) for a in argv]
    rc = main([*args, "--db", sqlite_url])
    err = capsys.readouterr().err
    assert rc == 2 and "Invalid value for '--" in err and "internal error" not in err, err
    assert not (tmp_path / "store.db").exists() and not out.exists()


# --- batch --out that cannot be written -----------------------------------------------------------------


def _jobs_recorded(url: str) -> list[str]:
    from zoomer_ar.store.orm import Job

    with read_session(open_store(url)) as s:
        return sorted(s.execute(select(Job.name).join(Analysis, Analysis.job_id == Job.id)).scalars())


def test_batch_out_that_cannot_be_written_records_nothing(sqlite_url, tmp_path, capsys):
    """`batch TRACES --out DIR` where DIR cannot be made (a file in the way) analysed every trace, recorded
    each in the store, then failed each on its reports (exit 2, 'writing the reports failed'), leaving the
    store holding runs whose reports were never written. Now the folder is checked before any work: one line
    naming it, exit 2, no cluster started, no store created."""
    from store_support import REPO

    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a folder\n")
    out = blocker / "reports"
    rc = main(["batch", str(REPO / "examples" / "traces" / "clean"), str(REPO / "examples" / "traces" / "sync_point"),
               "--out", str(out), "--db", sqlite_url, "--no-progress"])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(out) in err[0] and "internal error" not in err[0], err
    assert captured.out == "" and not (tmp_path / "store.db").exists()
    assert blocker.read_text() == "a file, not a folder\n"


def test_batch_trace_whose_reports_cannot_be_written_is_not_recorded(store_url, tmp_path, capsys):
    """A trace whose reports could not be written while the batch ran (here a folder where its report.md
    goes; a full disk likewise) was recorded and then reported failed; now its reports are written inside
    the recording's transaction, so it is not recorded, and the other traces are recorded with their reports."""
    from store_support import REPO

    reports = tmp_path / "reports"
    traces = [REPO / "examples" / "traces" / "clean", REPO / "examples" / "traces" / "sync_point"]
    earlier = reports / "clean"  # this input's earlier reports, where report.md cannot be replaced
    (earlier / "report.md").mkdir(parents=True)
    (earlier / "report.md" / "keep").write_text("in the way\n")
    (earlier / "findings.json").write_text(json.dumps({"job": {"path": str(traces[0])}}))
    rc = main(["batch", *map(str, traces), "--out", str(reports), "--db", store_url, "--workers", "1",
               "--no-progress"])
    text = capsys.readouterr()
    assert rc == 1, text
    assert "batch: 1 analysed, 1 failed" in text.out and "writing the reports failed" in text.out, text
    assert _jobs_recorded(store_url) == ["sync_point"]
    assert (reports / "sync_point" / "report.html").is_file()
    assert (earlier / "report.md" / "keep").read_text() == "in the way\n"


# --- a SQLite store damaged past its schema --------------------------------------------------------------


def _damage_table(db_file, table: str) -> None:  # noqa: ANN001 - a Path
    """Overwrite the root page of `table` with garbage (the header and the schema stay readable), as a disk
    error or a copy cut short does: SQLite opens the file and fails only when that table is read."""
    import sqlite3

    con = sqlite3.connect(db_file)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("PRAGMA journal_mode=DELETE")
    page = con.execute("PRAGMA page_size").fetchone()[0]
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    con.close()
    data = bytearray(db_file.read_bytes())
    start = (root - 1) * page
    data[start + 8:start + page] = b"\xab" * (page - 8)
    db_file.write_bytes(bytes(data))


@pytest.mark.parametrize("argv", [["record", "{new}"], ["record", "{same}"], ["record", "{new}", "--team", "vision"],
                                  ["digest"], ["history", "resnet"]])
def test_a_store_damaged_past_its_schema_is_one_line_exit_2(sqlite_url, tmp_path, capsys, argv):
    """A SQLite store whose analyses table is damaged (its schema intact, so the store opens) made `record` an
    internal error: 'DatabaseError: (sqlite3.DatabaseError) database disk image is malformed' with the SQL, over
    several lines. Now, as for a file that is not a store at all, one line naming the file, exit 2."""
    same = tmp_path / "same.json"
    new = tmp_path / "new.json"
    first = make_analysis("resnet", findings={"idle-gpu": 30.0})
    record_analysis(first, RecordOptions(team="vision", gpu_hours=10.0), db=sqlite_url)
    same.write_text(first.model_dump_json())
    new.write_text(make_analysis("resnet", findings={"idle-gpu": 20.0}).model_dump_json())
    dispose_engine(sqlite_url)
    db_file = tmp_path / "store.db"
    _damage_table(db_file, "analyses")
    capsys.readouterr()
    rc = main([a.format(new=new, same=same) for a in argv] + ["--db", sqlite_url])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert str(db_file) in err[0] and "malformed" in err[0] and "internal error" not in err[0], err


# --- a store a newer zoomer-ar migrated --------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["digest"], ["history", "resnet"], ["record", "{new}"], ["db", "upgrade"],
                                  ["analyze", "{trace}", "--record", "--no-files"]])
def test_a_store_of_a_newer_schema_is_one_line_exit_2(store_url, tmp_path, capsys, argv):
    """A store whose schema a newer zoomer-ar migrated (alembic_version at a revision this version has no
    migration for) made every store command an internal error: 'CommandError: Can't locate revision identified
    by ...'. Now one line naming the store and the revision, exit 2, and the store is left as it was."""
    from sqlalchemy import text

    from store_support import REPO

    record_analysis(make_analysis("resnet", findings={"idle-gpu": 30.0}), RecordOptions(gpu_hours=10.0), db=store_url)
    with open_store(store_url).begin() as c:
        c.execute(text("UPDATE alembic_version SET version_num = '0099_from_the_future'"))
    dispose_engine(store_url)
    new = tmp_path / "new.json"
    new.write_text(make_analysis("resnet", findings={"idle-gpu": 20.0}).model_dump_json())
    capsys.readouterr()
    args = [a.format(new=new, trace=REPO / "examples" / "traces" / "clean") for a in argv]
    rc = main([*args, "--db", store_url])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "'0099_from_the_future'" in err[0] and "newer zoomer-ar" in err[0] and "internal error" not in err[0], err
    dispose_engine(store_url)
    engine = create_engine(resolve_url(store_url))
    try:
        with engine.connect() as c:
            assert c.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == "0099_from_the_future"
            assert c.execute(text("SELECT count(*) FROM analyses")).scalar_one() == 1
    finally:
        engine.dispose()


# --- a store this user cannot write ---------------------------------------------------------------------


@contextmanager
def read_only_folder(folder):  # noqa: ANN001, ANN201 - a Path
    """`folder` and its files made read-only for this process: permissions for a normal user; for root (whom
    permissions do not stop) a read-only bind mount of the folder on itself. Skips where neither works."""
    import stat
    import subprocess

    if os.geteuid() != 0:
        files = [p for p in folder.iterdir() if p.is_file()]
        for p in files:
            p.chmod(stat.S_IRUSR | stat.S_IRGRP)
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            yield
        finally:
            folder.chmod(stat.S_IRWXU)
            for p in files:
                p.chmod(stat.S_IRUSR | stat.S_IWUSR)
        return
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot make a read-only folder as root here: {mounted.stderr.decode().strip()}")
    try:
        ro = subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True)
        if ro.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {ro.stderr.decode().strip()}")
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_store_this_user_cannot_write_is_still_read(tmp_path, capsys):
    """`digest` and `history` on a SQLite store the user may read but not write (a team's store file owned by
    another account, a read-only mount, a snapshot) failed: 'cannot open the store ...: unable to open database
    file' (a WAL store needs its -shm file beside it, which the connection could not make) or 'attempt to write
    a readonly database' (the connection switched the store to WAL). Now they read it (opened read-only) and
    answer what they answer where it can be written; `record` says the store is read-only here, exit 1; the
    file is left byte for byte as it was."""
    folder = tmp_path / "shared"
    folder.mkdir()
    url = "sqlite:///" + str(folder / "store.db")
    for week, pct in (("2026-W47", 30.0), ("2026-W48", 20.0)):
        record_analysis(make_analysis("resnet", findings={"idle-gpu": pct}),
                        RecordOptions(team="vision", gpu_hours=100.0, gpu_hour_cost=2.0, week=week), db=url)
    queries = [["digest", "--format", "json"], ["digest", "--team", "vision", "--week", "2026-W47", "--format", "json"],
               ["history", "resnet", "--format", "json"]]

    def answers() -> list[dict]:
        out = []
        for argv in queries:
            assert main([*argv, "--db", url]) == 0, capsys.readouterr().err
            doc = json.loads(capsys.readouterr().out)
            doc.pop("generated_at", None)
            out.append(doc)
        return out

    writable = answers()
    dispose_engine(url)
    assert sorted(p.name for p in folder.iterdir()) == ["store.db"], "the last connection closed: WAL files gone"
    before = (folder / "store.db").read_bytes()
    new = tmp_path / "new.json"
    new.write_text(make_analysis("resnet", findings={"idle-gpu": 10.0}).model_dump_json())
    with read_only_folder(folder):
        try:
            assert answers() == writable
            rc = main(["record", str(new), "--db", url])
            err = capsys.readouterr().err.strip().splitlines()
            assert rc == 1 and len(err) == 1 and "read-only here" in err[0] and "internal error" not in err[0], err
        finally:
            dispose_engine(url)  # the read-only engine too: nothing holds the file when the folder is unmounted
    assert (folder / "store.db").read_bytes() == before


# --- history's most recent runs -------------------------------------------------------------------------


def test_history_limit_keeps_the_latest_recorded_runs_on_both_stores(store_url, capsys):
    """Runs of one week recorded with --week (trace times outside it) share that week's Monday 00:00, and
    `history --limit N` ordered by week and time alone: which N came back was up to the database. After an
    update moved rows (PostgreSQL rewrites an updated row), PostgreSQL returned the first and the last run
    where SQLite returned the last two. Now the later recorded run counts as the more recent on both."""
    from sqlalchemy import text

    ids = [record_analysis(make_analysis("tie", findings={"idle-gpu": pct}, start_unix_s=1.6e9),
                           RecordOptions(gpu_hours=10.0, week="2026-W40"), db=store_url).analysis_id
           for pct in (10.0, 20.0, 30.0)]
    with open_store(store_url).begin() as c:  # rows rewritten (new index entries): the older runs move on disk
        for week in ("2026-W39", "2026-W40"):
            c.execute(text("UPDATE analyses SET week = :w WHERE id IN (:a, :b)"), {"w": week, "a": ids[0], "b": ids[1]})
    capsys.readouterr()
    assert main(["history", "tie", "--limit", "2", "--format", "json", "--db", store_url]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["analysis_id"] for r in runs] == ids[1:], "the two latest, oldest first"
    assert len({r["recorded_at"] for r in runs}) == 1


def test_digest_top_pattern_of_equal_waste_is_the_same_on_both_stores(store_url):
    """A job's top pattern was the first of its patterns as the database happened to return them: with equal
    waste (findings of the same share of the step), SQLite's sorted GROUP BY named one pattern and PostgreSQL's
    hash aggregate (its plan on a large findings table, forced here) another for each job. Now equal waste
    goes to the first pattern by name on both."""
    from sqlalchemy import event

    patterns = ["zero-grad-not-none", "sync-point", "idle-gpu", "fp32-matmul", "extra-copy", "misaligned-gemm"]
    for j in range(6):
        record_analysis(make_analysis(f"job{j}", findings={p: 10.0 for p in patterns}),
                        RecordOptions(gpu_hours=100.0, week="2026-W48"), db=store_url)
    engine = open_store(store_url)

    def hash_plans(dbapi_conn, _record) -> None:  # noqa: ANN001
        cur = dbapi_conn.cursor()
        for setting in ("enable_indexscan", "enable_bitmapscan", "enable_sort"):
            cur.execute(f"SET {setting} = off")
        cur.close()
        dbapi_conn.commit()

    if engine.dialect.name == "postgresql":
        engine.dispose()
        event.listen(engine, "connect", hash_plans)
    try:
        from zoomer_ar.store.digest import build_digest

        digest = build_digest(engine, week="2026-W48")
    finally:
        if engine.dialect.name == "postgresql":
            event.remove(engine, "connect", hash_plans)
            engine.dispose()
    assert [r.top_pattern for r in digest.jobs] == ["extra-copy"] * 6


# --- weeks and times no run was recorded in ----------------------------------------------------------------


@pytest.mark.parametrize("argv", [["digest", "--week", "0001-W05"], ["record", "{f}", "--week", "0001-W01"],
                                  ["record", "{f}", "--recorded-at", "0001-01-10"],
                                  ["record", "{f}", "--recorded-at", "1969-12-31T23:30:00Z"]])
def test_weeks_before_1970_are_refused(sqlite_url, tmp_path, capsys, argv):
    """`digest --week 0001-W05` was an internal error ('OverflowError: date value out of range': its twelve-week
    chart reaches before the first date), and `record --recorded-at 0001-01-10` recorded a run whose week
    every later digest then failed on. Now a week or time before 1970 is a usage error naming the option,
    exit 2, nothing recorded; 1970 onwards (a time given in another zone by its UTC time) still works."""
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("old", findings={"idle-gpu": 30.0}).model_dump_json())
    rc = main([a.format(f=f) for a in argv] + ["--db", sqlite_url])
    err = capsys.readouterr().err
    assert rc == 2 and "Invalid value for '--" in err and "1970" in err and "internal error" not in err, err
    assert not (tmp_path / "store.db").exists()
    assert main(["record", str(f), "--recorded-at", "1969-12-31T23:30:00-01:00", "--db", sqlite_url]) == 0
    assert main(["digest", "--week", "1970-W01", "--db", sqlite_url]) == 0
    assert "1970-W01" in capsys.readouterr().out


@pytest.mark.parametrize("option", ["--team", "--db"])
def test_batch_store_options_with_no_record_are_a_usage_error(tmp_path, capsys, option):
    """`batch ... --no-record --team vision` (or --db) analysed everything and silently dropped the option;
    `analyze` refuses a store option without --record. Now a usage error naming it, exit 2, before any work."""
    from store_support import REPO

    value = "vision" if option == "--team" else str(tmp_path / "store.db")
    rc = main(["batch", str(REPO / "examples" / "traces" / "clean"), "--no-record", option, value, "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 2 and f"{option} has no effect with --no-record" in captured.err, captured
    assert "ok " not in captured.err + captured.out and not (tmp_path / "store.db").exists()


def test_batch_beside_another_cluster_prints_no_port_warning(tmp_path):
    """With another Dask cluster (another batch) on the machine, every batch printed a 4-line 'UserWarning: Port
    8787 is already in use. Perhaps you already have a cluster running?' among its lines: its LocalCluster,
    meant without a dashboard, still started the scheduler's HTTP server on the default port. Now it takes any
    free port on loopback."""
    import socket
    import subprocess
    import sys

    from store_support import REPO

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", 8787))
        holder.listen()
    except OSError:
        pass  # something holds it already: the same situation
    try:
        out = subprocess.run([sys.executable, "-m", "zoomer_ar", "batch", str(REPO / "examples" / "traces" / "clean"),
                              "--db", str(tmp_path / "store.db"), "--workers", "1", "--no-progress"],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
    finally:
        holder.close()
    assert out.returncode == 0, out.stderr
    assert "8787" not in out.stderr and "Warning" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("[1/1] ok"), out.stderr


# --- reading a database that holds no store ---------------------------------------------------------------


@pytest.mark.parametrize("argv", [["digest"], ["history", "resnet"]])
@pytest.mark.parametrize("kind", ["empty-file", "other-sqlite-database", "other-postgresql-database"])
def test_reading_a_database_that_holds_no_store_changes_nothing(request, tmp_path, capsys, argv, kind):
    """`digest --db DB` or `history` on a database that holds no store (an empty file, another application's
    SQLite file or PostgreSQL database) created the store's eleven tables in it and printed an empty digest
    (exit 0): a read that wrote into someone else's database, where a missing file is refused ('no store at
    this path'). Now one line saying no store is there, exit 2, and the database is left byte for byte (SQLite,
    its journal mode too) or table for table (PostgreSQL) as it was."""
    import sqlite3

    from sqlalchemy import text

    if kind == "other-postgresql-database":
        url = request.getfixturevalue("pg_url")
        engine = create_engine(resolve_url(url))
        with engine.begin() as c:
            c.execute(text("CREATE TABLE customers (id integer, name text)"))
    else:
        db_file = tmp_path / "app.db"
        db_file.touch()
        if kind == "other-sqlite-database":
            con = sqlite3.connect(db_file)
            con.execute("CREATE TABLE bookmarks (id integer primary key, url text)")
            con.commit()
            con.close()
        url, before = str(db_file), db_file.read_bytes()
    rc = main([*argv, "--db", url])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "no store" in err[0] and "internal error" not in err[0], err
    dispose_engine(url)
    if kind == "other-postgresql-database":
        with engine.connect() as c:
            tables = c.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars().all()
        engine.dispose()
        assert tables == ["customers"]
    else:
        assert db_file.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


@pytest.mark.parametrize("argv", [["record", "{f}"], ["db", "upgrade"]])
def test_a_new_store_in_a_folder_this_user_cannot_write_says_so(tmp_path, capsys, argv):
    """`record --db DIR/new.db` (or `db upgrade`) where DIR cannot be written said only SQLite's 'unable to
    open database file'; the line now says no store can be made there and names the folder (exit 1)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "placeholder").write_text("")
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("resnet", findings={"idle-gpu": 30.0}).model_dump_json())
    url = "sqlite:///" + str(folder / "new.db")
    with read_only_folder(folder):
        try:
            rc = main([a.format(f=f) for a in argv] + ["--db", url])
        finally:
            dispose_engine(url)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and f"none can be made: this user cannot write {folder}" in err[0], err
    assert not (folder / "new.db").exists()


@pytest.mark.parametrize("name", ["resnet\nweek 2026-W01: all clear", "x\x1b[31my", "nul\x00job", "a\u2028b"])
def test_a_job_name_from_the_trace_with_control_characters_is_refused(store_url, tmp_path, capsys, name):
    """Without --job the job is named after the trace (analyze's --name, the file's name, a findings.json's
    job.name): one holding a newline or an escape sequence was recorded as is, and broke history's lines and
    the digest's tables as a bad --job did (a NUL became U+FFFD). Now `record` refuses the file before
    recording any of the batch, naming it and saying to give --job (exit 2); with --job it is recorded."""
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(make_analysis("fine", findings={"idle-gpu": 30.0}).model_dump_json())
    bad.write_text(make_analysis(name, findings={"idle-gpu": 30.0}).model_dump_json())
    rc = main(["record", str(good), str(bad), "--db", store_url])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(bad) in err[0] and "--job" in err[0], err
    assert _recorded(store_url) == 0
    assert main(["record", str(bad), "--job", "renamed", "--db", store_url]) == 0
    assert _jobs_recorded(store_url) == ["renamed"]


def test_analyze_record_with_a_name_holding_a_newline_records_nothing(sqlite_url, tmp_path, capsys):
    """`analyze TRACE --record --name 'a<newline>b'` recorded a job named with the newline; now one line
    saying so, exit 2, nothing recorded and no output folder left."""
    from store_support import REPO

    out = tmp_path / "out"
    rc = main(["analyze", str(REPO / "examples" / "traces" / "clean"), "--record", "--name", "evil\nname",
               "--out", str(out), "--db", sqlite_url])
    err = capsys.readouterr().err
    assert rc == 2 and "job name 'evil\\nname' holds a control character" in err, err
    assert not out.exists() and _recorded(sqlite_url) == 0


# --- a --db that is a device or a FIFO ----------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["digest"], ["history", "x"], ["record", "{f}"], ["db", "upgrade"]])
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_db_that_is_a_fifo_or_a_device_is_one_line_exit_2(tmp_path, argv, kind):
    """`--db PIPE` (a FIFO) waited for ever: the check of the SQLite header opened it for reading, which blocks
    until a writer comes; `record --db /dev/null` said 'disk I/O error' (exit 1). Now both are one line saying
    it is not a regular file, exit 2, at once."""
    import subprocess
    import sys

    if kind == "fifo":
        target = tmp_path / "pipe"
        os.mkfifo(target)
    else:
        target = "/dev/null"
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("j").model_dump_json())
    args = [a.format(f=f) for a in argv] + ["--db", str(target)]
    out = subprocess.run([sys.executable, "-m", "zoomer_ar", *args], capture_output=True, text=True, timeout=120)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1, out.stderr
    assert str(target) in err[0] and "not a regular file" in err[0], err
