"""A GPU job profiled without its device activity (the trace lists a GPU, or holds CUDA runtime calls,
but has no kernel, copy or memset event) is not a CPU-only job: its host op times are dispatch times.
Before, hta/distributed_info_unavailable (8x A100, cpu_op events only) was "compute-bound: 91% of the
host time" with extra-copy at 8.9% and fp32-matmul from aten::mm host times."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path

REPO = Path(__file__).resolve().parents[1]
HOST_COMPUTE_RULES = {"extra-copy", "fp32-matmul", "misaligned-gemm", "conv-bias-before-bn"}


@pytest.mark.parametrize("rel", [
    "hta/distributed_info_unavailable/distributed_info_not_found.json.gz",  # deviceProperties, cpu_op only
    "hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",  # CUDA runtime calls, no kernels
])
def test_gpu_job_without_device_events_is_not_read_as_a_cpu_job(shared_traces, rel):
    a = analyze_path(shared_traces / rel)
    assert a.features["device_not_recorded"] is True
    assert a.features["has_gpu"] is False
    assert a.bottleneck.type == "unknown"
    assert "dispatch times" in a.bottleneck.summary
    assert not HOST_COMPUTE_RULES & {f.pattern for f in a.findings}
    assert any("no device events" in n and "ProfilerActivity.CUDA" in n for n in a.notes)
    assert not any(n.startswith("No GPU or accelerator activity") for n in a.notes)


def test_the_device_listed_is_named_in_the_note(shared_traces):
    a = analyze_path(shared_traces / "hta/distributed_info_unavailable/distributed_info_not_found.json.gz")
    assert any("lists NVIDIA A100-PG509-200" in n for n in a.notes)


@pytest.mark.parametrize("rel", [
    "hta/cpu_only_full/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",  # a gloo CPU job: nothing listed
    "hta/mixed_files",  # GPU ranks and a CPU-only one: the job has device events
    "hta/mtia_trace_single_rank/mtia_rank_0.json.gz",  # accelerator events
    "kineto/resnet50_num_workers_0",
])
def test_jobs_with_device_events_or_without_a_device_are_unchanged(shared_traces, rel):
    a = analyze_path(shared_traces / rel)
    assert a.features["device_not_recorded"] is False
    assert a.bottleneck.type != "unknown"


def test_the_projects_cpu_scenarios_stay_cpu_jobs():
    """The bundled CPU recordings (torch on a machine without a GPU) list no device: the CPU rules apply."""
    traces = sorted(p for p in (REPO / "examples" / "traces").iterdir() if p.is_dir())
    assert traces
    for p in traces:
        a = analyze_path(p)
        assert a.features["device_not_recorded"] is False, p.name
        if not a.features["has_accelerator"]:
            s = a.bottleneck.summary
            assert "of the host time (" in s and s.endswith("; no GPU in this trace)"), (p.name, s)
