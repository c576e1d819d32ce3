"""Shared test fixtures: the real-trace corpus in ../shared/traces and its labels; a fresh analyze."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(os.environ.get("ZOOMER_SHARED_TRACES", REPO.parent / "shared" / "traces"))
EXAMPLES = REPO / "examples"


def shared_available() -> bool:
    return (SHARED_TRACES / "LABELS.yaml").is_file()


def load_labels() -> dict:
    if not shared_available():
        return {}
    return yaml.safe_load((SHARED_TRACES / "LABELS.yaml").read_text())


def all_trace_files() -> list[Path]:
    if not shared_available():
        return []
    return sorted(
        p for p in SHARED_TRACES.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz", ".gz"))
    )


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not shared_available():
        if os.environ.get("CI"):
            pytest.fail(f"the real-trace corpus is missing at {SHARED_TRACES}")
        pytest.skip(f"real-trace corpus not found at {SHARED_TRACES}")
    return SHARED_TRACES


@pytest.fixture
def fresh_analyze(tmp_path):
    """`zoomer-ar analyze` of a bundled example in a fresh interpreter: returns (the imported modules
    whose top-level package is in `watch`, the output folder). What one analysis imports is only
    visible in a new process (the test process has imported everything)."""

    def run(watch: tuple[str, ...], example: str = "dataloader_bound") -> tuple[list[str], Path]:
        out = tmp_path / f"fresh-{example}"
        code = (
            "import sys; from zoomer_ar.cli import main\n"
            f"rc = main(['analyze', {str(EXAMPLES / 'traces' / example)!r}, '--out', {str(out)!r}, '--no-progress'])\n"
            "assert rc == 0, rc\n"
            f"print('MODULES', sorted(m for m in sys.modules if m.split('.')[0] in {watch!r}))\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES "))
        return ast.literal_eval(line[len("MODULES "):]), out

    return run


def one_error_line(capsys, *parts: str) -> str:
    """The command's stderr: exactly one `zoomer-ar: error:` line (no internal error), holding each of `parts`."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("zoomer-ar: error:") and "internal error" not in err, err
    for p in parts:
        assert p in err, err
    return err


def files_under(folder: Path) -> list[str]:
    """Every path below `folder`, relative to it, sorted (what a command left behind)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


SYNC_POINT_SOURCES = ("sync_point.py", "_common.py")  # what examples/traces/sync_point's frames name


def git_repo(folder: Path) -> Path:
    """``folder`` as a git repository with everything in it committed (what a user's checkout is)."""
    run = dict(cwd=folder, check=True, capture_output=True)
    subprocess.run(["git", "init", "-q"], **run)
    subprocess.run(["git", "add", "-A"], **run)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], **run)
    return folder


def copy_scenario_sources(folder: Path, names: tuple[str, ...] = SYNC_POINT_SOURCES) -> Path:
    """`folder` created, holding copies of the scenario programs `names` (training_data/scenarios)."""
    folder.mkdir()
    for name in names:
        shutil.copy(REPO / "training_data" / "scenarios" / name, folder / name)
    return folder
