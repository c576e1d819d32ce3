"""DataLoader worker counts that fit the machine the program runs on: the dataloader-workers fixer's
DATALOADER_WORKERS (computed when the program runs) and the relaunch's num_workers setting (lowered
by `zoomer-ar relaunch` to the machine it runs on). Real processes pinned to one or two cores with
taskset, no mocked CPU counts."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import git_repo
from zoomer_ar.fix.api import fix_source
from zoomer_ar.fix.worker_count import EXPRESSION, NAME
from zoomer_ar.relaunch import RelaunchSpec, render_spec
from zoomer_ar.relaunch.cli import fit_to_machine
from zoomer_ar.relaunch.spec import Command
from zoomer_ar.relaunch.workers import count_note, fit_overrides, fitted_count

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "training_data" / "scenarios"
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
pinnable = pytest.mark.skipif(shutil.which("taskset") is None or not hasattr(os, "sched_getaffinity"),
                              reason="needs taskset and CPU affinity (Linux)")


def _pinned(cores: str, code: str, **env: str) -> str:
    """What ``code`` prints, run by this interpreter pinned to ``cores`` (taskset's list)."""
    done = subprocess.run(["taskset", "-c", cores, sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60, check=True)
    return done.stdout.strip()


@pinnable
@pytest.mark.parametrize(("cores", "env", "want"), [
    ("0", {}, 0),  # one core: a worker would only take turns with training
    ("0,1", {}, 1) if CPUS >= 2 else pytest.param("0,1", {}, 1, marks=pytest.mark.skip(reason="one CPU")),
    ("0,1", {"LOCAL_WORLD_SIZE": "2"}, 0) if CPUS >= 2 else pytest.param("0,1", {}, 0, marks=pytest.mark.skip(reason="one CPU")),
    ("0,1", {"LOCAL_WORLD_SIZE": ""}, 1) if CPUS >= 2 else pytest.param("0,1", {}, 1, marks=pytest.mark.skip(reason="one CPU")),
])
def test_the_inserted_count_fits_the_cores_the_program_may_use(cores, env, want):
    """The expression the fix inserts, run as the program runs it: the CPUs of its affinity (not the
    machine's count), shared by the node's training processes, one core left to each."""
    assert _pinned(cores, f"import os\n{NAME} = {EXPRESSION}\nprint({NAME})", **env) == str(want)


def test_the_count_is_capped_and_never_negative():
    code = f"import os\n{NAME} = {EXPRESSION}\nprint({NAME})"
    env = {**os.environ, "LOCAL_WORLD_SIZE": "64"}  # more processes than CPUs: 0, not a negative count
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=True).stdout.strip() == "0"
    assert "min(\n    8," in EXPRESSION


def test_explicit_option_stays_a_literal():
    src = "from torch.utils.data import DataLoader\nloader = DataLoader(ds, shuffle=True)\n"
    fixed = fix_source(src, ["dataloader-bound"], options={"dataloader-bound": {"num_workers": 3}})
    assert "num_workers=3, pin_memory=True, persistent_workers=True, prefetch_factor=2" in fixed and NAME not in fixed
    runtime = fix_source(src, ["dataloader-bound"])
    assert f"num_workers={NAME}" in runtime and f"persistent_workers={NAME} > 0" in runtime
    assert fix_source(runtime, ["dataloader-bound"]) == runtime


def test_fit_overrides_lowers_keeps_or_leaves_out():
    overrides = {"dataloader.num_workers": 4, "dataloader.pin_memory": True, "dataloader.persistent_workers": True}
    assert fit_overrides(overrides, 64) == (overrides, None)
    two, line = fit_overrides(overrides, 2)
    assert two == {**overrides, "dataloader.num_workers": 1} and "dataloader.num_workers=4 -> 1" in line
    one, line = fit_overrides(overrides, 1)
    assert one == {"dataloader.pin_memory": True} and "left out" in line and "2 usable" not in line
    # torchrun's processes share the node: 16 CPUs for 8 processes leave 1 worker each
    assert fit_overrides({"num-workers": 4}, 16, 8)[0] == {"num-workers": 1}
    assert fit_overrides({"data.workers": 8, "lr": 0.1}, 3)[0] == {"data.workers": 2, "lr": 0.1}
    assert fit_overrides({"compile": True}, 1) == ({"compile": True}, None)
    assert fitted_count(4, 1) == 0 and fitted_count(4, 2) == 1 and fitted_count(4, 96) == 4


def test_spec_note_states_the_assumption():
    note = count_note({"num-workers": 4, "pin-memory": True})
    assert note.startswith("num-workers=4 is the most") and "assumes those workers get cores" in note
    assert count_note({"pin-memory": True}) is None


def test_fit_to_machine_uses_torchrun_processes():
    spec = RelaunchSpec(job="j", command=Command(launcher="torchrun", script="t.py", nproc_per_node=4),
                        config_overrides={"dataloader.num_workers": 4})
    fitted, line = fit_to_machine(spec, cpus=8)
    assert fitted.config_overrides == {"dataloader.num_workers": 1} and "for 4 training processes" in line
    assert "dataloader.num_workers=1" in fitted.argv() and spec.config_overrides == {"dataloader.num_workers": 4}


@pinnable
def test_relaunch_on_one_core_leaves_the_workers_out(tmp_path):
    """`zoomer-ar relaunch` pinned to one core: the command it runs has no worker settings, and it says why."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("import sys\nprint(sys.argv[1:])\n")
    git_repo(src)
    spec = RelaunchSpec(job="j", command=Command(script="train.py", args=["--x"]), override_style="hydra",
                        config_overrides={"dataloader.num_workers": 4, "dataloader.pin_memory": True,
                                          "dataloader.persistent_workers": True})
    (tmp_path / "relaunch.yaml").write_text(render_spec(spec))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    base = [sys.executable, "-m", "zoomer_ar", "relaunch", str(tmp_path / "relaunch.yaml"), "--cwd", str(src)]
    one = subprocess.run(["taskset", "-c", "0", *base], capture_output=True, text=True, env=env, timeout=120)
    assert one.returncode == 0, one.stderr
    assert one.stdout.strip() == "['--x', 'dataloader.pin_memory=true']"
    assert "1 usable CPU:" in one.stderr and "dataloader.num_workers, dataloader.persistent_workers are left out" in one.stderr
    dry = subprocess.run(["taskset", "-c", "0", *base, "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert dry.returncode == 0 and "num_workers" not in dry.stdout and "left out" in dry.stderr


@pinnable
@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
def test_fixed_scenario_runs_on_one_core_without_workers(tmp_path):
    """The patched dataloader_bound scenario on one core: DATALOADER_WORKERS is 0, and the arguments that
    follow it (persistent_workers=False) are ones torch takes without workers (True would raise ValueError)."""
    for p in SCENARIOS.iterdir():
        if p.suffix == ".py":
            shutil.copy2(p, tmp_path / p.name)
    program = tmp_path / "dataloader_bound.py"
    fixed = fix_source(program.read_text(), ["dataloader-bound"])
    program.write_text(fixed.replace('    print(f"dataloader_bound: last loss', '    print("workers", loader.num_workers)\n'
                                     '    print(f"dataloader_bound: last loss'))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, program.name, "--out", str(tmp_path / "out"), "--steps", "1", "--skip", "0", "--warmup", "0"]
    done = subprocess.run(["taskset", "-c", "0", *cmd], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "workers 0" in done.stdout
