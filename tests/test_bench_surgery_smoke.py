"""benchmarks/bench_surgery.py runs end to end in a tiny mode (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))
import gen_trace  # noqa: E402


def test_bench_surgery_tiny_run(tmp_path):
    trace = tmp_path / "synthetic.json"
    gen_trace.generate(trace, 0.002, synthetic=True, quiet=True)
    out = tmp_path / "bench.json"
    args = [sys.executable, str(BENCH / "bench_surgery.py"), "--trace", str(trace), "--reps", "1",
            "--work", str(tmp_path / "work"), "--json", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "naive json load+dump" in proc.stdout and "gzip -6 -c" in proc.stdout
    doc = json.loads(out.read_text())
    rows = {r["command"]: r for r in doc["rows"]}
    assert {"slice", "split", "filter", "compress", "check", "merge", "sample"} <= rows.keys()
    for name, row in rows.items():
        if name == "slice-window":  # a window in ms: the tiny trace may be shorter than it
            continue
        z = row["zoomer"]
        assert "error" not in z, (name, z)
        assert z["wall"] > 0 and z["rss_mb"] and z["rss_mb"] > 5, (name, z)
    for name in ("slice", "filter"):
        peers = rows[name]["peers"]
        assert [p["peer"] for p in peers] == ["naive json load+dump", "naive msgspec load+dump"]
        assert all("error" not in p and p["wall"] > 0 for p in peers), peers
    assert (tmp_path / "synthetic_job4").is_dir()
