"""zoomer_ar.capture as an engineer meets it around a training loop: wrong arguments, a folder it
cannot write, a folder that already holds a capture, a schedule longer than the run, Ctrl-C, and
ranks named from a launcher's environment. Every refusal comes before the loop runs a step."""

from __future__ import annotations

import gzip
import json
import os
import signal
import stat
from pathlib import Path

import pytest

from zoomer_ar.capture import CaptureError, SteadyStateProfiler, detect_rank, profile_steps

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@pytest.fixture(autouse=True)
def no_launcher_env(monkeypatch):
    for var in RANK_VARS + ("WORLD_SIZE",):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture()
def counted_step():
    """A tiny training step that counts its calls (torch needed)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    calls: list[int] = []

    def step(i: int) -> None:
        model(x).pow(2).mean().backward()
        calls.append(i)

    step.calls = calls  # type: ignore[attr-defined]
    return step


@pytest.mark.parametrize("kwargs, name", [
    ({"active": "5"}, "active"), ({"active": 2.5}, "active"), ({"active": True}, "active"),
    ({"skip_first": None}, "skip_first"), ({"warmup": 1.0}, "warmup"), ({"repeat": "2"}, "repeat"),
    ({"rank": "1"}, "rank"),
])
def test_a_wrong_argument_type_is_a_type_error_naming_it(tmp_path, kwargs, name):
    """A string, float, bool or None count used to be compared with ints (TypeError "'<' not
    supported between 'str' and 'int'") or silently truncated (active=2.5 recorded 2 steps)."""
    with pytest.raises(TypeError, match=rf"^{name} must be an int >= \d, not "):
        SteadyStateProfiler(tmp_path, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"active": 0}, "active must be >= 1, not 0"), ({"skip_first": -1}, "skip_first must be >= 0, not -1"),
    ({"repeat": 0}, "repeat must be >= 1"), ({"rank": -2}, "rank must be >= 0, not -2"),
])
def test_a_count_out_of_range_is_a_value_error(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        SteadyStateProfiler(tmp_path, **kwargs)
    assert not any(tmp_path.iterdir())  # nothing written


def test_profile_steps_checks_steps_and_step_fn_before_running(tmp_path):
    with pytest.raises(TypeError, match="step_fn must be callable"):
        profile_steps(None, out_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="steps must be an int"):
        profile_steps(lambda i: None, out_dir=tmp_path, steps="4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps=0 is too few for the schedule: it needs 4"):
        profile_steps(lambda i: None, out_dir=tmp_path, steps=0)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", "٣"])
def test_a_rank_variable_that_holds_no_rank_is_refused(monkeypatch, value):
    """RANK=-1 named the file rank--1.pt.trace.json.gz, and RANK=abc fell back to rank 0 (every
    rank of the job then writes the same file)."""
    monkeypatch.setenv("RANK", value)
    with pytest.raises(ValueError, match=r"RANK=.* in the environment is not a rank .*pass rank="):
        detect_rank()
    assert detect_rank(4) == (4, "argument")  # an explicit rank needs no environment


def test_rank_from_launchers_without_torchrun(monkeypatch):
    """srun or mpirun without torchrun set no RANK: every process was rank 0 and wrote one file."""
    monkeypatch.setenv("SLURM_PROCID", "5")
    assert detect_rank() == (5, "env SLURM_PROCID")
    monkeypatch.setenv("RANK", "3")  # torchrun's RANK comes first
    assert detect_rank() == (3, "env RANK")
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("SLURM_PROCID")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "7")
    assert detect_rank() == (7, "env OMPI_COMM_WORLD_RANK")
    monkeypatch.setenv("RANK", " ")  # blank: as if unset
    assert detect_rank() == (7, "env OMPI_COMM_WORLD_RANK")


def test_an_out_dir_that_is_a_file_is_refused_at_start(tmp_path):
    target = tmp_path / "trace.json"
    target.write_text("{}")
    prof = SteadyStateProfiler(target, skip_first=0, warmup=0, active=1)
    with pytest.raises(CaptureError, match="exists and is not a folder"):
        prof.start()
    assert target.read_text() == "{}"


def test_a_folder_it_cannot_write_is_refused_before_the_loop_runs(tmp_path):
    """An existing read-only folder passed mkdir(exist_ok=True); the PermissionError came when the
    first trace was ready, after skip_first steps of training."""
    if os.geteuid() == 0:  # root writes any folder with permission bits: /proc/self takes no new file
        target = Path("/proc/self")
        if not target.is_dir():
            pytest.skip("running as root without /proc: no folder root cannot write")
    else:
        target = tmp_path / "ro"
        target.mkdir()
        target.chmod(stat.S_IRUSR | stat.S_IXUSR)
    prof = SteadyStateProfiler(target, skip_first=0, warmup=0, active=1)
    try:
        with pytest.raises(CaptureError, match=rf"^{target}: cannot write the trace here \(.+\): choose a writable out_dir$"):
            prof.start()
    finally:
        if target != Path("/proc/self"):
            target.chmod(0o755)
    assert prof._prof is None  # no profiler was started


@pytest.mark.torch
def test_a_second_run_into_the_same_folder_keeps_the_first(counted_step, tmp_path):
    """The second run overwrote the first run's trace and job.json, and left its cycle-1 trace beside
    the new files: one folder, two runs. Now it is refused before its first step; overwrite=True
    replaces every file of the earlier run of that rank."""
    profile_steps(counted_step, out_dir=tmp_path, warmup=0, active=1, repeat=2, job_name="first")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert {str(p.relative_to(tmp_path)) for p in before} == {"rank-0.pt.trace.json.gz", "cycle-1/rank-0.pt.trace.json.gz",
                                                              "job.json"}
    counted_step.calls.clear()
    with pytest.raises(CaptureError, match=r"already holds a capture of rank 0 \(rank-0.pt.trace.json.gz, "
                                           r"cycle-1/rank-0.pt.trace.json.gz, job.json\): pass overwrite=True"):
        profile_steps(counted_step, out_dir=tmp_path, warmup=0, active=1, job_name="second")
    assert counted_step.calls == []  # refused before the loop ran
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before

    res = profile_steps(counted_step, out_dir=tmp_path, warmup=0, active=1, job_name="second", overwrite=True)
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["job.json", "rank-0.pt.trace.json.gz"]  # the first run's cycle-1 is gone
    assert res.traces == [tmp_path / "rank-0.pt.trace.json.gz"]
    assert json.loads((tmp_path / "job.json").read_text())["job_name"] == "second"


@pytest.mark.torch
def test_ranks_of_one_job_share_a_folder(counted_step, tmp_path, monkeypatch):
    """Only a rank's own files count as an earlier capture: rank 1 starts beside rank 0's files."""
    monkeypatch.setenv("RANK", "0")
    profile_steps(counted_step, out_dir=tmp_path, warmup=0, active=1)
    monkeypatch.setenv("RANK", "1")
    profile_steps(counted_step, out_dir=tmp_path, warmup=0, active=1)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "job.json", "job.ranks/rank-1.json", "rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz"]


@pytest.mark.torch
def test_a_schedule_longer_than_the_run_warns(counted_step, tmp_path):
    """The loop stopped before the first recorded step: no trace, and not a word about it."""
    with pytest.warns(RuntimeWarning, match=r"no step recorded in .*: the loop ran 10 step\(s\) and stopped before "
                                            r"step 552, the first the schedule records \(skip_first 550 \+ wait 0 \+ "
                                            r"warmup 2\); lower skip_first or run the loop for 557 steps"):
        with SteadyStateProfiler(tmp_path, skip_first=550, warmup=2, active=5) as prof:
            for i in range(10):
                counted_step(i)
                prof.step()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.json"]
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["complete"] is False and job["traces"] == [] and job["steps_run"] == 10


@pytest.mark.torch
def test_ctrl_c_mid_run_leaves_no_half_written_file(counted_step, tmp_path):
    """Ctrl-C in the loop: the user's KeyboardInterrupt comes through, the profiler is stopped, and
    the folder holds no job.json and no temporary file."""
    import torch

    # Python's own Ctrl-C handler: a process started in the background by a non-interactive shell (`cmd &`,
    # as CI scripts may run the suite) inherits SIGINT ignored, and the signal would never arrive
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_mid_run(counted_step, tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not torch.autograd.profiler._is_profiler_enabled
    assert not (tmp_path / "job.json").exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".")]


def _interrupt_mid_run(counted_step, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with SteadyStateProfiler(tmp_path, skip_first=1, warmup=1, active=3) as prof:
            for i in range(10):
                counted_step(i)
                prof.step()
                if i == 3:
                    os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered to this process


def test_an_interrupted_gzip_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Ctrl-C (or a full disk) while a trace was being compressed left rank-N.pt.trace.json.gz.tmp."""
    import zoomer_ar.capture as capture

    src = tmp_path / "src.json"
    src.write_text(json.dumps({"traceEvents": [{"name": "x" * 100}] * 1000}))
    dst = tmp_path / "out" / "rank-0.pt.trace.json.gz"
    dst.parent.mkdir()

    def interrupted(fin, fout, length=0):
        fout.write(fin.read(4096))
        raise KeyboardInterrupt  # the moment the user pressed Ctrl-C

    monkeypatch.setattr(capture.shutil, "copyfileobj", interrupted)
    with pytest.raises(KeyboardInterrupt):
        capture._gzip_file(str(src), dst)
    assert list(dst.parent.iterdir()) == []
    monkeypatch.undo()
    capture._gzip_file(str(src), dst)
    with gzip.open(dst, "rt") as fh:
        assert json.load(fh)["traceEvents"][0]["name"] == "x" * 100


@pytest.mark.torch
def test_overwrite_keeps_the_earlier_capture_until_a_new_trace_is_written(counted_step, tmp_path):
    """overwrite=True deleted the earlier run's files when the profiler started: a new run that then failed
    (an OOM, a bug, Ctrl-C) before its first recorded step left the folder with neither run's capture,
    and one too short to record wrote a job.json over the earlier run's, beside its trace."""
    profile_steps(counted_step, out_dir=tmp_path, warmup=0, active=1, repeat=2, job_name="first")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    with pytest.raises(ZeroDivisionError):
        with SteadyStateProfiler(tmp_path, skip_first=2, warmup=0, active=1, overwrite=True) as prof:
            for i in range(5):
                if i == 1:
                    1 / 0  # the new run fails before its first recorded step (step 2)
                counted_step(i)
                prof.step()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before

    with pytest.warns(RuntimeWarning, match=r"no step recorded .*; the earlier capture there is kept \(rank-0"):
        with SteadyStateProfiler(tmp_path, skip_first=5, warmup=0, active=1, overwrite=True) as prof:
            for i in range(2):
                counted_step(i)
                prof.step()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.torch
def test_repeat_does_not_pass_on_torchs_warning_that_cycles_are_lost(tmp_path):
    """With repeat=2 torch warned "Only events from the current cycle will be reported. To keep events
    across cycles, set acc_events=True": the helper writes each cycle to its own file, so nothing is lost
    and the advice does not apply. (torch warns once per process: the capture runs in a fresh one.)"""
    import subprocess
    import sys

    code = ("import warnings, torch; warnings.simplefilter('always')\n"
            "from zoomer_ar.capture import profile_steps\n"
            "m, x = torch.nn.Linear(8, 8), torch.randn(4, 8)\n"
            f"profile_steps(lambda i: m(x).sum().backward(), out_dir={str(tmp_path / 'run')!r}, warmup=1, active=1, repeat=2)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "clears events at the end of each cycle" not in out.stderr
    assert (tmp_path / "run" / "cycle-1" / "rank-0.pt.trace.json.gz").is_file()


@pytest.mark.torch
def test_a_job_killed_long_after_its_capture_keeps_its_job_file(tmp_path):
    """job.json was written only when the profiler stopped: a loop that trained on under it after the
    recorded steps and was then killed (SIGTERM at the end of an allocation, the OOM killer) left the
    trace without job.json, and relaunch without the command. It is now written with the last trace."""
    import subprocess
    import sys

    code = ("import os, signal, sys, torch\n"
            "from zoomer_ar.capture import SteadyStateProfiler\n"
            "m, x = torch.nn.Linear(8, 8), torch.randn(4, 8)\n"
            "with SteadyStateProfiler(sys.argv[1], skip_first=1, warmup=0, active=2) as prof:\n"
            "    for i in range(100):\n"
            "        m(x).sum().backward()\n"
            "        prof.step()\n"
            "        if i == 10:\n"
            "            os.kill(os.getpid(), signal.SIGKILL)\n")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["job.json", "rank-0.pt.trace.json.gz"]
    job = json.loads((out / "job.json").read_text())
    assert job["complete"] is True and job["steps_recorded"] == [1, 2] and job["traces"] == ["rank-0.pt.trace.json.gz"]
    assert job["argv"] == ["-c", str(out)]
