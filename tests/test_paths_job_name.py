"""The job's name (report titles, zoomer-out/<job>) of a folder given as `..` or `x/..`: the folder's
own name, as `.` gives it; it was `..` (reports titled '..', outputs in zoomer-out/_..)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from zoomer_ar.cli import main
from zoomer_ar.load.job import job_name_of

from conftest import SHARED_TRACES

DLRM_RANK = SHARED_TRACES / "param" / "dlrm_8ranks" / "worker0_step_12.1694128201545.pt.trace.json.gz"


def test_a_parent_folder_is_named_by_its_own_name(tmp_path, monkeypatch):
    (tmp_path / "run7" / "logs").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "run7" / "logs")
    assert job_name_of(Path("..")) == "run7"
    assert job_name_of(Path(".")) == "logs"
    assert job_name_of(Path("../logs/..")) == "run7"
    assert job_name_of(Path("../logs")) == "logs"


def test_analyze_of_the_parent_folder_names_the_job_after_it(tmp_path, monkeypatch, capsys, shared_traces):
    job = tmp_path / "run7"
    (job / "logs").mkdir(parents=True)
    shutil.copyfile(DLRM_RANK, job / DLRM_RANK.name)
    monkeypatch.chdir(job / "logs")
    assert main(["analyze", "..", "--no-files", "--format", "json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["name"] == "run7"
