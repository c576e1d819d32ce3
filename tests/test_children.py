"""The engine's own child processes import nothing from the current directory (zoomer_ar/children.py).

Run from a user's folder holding a `multiprocessing/` package and a `random.py` (a PyTorch checkout,
a training repo), the spawned workers of `analyze` (streaming rank folders), `fix` (parsing trees)
and `batch` (Dask) imported those in place of the standard library's: user code ran, and `analyze`
died with "internal error: BrokenProcessPool". Here the user's modules write a marker file when
imported, and the commands run as a user runs them (the installed console script, that folder as
the current directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED_TRACES

CLI = Path(sys.executable).parent / "zoomer-ar"


@pytest.fixture
def user_folder(tmp_path) -> Path:
    d = tmp_path / "repo"
    (d / "multiprocessing").mkdir(parents=True)
    marker = tmp_path / "USER_CODE_RAN"
    (d / "multiprocessing" / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('multiprocessing\\n')\n")
    (d / "random.py").write_text(f"open({str(marker)!r}, 'a').write('random\\n')\n")
    for i in range(40):  # enough files for `fix` to read them in worker processes
        (d / f"train_{i}.py").write_text("import torch\nx = torch.zeros(3)\nfor i in range(3):\n    y = x.item()\n")
    return d


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    return subprocess.run([str(CLI), *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def _clean(folder: Path) -> None:
    marker = folder.parent / "USER_CODE_RAN"
    assert not marker.exists(), f"user code ran: {marker.read_text()}"


def test_streaming_workers_do_not_import_the_users_modules(user_folder, shared_traces):
    r = _run(["analyze", str(SHARED_TRACES / "param/dlrm_8ranks"), "--stream", "--no-files"], user_folder)
    assert r.returncode == 0, r.stderr
    assert "8 rank files" in r.stdout
    _clean(user_folder)


def test_fix_workers_do_not_import_the_users_modules(user_folder):
    r = _run(["fix", ".", "-j", "2"], user_folder)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("loop-item-sync") >= 40 or r.stdout.count("sync-point") >= 40
    _clean(user_folder)


def test_batch_workers_do_not_import_the_users_modules(user_folder, shared_traces):
    r = _run(["batch", str(SHARED_TRACES / "param/dlrm_8ranks"), "--no-record", "--workers", "2"], user_folder)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "1 analysed, 0 failed" in r.stdout + r.stderr
    _clean(user_folder)


def test_a_users_program_keeps_its_own_path(tmp_path):
    # the setting is the engine's children's only: what the engine leaves in the environment, a user's
    # program started later (zoomer-ar relaunch) inherits
    from zoomer_ar.children import child_env, no_cwd_imports

    before = os.environ.get("PYTHONSAFEPATH")
    with no_cwd_imports():
        assert os.environ["PYTHONSAFEPATH"] == "1"
    assert os.environ.get("PYTHONSAFEPATH") == before
    assert child_env({"A": "1"}) == {"A": "1", "PYTHONSAFEPATH": "1"}
