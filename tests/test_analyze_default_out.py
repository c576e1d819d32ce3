"""`analyze FOLDER` without --out writes to zoomer-out/<job> in the current folder. When the current
folder is the rank folder itself (`cd job && zoomer-ar analyze .`) or a folder inside it, that put the
reports into the rank folder, which an explicit `--out` there is refused for: the outputs now go to
zoomer-out/<job> beside the rank folder, with a note saying so, and the rank folder is left as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zoomer_ar.cli import main

from conftest import SHARED_TRACES, files_under

DLRM = SHARED_TRACES / "param" / "dlrm_8ranks"


@pytest.fixture
def job(tmp_path: Path, shared_traces) -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    for f in sorted(DLRM.glob("worker[01]_*")):
        shutil.copyfile(f, folder / f.name)
    return folder


def _ranks_of(findings: Path) -> list[str]:
    return [Path(r["path"]).name for r in json.loads(findings.read_text())["job"]["ranks"]]


@pytest.mark.parametrize("cwd, arg", [("job", "."), ("job/logs", ".."), ("job/logs", "../../job")])
def test_the_default_output_folder_is_never_inside_the_rank_folder(cwd, arg, job, tmp_path, monkeypatch, capsys):
    (job / "logs").mkdir()
    monkeypatch.chdir(tmp_path / cwd)
    ranks = sorted(p.name for p in job.glob("*.gz"))
    for _ in range(2):  # analysed again: the same folder, reused
        assert main(["analyze", arg, "--no-progress"]) == 0
        err = capsys.readouterr().err
        out = tmp_path / "zoomer-out" / "job"
        assert f"note: the current folder is inside the rank folder {job}" in err.replace(os.path.realpath(job), str(job))
        assert _ranks_of(out / "findings.json") == ranks
        assert files_under(job) == ["logs", *ranks]
    assert sorted(p.name for p in (tmp_path / "zoomer-out").iterdir()) == ["job"]


def test_the_default_output_folder_elsewhere_is_unchanged(job, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "job", "--no-progress"]) == 0
    assert "note: the current folder" not in capsys.readouterr().err
    assert (tmp_path / "zoomer-out" / "job" / "findings.json").is_file()


def test_the_same_rank_folder_analysed_from_three_folders_shares_one_output_folder(job, tmp_path, monkeypatch, capsys):
    """zoomer-out/ beside the rank folder is shared by runs started from different folders; findings.json's
    job.path is relative to the earlier run's folder (`.`, `..`, `job`), and comparing it from the current
    folder gave job, job-2, job-3 for one input: the rank files recorded with it (names, sizes, sha256) decide."""
    (job / "logs").mkdir()
    for cwd, arg in [("job", "."), ("job/logs", ".."), ("", "job")]:
        monkeypatch.chdir(tmp_path / cwd)
        assert main(["analyze", arg, "--no-progress"]) == 0
        capsys.readouterr()
        assert json.loads((tmp_path / "zoomer-out" / "job" / "findings.json").read_text())["job"]["path"] == arg
    assert sorted(p.name for p in (tmp_path / "zoomer-out").iterdir()) == ["job"]


def test_another_rank_folder_of_the_same_name_and_sizes_gets_its_own_folder(job, tmp_path, monkeypatch, capsys):
    """The same file names and sizes with other bytes are another input: its reports never replace the first's."""
    monkeypatch.chdir(job)
    assert main(["analyze", ".", "--no-progress"]) == 0
    other = tmp_path / "elsewhere" / "job"
    other.mkdir(parents=True)
    for f in sorted(job.glob("*.gz")):
        data = bytearray(f.read_bytes())
        data[4:8] = bytes(4) if data[4:8] != bytes(4) else b"\x01\x00\x00\x00"  # the gzip header's mtime
        (other / f.name).write_bytes(bytes(data))
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", str(other), "--no-progress"]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "zoomer-out" / "job" / "findings.json").read_text())["job"]["path"] == "."
    assert json.loads((tmp_path / "zoomer-out" / "job-2" / "findings.json").read_text())["job"]["path"] == str(other)


def test_no_files_never_reads_the_output_folders(job, tmp_path):
    """--no-files writes no folder, yet it chose one: it read zoomer-out/<job>/findings.json (and may hash the
    input to tell whether that is this input's). A findings.json that blocks on reading (a FIFO) shows it."""
    (tmp_path / "zoomer-out" / "job").mkdir(parents=True)
    os.mkfifo(tmp_path / "zoomer-out" / "job" / "findings.json")
    done = subprocess.run([sys.executable, "-m", "zoomer_ar", "analyze", "job", "--no-files", "--no-progress"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert files_under(tmp_path / "zoomer-out") == ["job", "job/findings.json"]
