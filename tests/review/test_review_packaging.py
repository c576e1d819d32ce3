"""The shipped integrations run as written: the pre-commit hook entry, the GitHub Action's review
script (against the local GitHub API), and the README / docs examples that point at them."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml
from review_testutil import BASE_TRAIN, FEATURE_TRAIN, MUST_HOLD, REPO_ROOT, FakeGitHub, GitRepo, must_hold_repo, sarif_errors

BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO_ROOT)
    return {**env, **extra}


def _zoomer() -> list[str]:
    exe = BIN / "zoomer-ar"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "zoomer_ar.cli"]


def test_pre_commit_hook_entry(tmp_path):
    hooks = yaml.safe_load((REPO_ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "zoomer-ar-review")
    assert hook["language"] == "python" and hook["types_or"] == ["python", "jupyter"] and "types" not in hook and hook["pass_filenames"] is True
    entry = shlex.split(hook["entry"])
    assert entry[:2] == ["zoomer-ar", "review"]
    repo = GitRepo(tmp_path / "r")
    repo.write("train.py", BASE_TRAIN)
    repo.commit("base")
    repo.write("train.py", FEATURE_TRAIN)
    repo.git("add", "train.py")
    # as pre-commit runs it: in the repository root, the staged file names appended
    proc = subprocess.run([*_zoomer(), *entry[1:], "train.py"], cwd=repo.path, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert [line.split(" ")[2] for line in proc.stdout.splitlines() if line.startswith("train.py:")] == [r for r, _ in MUST_HOLD]
    # a clean change passes
    repo.write("train.py", BASE_TRAIN + "\n\ndef helper():\n    return 1\n")
    repo.git("add", "train.py")
    proc = subprocess.run([*_zoomer(), *entry[1:], "train.py"], cwd=repo.path, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _action() -> dict:
    return yaml.safe_load((REPO_ROOT / "action.yml").read_text())


def test_action_definition():
    action = _action()
    assert action["runs"]["using"] == "composite"
    steps = {s["name"]: s for s in action["runs"]["steps"]}
    assert steps["Upload SARIF"]["uses"].startswith("github/codeql-action/upload-sarif@")
    assert "${{" not in steps["Review"]["run"]  # inputs reach the script through env only (no injection)
    for name in ("base", "head", "post", "fail-on", "sarif-file", "token"):
        assert name in action["inputs"]


def test_action_review_script_runs_and_posts(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    script = next(s for s in _action()["runs"]["steps"] if s["name"] == "Review")["run"]
    out = tmp_path / "github_output"
    out.write_text("")
    with FakeGitHub("acme/trainer") as gh:
        env = _env(**gh.env(pr=7, event_dir=tmp_path), BASE=repo.sha("main"), HEAD=repo.sha("feature"), POST="true",
                   SARIF="zoomer-ar.sarif", FAIL_ON="high", MAX_COMMENTS="", TRACE="", DB="", GITHUB_OUTPUT=str(out))
        proc = subprocess.run(["bash", "-e", "-c", script], cwd=repo.path, env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr  # the step itself succeeds; the Gate step fails the job
        assert len(gh.issue_comments[7]) == 1 and len(gh.review_comments[7]) == 3
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert outputs == {"exit-code": "1", "sarif-file": "zoomer-ar.sarif", "findings": "3"}
    assert sarif_errors(json.loads((repo.path / "zoomer-ar.sarif").read_text())) == []


def test_readme_and_docs_show_the_integrations():
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("## Pre-merge bot"):]
    assert "uses: " in section and "zoomer-ar-review" in section and "security-events: write" in section
    docs = (REPO_ROOT / "docs" / "review.md").read_text()
    assert "bench_review.py" in docs and "[tool.zoomer-ar]" in docs
    for rule in ("sync-point", "dataloader-bound", "single-tensor-optimizer"):
        assert f"`{rule}`" in docs


def test_benchmark_smoke():
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_review.py"), "--files", "40", "--jobs", "2"],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "bench_review: 40 changed files" in proc.stdout and "review: " in proc.stdout and "errors 0" in proc.stdout
