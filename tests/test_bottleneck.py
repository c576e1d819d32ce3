"""The bottleneck split counts GPU compute as time with a kernel running (the union over streams),
so it never claims more GPU time than the GPU was busy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path


def _x(name, cat, ts, dur, tid, **args):
    ev = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0 if cat == "kernel" else 1, "tid": tid}
    if args:
        ev["args"] = args
    return ev


def test_kernels_overlapping_on_two_streams_count_once(tmp_path: Path):
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 1000, 1)]
    for k in range(4):  # per 250 us: two 100 us kernels at once on streams 7 and 8
        t = 250 * k
        ev += [
            _x("cudaLaunchKernel", "cuda_runtime", t, 5, 1, correlation=2 * k + 1),
            _x("cudaLaunchKernel", "cuda_runtime", t + 5, 5, 1, correlation=2 * k + 2),
            _x("gemm_a", "kernel", t + 20, 100, 7, correlation=2 * k + 1, stream=7, device=0),
            _x("gemm_b", "kernel", t + 20, 100, 8, correlation=2 * k + 2, stream=8, device=0),
        ]
    p = tmp_path / "two_streams.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    a = analyze_path(p)
    f = a.features
    assert f["kernel_ms_per_step"] == pytest.approx(0.8)  # the sum: 8 kernels x 100 us
    assert f["compute_ms_per_step"] == pytest.approx(0.4)  # the union: 4 x 100 us
    busy_ms = f["gpu_span_ms"] * f["gpu_busy_pct"] / 100.0
    assert f["compute_ms_per_step"] <= busy_ms + 1e-9


def test_compute_bound_share_is_the_union():
    from zoomer_ar.detect.bottleneck import classify
    from zoomer_ar.features import FeatureVector

    fv = FeatureVector(has_gpu=True, has_accelerator=True, step_ms=1.0, kernel_ms_per_step=0.8,
                       compute_ms_per_step=0.4, profiler_steps=4)
    b = classify(fv)
    assert b.type == "compute-bound" and "(0.40 ms per profiled step)" in b.summary  # the sum would say 0.80


def test_reports_name_the_bottleneck_once(tmp_path: Path):
    from zoomer_ar.render import render_markdown, render_text
    from zoomer_ar.render.digest import fmt_gh

    root = Path(__file__).resolve().parent.parent
    a = analyze_path(root / "examples" / "traces" / "dataloader_bound")
    row = next(line for line in render_markdown(a).splitlines() if line.startswith("| Bottleneck"))
    assert row.count(a.bottleneck.type) == 1, row
    assert a.bottleneck.summary.split(": ", 1)[1] in row
    assert a.bottleneck.summary in render_text(a)
    assert fmt_gh(4.43e-05) == "0.0000443" and fmt_gh(1234.5) == "1,234"  # digests: no exponent


# --- the sentence: figures that are not rounded away, steps that exist, one aside -------------------------
def _figure(summary: str) -> float:
    import re

    m = re.search(r"\(([\d.]+) ms ", summary)
    assert m, summary
    return float(m.group(1))


def test_a_tiny_trace_without_steps_says_so_and_keeps_its_figure(shared_traces):
    """kineto/sync_event_order spans 0.00013 ms and has no ProfilerStep markers: the summary read
    "(0.00 ms per profiled step)", a figure rounded away and steps the trace does not have."""
    for trace in ("kineto/sync_event_order/before_fix_trace.json", "hta/large_integer_trace"):
        a = analyze_path(shared_traces / trace)
        f, s = a.features, a.bottleneck.summary
        assert f["profiler_steps"] == 0 and 0 < f["step_ms"] < 1
        assert "per profiled step" not in s and "0.00 ms" not in s, s
        assert "ms in the whole trace: no ProfilerStep markers, so it counts as one step)" in s, s
        shown = _figure(s)
        assert shown > 0
        # the figure is the bottleneck's share of the trace's accounted time, to three significant digits
        parts = {"compute": f["compute_ms_per_step"], "communication": f["exposed_comm_ms_per_step"]}
        assert shown == pytest.approx(parts[a.bottleneck.type.split("-")[0]], rel=5e-3), (s, parts)


def test_a_trace_with_steps_keeps_per_profiled_step(shared_traces):
    a = analyze_path(shared_traces / "kineto/resnet50_num_workers_0")
    assert a.features["profiler_steps"] == 6
    assert a.bottleneck.summary.endswith(" ms per profiled step)"), a.bottleneck.summary


def test_the_accelerator_and_cpu_summaries_read_as_one_sentence(shared_traces):
    """MTIA read "host-bound: 42% of the accelerator time (no CUDA/ROCm GPU events; the device's phases)
    (5636.62 ms per profiled step)", CPU traces "... of the host time (no GPU in this trace) (254.37 ms per
    profiled step)": two parentheses in a row."""
    mtia = analyze_path(shared_traces / "hta/mtia_trace_single_rank/mtia_rank_0.json.gz")
    cpu = analyze_path(shared_traces / "hta/cpu_only_full")
    for a, basis in ((mtia, "accelerator time"), (cpu, "host time")):
        s = a.bottleneck.summary
        assert ") (" not in s and s.count("(") == 1 and s.endswith(")"), s
        assert f"% of the {basis} (" in s and _figure(s) > 0, s
    assert "device timeline's phases" in mtia.bottleneck.summary
    assert "no CUDA/ROCm GPU events; the device's phases" not in mtia.bottleneck.summary
    assert "per profiled step; no GPU in this trace)" in cpu.bottleneck.summary
