"""An idle gap's evidence says what the host was doing: the runtime call it was blocked in for most of
the gap (a synchronous copy, a cudaMalloc, a stalled launch), with that call's Python frames; otherwise
the frames of the call that launched the work after the gap (or of the synchronisation it followed).

tracelens/inference/sglang_prefilldecode: the GPU idles 493 ms at the start of the step while the host
sits in one hipMemcpyWithStream (a 60-byte host-to-device copy of `torch.tensor(...)` in sglang's
forward_batch_info.py `init_new`, waiting 493 ms for its stream); the report used to say "cause: host"
and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

from zoomer_ar.analyze import analyze_job, analyze_path
from zoomer_ar.features import extract
from zoomer_ar.load import load_job
from zoomer_ar.stream import load_job_streaming

SGLANG = "tracelens/inference/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz"


def _idle_events(analysis):
    f = next(x for x in analysis.findings if x.pattern == "idle-gpu")
    return f, [e for e in f.evidence.events if e.category == "idle"]


def test_the_sglang_gap_names_the_blocking_copy_and_its_line(shared_traces):
    a = analyze_path(shared_traces / SGLANG)
    finding, gaps = _idle_events(a)
    worst = gaps[0]
    assert worst.dur_ms > 490
    assert "the host was in hipMemcpyWithStream for 493." in worst.detail
    assert worst.frames and worst.frames[0].function == "init_new"
    assert worst.frames[0].file.endswith("forward_batch_info.py")
    assert finding.evidence.frames[0].function == "init_new"  # the finding's "Source:" line
    # the short gaps after it are not blocked in one call: no such clause
    assert all("the host was in" not in e.detail for e in gaps[1:])


def test_the_streaming_path_gives_the_same_gap_evidence(shared_traces):
    path = shared_traces / SGLANG
    ref = analyze_job(load_job(path))
    got = analyze_job(load_job_streaming(path, workers=1))
    assert [f.evidence.model_dump() for f in ref.findings] == [f.evidence.model_dump() for f in got.findings]


def _trace(tmp_path: Path, malloc_us: tuple[float, float]) -> Path:
    """One host thread: kernel K1 (launched at 1 us) runs 5-15 us; the host then calls cudaMalloc
    inside `wait_here`, then launches K2 from `launch_late` at 595 us; K2 runs 600-610 us."""
    pid, tid = 1, 1

    def x(name, cat, ts, dur, **args):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid if cat != "kernel" else 0,
                "tid": tid if cat != "kernel" else 7, "args": args}

    m0, m1 = malloc_us
    events = [
        x("/home/u/train.py(10): step", "python_function", 0, 700),
        x("cudaLaunchKernel", "cuda_runtime", 1, 2, correlation=1),
        x("k1", "kernel", 5, 10, correlation=1, stream=7, device=0),
        x("/home/u/train.py(20): wait_here", "python_function", m0 - 0.5, m1 - m0 + 1),
        x("cudaMalloc", "cuda_runtime", m0, m1 - m0),
        x("/home/u/train.py(30): launch_late", "python_function", 594, 5),
        x("cudaLaunchKernel", "cuda_runtime", 595, 2, correlation=2),
        x("k2", "kernel", 600, 10, correlation=2, stream=7, device=0),
    ]
    for i, e in enumerate(sorted(events, key=lambda e: e["ts"])):  # python frames carry ids Kineto-style
        if e["cat"] == "python_function":
            e["args"] = {"Python id": i + 1, "Python parent id": 0}
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"name": "NVIDIA H100"}]}))
    return p


def _gap(tmp_path, malloc_us):
    jf = extract(load_job(_trace(tmp_path, malloc_us)))
    (gap,) = [e for e in jf.evidence["idle_gaps"] if e.dur_ms > 0.5]
    return gap


def test_a_call_covering_most_of_the_gap_is_named_with_its_frames(tmp_path):
    gap = _gap(tmp_path, (20.0, 590.0))
    assert gap.detail == "cause: host; the host was in cudaMalloc for 0.570 ms of it"
    assert [(f.file, f.function) for f in gap.frames][:1] == [("/home/u/train.py", "wait_here")]


def test_otherwise_the_frames_of_the_late_launch(tmp_path):
    gap = _gap(tmp_path, (20.0, 50.0))  # 30 us of a 585 us gap
    assert gap.detail == "cause: host"
    assert [(f.file, f.function) for f in gap.frames][:1] == [("/home/u/train.py", "launch_late")]
