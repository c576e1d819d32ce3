"""Regression tests for the store audit, on SQLite and PostgreSQL: a job's team never changes, re-recording
changes nothing (also with concurrent recorders), undoing a run, Markdown escaping of the digest and history,
and a --db file that is not a SQLite database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from sqlalchemy import func, select

from zoomer_ar.cli import main
from zoomer_ar.render.digest import render_digest, render_history
from zoomer_ar.store.db import open_store, read_session, write_session
from zoomer_ar.store.digest import build_digest
from zoomer_ar.store.history import job_history
from zoomer_ar.store.orm import Analysis, Finding, Job, Trace, Verdict
from zoomer_ar.store.record import RecordOptions, add_verdict, content_hash, record_analysis

from store_support import REPO, make_analysis, pg_server_url, pg_url, sqlite_url, store_url  # noqa: F401 - fixtures


def counts(url: str) -> dict[str, int]:
    with read_session(open_store(url)) as s:
        return {t.__tablename__: s.execute(select(func.count()).select_from(t)).scalar_one()
                for t in (Job, Trace, Analysis, Finding, Verdict)}


def jobs(url: str) -> dict[str, tuple]:
    with read_session(open_store(url)) as s:
        return {j.name: (j.team, j.owner, j.gpu_count, j.gpu_hour_cost) for j in s.execute(select(Job)).scalars()}


# --- a job's team never changes -------------------------------------------------------------------------


def test_a_job_cannot_move_to_another_team(store_url, capsys, tmp_path):
    from zoomer_ar.store.record import JobTeamConflict

    record_analysis(make_analysis("shared", findings={"idle-gpu": 10.0}),
                    RecordOptions(team="ml", owner="ana", gpu_hour_cost=2.0, week="2026-W10"), db=store_url)
    before_jobs, before = jobs(store_url), counts(store_url)
    with pytest.raises(JobTeamConflict) as err:
        record_analysis(make_analysis("shared", findings={"idle-gpu": 20.0}),
                        RecordOptions(team="ml-resnet", owner="mallory", gpus=99, gpu_hour_cost=9.0, week="2026-W10"),
                        db=store_url)
    assert err.value.exit_code == 2 and "belongs to team 'ml'" in str(err.value)
    assert jobs(store_url) == before_jobs == {"shared": ("ml", "ana", 1, 2.0)}
    assert counts(store_url) == before, "a refused recording writes nothing"
    # the same through `zoomer-ar record`: one line, exit 2
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("shared", findings={"sync-point": 5.0}).model_dump_json())
    capsys.readouterr()
    assert main(["record", str(f), "--db", store_url, "--team", "other"]) == 2
    err_text = capsys.readouterr().err.strip()
    assert len(err_text.splitlines()) == 1 and "belongs to team 'ml'" in err_text
    # the same team, or no team given, still records runs of the job
    assert record_analysis(make_analysis("shared"), RecordOptions(team="ml", week="2026-W11"), db=store_url).created
    assert record_analysis(make_analysis("shared"), RecordOptions(week="2026-W12"), db=store_url).created
    assert jobs(store_url)["shared"][0] == "ml"


def test_a_job_without_team_gets_its_first_team(store_url):
    from zoomer_ar.store.record import JobTeamConflict

    record_analysis(make_analysis("solo"), RecordOptions(week="2026-W10"), db=store_url)
    record_analysis(make_analysis("solo"), RecordOptions(team="core", week="2026-W11"), db=store_url)
    assert jobs(store_url)["solo"][0] == "core"
    with pytest.raises(JobTeamConflict):
        record_analysis(make_analysis("solo"), RecordOptions(team="other", week="2026-W12"), db=store_url)


# --- already recorded: nothing changes ----------------------------------------------------------------------


def test_rerecording_changes_no_job_even_when_refreshed(store_url):
    a = make_analysis("orig", key="same-bytes", findings={"idle-gpu": 40.0})
    record_analysis(a, RecordOptions(week="2026-W20", gpu_hours=10), db=store_url)  # no price yet
    before_jobs = jobs(store_url)
    # a newer tool version refreshes the run in place; the options of this call touch no job
    b = make_analysis("orig", key="same-bytes", findings={"idle-gpu": 30.0}, tool_version="9.9.9")
    r = record_analysis(b, RecordOptions(job="intruder", team="x", owner="o", gpus=8, gpu_hour_cost=5.0), db=store_url)
    assert r.status == "refreshed" and r.job == "orig" and r.gpu_hour_cost is None
    assert jobs(store_url) == before_jobs, "no job created or changed by an already recorded trace"
    with read_session(open_store(store_url)) as s:
        assert s.execute(select(Analysis.usd, Analysis.gpu_hour_cost)).one() == (0.0, None), "not repriced"


CHILD = r"""
import sys, time
from pathlib import Path
from zoomer_ar.models import Analysis
from zoomer_ar.store.record import RecordOptions, record_analysis
url, go, f, job = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
a = Analysis.model_validate_json(Path(f).read_text())
deadline = time.time() + 60
while not go.exists() and time.time() < deadline:
    time.sleep(0.002)
r = record_analysis(a, RecordOptions(job=job, team="t-" + job, owner="o-" + job, gpu_hour_cost=2.0), db=url)
print(r.status, r.job)
"""


def test_concurrent_recorders_of_one_trace_create_one_job(store_url, tmp_path):
    """8 processes record the same findings under 8 job names at once: one run, one job, no stray rows."""
    open_store(store_url)  # migrated before the race
    f = tmp_path / "f.json"
    f.write_text(make_analysis("same", findings={"idle-gpu": 10.0}).model_dump_json())
    script, go = tmp_path / "child.py", tmp_path / "go"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, str(script), store_url, str(go), str(f), f"j{i}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(8)]
    time.sleep(1.5)
    go.touch()
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    statuses = sorted(o[0].split()[0] for o in outs)
    winners = {o[0].split()[1] for o in outs}
    assert statuses == ["exists"] * 7 + ["recorded"] and len(winners) == 1, outs
    (winner,) = winners
    assert set(jobs(store_url)) == {winner}, "the losers created or changed no job"
    assert counts(store_url)["analyses"] == 1


# --- undoing a run --------------------------------------------------------------------------------------


def test_forget_analysis_removes_run_job_and_unlabelled_trace(store_url):
    from zoomer_ar.store.record import forget_analysis

    keep = record_analysis(make_analysis("kept", findings={"idle-gpu": 10.0}), RecordOptions(week="2026-W30"),
                           db=store_url)
    gone = record_analysis(make_analysis("kept", findings={"sync-point": 4.0}), RecordOptions(week="2026-W31"),
                           db=store_url)
    labelled_a = make_analysis("labelled", findings={"idle-gpu": 1.0})
    labelled = record_analysis(labelled_a, RecordOptions(week="2026-W31"), db=store_url)
    add_verdict(content_hash(labelled_a), "idle-gpu", "positive", author="ana", db=store_url)
    engine = open_store(store_url)
    with write_session(engine) as s:
        assert forget_analysis(s, gone.analysis_id) and forget_analysis(s, labelled.analysis_id)
        assert not forget_analysis(s, 10**9)
    c = counts(store_url)
    assert (c["analyses"], c["findings"], c["verdicts"]) == (1, 1, 1)
    assert c["traces"] == 2, "the labelled trace stays with its verdict"
    assert set(jobs(store_url)) == {"kept"}, "a job left without runs goes; one with runs stays"
    assert [r.analysis_id for r in job_history("kept", engine).runs] == [keep.analysis_id]
    assert build_digest(engine, week="2026-W31").runs == 0


# --- Markdown escaping --------------------------------------------------------------------------------------


def test_markdown_digest_and_history_escape_user_text(store_url):
    job, owner, team = "<script>alert(1)</script>", "<img src=x onerror=alert(2)> [x](javascript:y)", "t|<b>"
    record_analysis(make_analysis("x", findings={"idle-gpu": 20.0, "evil`x|y": 5.0}),
                    RecordOptions(job=job, team=team, owner=owner, gpu_hours=10, gpu_hour_cost=1.0, week="2026-W30"),
                    db=store_url)
    d = build_digest(store_url, week="2026-W30", team=team)
    md = render_digest(d, "md")
    hist = render_history(job_history(job, store_url), "md")
    for text in (md, hist):
        low = text.lower()
        assert "<script" not in low and "<img" not in low and "<b>" not in low, text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md and "\\[x\\](javascript:y)" in md
    assert "(team t\\|&lt;b&gt;)" in md.splitlines()[0]
    assert "`evil'x\\|y`" in md, "a pattern id stays inside its code span and table cell"
    html = render_digest(d, "html")
    assert "<script" not in html.lower() and "&lt;script&gt;" in html


# --- --db that is not a SQLite database --------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"garbage\n", b"PK\x03\x04" + b"\0" * 4000, b"SQLite format 3\x00" + b"\xff" * 5000])
@pytest.mark.parametrize("argv", [["digest"], ["history", "x"], ["record", "{findings}"], ["db", "upgrade"]],
                         ids=["digest", "history", "record", "db-upgrade"])
def test_db_that_is_not_sqlite_is_one_line_exit_2(tmp_path, capsys, content, argv):
    junk = tmp_path / "junk.db"
    junk.write_bytes(content)
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("j").model_dump_json())
    args = [a.format(findings=f) for a in argv] + ["--db", str(junk)]
    t0 = time.monotonic()
    assert main(args) == 2
    assert time.monotonic() - t0 < 30, "no minute of retries on a file that is not a database"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(junk) in err[0] and "internal error" not in err[0], err
    assert junk.read_bytes() == content, "the file is left as it was"


def test_db_that_is_a_folder_is_exit_2(tmp_path, capsys):
    assert main(["db", "upgrade", "--db", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_digest_json_is_unaffected_by_markdown_escaping(store_url):
    record_analysis(make_analysis("a_b", findings={"idle-gpu": 10.0}), RecordOptions(week="2026-W30"), db=store_url)
    doc = json.loads(render_digest(build_digest(store_url, week="2026-W30"), "json"))
    assert doc["jobs"][0]["job"] == "a_b"
    assert "| a_b |" in render_digest(build_digest(store_url, week="2026-W30"), "md"), "intraword _ is not escaped"


@pytest.mark.parametrize("url", ["foo://bar", "sqlite+nodriver:///x.db", "://x", "postgresql://u:secret@[::1"])
@pytest.mark.parametrize("argv", [["digest"], ["history", "x"], ["record", "{findings}"], ["db", "upgrade"]],
                         ids=["digest", "history", "record", "db-upgrade"])
def test_db_url_that_does_not_parse_is_one_line_exit_2(tmp_path, capsys, url, argv):
    """A --db URL with an unknown dialect or a bad port was an internal error (exit 1) in record and db upgrade."""
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("j").model_dump_json())
    assert main([a.format(findings=f) for a in argv] + ["--db", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a usable store URL" in err[0] and "internal error" not in err[0], err
    assert "secret" not in err[0], "the password is not shown"


# --- a store another process keeps locked ---------------------------------------------------------------

LOCK_HOLDER = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(120)
"""


def test_locked_store_is_one_line_after_the_busy_timeout(tmp_path, capsys, monkeypatch):
    """A SQLite store locked by another process kept `record` waiting the busy timeout 30 times over
    (with_retry on "database is locked": half an hour at the default 60 s) and then died with an internal
    error; now retries stop at the busy timeout and the command says the store is locked, exit 1."""
    from zoomer_ar.store import db as store_db

    monkeypatch.setattr(store_db, "SQLITE_BUSY_TIMEOUT_S", 1.0)
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    record_analysis(make_analysis("first"), RecordOptions(), db=url)
    store_db.dispose_engine(url)
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("second").model_dump_json())
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        rc = main(["record", str(f), "--db", str(path)])
        elapsed = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
        store_db.dispose_engine(str(path))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "locked" in err[0] and "internal error" not in err[0], err
    assert elapsed < 15, f"gave up after {elapsed:.0f} s, not after about the busy timeout"
    assert [j for j in jobs(url)] == ["first"], "nothing recorded, nothing lost"


# --- --out that is not a regular file ------------------------------------------------------------------


def test_digest_out_to_a_fifo_writes_into_it(tmp_path, capsys):
    """`--out /dev/stdout` (or /dev/null, a named pipe) was replaced by a regular file: atomic_write renamed
    its temporary file over the device or pipe (as root, /dev/null itself). Now it is written into."""
    import stat

    url = f"sqlite:///{tmp_path / 'store.db'}"
    record_analysis(make_analysis("j", findings={"idle-gpu": 10.0}), RecordOptions(week="2026-W30"), db=url)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    rd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so the writer's open does not block
    try:
        assert main(["digest", "--db", url, "--week", "2026-W30", "--out", str(fifo)]) == 0
        got = os.read(rd, 1 << 16).decode()
    finally:
        os.close(rd)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the pipe is still a pipe"
    assert got.startswith("# Zoomer AR weekly digest: 2026-W30"), got[:200]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pipe")] == [], "no temporary file left"


# --- option values ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["record", "{findings}", "--gpu-hours", "nan"],
    ["record", "{findings}", "--gpu-hour-cost", "inf"],
    ["record", "{findings}", "--gpu-hours", "1e308", "--gpu-hour-cost", "1e308"],
    ["digest", "--top", "99999999999999999999"],
    ["history", "j", "--limit", "99999999999999999999"],
], ids=["gpu-hours-nan", "cost-inf", "huge-cost", "digest-top", "history-limit"])
def test_option_values_out_of_range_are_usage_errors(tmp_path, capsys, argv):
    """nan and inf passed click's FloatRange(min=0) and made `record` an internal error (the INSERT failed),
    while `analyze --gpu-hours nan` wrote a null cost 'given with --gpu-hours'; a --top or --limit past
    SQLite's integers was an internal OverflowError. Now they are refused as usage errors (exit 2), as the
    service refuses them, and the store is unchanged."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    record_analysis(make_analysis("j"), RecordOptions(), db=url)
    f = tmp_path / "findings.json"
    f.write_text(make_analysis("other").model_dump_json())
    assert main([a.format(findings=f) for a in argv] + ["--db", url]) == 2
    err = capsys.readouterr().err
    assert "Invalid value" in err and "internal error" not in err and "Traceback" not in err, err
    assert list(jobs(url)) == ["j"]
