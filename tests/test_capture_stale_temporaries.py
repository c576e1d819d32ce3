"""A capture killed with SIGKILL mid-export left its hidden temporary (the uncompressed export: gigabytes
for a GPU trace) beside the output for good: no later capture removed it. A later capture of that rank
now removes the temporaries of its own naming that are old and whose writer is gone, and never one a
running process holds (each writer keeps an flock on its temporary; a name carries its pid and host)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HOURS = 3600

#: a real capture of rank 0 into argv[1] whose export is stopped right after it wrote the temporary:
#: "kill" SIGKILLs the process there, "pause" says so on stdout and waits for stdin to close
_CAPTURE = r"""
import os, signal, sys, torch
from zoomer_ar.capture import profile_steps
real = torch.profiler.profile.export_chrome_trace
def export_then_stop(self, path):
    real(self, path)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    print("exported", path, flush=True)
    sys.stdin.read()
torch.profiler.profile.export_chrome_trace = export_then_stop
model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
profile_steps(lambda i: model(x).sum().backward(), out_dir=sys.argv[1], rank=0, skip_first=0, warmup=0, active=1)
"""


def _capture(out: Path) -> None:
    torch = pytest.importorskip("torch")
    from zoomer_ar.capture import profile_steps

    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    profile_steps(lambda i: model(x).sum().backward(), out_dir=out, rank=0, skip_first=0, warmup=0, active=1)


def _killed_mid_export(out: Path) -> Path:
    proc = subprocess.run([sys.executable, "-c", _CAPTURE, str(out), "kill"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    (left,) = out.iterdir()
    assert left.name.startswith(".rank-0.pt.trace.json.gz.") and left.stat().st_size > 0
    return left


def _age(path: Path, hours: float) -> None:
    t = time.time() - hours * HOURS
    os.utime(path, (t, t))


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.torch
def test_a_later_capture_removes_what_a_killed_capture_left(tmp_path):
    out = tmp_path / "run"
    left = _killed_mid_export(out)
    legacy = out / ".rank-0.pt.trace.json.gz.ab12cd34.json.tmp"  # an earlier version's naming, no lock, no pid
    legacy.write_text("{")
    gz_legacy = out / "rank-0.pt.trace.json.gz.tmp"
    gz_legacy.write_bytes(b"\x1f\x8b")
    for p in (left, legacy, gz_legacy):
        _age(p, 7)
    with pytest.warns(RuntimeWarning, match=r"removed 3 temporary file\(s\) an earlier capture of rank 0 left"):
        _capture(out)
    assert _names(out) == ["job.json", "rank-0.pt.trace.json.gz"]


@pytest.mark.torch
def test_a_killed_writers_leftover_goes_after_a_minute_an_unproven_one_after_hours(tmp_path):
    """This host's writer, its process gone and its lock free: two minutes are old enough (a run restarted
    after an OOM kill gets its room back). An earlier version's name says no writer: kept for hours."""
    out = tmp_path / "run"
    left = _killed_mid_export(out)
    legacy = out / ".rank-0.pt.trace.json.gz.ab12cd34.json.tmp"
    legacy.write_text("{")
    for p in (left, legacy):
        _age(p, 2 / 60)
    with pytest.warns(RuntimeWarning, match=r"removed 1 temporary file\(s\)"):
        _capture(out)
    assert _names(out) == sorted([legacy.name, "job.json", "rank-0.pt.trace.json.gz"])


@pytest.mark.torch
def test_a_recent_leftover_and_other_ranks_ones_are_kept(tmp_path):
    """Written just now (dated an hour ahead, as a write in progress would be, whatever the machine's
    load), or another rank's: left as it is."""
    out = tmp_path / "run"
    left = _killed_mid_export(out)
    _age(left, -1)
    other_rank = out / ".rank-1.pt.trace.json.gz.ab12cd34.json.tmp"
    other_rank.write_text("{")
    _age(other_rank, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _capture(out)
    assert _names(out) == sorted([left.name, other_rank.name, "job.json", "rank-0.pt.trace.json.gz"])


@pytest.mark.torch
def test_a_temporary_in_use_is_never_removed(tmp_path):
    """A capture paused mid-export (its process running, its temporary old) keeps its file, and finishes."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", _CAPTURE, str(out), "pause"], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("exported "), line
        held = Path(line.split(" ", 1)[1].strip())
        _age(held, 7)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            _capture(out)
        assert held.exists()
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=300) == 0
    assert not held.exists()


def test_a_temporary_locked_on_another_host_is_kept_until_its_lock_goes(tmp_path):
    """A name from another host (no pid to check here): the lock says whether its writer is alive."""
    pytest.importorskip("fcntl")
    from zoomer_ar.capture_temp import remove_stale

    tmp = tmp_path / ".rank-0.pt.trace.json.gz.zoomer-4242@other-host.example.0a1b2c3d.json.tmp"
    tmp.write_text("{}")
    _age(tmp, 7)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'rb'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('locked', flush=True); sys.stdin.read()", str(tmp)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert remove_stale(tmp_path, ["rank-0.pt.trace.json.gz"]) == [] and tmp.exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert remove_stale(tmp_path, ["rank-0.pt.trace.json.gz"]) == [tmp] and not tmp.exists()


def test_a_dead_writer_on_this_host_is_told_by_its_pid(tmp_path):
    """Named for this host and a process that is running (this one): kept even without a lock."""
    from zoomer_ar.capture_temp import _host, remove_stale

    mine = tmp_path / f".job.json.zoomer-{os.getpid()}@{_host()}.9f8e7d6c.json.tmp"
    mine.write_text("{}")
    _age(mine, 7)
    assert remove_stale(tmp_path, ["job.json"]) == [] and mine.exists()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f".job.json.zoomer-{gone.stdout.strip()}@{_host()}.9f8e7d6c.json.tmp"
    dead.write_text("{}")
    _age(dead, 7)
    assert remove_stale(tmp_path, ["job.json"]) == [dead]


@pytest.mark.torch
def test_the_trace_and_job_file_keep_the_mode_a_plain_write_gives(tmp_path):
    """They are written as temporaries and renamed: created 0600 (tempfile.mkstemp's mode), a trace in a
    shared folder became unreadable to the others who read it; now 0666 less the umask, as open() gives."""
    old = os.umask(0o022)
    try:
        _capture(tmp_path / "run")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "run").iterdir()}
    assert modes == {"job.json": 0o644, "rank-0.pt.trace.json.gz": 0o644}


def test_on_windows_no_process_is_signalled(monkeypatch):
    """os.kill(pid, 0) asks whether a process runs on POSIX and terminates it on Windows: there the
    sweep must not ask, and counts the writer as running (its temporary is kept)."""
    from zoomer_ar import capture_temp

    signalled: list[tuple[int, int]] = []
    with monkeypatch.context() as m:  # os.name is everyone's (pathlib's too): patched for the one call
        m.setattr(capture_temp.os, "name", "nt")
        m.setattr(capture_temp.os, "kill", lambda pid, sig: signalled.append((pid, sig)))
        running = capture_temp._pid_running(4242)
    assert running is True and signalled == []
