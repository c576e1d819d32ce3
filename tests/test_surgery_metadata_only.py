"""A trace that holds only metadata events (process and thread names, no event on a timeline):
`analyze` refuses it (exit 2), so every `trace` command refuses it too, with one line, and never
writes an output that `trace check` would then refuse. In a job folder such a rank is skipped with a
note, as `analyze` skips it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zoomer_ar.cli import main

from conftest import SHARED_TRACES, files_under, one_error_line

SIMPLE_ADD = SHARED_TRACES / "hta/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz"

META_ONLY = {"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
]}


@pytest.fixture
def meta_only(tmp_path: Path) -> Path:
    path = tmp_path / "in" / "meta.json"
    path.parent.mkdir()
    path.write_text(json.dumps(META_ONLY))
    return path


def test_analyze_refuses_a_metadata_only_trace(meta_only, tmp_path, capsys):
    """The behaviour the trace commands are made to agree with."""
    assert main(["analyze", str(meta_only), "--out", str(tmp_path / "o")]) == 2
    one_error_line(capsys, "meta.json")


@pytest.mark.parametrize("command", [
    ["trace", "filter"], ["trace", "compress"], ["trace", "repair"], ["trace", "merge"],
])
def test_trace_commands_refuse_a_metadata_only_trace(command, meta_only, tmp_path, capsys):
    out = tmp_path / "out" / "x.json"
    assert main([*command, str(meta_only), str(out)]) == 2
    one_error_line(capsys, "meta.json", "only metadata")
    assert not out.parent.exists()  # nothing written, no folder made


def test_check_refuses_a_metadata_only_trace(meta_only, capsys):
    assert main(["trace", "check", str(meta_only)]) == 2
    err = capsys.readouterr()
    assert "only metadata" in err.out
    assert err.err.count("\n") == 1 and "not a valid Chrome trace" in err.err and "only metadata" in err.err


def test_check_refuses_an_empty_events_list(tmp_path, capsys):
    """`analyze`, filter, compress and merge refuse `"traceEvents": []`; check called it valid."""
    path = tmp_path / "empty.json"
    path.write_text('{"traceEvents": []}')
    assert main(["trace", "check", str(path)]) == 2
    assert "'traceEvents' is empty" in capsys.readouterr().err


def test_filter_that_keeps_only_metadata_writes_nothing(tmp_path, capsys, shared_traces):
    """The output would be a metadata-only trace, refused by `check` and `analyze`: refused, as `slice`
    refuses a window that holds no event; the line still names the categories the trace has."""
    out = tmp_path / "none.json"
    assert main(["trace", "filter", str(SIMPLE_ADD), str(out), "--cat", "no_such_category"]) == 2
    err = one_error_line(capsys, "kept no event besides metadata", "kernel", "cpu_op", "nothing written")
    assert str(SIMPLE_ADD) in err
    assert not out.exists()
    assert files_under(tmp_path) == []


@pytest.fixture
def job(tmp_path: Path, meta_only: Path, shared_traces) -> Path:
    """A real rank beside a metadata-only one."""
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copyfile(SIMPLE_ADD, folder / "rank0.json.gz")
    shutil.copyfile(meta_only, folder / "rank1.json")
    return folder


@pytest.mark.parametrize("command", [
    ["trace", "filter", "{job}", "{out}"],
    ["trace", "sample", "{job}", "{out}", "--ranks", "0,1"],
    ["trace", "sample", "{job}", "{out}", "--ranks", "0,1", "--compression", "gzip"],
    ["trace", "merge", "{job}", "{out}/merged.json"],
])
def test_a_metadata_only_rank_is_skipped_with_a_note(command, job, tmp_path, capsys):
    out = tmp_path / "out"
    args = [a.format(job=job, out=out) for a in command]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert f"note: skipped {job / 'rank1.json'}: " in err and "only metadata" in err
    written = files_under(out)
    assert written and not any(name.startswith("rank1") for name in written)
    assert main(["trace", "check", str(out)]) == 0


def test_filter_of_a_job_skips_a_rank_it_empties(tmp_path, capsys, shared_traces):
    """--ph X keeps rank 0's complete events and nothing of rank 1 (an instant event): rank 1 is
    skipped with a note, not written as a metadata-only file that `analyze OUT` would skip again."""
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copyfile(SIMPLE_ADD, folder / "rank0.json.gz")
    instant = {"ph": "i", "name": "mark", "ts": 5, "pid": 1, "tid": 2, "s": "t"}
    (folder / "rank1.json").write_text(json.dumps({"traceEvents": [*META_ONLY["traceEvents"], instant]}))
    out = tmp_path / "out"
    assert main(["trace", "filter", str(folder), str(out), "--ph", "X"]) == 0
    err = capsys.readouterr().err
    assert f"note: skipped {folder / 'rank1.json'}: " in err and "kept no event besides metadata" in err
    assert files_under(out) == ["rank0.json.gz"]
