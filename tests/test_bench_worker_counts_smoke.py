"""benchmarks/bench_worker_counts.py runs end to end in a tiny mode: a row per CPU setting with a step time per
worker count, the variants being the dataloader-workers fix with the count as a literal (nothing about the
figures themselves is asserted)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import REPO

BENCH = REPO / "benchmarks" / "bench_worker_counts.py"

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (make setup installs it)"),
    pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)"),
]


def test_tiny_run_prints_a_row_per_setting():
    proc = subprocess.run([sys.executable, str(BENCH), "--cores", "all/0", "--counts", "0,1", "--rounds", "1",
                           "--steps", "2", "--skip", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["cores", "0", "workers", "1", "workers"]
    rows = {ln.split()[0]: [float(x) for x in ln.split()[1:]] for ln in lines[2:4]}
    assert set(rows) == {"all", "0"} and all(len(v) == 2 and all(x > 0 for x in v) for v in rows.values())


def test_the_variant_is_the_fix_with_a_literal_count(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_worker_counts as B
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    src = REPO / "training_data" / "scenarios"
    work = tmp_path / "s"
    work.mkdir()
    (work / B.PROGRAM).write_text((src / B.PROGRAM).read_text())
    assert B.variant(work, 0) == B.PROGRAM
    text = (work / B.variant(work, 2)).read_text()
    assert "num_workers=2" in text and "DATALOADER_WORKERS" not in text
