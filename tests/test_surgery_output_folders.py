"""Folder outputs (`trace split`, and `filter`/`sample` of a job folder) into a folder that already holds
trace files: the new files would sit beside an earlier run's (`split` twice with other --steps-per-file,
a `sample -k 4` after a `sample -k 2`) and a later `analyze OUT` would read the mix without a word. Such
a folder is refused before anything is read or written; one holding no trace file is fine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from zoomer_ar.cli import main

from conftest import SHARED_TRACES, files_under, one_error_line

NS = SHARED_TRACES / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
DLRM = SHARED_TRACES / "param/dlrm_8ranks"


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_split_twice_into_one_folder_is_refused(tmp_path, capsys, shared_traces):
    out = tmp_path / "steps"
    assert main(["trace", "split", str(NS), str(out)]) == 0
    capsys.readouterr()
    first = _contents(out)
    assert len(first) == 5
    assert main(["trace", "split", str(NS), str(out), "--steps-per-file", "2"]) == 2
    one_error_line(capsys, str(out), "already holds 5 trace files", "steps_101-101")
    assert _contents(out) == first  # the earlier split as it was: nothing added, nothing replaced


def test_split_into_a_folder_without_traces_writes(tmp_path, capsys, shared_traces):
    out = tmp_path / "steps"
    out.mkdir()
    (out / "README.md").write_text("steps of rank 0\n")
    (out / ".hidden.json").write_text("{}")  # a hidden file is no rank to `analyze`
    assert main(["trace", "split", str(NS), str(out), "--steps-per-file", "5"]) == 0
    assert files_under(out) == [".hidden.json", "README.md",
                                "rank-0.Apr_03_18_51_38.1102.pt.trace.steps_101-105.json.gz"]


@pytest.fixture
def job(tmp_path: Path, shared_traces) -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    for f in sorted(DLRM.iterdir())[:4]:
        shutil.copyfile(f, folder / f.name)
    return folder


@pytest.mark.parametrize("first, second", [
    (["trace", "sample", "{job}", "{out}", "-k", "4"], ["trace", "sample", "{job}", "{out}", "-k", "2"]),
    (["trace", "filter", "{job}", "{out}", "--cat", "kernel"], ["trace", "filter", "{job}", "{out}", "--ranks", "0"]),
])
def test_a_job_output_folder_of_an_earlier_run_is_refused(first, second, job, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([a.format(job=job, out=out) for a in first]) == 0
    capsys.readouterr()
    before = _contents(out)
    assert main([a.format(job=job, out=out) for a in second]) == 2
    one_error_line(capsys, str(out), "already holds 4 trace files")
    assert _contents(out) == before
