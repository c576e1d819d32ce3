"""How a relaunched job ends: Ctrl-C reaches the job, which relaunch lets finish stopping (saving,
exporting its trace) instead of killing it a quarter second later; a job ended by a signal gives
the exit status a shell gives (128 + N) and a line naming the signal. The real `zoomer-ar relaunch`,
a real process group and real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from zoomer_ar.relaunch import RelaunchSpec, render_spec
from zoomer_ar.relaunch.spec import Command

#: started: marker written; on Ctrl-C it takes a while to save (as a job writing a checkpoint or its trace)
JOB = '''
import os, signal, sys, time
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
open("started", "w").write("x")
try:
    time.sleep(300)
except KeyboardInterrupt:
    time.sleep(1.5)
    open("saved", "w").write("x")
    raise
'''


def spec_for(tmp_path: Path, arg: str) -> Path:
    (tmp_path / "job.py").write_text(JOB)
    spec = RelaunchSpec(job="j", command=Command(python=sys.executable, script="job.py", args=[arg]),
                        cwd=str(tmp_path))
    path = tmp_path / "relaunch.yaml"
    path.write_text(render_spec(spec))
    return path


def start(spec: Path) -> subprocess.Popen:
    """`zoomer-ar relaunch` as the foreground job of a terminal: its own process group, which Ctrl-C signals."""
    return subprocess.Popen([sys.executable, "-m", "zoomer_ar", "relaunch", str(spec)], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_lets_the_job_finish_stopping(tmp_path):
    proc = start(spec_for(tmp_path, "wait"))
    deadline = time.monotonic() + 240
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    _, err = proc.communicate(timeout=240)
    assert (tmp_path / "saved").exists(), err  # the job's own clean-up ran to its end
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == "zoomer-ar: the job was stopped by SIGINT"


def test_a_job_killed_by_a_signal_exits_as_a_shell_says(tmp_path):
    done = subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(spec_for(tmp_path, "kill"))],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 128 + signal.SIGKILL  # 137, not 247 (SystemExit(-9))
    assert done.stderr.strip() == "zoomer-ar: the job was stopped by SIGKILL"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()


def test_sigterm_to_relaunch_alone_stops_the_job(tmp_path):
    """`kill PID` of relaunch (not its process group): the job is stopped too, not left running orphaned."""
    spec = spec_for(tmp_path, "wait")
    (tmp_path / "job.py").write_text(JOB.replace('open("started", "w").write("x")',
                                                 'open("started", "w").write(str(os.getpid()))'))
    proc = start(spec)
    deadline = time.monotonic() + 240
    while not (tmp_path / "started").exists() or not (tmp_path / "started").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.1)
    job_pid = int((tmp_path / "started").read_text())
    try:
        proc.terminate()  # SIGTERM to relaunch only
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 128 + signal.SIGTERM
        assert err.strip().splitlines()[-1] == "zoomer-ar: the job was stopped by SIGTERM"
        assert not _running(job_pid)
    finally:
        if _running(job_pid):  # the job this test started, left running without the fix
            os.kill(job_pid, signal.SIGKILL)
