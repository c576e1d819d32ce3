"""zero_grad fills cost host time and, on a GPU, kernel time; the two lie on timelines that overlap, so
the feature (and the rule's impact) is the longer of the two, not their sum, and both parts are
reported. The kernels of a fill are launched by the ops nested in it (aten::zero_ -> aten::fill_ ->
cudaLaunchKernel): matching them by the outer op's External id found none on resnet50 (0.0 ms)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path
from zoomer_ar.features import extract
from zoomer_ar.load import load_job

REPO = Path(__file__).resolve().parents[1]


def test_resnet50_fill_kernels_are_found_through_the_nested_launches(shared_traces):
    fv = extract(load_job(shared_traces / "kineto/resnet50_num_workers_0")).vector
    assert fv.zero_grad_fill_ops == 966
    # 161 zero_ ops a step (6 steps); their kernels are found through the aten::fill_ launches nested in them
    assert fv.zero_grad_fill_gpu_ms_per_step == pytest.approx(0.171, abs=0.002)
    assert fv.zero_grad_fill_host_ms_per_step == pytest.approx(4.545, abs=0.01)
    assert fv.zero_grad_fill_ms_per_step == max(fv.zero_grad_fill_host_ms_per_step, fv.zero_grad_fill_gpu_ms_per_step)


def test_fill_time_is_the_longer_timeline_not_the_sum(shared_traces):
    a = analyze_path(shared_traces / "param/linear_kineto.json.gz")
    f = a.features
    host, gpu = f["zero_grad_fill_host_ms_per_step"], f["zero_grad_fill_gpu_ms_per_step"]
    assert gpu > 1.0 and host > gpu  # both timelines hold real fill time here
    assert f["zero_grad_fill_ms_per_step"] == pytest.approx(host)
    zg = next(x for x in a.findings if x.pattern == "zero-grad-not-none")
    assert zg.impact.ms_per_step == pytest.approx(host, rel=1e-3)
    assert zg.impact.ms_per_step < host + gpu - 1.0


def test_cpu_jobs_have_no_gpu_part():
    fv = extract(load_job(REPO / "examples/traces/zero_grad_not_none")).vector
    assert fv.zero_grad_fill_ops > 0
    assert fv.zero_grad_fill_gpu_ms_per_step is None
    assert fv.zero_grad_fill_ms_per_step == fv.zero_grad_fill_host_ms_per_step > 0
