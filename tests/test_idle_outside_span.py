"""Step time with no device work at all (before the device's first op, after its last one) is host time
the bottleneck must count: tracelens/h100/timesformer spends 218 ms of its 382.5 ms step in a CPU
preprocess before the GPU starts, and was "compute-bound: 97% of the accounted GPU time" because the
bottleneck only counted idle gaps inside the GPU span. gpu_busy_pct (LABELS: 99%) stays the busy share
of the GPU span, so idle-gpu stays quiet there as labelled."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path
from zoomer_ar.features import extract
from zoomer_ar.load import load_job

REPO = Path(__file__).resolve().parents[1]
TIMESFORMER = "tracelens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz"


def test_cpu_preprocess_before_the_gpu_starts_is_host_time(shared_traces):
    a = analyze_path(shared_traces / TIMESFORMER)
    f = a.features
    assert f["gpu_busy_pct"] == pytest.approx(99.0, abs=0.5)
    assert f["gpu_idle_outside_span_ms_per_step"] == pytest.approx(f["step_ms"] - f["gpu_span_ms"], abs=0.5)
    assert f["gpu_idle_outside_span_ms_per_step"] == pytest.approx(222.5, abs=1.0)
    assert a.bottleneck.type == "host-bound"
    assert a.bottleneck.shares["host"] > 50
    assert "idle-gpu" not in {x.pattern for x in a.findings}


def test_no_steps_no_outside_figure(shared_traces):
    fv = extract(load_job(shared_traces / "param/linear_kineto.json.gz")).vector
    assert fv.profiler_steps == 0
    assert fv.gpu_idle_outside_span_ms_per_step is None


def test_device_busy_across_its_steps_has_little_outside(shared_traces):
    fv = extract(load_job(shared_traces / "hta/trace_diff/test")).vector
    assert fv.gpu_idle_outside_span_ms_per_step is not None
    assert fv.gpu_idle_outside_span_ms_per_step < 0.01 * fv.step_ms


def test_cpu_jobs_have_none():
    fv = extract(load_job(REPO / "examples/traces/clean")).vector
    assert fv.gpu_idle_outside_span_ms_per_step is None
