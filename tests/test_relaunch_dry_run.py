"""The dry run says what the real run would stop at (a recorded interpreter that is gone, a patch
that is missing or does not apply) instead of printing the command as if it would run; the real
run stops at the same reason, in one line, exit 2. The real CLI in a subprocess, a real checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import git_repo
from zoomer_ar.relaunch import RelaunchSpec, render_spec
from zoomer_ar.relaunch.spec import Command

PATCH = ("--- a/job.py\n+++ b/job.py\n@@ -1,2 +1,2 @@\n-WORKERS = 0\n+WORKERS = 4\n"
         " open('ran.txt', 'w').write(str(WORKERS))\n")


def checkout(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "job.py").write_text("WORKERS = 0\nopen('ran.txt', 'w').write(str(WORKERS))\n")
    return git_repo(folder)


def relaunch(spec: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(spec), *extra], env=env,
                          capture_output=True, text=True, timeout=300)


def write(tmp_path: Path, repo: Path, python: str) -> Path:
    (tmp_path / "patch.diff").write_text(PATCH)
    spec = RelaunchSpec(job="j", command=Command(python=python, script="job.py"), cwd=str(repo), patch="patch.diff")
    (tmp_path / "relaunch.yaml").write_text(render_spec(spec))
    return tmp_path / "relaunch.yaml"


def test_dry_run_says_the_recorded_interpreter_is_gone(tmp_path):
    repo = checkout(tmp_path / "repo")
    gone = str(tmp_path / "old-venv" / "bin" / "python")  # the venv the job ran on, since deleted
    spec = write(tmp_path, repo, gone)
    dry = relaunch(spec, "--dry-run")
    assert dry.returncode == 0 and dry.stdout.splitlines()[-1] == f"{gone} job.py"
    assert f"note: a real run stops here: the recorded interpreter {gone} is not on this machine" in dry.stderr
    real = relaunch(spec)
    assert real.returncode == 2 and len(real.stderr.strip().splitlines()) == 1
    assert f"the recorded interpreter {gone} is not on this machine" in real.stderr
    assert not (repo / "ran.txt").exists()
    assert subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True).stdout == ""


def test_dry_run_says_the_patch_does_not_apply_or_is_applied(tmp_path):
    repo = checkout(tmp_path / "repo")
    spec = write(tmp_path, repo, sys.executable)
    assert "note:" not in relaunch(spec, "--dry-run").stderr  # applies: nothing to say
    (repo / "job.py").write_text("WORKERS = 1\nopen('ran.txt', 'w').write(str(WORKERS))\n")  # edited since
    dry = relaunch(spec, "--dry-run")
    assert dry.returncode == 0 and "note: a real run stops here: patch.diff does not apply" in dry.stderr
    real = relaunch(spec)
    assert real.returncode == 2 and "patch does not apply" in real.stderr
    subprocess.run(["git", "checkout", "job.py"], cwd=repo, check=True)
    assert relaunch(spec).returncode == 0 and (repo / "ran.txt").read_text() == "4"
    again = relaunch(spec, "--dry-run")
    assert "patch.diff is already applied" in again.stderr


def test_torchrun_spec_with_the_interpreter_gone_names_torchrun_as_the_fallback(tmp_path):
    """null command.python runs `torchrun` from PATH for a torchrun launch, not `python`: the line says so."""
    repo = checkout(tmp_path / "repo")
    gone = str(tmp_path / "old-venv" / "bin" / "python")
    spec = RelaunchSpec(job="j", command=Command(launcher="torchrun", python=gone, script="job.py", nproc_per_node=2),
                        cwd=str(repo))
    (tmp_path / "relaunch.yaml").write_text(render_spec(spec))
    real = relaunch(tmp_path / "relaunch.yaml")
    assert real.returncode == 2 and "(or null for `torchrun` on PATH)" in real.stderr, real.stderr


def test_no_git_on_path_is_one_line_not_an_internal_error(tmp_path):
    """A node without git (a slim container): the patch cannot be applied; one line, exit 2, nothing run."""
    repo = checkout(tmp_path / "repo")
    spec = write(tmp_path, repo, sys.executable)
    no_git = tmp_path / "bin"
    no_git.mkdir()
    env = dict(os.environ, PATH=str(no_git))
    for extra, code in (("--dry-run", 0), (None, 2)):
        done = subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(spec), *([extra] if extra else [])],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == code, done.stderr
        assert "git is not on PATH" in done.stderr and "internal error" not in done.stderr
    assert not (repo / "ran.txt").exists()
