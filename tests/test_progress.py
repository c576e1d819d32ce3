"""Progress on long loads: every reader reports the bytes it has read of each file, up to the file's
size, and `zoomer-ar analyze` shows them as bars in a terminal - for rank files read one after the
other, and for rank files read at once in worker processes (the streaming reader's pool), which
report through shared memory."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zoomer_ar.load import load_job
from zoomer_ar.stream import load_job_streaming

from conftest import REPO, SHARED_TRACES

RESNET = SHARED_TRACES / "kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
STACKS = REPO / "examples/gpu/sync_point/rank-0.pt.trace.json.gz"  # H200, with_stack: evidence frames


def _recorder():
    calls: dict[str, list[tuple[int, int]]] = {}

    def factory(path: Path):
        seen = calls.setdefault(path.name, [])
        return lambda done, total: seen.append((done, total))

    return calls, factory


def _reads(calls: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The reads of a file in its reports: one starts where the bytes read go back down."""
    reads: list[list[tuple[int, int]]] = []
    for done, total in calls:
        if not reads or done < reads[-1][-1][0]:
            reads.append([])
        reads[-1].append((done, total))
    return reads


def _check(calls: list[tuple[int, int]], size: int, reads: int | None = None) -> None:
    assert calls, "no progress reported"
    assert all(t == size for _, t in calls)
    got = _reads(calls)
    assert got[-1][-1] == (size, size)  # the last read went to the end of the file
    if reads is not None:
        assert len(got) == reads and all(r[-1] == (size, size) for r in got)


@pytest.fixture
def folder(tmp_path, shared_traces) -> Path:
    """Two rank files of 1.2 MB (gzip) each."""
    d = tmp_path / "job"
    d.mkdir()
    doc = json.loads(gzip.decompress(RESNET.read_bytes()))
    for r in (0, 1):
        doc["distributedInfo"] = {"rank": r, "world_size": 2}
        (d / f"rank-{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    return d


def test_the_in_memory_loader_reports_each_file(folder):
    calls, factory = _recorder()
    load_job(folder, progress_factory=factory)
    for f in folder.iterdir():
        _check(calls[f.name], f.stat().st_size, reads=1)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "worker-processes"])
def test_the_streaming_loader_reports_each_file_also_from_worker_processes(folder, workers):
    # the pool's workers write their bytes read into shared memory; the main process passes them on
    # while it waits (it reported nothing for files read in workers)
    calls, factory = _recorder()
    load_job_streaming(folder, workers=workers, progress_factory=factory, chunk=64 << 10)
    for f in folder.iterdir():
        _check(calls[f.name], f.stat().st_size)
    if workers == 2:
        assert any(len(c) > 1 for c in calls.values())  # reports while reading, not only at the end


def test_a_second_read_of_a_file_is_reported_from_its_start():
    # a trace with Python stacks is read again for its evidence frames: that read reports too (it used to
    # run silent after the first read's bar had closed)
    calls, factory = _recorder()
    load_job_streaming(STACKS, workers=1, progress_factory=factory, chunk=64 << 10)
    _check(calls[STACKS.name], STACKS.stat().st_size, reads=2)


def test_a_refused_file_read_in_a_worker_closes_its_bar(folder):
    bad = folder / "rank-2.json"
    bad.write_text('{"foo": 1}')
    calls, factory = _recorder()
    job = load_job_streaming(folder, workers=2, progress_factory=factory)
    assert [Path(s.path).name for s in job.info.skipped] == ["rank-2.json"]
    assert calls["rank-2.json"][-1][0] == calls["rank-2.json"][-1][1] > 0


def _terminal(args: list[str], env: dict[str, str]) -> str:
    """What `zoomer-ar ARGS` writes to a real terminal (script(1) gives it a pty), bars for every file."""
    if not shutil.which("script"):
        pytest.skip("script(1) is not installed")
    code = ("import sys; from zoomer_ar import progress; progress.PROGRESS_MIN_BYTES = 0; "
            "from zoomer_ar.cli import main; sys.exit(main(sys.argv[1:]))")
    cmd = f"{sys.executable} -c \"{code}\" " + " ".join(args)
    return subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True,
                          env=dict(os.environ, COLUMNS="120", TERM="xterm", **env), timeout=300).stdout


def test_cli_shows_bars_in_a_terminal_for_a_folder_read_in_worker_processes(folder):
    out = _terminal(["analyze", str(folder), "--no-files", "--stream"], {"ZOOMER_STREAM_WORKERS": "2"})
    assert "reading" in out and "rank-0.json.gz" in out and "rank-1.json.gz" in out
    assert "profiled steps" in out  # the analysis went on


def test_cli_shows_a_bar_for_each_read_of_a_file(folder):
    # the streaming reader reads a trace with stacks twice (its evidence frames): the second read has a bar too
    out = _terminal(["analyze", str(STACKS), "--no-files", "--stream"], {})
    assert f"{STACKS.name} (pass 2)" in out and "profiled steps" in out


def test_cli_shows_bars_for_trace_surgery_and_the_annotated_copy(tmp_path):
    # reads without a caller's callback (surgery, the annotated copy) report to the command's bars
    out = _terminal(["trace", "compress", str(STACKS), str(tmp_path / "c.json.gz")], {})
    assert f"reading {STACKS.name}" in _plain(out)
    out = _terminal(["analyze", str(STACKS), "--no-files", "--no-stream", "--annotate", str(tmp_path / "a.json.gz")], {})
    assert f"reading {STACKS.name}" in _plain(out) and "annotated trace:" in out


def test_no_bars_outside_a_terminal(tmp_path, capsys):
    from zoomer_ar.cli import main

    assert main(["trace", "compress", str(STACKS), str(tmp_path / "c.json.gz")]) == 0
    assert "reading" not in capsys.readouterr().err


def _plain(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_bars_open_at_a_files_first_report_and_close_with_the_command(tmp_path, monkeypatch):
    # a read that stops short (a probe of a file's first events, a refused file) leaves no bar behind
    from zoomer_ar import progress
    from zoomer_ar.load.reader import reading_progress, scoped_progress

    monkeypatch.setattr(progress, "PROGRESS_MIN_BYTES", 0)
    bars = progress.bar_factory(True)
    (tmp_path / "t.json").write_text("x" * 1000)
    with reading_progress(bars):
        first = scoped_progress(tmp_path / "t.json")
        assert not bars._open  # nothing shown before the first report
        first(100, 1000)
        assert len(bars._open) == 1
        first(50, 1000)  # read again from the start: the first read's bar goes, the second's comes
        assert len(bars._open) == 1
    assert not bars._open and scoped_progress(tmp_path / "t.json") is None  # closed with the scope


def test_cli_shows_bars_for_the_cuts_of_analyze_steps(tmp_path):
    """analyze --steps: the cut of a single file reports to the command's bars (its survey and copy
    passes), and so do the cuts of a folder's ranks made in worker processes."""
    out = _plain(_terminal(["analyze", str(STACKS), "--steps", "5..6", "--no-files"], {}))
    assert f"reading {STACKS.name}" in out and "profiled steps" in out
    job = tmp_path / "job"
    job.mkdir()
    for r in range(2):
        shutil.copy(STACKS, job / f"rank-{r}.pt.trace.json.gz")
    out = _plain(_terminal(["analyze", str(job), "--steps", "5..6", "--no-files"], {"ZOOMER_STREAM_WORKERS": "2"}))
    assert "reading rank-0.pt.trace.json.gz" in out and "reading rank-1.pt.trace.json.gz" in out
    assert "profiled steps" in out


def test_cli_shows_bars_on_stderr_when_stdout_is_a_file(tmp_path):
    """`zoomer-ar analyze TRACE --format json > findings.json` in a terminal: the bars were drawn on
    stdout (rich's default console), a file there, so none showed although stderr was the terminal that
    turned them on; they are drawn on stderr now, and the file holds the document alone."""
    saved = tmp_path / "out.json"
    out = _plain(_terminal(["analyze", str(STACKS), "--no-files", "--no-stream", "--format", "json", ">", str(saved)], {}))
    assert f"reading {STACKS.name}" in out
    assert json.loads(saved.read_text())["schema_version"]


def test_progress_forced_outside_a_terminal_writes_nothing(monkeypatch, capsys):
    """--progress where neither stream is a terminal: rich cannot draw there, and each bar it stopped
    left a blank line on stdout, ahead of the summary (or the --format json document)."""
    from zoomer_ar import progress
    from zoomer_ar.cli import main

    monkeypatch.setattr(progress, "PROGRESS_MIN_BYTES", 0)
    assert main(["analyze", str(STACKS), "--no-files", "--no-stream", "--progress"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("rank-0 - "), out[:80]
    assert "reading" not in err and "\n\n" not in err
