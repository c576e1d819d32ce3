"""`zoomer-ar review` arguments of the wrong kind: one line naming the argument, exit 2, no traceback."""

from __future__ import annotations

import pytest
from review_testutil import FEATURE_TRAIN, GitRepo, must_hold_repo

from zoomer_ar.cli import main


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["review", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def repo(tmp_path, monkeypatch):
    r = must_hold_repo(tmp_path / "r")
    r.write("extra.py", FEATURE_TRAIN)  # a file the feature branch adds; the working tree is main's
    r.commit("add extra.py")
    r.checkout("main")
    monkeypatch.chdir(r.path)
    return r


def test_a_file_that_does_not_exist_is_exit_2_naming_it(repo, capsys):
    """`review nothere.py` reviewed nothing and exited 0, as if the file were clean."""
    rc, out, err = _run(capsys, "nothere.py")
    assert rc == 2 and out == ""
    assert err.strip() == "zoomer-ar: error: nothere.py: no such file or folder (on disk)"
    rc, _, err = _run(capsys, "train.py", "sub/gone.py")
    assert rc == 2 and err.strip() == "zoomer-ar: error: sub/gone.py: no such file or folder (on disk)"


def test_with_head_a_file_of_the_head_commit_counts_and_others_are_exit_2(repo, capsys):
    assert not (repo.path / "extra.py").exists()
    rc, out, err = _run(capsys, "--base", "main", "--head", "feature", "--format", "text", "extra.py")
    assert rc == 0, err
    assert "extra.py:" in out and "train.py" not in out  # only the named file is reviewed
    rc, out, err = _run(capsys, "--base", "main", "--head", "feature", "gone.py")
    assert rc == 2 and err.strip() == "zoomer-ar: error: gone.py: no such file or folder (on disk or in feature)"


def test_existing_files_and_folders_still_review(repo, capsys, tmp_path):
    (repo.path / "pkg").mkdir()
    rc, _, err = _run(capsys, "--format", "text", "train.py", "pkg", ".")
    assert rc == 0, err
    (repo.path / "link.py").symlink_to(repo.path / "missing-target.py")  # a dangling link is still a path git knows
    rc, _, err = _run(capsys, "--format", "text", "link.py")
    assert rc == 0, err
    outside = GitRepo(tmp_path / "other")
    rc, _, err = _run(capsys, str(outside.path))
    assert rc == 2 and "not inside the repository" in err


@pytest.mark.parametrize("pr", ["-5", "0"])
def test_pr_that_is_not_a_positive_number_is_a_usage_error(repo, capsys, pr):
    """`--pr -5` and `--pr 0` were taken: with --post the review went to /issues/-5/comments."""
    rc, out, err = _run(capsys, "--post", f"--pr={pr}")
    assert rc == 2 and out == ""
    assert "Invalid value for '--pr'" in err and f"{pr} is not in the range x>=1" in err and "Traceback" not in err


@pytest.mark.parametrize("number", ["true", "false", "0", "-3", "7.0", '"7"', "null"])
def test_an_event_without_a_usable_pr_number_asks_for_pr(repo, capsys, monkeypatch, tmp_path, number):
    """An event payload with "number": true was pull request #1 (bool is an int in Python)."""
    event = tmp_path / "event.json"
    event.write_text(f'{{"action": "opened", "number": {number}, "pull_request": {{"number": {number}}}}}')
    for k, v in {"GITHUB_TOKEN": "t", "GITHUB_REPOSITORY": "acme/trainer", "GITHUB_EVENT_PATH": str(event),
                 "GITHUB_API_URL": "http://127.0.0.1:9"}.items():
        monkeypatch.setenv(k, v)
    rc, out, err = _run(capsys, "--post")
    assert rc == 2 and out == ""
    assert err.strip() == ("zoomer-ar: error: --post needs the pull-request number: --pr N, or a pull_request event "
                           "at GITHUB_EVENT_PATH")
