"""`analyze` reads a rank file too big to hold at once in windows of steps (zoomer_ar/stream/windowed.py):
the windows' merged figures are those of the one-pass analysis, the job info is the file's, and the
temporary windows are gone afterwards. The windowing is forced here with tiny ZOOMER_WINDOW_BYTES /
ZOOMER_WINDOW_MEMORY_MB; the memory it saves on multi-GB traces is measured by benchmarks/bench_huge.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile

import pytest

from zoomer_ar.analyze import analyze_path
from zoomer_ar.cli import main

from conftest import REPO, SHARED_TRACES

NS = SHARED_TRACES / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
RESNET = SHARED_TRACES / "kineto/resnet50_num_workers_0"
DLRM = SHARED_TRACES / "param/dlrm_8ranks"


def _close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def assert_equal_analyses(ref, got, where: str) -> None:
    """Every feature equal (floats to 1e-9: the windows add their sums in another order), the findings
    with their impacts, the bottleneck and the job info (the file's hash, size and events)."""
    diff = {k: (ref.features[k], got.features.get(k)) for k in ref.features
            if k != "per_rank" and not _close(ref.features[k], got.features.get(k))}
    assert not diff, f"{where}: features differ: {dict(list(diff.items())[:6])}"
    assert [(f.pattern, round(f.impact.ms_per_step, 3)) for f in ref.findings] == \
           [(f.pattern, round(f.impact.ms_per_step, 3)) for f in got.findings], where
    assert ref.bottleneck == got.bottleneck, where
    assert ref.job.model_dump() == got.job.model_dump(), f"{where}: job info differs"
    # the names compare judges a run by (program_match.py): every window's, as the one pass read them
    assert ref.program is not None and got.program == ref.program, f"{where}: program names differ"


def _windows_note(analysis) -> str | None:
    return next((n for n in analysis.notes if "windows of consecutive steps" in n), None)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """TMPDIR of the test's own: the windows' temporary folder must be gone afterwards."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


@pytest.mark.parametrize("path", [NS, RESNET], ids=["ns_resolution_trace", "resnet50_num_workers_0"])
def test_windowed_analysis_equals_the_one_pass_analysis(path, shared_traces, monkeypatch, scratch):
    monkeypatch.setenv("ZOOMER_WINDOW_BYTES", "0")
    ref = analyze_path(path, stream=True)
    assert _windows_note(ref) is None
    monkeypatch.setenv("ZOOMER_WINDOW_BYTES", "4000000")  # windows of about 2 MB of JSON
    got = analyze_path(path, stream=True)
    note = _windows_note(got)
    assert note is not None and "windows" in note, got.notes
    count = int(note.split(" read in ")[1].split()[0])
    assert count >= 2, note
    assert_equal_analyses(ref, got, path.name)
    assert got.program == analyze_path(path, stream=False).program  # and as the in-memory loader reads them
    assert list(scratch.iterdir()) == [], "the windows' temporary folder was left behind"


def test_one_pass_that_outgrows_its_memory_switches_to_windows(shared_traces, monkeypatch, scratch):
    monkeypatch.setenv("ZOOMER_WINDOW_BYTES", "0")
    ref = analyze_path(NS, stream=True)
    # the file's size does not call for windows (its JSON is about 15 MB), its one pass's memory does
    monkeypatch.setenv("ZOOMER_WINDOW_BYTES", "40000000")  # windows of half of it would be one, the whole file
    monkeypatch.setenv("ZOOMER_WINDOW_MEMORY_MB", "1")
    got = analyze_path(NS, stream=True)
    note = _windows_note(got)
    assert note is not None, got.notes
    # windows of half what the pass had read (not of half ZOOMER_WINDOW_BYTES: one window, the whole file)
    assert int(note.split(" read in ")[1].split()[0]) >= 2, note
    assert_equal_analyses(ref, got, NS.name)
    assert list(scratch.iterdir()) == []


def test_memory_switch_off_reads_in_one_pass(shared_traces, monkeypatch):
    monkeypatch.setenv("ZOOMER_WINDOW_BYTES", "20000000")
    monkeypatch.setenv("ZOOMER_WINDOW_MEMORY_MB", "0")
    assert _windows_note(analyze_path(NS, stream=True)) is None


def test_a_merged_trace_is_read_in_one_pass(shared_traces, tmp_path, monkeypatch):
    """A trace of several ranks (`trace merge`) cannot be cut by one rank's launches: one pass, as before."""
    merged = tmp_path / "merged.json"
    assert main(["trace", "merge", str(DLRM), str(merged)]) == 0
    monkeypatch.setenv("ZOOMER_WINDOW_BYTES", "0")
    ref = analyze_path(merged, stream=True)
    monkeypatch.setenv("ZOOMER_WINDOW_BYTES", "1000")
    got = analyze_path(merged, stream=True)
    assert _windows_note(got) is None
    assert_equal_analyses(ref, got, "merged dlrm_8ranks")


def test_rank_folder_windowed_in_worker_processes(shared_traces, tmp_path, monkeypatch):
    """Each rank file of a folder is cut and merged in the worker that reads it."""
    folder = tmp_path / "job"
    folder.mkdir()
    for rank, steps in ((0, "101..103"), (1, "102..105")):  # two different ranks cut from the real trace
        out = folder / f"rank{rank}.json"
        assert main(["trace", "slice", str(NS), str(out), "--steps", steps]) == 0
        doc = json.loads(out.read_text())
        doc["distributedInfo"] = {"rank": rank, "world_size": 2, "backend": "nccl"}
        out.write_text(json.dumps(doc))
    monkeypatch.setenv("ZOOMER_STREAM_WORKERS", "2")
    monkeypatch.setenv("ZOOMER_WINDOW_BYTES", "0")
    ref = analyze_path(folder, stream=True)
    monkeypatch.setenv("ZOOMER_WINDOW_BYTES", "3000000")
    got = analyze_path(folder, stream=True)
    assert sum("windows of consecutive steps" in n for n in got.notes) == 2, got.notes
    assert_equal_analyses(ref, got, "rank folder")


@pytest.mark.parametrize("env, value", [("ZOOMER_WINDOW_BYTES", "abc"), ("ZOOMER_WINDOW_BYTES", "-5"),
                                        ("ZOOMER_WINDOW_MEMORY_MB", "lots"), ("ZOOMER_WINDOW_MEMORY_MB", "-1")])
def test_bad_window_settings_are_refused_in_one_line(env, value, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "zoomer_ar.cli", "analyze", str(NS), "--out", str(tmp_path / "o")],
                          env={**os.environ, env: value}, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and env in lines[0] and "Traceback" not in proc.stderr, proc.stderr


_PEAK = """
import sys
from pathlib import Path
from zoomer_ar.analyze import analyze_path
a = analyze_path(Path(sys.argv[1]), stream=True)
hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))
print(hwm // 1024, sum('windows of consecutive steps' in n for n in a.notes))
"""


def test_windowed_memory_does_not_grow_with_the_trace(tmp_path):
    """Generated traces of 150 and 600 MB: in one pass the process's peak grows with the trace (about 80 MB
    per GB at these sizes); in windows of about 50 MB it grows only by the windows' summaries, which the
    merge holds together at the end (about 1 MB a window: 3 windows, then 12). Each run in a fresh process;
    the import floor is in all."""
    peaks = {}
    for size in ("0.15", "0.6"):
        trace = tmp_path / f"tiled_{size}.json"
        subprocess.run([sys.executable, str(REPO / "benchmarks/gen_trace.py"), "--size-gb", size, "--out", str(trace)],
                       check=True, capture_output=True, cwd=REPO)
        for setting in ("0", "100000000"):
            proc = subprocess.run([sys.executable, "-c", _PEAK, str(trace)], capture_output=True, text=True, cwd=REPO,
                                  env={**os.environ, "ZOOMER_WINDOW_BYTES": setting}, check=True)
            peak, windowed = map(int, proc.stdout.split())
            assert windowed == (setting != "0"), proc.stdout
            peaks[size, setting] = peak
        trace.unlink()
    one_pass_growth = peaks["0.6", "0"] - peaks["0.15", "0"]
    windowed_growth = peaks["0.6", "100000000"] - peaks["0.15", "100000000"]
    assert one_pass_growth >= 25, peaks
    assert windowed_growth <= one_pass_growth / 2, peaks


def test_a_named_pipe_is_refused_without_waiting_for_it(tmp_path):
    """The size test opens nothing that is not a regular file: a named pipe used to block `analyze` there."""
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "zoomer_ar.cli", "analyze", str(fifo), "--stream", "--out",
                           str(tmp_path / "o")], env={**os.environ, "ZOOMER_WINDOW_BYTES": "1000"},
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr, proc.stderr


_STOPPED = """
import sys, tempfile
from pathlib import Path
tempfile.tempdir = sys.argv[2]
import zoomer_ar.stream.load as L
real = L.stream_ranks

def slow(*a, **k):  # the first window read, then a pause for the SIGTERM
    out = real(*a, **k)
    print("reading", flush=True)
    import time; time.sleep(60)
    return out

L.stream_ranks = slow
from zoomer_ar.stream.windowed import read_windowed
read_windowed(Path(sys.argv[1]), 0)
"""


def test_sigterm_while_reading_windows_removes_them(shared_traces, tmp_path):
    """A worker the pool stops (SIGTERM) while it reads a rank's windows leaves no window files behind."""
    import signal

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _STOPPED, str(NS), str(scratch)], stdout=subprocess.PIPE,
                            text=True, cwd=REPO, env={**os.environ, "ZOOMER_WINDOW_BYTES": "4000000"})
    try:
        assert proc.stdout.readline().strip() == "reading"
        assert any(scratch.iterdir()), "no windows were written"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
    finally:
        proc.kill()
    assert list(scratch.iterdir()) == []


def test_memory_the_process_held_before_does_not_switch_to_windows(shared_traces, monkeypatch):
    """The switch counts what the read adds: a process already holding more than ZOOMER_WINDOW_MEMORY_MB (a
    service worker, a test run) reads a small trace in one pass (it used to read it in windows)."""
    monkeypatch.setenv("ZOOMER_WINDOW_BYTES", "40000000")
    monkeypatch.setenv("ZOOMER_WINDOW_MEMORY_MB", "60")
    held = bytearray(100 << 20)
    held[::4096] = b"x" * len(held[::4096])  # resident, not only reserved
    assert _windows_note(analyze_path(NS, stream=True)) is None
    del held
