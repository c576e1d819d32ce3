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

from conftest import REPO

RESNET = REPO.parent / "shared/traces/kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"


def _recorder():
    calls: dict[str, list[tuple[int, int]]] = {}

    def factory(path: Path):
        seen = calls.setdefault(path.name, [])
        return lambda done, total: seen.append((done, total))

    return calls, factory


def _check(calls: list[tuple[int, int]], size: int) -> None:
    assert calls, "no progress reported"
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)  # bytes read only grow
    assert calls[-1] == (size, size)  # ... to the whole file
    assert all(t == size for _, t in calls)


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
        _check(calls[f.name], f.stat().st_size)


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


def test_a_refused_file_read_in_a_worker_closes_its_bar(folder):
    bad = folder / "rank-2.json"
    bad.write_text('{"foo": 1}')
    calls, factory = _recorder()
    job = load_job_streaming(folder, workers=2, progress_factory=factory)
    assert [Path(s.path).name for s in job.info.skipped] == ["rank-2.json"]
    assert calls["rank-2.json"][-1][0] == calls["rank-2.json"][-1][1] > 0


def test_cli_shows_bars_in_a_terminal_for_a_folder_read_in_worker_processes(folder, tmp_path):
    # a real terminal (script(1) gives the command a pty): the bars of both rank files are drawn
    if not shutil.which("script"):
        pytest.skip("script(1) is not installed")
    code = ("import sys; from zoomer_ar import analyze_cli; analyze_cli.PROGRESS_MIN_BYTES = 0; "
            "from zoomer_ar.cli import main; sys.exit(main(['analyze', sys.argv[1], '--no-files', '--stream']))")
    env = dict(os.environ, ZOOMER_STREAM_WORKERS="2", COLUMNS="120", TERM="xterm")
    cmd = f"{sys.executable} -c \"{code}\" {folder}"
    out = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True, env=env,
                         timeout=300).stdout
    assert "reading" in out and "rank-0.json.gz" in out and "rank-1.json.gz" in out
    assert "profiled steps" in out  # the analysis went on
