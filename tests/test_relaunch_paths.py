"""Paths a relaunch spec gives: a relative ``cwd`` (a spec kept beside the checkout it runs in) is
taken from the spec's folder, as its ``patch`` is, wherever `zoomer-ar relaunch` is started from.
The real CLI in a subprocess, a real git checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import git_repo
from zoomer_ar.relaunch import RelaunchSpec, render_spec
from zoomer_ar.relaunch.spec import Command


def checkout(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "job.py").write_text("import os\nWORKERS = 0\nopen('ran.txt', 'w').write(f'{WORKERS} {os.getcwd()}')\n")
    return git_repo(folder)


def relaunch(spec: Path, started_in: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(spec), *extra], cwd=started_in,
                          env=env, capture_output=True, text=True, timeout=300)


def test_relative_cwd_is_taken_from_the_specs_folder(tmp_path):
    repo = checkout(tmp_path / "work" / "repo")
    specs = tmp_path / "work" / "zoomer-out"
    specs.mkdir()
    (specs / "patch.diff").write_text("--- a/job.py\n+++ b/job.py\n@@ -1,3 +1,3 @@\n import os\n-WORKERS = 0\n"
                                      "+WORKERS = 4\n open('ran.txt', 'w').write(f'{WORKERS} {os.getcwd()}')\n")
    spec = RelaunchSpec(job="j", command=Command(python=sys.executable, script="job.py"), cwd="../repo",
                        patch="patch.diff")
    (specs / "relaunch.yaml").write_text(render_spec(spec))
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()

    dry = relaunch(specs / "relaunch.yaml", elsewhere, "--dry-run")
    assert dry.returncode == 0 and "not on this machine" not in dry.stderr, dry.stderr
    assert dry.stderr.strip().splitlines()[-1] == f"cd {repo.resolve()}"

    done = relaunch(specs / "relaunch.yaml", elsewhere)
    assert done.returncode == 0, done.stderr
    assert (repo / "ran.txt").read_text() == f"4 {repo.resolve()}"
    assert not (elsewhere / "ran.txt").exists()


def test_a_path_no_file_system_can_hold_is_one_line(tmp_path):
    """cwd and patch longer than a file name (ENAMETOOLONG): one line, exit 2, not an internal error."""
    spec = tmp_path / "relaunch.yaml"
    spec.write_text(f'schema_version: "1.2"\njob: "j"\ncwd: "/tmp/{"c" * 5000}"\npatch: "{"p" * 5000}.diff"\n'
                    'command:\n  script: "t.py"\n')
    for extra, code in (("--dry-run", 0), (None, 2)):
        done = relaunch(spec, tmp_path, *([extra] if extra else []))
        assert done.returncode == code and "internal error" not in done.stderr, done.stderr[-500:]
    assert "is not on this machine" in done.stderr and len(done.stderr.strip().splitlines()) == 1
