"""`zoomer-ar review` end to end: formats, --fail-on, pre-commit mode and the must-hold scenario with
two --post runs against a local GitHub API."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from review_testutil import BASE_TRAIN, FEATURE_TRAIN, MUST_HOLD, REPO_ROOT, FakeGitHub, GitRepo, must_hold_repo, sarif_errors

from zoomer_ar.cli import main
from zoomer_ar.review.render import SUMMARY_MARKER


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["review", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_must_hold_end_to_end(tmp_path, capsys, monkeypatch):
    """Feature branch adding a training loop with .item() per step, a DataLoader without workers and
    foreach=False: exactly those three, with suggestions, valid SARIF, and a second --post updates."""
    repo = must_hold_repo(tmp_path / "r")
    args = ["--repo", str(repo.path), "--base", "main", "--head", "feature"]

    rc, out, _ = _run(capsys, *args, "--format", "github")
    payload = json.loads(out)
    assert rc == 0
    assert [(c["path"], c["line"], c["side"]) for c in payload["comments"]] == [("train.py", n, "RIGHT") for _, n in MUST_HOLD]
    assert [c["body"].split("`")[1] for c in payload["comments"]] == [r for r, _ in MUST_HOLD]
    # the DataLoader's fix also puts `import os` and DATALOADER_WORKERS after the imports, outside the hunk: its
    # comment carries the fix as a diff, the other two as suggestions
    bodies = {c["body"].split("`")[1]: c["body"] for c in payload["comments"]}
    assert all("```suggestion" in b for r, b in bodies.items() if r != "dataloader-bound")
    assert "```suggestion" not in bodies["dataloader-bound"] and "DATALOADER_WORKERS = max(0, min(" in bodies["dataloader-bound"]
    assert payload["commit_id"] == repo.sha("feature") and payload["body"].startswith(SUMMARY_MARKER)

    sarif = tmp_path / "out" / "zoomer.sarif"
    rc, out, _ = _run(capsys, *args, "--format", "sarif", "-o", str(sarif))
    doc = json.loads(sarif.read_text())
    assert rc == 0 and out == "" and sarif_errors(doc) == []
    assert [r["ruleId"] for r in doc["runs"][0]["results"]] == [r for r, _ in MUST_HOLD]

    with FakeGitHub("acme/trainer") as gh:
        for k, v in gh.env(pr=7, event_dir=tmp_path).items():
            monkeypatch.setenv(k, v)
        rc, out, err = _run(capsys, *args, "--post", "--format", "md")
        assert rc == 0 and out.startswith(SUMMARY_MARKER)
        assert "summary comment created" in err and "3 inline comments posted" in err
        rc, _, err = _run(capsys, *args, "--post", "--format", "text")
        assert rc == 0 and "summary comment updated" in err and "0 inline comments posted; 3 already posted" in err
        assert [m for m, _ in gh.calls() if m != "GET"] == ["POST", "POST", "PATCH"]
        assert len(gh.issue_comments[7]) == 1 and len(gh.review_comments[7]) == 3 and len(gh.reviews[7]) == 1


def test_formats_and_fail_on(tmp_path, capsys):
    repo = must_hold_repo(tmp_path / "r")
    args = ["--repo", str(repo.path), "--base", "main", "--head", "feature"]
    rc, out, _ = _run(capsys, *args)
    assert rc == 0 and "| 🔴 | high | `sync-point` | `train.py:" in out and "```diff" in out
    rc, out, _ = _run(capsys, *args, "--format", "text")
    lines = out.splitlines()
    assert [line.split(" ")[1:3] for line in lines[:3]] == [["high", "dataloader-bound"], ["medium", "single-tensor-optimizer"],
                                                            ["high", "sync-point"]]
    assert out.count("[suggestion]") == 2 and lines[-1] == "3 findings on changed lines in 1 changed Python file"
    rc, out, _ = _run(capsys, *args, "--format", "json")
    assert [f["rule_id"] for f in json.loads(out)["findings"]] == [r for r, _ in MUST_HOLD]
    rc, _, err = _run(capsys, *args, "--fail-on", "high")
    assert rc == 1 and "2 findings at or above high" in err
    assert _run(capsys, *args, "--fail-on", "critical")[0] == 0
    assert _run(capsys, *args, "--fail-on", "none")[0] == 0


def test_fail_on_from_config(tmp_path, capsys):
    repo = must_hold_repo(tmp_path / "r")
    repo.write("pyproject.toml", '[tool.zoomer-ar]\nfail-on = "medium"\n')
    repo.commit("gate")
    args = ["--repo", str(repo.path), "--base", "main", "--head", "feature", "--format", "text"]
    assert _run(capsys, *args)[0] == 1
    assert _run(capsys, *args, "--fail-on", "none")[0] == 0  # the flag wins


def test_bad_input_exit_codes(tmp_path, capsys, monkeypatch):
    repo = must_hold_repo(tmp_path / "r")
    rc, _, err = _run(capsys, "--repo", str(repo.path), "--base", "nope", "--head", "feature")
    assert rc == 2 and "not a commit" in err
    (tmp_path / "plain").mkdir()
    rc, _, err = _run(capsys, "--repo", str(tmp_path / "plain"))
    assert rc == 2 and "not a git repository" in err
    for k in ("GITHUB_TOKEN", "GH_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    rc, out, err = _run(capsys, "--repo", str(repo.path), "--base", "main", "--head", "feature", "--post")
    assert rc == 2 and "GITHUB_TOKEN" in err and out == ""


def test_unparsable_file_is_reported_not_fatal(tmp_path, capsys):
    repo = must_hold_repo(tmp_path / "r")
    repo.write("broken.py", "def f(:\n    pass\n")
    repo.commit("broken")
    rc, out, err = _run(capsys, "--repo", str(repo.path), "--base", "main", "--head", "feature")
    assert rc == 0 and "**Could not analyse**" in out and "`broken.py:1:" in out
    assert "warning: broken.py:1:" in err and "**3 findings**" in out


def test_pre_commit_mode_working_tree_and_file_arguments(tmp_path, capsys, monkeypatch):
    repo = GitRepo(tmp_path / "r")
    repo.write("train.py", BASE_TRAIN)
    repo.write("other.py", "x = 1\n")
    repo.commit("base")
    repo.write("train.py", FEATURE_TRAIN)
    repo.write("other.py", "from torch.utils.data import DataLoader\nloader = DataLoader(ds)\n")
    repo.git("add", "-A")
    monkeypatch.chdir(repo.path)
    rc, out, err = _run(capsys, "--format", "text", "--fail-on", "high", "train.py")
    assert rc == 1
    assert [line.split(":")[0:2] for line in out.splitlines() if line.startswith("train.py")] == [["train.py", str(n)] for _, n in MUST_HOLD]
    assert "other.py" not in out


def test_console_entry_point(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "zoomer_ar.cli", "review", "--repo", str(repo.path), "--base", "main",
                           "--head", "feature", "--format", "text"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("[suggestion]") == 2  # not the DataLoader's: its fix reaches past the hunk


@pytest.mark.parametrize("fmt", ["md", "github", "sarif", "text", "json"])
def test_empty_diff_every_format(tmp_path, capsys, fmt):
    repo = must_hold_repo(tmp_path / "r")
    rc, out, _ = _run(capsys, "--repo", str(repo.path), "--base", "feature", "--head", "feature", "--format", fmt)
    assert rc == 0 and out.strip()
    if fmt == "sarif":
        assert sarif_errors(json.loads(out)) == []
