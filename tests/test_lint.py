"""The code passes ruff's pyflakes rules (undefined names, unused imports and variables, shadowed
definitions): the configuration is pyproject.toml's [tool.ruff]; `make lint` runs the same check."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKED = ["zoomer_ar", "fixers", "rules", "benchmarks", "training_data", "tests"]


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ruff")
    assert found, "ruff is not installed: it is a dev dependency (pip install -e '.[dev]')"
    return [found]


def test_code_passes_the_pyflakes_rules():
    proc = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise", *CHECKED],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_check_would_catch_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return undefined_thing\n")
    proc = subprocess.run([*_ruff(), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(bad)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "F821" in proc.stdout
