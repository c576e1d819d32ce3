"""A job whose code is not on its command line (``python -c CODE``, ``python - < train.py``) has no
command to replay: sys.argv holds "-c" or "-" and the arguments, not the code. The spec used to
replay ``python -c traces/x``, running an argument as the program (NameError); it is now a template
whose first note says why, and relaunch refuses it in one line. A real program under the real capture
helper (torch, CPU), the real analyze and `zoomer-ar relaunch`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.relaunch import load_spec

CODE = '''
import sys, torch
from zoomer_ar.capture import SteadyStateProfiler
with SteadyStateProfiler(sys.argv[1], skip_first=0, warmup=1, active=1) as prof:
    while not prof.done:
        torch.randn(8, 8).sum()
        prof.step()
'''


@pytest.mark.parametrize("how", ["-c", "-"])
def test_code_not_on_the_command_line_gives_a_template(tmp_path, capsys, how):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    argv = [sys.executable, "-c", CODE, "traces/x"] if how == "-c" else [sys.executable, "-", "traces/x"]
    ran = subprocess.run(argv, cwd=tmp_path, env=env, input=None if how == "-c" else CODE, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert main(["analyze", str(tmp_path / "traces" / "x"), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    capsys.readouterr()
    spec = load_spec(tmp_path / "o" / "relaunch.yaml")
    assert spec.is_template()
    assert spec.notes[0].startswith(f"TEMPLATE: job.json records the job as started as `python {how}`")
    done = subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(tmp_path / "o" / "relaunch.yaml")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "a template, not a runnable command" in done.stderr
    assert not (tmp_path / "traces" / "x-relaunch").exists()
