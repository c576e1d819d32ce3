"""Timestamps are analysed relative to each rank's first whole microsecond (load.job.rebase_times).

Kineto writes epoch microseconds (~1.7e15), where float64 steps by 0.25 us: without the rebase
`ts + dur` of a sub-quarter-microsecond op equals its start and containment tests (ops inside an
optimizer window) miss it. These traces are built here, with the epoch start a real one has.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zoomer_ar.features import extract
from zoomer_ar.load import load_job
from zoomer_ar.stream import load_job_streaming

EPOCH_US = 1_712_195_495_000_000  # 2024-04-04, as in hta/ns_resolution_trace


def _trace(path: Path, t0: int, n_ops: int = 50, op_us: float = 0.1, rank: int = 0) -> Path:
    """One optimizer window of 100 us holding n_ops short per-parameter ops, plus a kernel."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "ts": t0 + 10, "dur": 100,
         "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 5, "dur": 3, "pid": 1, "tid": 1,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "sgd_kernel", "ts": t0 + 9, "dur": 40, "pid": 0, "tid": 7,
         "args": {"correlation": 7, "stream": 7, "device": 0}},
    ]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mul_", "ts": t0 + 11 + i, "dur": op_us, "pid": 1, "tid": 1}
               for i in range(n_ops)]
    doc = {"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("op_us", [0.1, 0.02])
def test_short_ops_inside_a_window_are_counted_at_epoch_timestamps(tmp_path, op_us):
    path = _trace(tmp_path / "t.json", EPOCH_US, op_us=op_us)
    job = load_job(path)
    # 0.25 us is the float64 step here: the raw sum loses the op's duration ...
    assert float(EPOCH_US + 11) + op_us == float(EPOCH_US + 11)
    # ... the loaded trace keeps it
    assert job.ranks[0].ts_base == float(EPOCH_US + 5)
    assert extract(job).vector.optimizer_per_param_ops == 50
    streamed = load_job_streaming(path, workers=1)
    assert extract(streamed).vector.optimizer_per_param_ops == 50


def test_features_do_not_depend_on_the_epoch(tmp_path):
    near = extract(load_job(_trace(tmp_path / "near.json", 1_000))).vector.model_dump()
    far = extract(load_job(_trace(tmp_path / "far.json", EPOCH_US))).vector.model_dump()
    assert far.pop("trace_start_unix_s") == pytest.approx((EPOCH_US + 5) / 1e6)
    near.pop("trace_start_unix_s")
    assert far == near


def test_each_rank_has_its_own_base_and_absolute_times_keep_their_offsets(tmp_path):
    """A rank's times are relative to its own first whole microsecond (so a rank's features are those of
    its trace alone, however it is read: the streaming path computes them in the rank's process);
    ts + ts_base is the absolute time, which keeps the ranks' offsets."""
    folder = tmp_path / "job"
    folder.mkdir()
    _trace(folder / "rank0.json", EPOCH_US, rank=0)
    _trace(folder / "rank1.json", EPOCH_US + 3_500_000, rank=1)  # started 3.5 s later
    alone = extract(load_job(folder / "rank1.json")).vector.model_dump()
    for job in (load_job(folder), load_job_streaming(folder, workers=2)):
        r0, r1 = job.ranks
        assert (r0.ts_base, r1.ts_base) == (float(EPOCH_US + 5), float(EPOCH_US + 3_500_005))
        assert float((r1.ts.min() + r1.ts_base) - (r0.ts.min() + r0.ts_base)) == 3_500_000.0
        assert float(np.min(r0.ts) + r0.ts_base) == float(EPOCH_US + 5)  # absolute time = ts + ts_base
        assert extract(job).vector.trace_start_unix_s == pytest.approx((EPOCH_US + 5) / 1e6)
        assert r1.ts.min() == r0.ts.min() == 0.0
    assert load_job(folder).ranks[1].ts.tolist() == load_job(folder / "rank1.json").ranks[0].ts.tolist()
    assert alone["trace_start_unix_s"] == pytest.approx((EPOCH_US + 3_500_005) / 1e6)


def test_on_a_real_trace_the_base_finds_the_short_optimizer_ops(shared_traces):
    """hta/ns_resolution_trace: epoch microseconds with nanosecond digits. The same trace read
    back at its absolute times (the base added again) loses most per-parameter optimizer ops."""
    job = load_job(shared_traces / "hta" / "ns_resolution_trace")
    rebased = extract(job).vector
    for r in job.ranks:  # back to absolute times, as the loader kept them before
        r.ts, r.ts_base = r.ts + r.ts_base, 0.0
    absolute = extract(job).vector
    assert rebased.optimizer_steps == absolute.optimizer_steps > 0
    assert rebased.optimizer_per_param_ops > 10 * absolute.optimizer_per_param_ops
    assert abs(rebased.gpu_busy_pct - 98.4) <= 0.02 * 98.4  # LABELS.yaml's figure still holds


@pytest.mark.parametrize("example", ["traces/clean", "gpu/sync_point"])
def test_trace_start_is_the_clock_base_plus_the_first_timestamp(example):
    """Newer traces count microseconds from a monotonic clock; baseTimeNanoseconds is the epoch time
    of its zero (the host's boot). The capture helper's job.json says when the run started: the
    trace's start must fall inside [started_at, finished_at] (the base alone is weeks earlier)."""
    import datetime as dt

    folder = Path(__file__).resolve().parent.parent / "examples" / example
    meta = json.loads((folder / "job.json").read_text())
    started = dt.datetime.fromisoformat(meta["started_at"].replace("Z", "+00:00")).timestamp()
    finished = dt.datetime.fromisoformat(meta["finished_at"].replace("Z", "+00:00")).timestamp()
    start = extract(load_job(folder)).vector.trace_start_unix_s
    assert start is not None and started - 1.0 <= start <= finished + 1.0
