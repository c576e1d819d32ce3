"""The benchmark scripts run, and the fast (streaming) loader they measure is exact.

- benchmarks/bench_load.py runs end to end in a tiny mode (no timing is asserted);
- benchmarks/gen_trace.py writes a valid, loadable, time-shifted trace of about the asked size;
- the streaming load path (zoomer_ar.load.job.stream_trace) gives the same RankTrace as the
  whole-document path (read_trace_bytes + decode_trace + build_columns), on every corpus file and
  on hand-made traces built to trip a slicing parser (boundaries inside strings, keys after the
  events array, tiny slices and chunks, mixed value types that force the fallback).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zoomer_ar.errors import InputError
from zoomer_ar.load import job as J
from zoomer_ar.load import load_job, load_trace
from zoomer_ar.load.columns import build_columns
from zoomer_ar.load.reader import read_trace_bytes

from conftest import REPO, SHARED_TRACES, all_trace_files

BENCH = REPO / "benchmarks"


# ------------------------------------------------------------------------------------------------
# streaming loader == whole-document loader
# ------------------------------------------------------------------------------------------------


def _reference(path: Path):
    data = read_trace_bytes(path)
    doc = J.decode_trace(data, str(path))
    if not doc.traceEvents:
        raise InputError(str(path), "trace has no events ('traceEvents' is empty)")
    return hashlib.sha256(path.read_bytes()).hexdigest(), doc, build_columns(doc.traceEvents, 0, str(path))


def _assert_same_trace(a, b, where: str, ignore: tuple[str, ...] = ()) -> None:
    for f in dataclasses.fields(a):
        if f.name in ignore:
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, f"{where}: {f.name} dtype/shape"
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f"{where}: column {f.name} differs"
        elif f.name == "msg_nelems":
            assert x.keys() == y.keys() and all(x[k] == y[k] or (x[k] != x[k] and y[k] != y[k]) for k in x), where
        else:
            assert x == y, f"{where}: {f.name} differs"


def _assert_stream_exact(path: Path) -> bool:
    """True when the streaming path handled the file (and matched), False when it deferred."""
    got = J.stream_trace(path)
    try:
        ref_sha, ref_doc, ref = _reference(path)
    except InputError:
        assert got is None, f"{path}: streaming accepted a file the whole-document path refuses"
        return False
    if got is None:
        return False
    sha, top, trace = got
    assert sha == ref_sha, f"{path}: sha256 differs"
    for f in J._TOP_FIELDS:
        assert getattr(top, f) == getattr(ref_doc, f), f"{path}: top-level {f} differs"
    _assert_same_trace(trace, ref, str(path))
    return True


def test_streaming_equals_whole_document_on_the_corpus(shared_traces):
    files = all_trace_files()
    assert files
    streamed = sum(_assert_stream_exact(p) for p in files)
    # nearly all real traces take the fast path; the rest (mixed value types) fall back, exactly
    assert streamed >= 0.9 * len(files) - 3, f"only {streamed} of {len(files)} files streamed"


def _event(i: int, **extra) -> dict:
    e = {"ph": "X", "cat": "cpu_op", "name": f"aten::op_{i % 7}", "pid": 1, "tid": 1 + i % 2, "ts": 1000.5 + i,
         "dur": 0.5 + i % 3, "args": {"External id": i, "Input Dims": [[i % 4, 3], []], "Input type": ["float", ""]}}
    e.update(extra)
    return e


TRICKY = {
    "traceName": "x ] } , { [ ]",
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H100 ]"}],
    "traceEvents": (
        [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main ]},{"}}]
        + [_event(i) for i in range(60)]
        + [_event(100, name='void k<float, "a"},{"b">(int) }]', args={"correlation": 5, "stream": 7, "device": 0})]
        + [{"ph": "s", "id": 3, "pid": 1, "tid": 1, "ts": 1010, "cat": "ac2g", "name": "ac2g"}]
        + [{"ph": "i", "cat": "[memory]", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1020,
            "args": {"Bytes": -512, "Total Allocated": 4096, "Device Id": 0, "Call stack": "a.py(1): f;b.py(2): g"}}]
        + [_event(200 + i) for i in range(40)]
    ),
    "distributedInfo": {"backend": "nccl", "rank": 2, "world_size": 4, "pg_config": [{"ranks": [0, 1]}]},
    "traceLogs": ["CuptiActivityProfiler.cpp:265] Processed", "}]"],
    "displayTimeUnit": "ms",
}


@pytest.mark.parametrize("slice_bytes,read_bytes", [(64, 7), (300, 64), (4096, 1000), (1 << 20, 1 << 20)])
@pytest.mark.parametrize("indent,gz", [(None, False), (2, True)])
def test_streaming_exact_on_tricky_traces(tmp_path, monkeypatch, slice_bytes, read_bytes, indent, gz):
    monkeypatch.setattr(J, "STREAM_SLICE", slice_bytes)
    monkeypatch.setattr(J, "STREAM_READ", read_bytes)
    text = json.dumps(TRICKY, indent=indent).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    assert _assert_stream_exact(path), "this trace should take the streaming path"
    trace, info = load_trace(path)
    assert info.rank == 2 and info.world_size == 4
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()  # the file as stored (`sha256sum`)
    assert trace.thread_names == {0: "main ]},{"}


@pytest.mark.parametrize("variant", ["list", "dup-key", "mixed-types", "empty", "not-json", "truncated"])
def test_streaming_defers_or_matches_on_odd_inputs(tmp_path, monkeypatch, variant):
    monkeypatch.setattr(J, "STREAM_SLICE", 200)
    monkeypatch.setattr(J, "STREAM_READ", 50)
    events = [_event(i) for i in range(30)]
    if variant == "list":
        text = json.dumps(events).encode()
    elif variant == "dup-key":
        text = json.dumps({"traceEvents": events}).encode()[:-1] + b', "traceEvents": []}'
    elif variant == "mixed-types":  # a string stream id in one slice: whole-trace conversion rules apply
        events[25]["args"]["stream"] = "+7"
        text = json.dumps({"traceEvents": events}).encode()
    elif variant == "empty":
        text = b'{"traceEvents": []}'
    elif variant == "not-json":
        text = b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}, {oops}]}'
    else:
        text = json.dumps({"traceEvents": events}).encode()[:-40]
    path = tmp_path / "odd.json"
    path.write_bytes(text)
    _assert_stream_exact(path)  # either defers (None) or matches the reference exactly
    try:
        expected = _reference(path)[2]
    except InputError as exc:
        with pytest.raises(InputError) as got:
            load_trace(path)
        assert got.value.reason == exc.reason
        return
    trace, _ = load_trace(path)
    # metadata, rank and the time-unit note are set by load_trace after the columns, on both paths
    _assert_same_trace(trace, expected, variant, ignore=("metadata", "rank", "time_unit_note"))


# ------------------------------------------------------------------------------------------------
# gen_trace.py and bench_load.py
# ------------------------------------------------------------------------------------------------


def _gen(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "gen_trace.py"), *args], capture_output=True, text=True,
                          timeout=300)


def test_gen_trace_tiled(tmp_path, shared_traces):
    out = tmp_path / "tiled.json"
    proc = _gen(["--size-gb", "0.02", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    size = out.stat().st_size
    assert 0.017e9 <= size <= 0.021e9, size
    meta = json.loads(out.with_name(out.name + ".meta").read_text())
    assert meta["copies"] >= 2 and meta["bytes"] == size
    job = load_job(out)
    trace = job.ranks[0]
    assert len(trace) == meta["events"]
    steps = [n for n in trace.names if n.startswith("ProfilerStep#")]
    assert len(steps) > 5, "ProfilerStep numbering continues across copies"
    cpu_steps = np.flatnonzero(trace.mask_names(lambda n: n.startswith("ProfilerStep#")) & trace.mask_cat("user_annotation"))
    starts = np.sort(trace.ts[cpu_steps])
    assert np.all(np.diff(starts) > 0), "copies are shifted in time, steps do not overlap"
    # flows keep unique ids per copy: every kernel's correlation id is unique
    kernels = trace.mask_cat("kernel")
    corr = trace.correlation[kernels]
    corr = corr[corr >= 0]
    assert corr.size and np.unique(corr).size == corr.size
    # a second run with the same parameters reuses the file
    again = _gen(["--size-gb", "0.02", "--out", str(out)])
    assert again.returncode == 0 and "reusing" in again.stderr


def test_gen_trace_synthetic_and_refuses_repo(tmp_path):
    out = tmp_path / "syn.json"
    proc = _gen(["--size-gb", "0.003", "--synthetic", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    job = load_job(out)
    cats = set(job.ranks[0].cats)
    assert {"cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "ac2g", "user_annotation"} <= cats
    refused = _gen(["--size-gb", "0.001", "--synthetic", "--out", str(REPO / "benchmarks" / "x.json")])
    assert refused.returncode == 2 and not (REPO / "benchmarks" / "x.json").exists()


def test_bench_load_tiny_run(tmp_path, shared_traces):
    out = tmp_path / "bench.json"
    args = [sys.executable, str(BENCH / "bench_load.py"), "--size-gb", "0.01", "--repeat", "1", "--repeat-large", "1",
            "--traces", "kineto/sync_event_order/after_fix_trace.json", "param/dlrm_8ranks",
            "--large-out", str(tmp_path / "large.json"), "--json", str(out)]
    try:
        import hta  # noqa: F401
    except ImportError:
        args.append("--no-hta")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Summary" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["machine"]["cores"] >= 1 and doc["command"].startswith("python benchmarks/bench_load.py")
    assert len(doc["real"]) == 2
    for row in doc["real"]:
        z = row["zoomer"]
        assert "error" not in z and z["events"] > 0 and z["work_s"] > 0 and z["peak_mb"] > 0
        tree = row["zoomer_tree"]  # the process-tree memory run: a real sampled figure, one process
        assert tree["samples"] >= 1 and tree["processes"] == 1 and 5 < tree["tree_pss_mb"] <= tree["tree_rss_mb"] + 1
        if row.get("hta") and "error" not in row["hta"]:
            assert row["hta_tree"]["tree_pss_mb"] > 0 and row["tree_mem_ratio"] > 0
    large = doc["large"]
    for kind in ("zoomer", "msgspec", "msgspec-nogc"):
        assert "error" not in large[kind], large[kind]
        assert large[kind]["events"] == large["events"]
    assert large["ratio_vs_msgspec"] > 0
    assert (SHARED_TRACES / "param" / "dlrm_8ranks").is_dir()


def test_bench_fix_tree_tiny_run(tmp_path):
    """bench_fix_tree.py on a small tree: both job counts run and give the same diff."""
    import subprocess
    import sys

    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "train.py").write_text("import torch\nfor b in loader:\n    torch.cuda.empty_cache()\n")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_fix_tree.py"), "--tree", str(tree), "--jobs", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "--jobs 2:" in proc.stdout and "identical diffs: yes" in proc.stdout


def test_bench_cli_tiny_run(tmp_path):
    """bench_cli.py: the analyze command timed in fresh processes against a git revision's (a worktree,
    removed afterwards); figures in --json, nothing asserted about them but that they were measured."""
    out = tmp_path / "cli.json"
    example = REPO / "examples" / "traces" / "dataloader_bound"
    proc = subprocess.run([sys.executable, str(BENCH / "bench_cli.py"), "--repeat", "1", "--no-hta", "--baseline-rev",
                           "HEAD", "--traces", str(example), "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["results"]
    assert row["zoomer"]["wall_s"] > 0 and row["baseline"]["wall_s"] > 0 and "hta" not in row
    assert 20 < row["zoomer"]["peak_mb"] < 2000 and 20 < row["baseline"]["peak_mb"] < 2000
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True).stdout
    assert "baseline-HEAD" not in worktrees


def test_bench_merged_tiny_run(tmp_path, shared_traces):
    # a merged trace, its rank folder and the in-memory split in fresh processes: the script compares the
    # three analyses' features itself and exits 1 when they differ (no timing is asserted)
    proc = subprocess.run([sys.executable, str(BENCH / "bench_merged.py"), "--size-gb", "0.004", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "features identical in all three: yes" in proc.stdout
    assert proc.stdout.count(" 2 ranks ") == 3
    assert not list(tmp_path.iterdir())  # generated traces removed


def test_bench_rank_folder_tiny_run(tmp_path, shared_traces):
    # rank folders of 1 and 3 ranks analysed with summaries and with every rank's rows, in fresh processes
    # whose process trees are sampled; the script compares the two ways' features itself (no memory or time
    # figure is asserted: on a trace this small the imports dominate)
    proc = subprocess.run([sys.executable, str(BENCH / "bench_rank_folder.py"), "--rank-gb", "0.004", "--ranks", "3,1",
                           "--dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "features identical both ways at every size: yes" in proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:2] in (["1", "summaries"], ["1", "rows"],
                                                                                     ["3", "summaries"], ["3", "rows"])]
    assert len(rows) == 4 and all(float(r[6]) > 0 for r in rows)  # a tree PSS sample in every run
    assert not list(tmp_path.iterdir())  # generated traces removed


def test_bench_huge_tiny_run(tmp_path, shared_traces):
    # the streaming analysis, the typed-decode floor and `analyze --steps` on a window mid-trace, each in a
    # fresh process (exit 1 only reports the throughput target, unreachable on a trace this small)
    out = tmp_path / "huge.json"
    proc = subprocess.run([sys.executable, str(BENCH / "bench_huge.py"), "--sizes", "0.01", "--no-hta", "--no-msgspec",
                           "--window-steps", "3", "--dir", str(tmp_path / "traces"), "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    size = json.loads(out.read_text())["sizes"]["0.01"]
    assert size["zoomer"]["rows"] > 0 and "error" not in size["msgspec-slices"]
    window = size["zoomer-steps"]
    assert window["profiler_steps"] == 3 and window["findings"], window
    lo, hi = (int(x) for x in window["steps"].split(".."))
    assert hi - lo == 2
    assert "analyze --steps (a window of steps, any size): peak RSS" in proc.stdout
    assert not list((tmp_path / "traces").glob("*.json"))  # generated traces removed


def test_bench_steps_tiny_run(tmp_path, shared_traces):
    # analyze --steps on a generated rank folder, pooled and one by one, then dlrm_8ranks both ways, in
    # fresh processes; the script compares the settings' findings itself (no timing is asserted)
    proc = subprocess.run([sys.executable, str(BENCH / "bench_steps.py"), "--rank-gb", "0.004", "--repeat", "1",
                           "--dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("findings (pattern, impact) identical") == 2
    assert "2 ranks x 0.004 GB, --steps" in proc.stdout and "param/dlrm_8ranks" in proc.stdout
    assert not list(tmp_path.iterdir())  # generated traces removed


def test_stream_memory_tiny_run(tmp_path, shared_traces):
    # the probe behind docs/huge-traces.md's table of the streaming load's steps (no figure asserted)
    proc = subprocess.run([sys.executable, str(BENCH / "stream_memory.py"), "--size-gb", "0.004",
                           "--prune-rows", "1", "--features"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for step in ("start (imports done)", "before check", "after finish", "after prune", "end",
                 "after gpu_features", "after rank_phases", "features done"):
        assert step in proc.stdout, proc.stdout
