"""`zoomer-ar trace ...` against the analyzer's loader (third audit): `check` passed events whose
fields the loader refuses (`"name": [1, 2]`), `merge` wrote them into its output, and a full disk
while writing was reported as `cannot read <input>` with the partial output left behind. Each
test failed on the code before the fix. The convention: exit 2, one line naming the file (and the
event), never a traceback; `check` and `analyze` agree on every file."""

from __future__ import annotations

import errno
import gzip
import json
import os
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.load import load_job
from zoomer_ar.surgery import check_trace

from conftest import SHARED_TRACES, one_error_line, files_under

NS = SHARED_TRACES / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # steps 101..105
DLRM = SHARED_TRACES / "param/dlrm_8ranks"


def _trace(rank: int = 0) -> dict:
    """A small valid Kineto-like trace: a named process, two profiler steps, a kernel in each."""
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"name": "ProfilerStep#1", "ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 100, "dur": 50},
        {"name": "gemm", "ph": "X", "cat": "kernel", "pid": 2, "tid": 7, "ts": 110, "dur": 20,
         "args": {"correlation": 5, "stream": 7}},
        {"name": "ProfilerStep#2", "ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 160, "dur": 50},
        {"name": "gemm", "ph": "X", "cat": "kernel", "pid": 2, "tid": 7, "ts": 170, "dur": 20},
    ]
    return {"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": events}


# Events (index 5, after the valid ones) that `trace check` used to pass although the loader refuses
# them, and the field each one gets wrong. Missing or non-numeric ts/dur/pid/tid of timed events were
# already refused by the structural rules; these are the types those rules did not look at.
BAD = {
    "name_list": ({"name": [1, 2], "ph": "X", "cat": "kernel", "pid": 2, "tid": 7, "ts": 200, "dur": 1}, "name"),
    "cat_number": ({"name": "k", "ph": "X", "cat": 3, "pid": 2, "tid": 7, "ts": 200, "dur": 1}, "cat"),
    "args_correlation_list": ({"name": "k", "ph": "X", "cat": "kernel", "pid": 2, "tid": 7, "ts": 200, "dur": 1,
                               "args": {"correlation": [1]}}, "args.correlation"),
    "metadata_ts_string": ({"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "ts": "abc",
                            "args": {"name": "main"}}, "ts"),
    "metadata_tid_float": ({"name": "thread_name", "ph": "M", "pid": 1, "tid": 1.5, "args": {"name": "main"}}, "tid"),
    "instant_dur_string": ({"name": "mark", "ph": "i", "s": "t", "pid": 1, "tid": 1, "ts": 120, "dur": "2"}, "dur"),
}
# `check` refused this one already (as `pid`/`tid` missing), `merge` wrote it through
MERGE_BAD = {**BAD, "pid_float": ({"name": "k", "ph": "X", "cat": "kernel", "pid": 1.5, "tid": 7, "ts": 200,
                                   "dur": 1}, "pid")}


def _write(path: Path, doc: dict) -> Path:
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def _bad_trace(path: Path, case: str, rank: int = 0) -> Path:
    doc = _trace(rank)
    doc["traceEvents"].append(MERGE_BAD[case][0])
    return _write(path, doc)


def _analyze(path: Path, tmp_path: Path) -> int:
    """`zoomer-ar analyze` with its reports in tmp_path (not zoomer-out/ of the working folder)."""
    return main(["analyze", str(path), "--out", str(tmp_path / "reports")])


# ---- 1: `trace check` holds events to the loader's types ---------------------------------------


def test_the_valid_base_trace_passes_check_and_analyze(tmp_path, capsys):
    src = _write(tmp_path / "ok.json", _trace())
    assert main(["trace", "check", str(src)]) == 0
    assert _analyze(src, tmp_path) == 0


@pytest.mark.parametrize("case", sorted(BAD))
def test_check_refuses_what_the_loader_refuses(case, tmp_path, capsys):
    src = _bad_trace(tmp_path / f"{case}.json", case)
    field = BAD[case][1]
    assert main(["trace", "check", str(src)]) == 2
    err = one_error_line(capsys, str(src), "event 5", f"`{field}` has the wrong type")
    assert "not a valid Chrome trace" in err
    assert _analyze(src, tmp_path) == 2  # the two commands agree
    one_error_line(capsys, str(src), field)


def test_check_counts_events_across_slices_of_a_real_trace(tmp_path, shared_traces):
    """The event index is the one in the file, not in the slice the scanner handed over."""
    doc = json.loads(gzip.decompress(NS.read_bytes()))
    i = max(k for k, e in enumerate(doc["traceEvents"]) if e["ph"] == "X")  # in the last slice
    doc["traceEvents"][i]["name"] = [1, 2]
    src = _write(tmp_path / "late.json", doc)
    assert src.stat().st_size > 4 << 20  # several slices
    n, problems = check_trace(src)
    assert n == len(doc["traceEvents"])
    assert len(problems) == 1 and problems[0].startswith(f"event {i}") and "`name` has the wrong type" in problems[0]


def test_check_of_several_files_names_the_first_bad_one(tmp_path, capsys):
    ok = _write(tmp_path / "ok.json", _trace())
    bad = _bad_trace(tmp_path / "bad.json", "name_list")
    assert main(["trace", "check", str(ok), str(bad)]) == 2
    one_error_line(capsys, str(bad), "event 5", "`name`")


# ---- 2: `trace merge` never writes what the loader refuses -------------------------------------


@pytest.mark.parametrize("case", sorted(MERGE_BAD))
def test_merge_refuses_a_file_with_wrong_typed_fields(case, tmp_path, capsys):
    """Used to write the event through (exit 0); a float pid even came out as the string
    "rank0:1.5", hiding the bad input."""
    src = _bad_trace(tmp_path / "r0.json", case)
    out = tmp_path / "merged.json"
    assert main(["trace", "merge", str(src), str(out)]) == 2
    one_error_line(capsys, str(src), "event 5", f"`{MERGE_BAD[case][1]}` has the wrong type")
    assert not out.exists() and files_under(tmp_path) == ["r0.json"]


def test_merge_skips_a_wrong_typed_rank_of_a_job_like_analyze(tmp_path, capsys):
    job = tmp_path / "job"
    job.mkdir()
    _write(job / "rank0.json", _trace(0))
    _bad_trace(job / "rank1.json", "name_list", rank=1)
    out = tmp_path / "merged.json"
    assert main(["trace", "merge", str(job), str(out)]) == 0
    err = capsys.readouterr().err
    assert "note: skipped" in err and "rank1.json" in err and "event 5" in err
    assert json.loads(out.read_bytes())["distributedInfo"]["merged_ranks"] == [0]
    assert check_trace(out)[1] == []
    assert _analyze(out, tmp_path) == 0  # the merged file is one the analyzer reads
    skipped = load_job(job).info.skipped  # and analyze skips the same rank of the job
    assert [Path(s.path).name for s in skipped] == ["rank1.json"]


# ---- 3: a full disk is the output's fault, and leaves nothing behind ----------------------------


class _FullDisk:
    """A file on a disk that fills up after `room` bytes (or, room None, when it is closed)."""

    def __init__(self, fh, room: int | None) -> None:
        self.fh, self.room = fh, room

    def write(self, data) -> int:
        if self.room is not None and len(data) > self.room:
            self.fh.write(bytes(data[: self.room]))  # a partial file on disk, as a real full disk leaves
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.room is not None:
            self.room -= len(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()
        if self.room is None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def full_disk(monkeypatch):
    """Every file opened for writing fills the disk; `full_disk(room)` sets when."""
    real_open = Path.open

    def setup(room: int | None) -> None:
        def fake_open(self, mode="r", *args, **kwargs):
            fh = real_open(self, mode, *args, **kwargs)
            return _FullDisk(fh, room) if "w" in mode else fh

        monkeypatch.setattr(Path, "open", fake_open)

    return setup


_WRITES = {
    "filter": ["filter", "{NS}", "{T}/out.json", "--exclude-cat", "python_function"],
    "filter_gz": ["filter", "{NS}", "{T}/out.json.gz"],
    "slice": ["slice", "{NS}", "{T}/out.json", "--steps", "102..103"],
    "split": ["split", "{NS}", "{T}/steps"],
    "compress": ["compress", "{NS}", "{T}/out.json"],
    "merge": ["merge", "{DLRM}", "{T}/out.json.gz"],
    "sample": ["sample", "{DLRM}", "{T}/smp", "-k", "2"],
    "sample_gz": ["sample", "{DLRM}", "{T}/smp", "-k", "2", "--compression", "gzip"],
    "filter_job": ["filter", "{DLRM}", "{T}/flt", "--ranks", "0,1"],
}


@pytest.mark.parametrize("room", [0, 1000, None], ids=["at_once", "midway", "on_close"])
@pytest.mark.parametrize("cmd", sorted(_WRITES))
def test_a_full_disk_is_a_write_error_naming_the_output(cmd, room, tmp_path, capsys, full_disk, shared_traces):
    """Used to be `cannot read: No space left on device` naming the input (or an internal error),
    with the partial output left in place."""
    args = [a.format(NS=NS, DLRM=DLRM, T=tmp_path) for a in _WRITES[cmd]]
    full_disk(room)
    assert main(["trace", *args]) == 2
    err = one_error_line(capsys, str(tmp_path), "cannot write", "No space left on device")
    assert "cannot read" not in err
    assert files_under(tmp_path) == []  # no partial file, not even the temporary one, nor an empty folder
