"""Regression tests for the store audit as a production user runs it (PostgreSQL, compared with SQLite):
a server that goes away mid-run, text PostgreSQL cannot store, impact figures that are not a share of the
step, numbers past the store's columns."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from zoomer_ar.cli import main
from zoomer_ar.store import record as record_mod
from zoomer_ar.store.db import open_store, read_session, resolve_url
from zoomer_ar.store.record import RecordOptions, record_analysis
from zoomer_ar.store.orm import Analysis, Finding, Job, Trace

from store_support import make_analysis, pg_server_url, pg_url, sqlite_url, store_url  # noqa: F401 - fixtures


def count(url: str, table) -> int:  # noqa: ANN001
    with read_session(open_store(url)) as s:
        return s.execute(select(func.count()).select_from(table)).scalar_one()


# --- the server goes away mid-run ------------------------------------------------------------------------


def test_server_gone_mid_record_is_one_line_exit_1(pg_url, tmp_path, capsys, monkeypatch):
    """A PostgreSQL server that went away while `record` ran (connections cut, none accepted) ended in
    'internal error: OperationalError: ...' over several lines, after a psycopg warning ('error ignored
    terminating <psycopg.Pipeline [BAD]>'); now it is one line naming the store (password hidden), exit 1."""
    files = []
    for name in ("first", "second"):
        f = tmp_path / f"{name}.json"
        f.write_text(make_analysis(name, findings={"idle-gpu": 50.0}).model_dump_json())
        files.append(f)
    assert main(["record", str(files[0]), "--db", pg_url]) == 0
    capsys.readouterr()
    db = make_url(resolve_url(pg_url)).database
    admin = create_engine(resolve_url(pg_url).rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    real = record_mod.write_session

    @contextmanager
    def server_goes_away(engine):  # noqa: ANN001, ANN202
        with real(engine) as s:
            s.execute(text("select 1"))
            with admin.connect() as c:  # the database stops accepting connections and drops the open ones
                c.exec_driver_sql(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
                c.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  f"WHERE datname = '{db}' AND pid <> pg_backend_pid()")
            yield s

    monkeypatch.setattr(record_mod, "write_session", server_goes_away)
    try:
        rc = main(["record", str(files[1]), "--db", pg_url])
    finally:
        monkeypatch.setattr(record_mod, "write_session", real)
        with admin.connect() as c:
            c.exec_driver_sql(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
        admin.dispose()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert "internal error" not in err[0] and "cannot record into the store" in err[0], err
    from zoomer_ar.store.db import dispose_engine

    dispose_engine(pg_url)
    assert count(pg_url, Analysis) == 1, "the run in flight was rolled back"


# --- NUL characters -------------------------------------------------------------------------------------


def test_nul_characters_are_stored_alike_on_both_stores(store_url, tmp_path, capsys):
    """A findings.json whose text held a NUL character (job name, device, title, figure key, note, path:
    JSON "\\u0000", valid JSON that a trace can carry into an analysis) was recorded as is on SQLite and was an
    internal error on PostgreSQL, which refuses NUL in text and JSON ('DataError: PostgreSQL text fields cannot
    contain NUL (0x00) bytes' with the SQL and its parameters); now both stores keep it as U+FFFD. (A job name
    holding one is refused: test_store_commands_audit.)"""
    a = make_analysis("nul\ufffdjob", findings={"idle-gpu": 40.0})
    a.job.path = "/traces/a\x00b"
    a.job.ranks[0].devices = ["NVIDIA\x00H100"]
    a.findings[0].title = "idle\x00title"
    a.findings[0].evidence.figures = {"k\x00": 1.0}
    a.notes = ["a note\x00"]
    f = tmp_path / "findings.json"
    f.write_text(a.model_dump_json())
    rc = main(["record", str(f), "--db", store_url, "--gpu-hours", "10", "--owner", "o"])
    err = capsys.readouterr().err
    assert rc == 0, err
    with read_session(open_store(store_url)) as s:
        job = s.execute(select(Job)).scalar_one()
        run = s.execute(select(Analysis)).scalar_one()
        finding = s.execute(select(Finding)).scalar_one()
        path = s.execute(select(Trace.path)).scalar_one()
    assert (job.name, job.gpu_type, path) == ("nul\ufffdjob", "NVIDIA\ufffdH100", "/traces/a\ufffdb")
    assert (finding.title, finding.figures, run.notes) == ("idle\ufffdtitle", {"k\ufffd": 1.0}, ["a note\ufffd"])
    assert main(["history", "nul\ufffdjob", "--db", store_url]) == 0
    assert main(["digest", "--db", store_url, "--format", "json"]) == 0


# --- impact figures that are not a share of the step ---------------------------------------------------


def _refused_batch(store_url: str, tmp_path: Path, capsys, good, bad: dict) -> str:
    """`record good.json bad.json`: exit 2 with one line naming bad.json, and nothing of the batch recorded.
    The line, for the caller's checks of what it names."""
    files = [tmp_path / "good.json", tmp_path / "bad.json"]
    files[0].write_text(good.model_dump_json())
    files[1].write_text(json.dumps(bad))
    rc = main(["record", *map(str, files), "--db", store_url, "--gpu-hours", "10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert str(files[1]) in err[0], err
    assert count(store_url, Analysis) == 0
    return err[0]


@pytest.mark.parametrize("field,value", [("pct_of_step", float("nan")), ("pct_of_step", float("inf")),
                                         ("pct_of_step", 1e308), ("pct_of_step", -50.0),
                                         ("ms_per_step", float("nan")), ("gpu_hours_per_1000_steps", -1.0)])
def test_impact_that_is_not_a_share_of_the_step_is_bad_input(store_url, tmp_path, capsys, field, value):
    """A findings.json whose finding impact was NaN was an internal error on SQLite (NOT NULL constraint failed,
    with the SQL) and recorded on PostgreSQL, where every digest total then read NaN ('NaN GPU-hours ($NaN)
    wasted'); infinity likewise, and 1e308 or a negative share were recorded on both, as 1e308 wasted
    GPU-hours or negative waste. Now it is one line naming the file and the field, exit 2, nothing recorded."""
    good = make_analysis("good", findings={"idle-gpu": 40.0})
    bad = json.loads(make_analysis("bad", findings={"idle-gpu": 40.0, "fp32-matmul": 5.0}).model_dump_json())
    bad["findings"][1]["impact"][field] = value  # json.dumps writes NaN and Infinity as Python's json.load reads them
    line = _refused_batch(store_url, tmp_path, capsys, good, bad)
    assert f"findings.1.impact.{field}" in line, line


# --- numbers past the store's columns, figures that are not numbers --------------------------------------


@pytest.mark.parametrize("edit,where", [
    (lambda d: d["job"]["ranks"][0].update(size_bytes=10**20), "size_bytes"),
    (lambda d: d["job"].update(world_size=10**12), "job.world_size"),
    (lambda d: d["features"].update(world_size=10**12), "features.world_size"),
    (lambda d: d["features"].update(profiler_steps=10**30), "features.profiler_steps"),
    (lambda d: d["features"].update(profiler_steps=1e300), "features.profiler_steps"),
    (lambda d: d["features"].update(wall_ms="abc"), "features.wall_ms"),
    (lambda d: d["features"].update(phase_idle_pct="abc"), "features.phase_idle_pct"),
    (lambda d: d["features"].update(trace_start_unix_s=1e300), "features.trace_start_unix_s"),
    (lambda d: d["features"].update(trace_start_unix_s=-1e12), "features.trace_start_unix_s"),
])
def test_numbers_the_store_cannot_hold_are_bad_input(store_url, tmp_path, capsys, edit, where):
    """A findings.json with a count past the store's integer columns (size_bytes 1e20, world_size 1e12,
    profiler_steps 1e30) or a figure the store reads that is not a number (wall_ms "abc") or not a time
    (trace_start_unix_s 1e300) was an internal error on both stores (OverflowError, DataError with the SQL,
    ValueError), or recorded on SQLite and refused by PostgreSQL; now one line names the file and the field,
    exit 2, and no file of the batch is recorded."""
    good = make_analysis("good", findings={"idle-gpu": 40.0})
    bad = json.loads(make_analysis("bad", findings={"idle-gpu": 40.0}, start_unix_s=1.8e9).model_dump_json())
    edit(bad)
    line = _refused_batch(store_url, tmp_path, capsys, good, bad)
    assert where in line and "internal error" not in line, line


def test_gpus_past_the_store_integers_is_a_usage_error(store_url, tmp_path, capsys):
    """--gpus 3000000000 was recorded on SQLite and an internal error on PostgreSQL (integer out of range)."""
    f = tmp_path / "f.json"
    f.write_text(make_analysis("g").model_dump_json())
    assert main(["record", str(f), "--gpus", "3000000000", "--db", store_url]) == 2
    assert "--gpus" in capsys.readouterr().err
    assert count(store_url, Analysis) == 0


# --- a batch refused whole ------------------------------------------------------------------------------


def test_record_batch_with_a_job_of_another_team_records_none(store_url, tmp_path, capsys):
    """`record a.json b.json --team nlp`, where b's job belongs to team vision, recorded a.json and then
    refused b.json (exit 2: part of the batch written although the command failed on bad input); now the
    conflict is found before any file is recorded."""
    b0 = make_analysis("jobB")
    record_analysis(b0, RecordOptions(team="vision"), db=store_url)
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    files[0].write_text(make_analysis("jobA").model_dump_json())
    files[1].write_text(make_analysis("jobB").model_dump_json())
    rc = main(["record", *map(str, files), "--team", "nlp", "--db", store_url])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "belongs to team 'vision'" in err[0], err
    assert count(store_url, Analysis) == 1 and count(store_url, Job) == 1, "nothing of the batch recorded"
