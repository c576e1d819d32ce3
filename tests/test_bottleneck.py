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
                       compute_ms_per_step=0.4)
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
