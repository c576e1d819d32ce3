"""Phase split for cost attribution (zoomer_ar/features/phases.py) on a hand-built trace and the real corpus."""

from __future__ import annotations

import json

import pytest

from zoomer_ar.features.phases import PHASES, is_backward_op, job_phases
from zoomer_ar.load import load_job

from store_support import TRACES

BASE_NS = 1_764_000_000_000_000_000  # 2025-11-24T16:00:00Z


def X(name, cat, ts, dur, tid, **args):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def training_step() -> dict:
    """One step on 1 GPU; times in us, wall window [0, 1000].

    GPU: forward kernel 150-350, backward 420-600 (+ a backward kernel 650-700 overlapping NCCL),
    NCCL 600-700, optimizer 720-800. Host: DataLoader 0-100; idle otherwise.
    """
    ev = [
        X("ProfilerStep#1", "user_annotation", 0, 1000, 1),
        X("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 0, 100, 1),
        X("aten::linear", "cpu_op", 100, 200, 1),
        X("cudaLaunchKernel", "cuda_runtime", 110, 10, 1, correlation=1),
        X("ampere_sgemm_128x64_nn", "kernel", 150, 200, 7, correlation=1, stream=7),
        X("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 400, 200, 2),
        X("cudaLaunchKernel", "cuda_runtime", 410, 10, 2, correlation=2),
        X("ampere_sgemm_128x64_tn", "kernel", 420, 180, 7, correlation=2, stream=7),
        X("cudaLaunchKernel", "cuda_runtime", 595, 3, 2, correlation=5),
        X("elementwise_kernel", "kernel", 650, 50, 8, correlation=5, stream=8),
        X("cudaLaunchKernel", "cuda_runtime", 590, 5, 1, correlation=4),
        X("ncclKernel_AllReduce_RING_LL_Sum_float", "kernel", 600, 100, 9, correlation=4, stream=9),
        X("Optimizer.step#SGD.step", "user_annotation", 700, 200, 1),
        X("cudaLaunchKernel", "cuda_runtime", 710, 10, 1, correlation=3),
        X("multi_tensor_apply_kernel", "kernel", 720, 80, 7, correlation=3, stream=7),
    ]
    return {"traceEvents": ev, "baseTimeNanoseconds": BASE_NS}


def test_phase_definitions_on_a_hand_built_step(tmp_path):
    p = tmp_path / "step.json"
    p.write_text(json.dumps(training_step()))
    ph = job_phases(load_job(p).ranks)
    assert ph["phase_basis"] == "gpu"
    got = {k: ph[f"phase_{k}_pct"] for k in PHASES}
    # percent of the 1000 us window
    assert got == {
        "dataloader": pytest.approx(10.0),     # GPU idle while the host is in __next__
        "forward": pytest.approx(20.0),        # 150-350
        "backward": pytest.approx(20.5),       # 420-600, plus half of 650-700 shared with NCCL
        "optimizer": pytest.approx(8.0),       # 720-800
        "communication": pytest.approx(7.5),   # 600-700, half of 650-700
        "idle": pytest.approx(34.0),           # 100-150, 350-420, 700-720, 800-1000
    }
    assert sum(got.values()) == pytest.approx(100.0)
    # baseTimeNanoseconds is the clock's zero: the start is the base plus the first event's time
    first_us = min(e["ts"] for e in training_step()["traceEvents"] if e.get("ph") == "X")
    assert ph["trace_start_unix_s"] == pytest.approx(BASE_NS / 1e9 + first_us / 1e6)


def test_host_basis_without_gpu_events(tmp_path):
    ev = [
        X("ProfilerStep#1", "user_annotation", 0, 1000, 1),
        X("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 0, 200, 1),
        X("aten::linear", "cpu_op", 200, 300, 1),
        X("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 500, 300, 1),
        X("Optimizer.step#SGD.step", "user_annotation", 800, 100, 1),
    ]
    p = tmp_path / "cpu.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    ph = job_phases(load_job(p).ranks)
    assert ph["phase_basis"] == "host"
    assert {k: ph[f"phase_{k}_pct"] for k in PHASES} == {
        "dataloader": pytest.approx(20.0), "forward": pytest.approx(30.0), "backward": pytest.approx(30.0),
        "optimizer": pytest.approx(10.0), "communication": 0.0, "idle": pytest.approx(10.0)}
    assert ph["trace_start_unix_s"] is None  # ts 0 is not a wall-clock time


def test_epoch_timestamps_give_the_trace_time(tmp_path):
    ev = [X("aten::add", "cpu_op", 1_700_000_000_000_000, 10, 1)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    assert job_phases(load_job(p).ranks)["trace_start_unix_s"] == pytest.approx(1_700_000_000.0)


def test_backward_op_names():
    assert is_backward_op("autograd::engine::evaluate_function: ConvolutionBackward0")
    assert is_backward_op("CudnnConvolutionBackward")  # 2021 schema: the autograd node itself
    assert not is_backward_op("aten::convolution_backward_overrideable_x")
    assert not is_backward_op("aten::linear")


REAL = [
    "kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "param/dlrm_8ranks",
    "hta/cpu_only_full/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta/mtia_trace_single_rank/mtia_rank_0.json.gz",
]


@pytest.mark.parametrize("rel", REAL)
def test_real_traces_split_to_100_percent(rel):
    if not (TRACES / rel).exists():
        pytest.skip(f"real-trace corpus not found at {TRACES}")
    ph = job_phases(load_job(TRACES / rel).ranks)
    assert sum(ph[f"phase_{k}_pct"] for k in PHASES) == pytest.approx(100.0)
    assert all(ph[f"phase_{k}_pct"] >= 0 for k in PHASES)


def test_dataloader_bound_trace_attributes_its_wait_to_the_dataloader():
    """num_workers=0 spends a third of the window waiting for data; the fixed run almost none."""
    slow = TRACES / "kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
    fast = TRACES / "kineto/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
    if not slow.exists():
        pytest.skip(f"real-trace corpus not found at {TRACES}")
    assert job_phases(load_job(slow).ranks)["phase_dataloader_pct"] > 25.0
    assert job_phases(load_job(fast).ranks)["phase_dataloader_pct"] < 2.0
    comm = job_phases(load_job(TRACES / "hta/trace_diff/control/control.json.gz").ranks)
    assert comm["phase_communication_pct"] > 10.0 and comm["phase_backward_pct"] > 10.0
