"""Rules against the trace generator's labels (zoomer_ar.synth): jobs drawn with a forced plant, analysed
from their Kineto documents by the real loader and feature extraction, each rule judged against the
label the generator gives from the plant's counterfactual cost."""

from __future__ import annotations

from functools import lru_cache

from zoomer_ar.detect.rules import load_rules
from zoomer_ar.features import extract
from zoomer_ar.synth.documents import load_documents
from zoomer_ar.synth.generator import GeneratedJob, generate

RULES = {r.id: r for r in load_rules()}


@lru_cache(maxsize=None)
def _job(seed: int, plant: str) -> tuple[GeneratedJob, dict]:
    g = generate(seed, [plant])
    return g, extract(load_documents(g.documents, f"synth-{seed}")).vector.model_dump()


def _fires(pattern: str, features: dict) -> bool:
    return RULES[pattern].evaluate(features) is not None


def test_a_heavier_rank_is_not_a_straggler():
    """A rank with more compute (sharding-imbalance) makes the others wait at every collective of the step,
    and with two ranks the max-minus-median imbalance is half the gap: the rule took the rest of that waiting
    for a straggler (6 of these 24 jobs, up to 44% of the step)."""
    jobs = [_job(s, "sharding-imbalance") for s in range(24)]
    judged = [(g, f) for g, f in jobs if g.labels["straggler"] == "negative" and f["n_ranks"] >= 2]
    assert len(judged) == len(jobs)  # the generator plants no straggler here
    assert sum(f["straggler_wait_ms_per_step"] > 0.05 * f["step_ms"] for _, f in judged) >= 6  # they do wait
    assert [g.spec.seed for g, f in judged if _fires("straggler", f)] == []


def test_a_planted_straggler_is_still_found():
    jobs = [_job(s, "straggler") for s in range(80)]
    positives = [f for g, f in jobs if g.labels["straggler"] == "positive"]
    assert len(positives) >= 10
    assert sum(_fires("straggler", f) for f in positives) >= 0.9 * len(positives)


def test_a_stragglers_cost_counts_its_lag_once_per_step():
    """A rank late once per step is waited for at each of the step's collectives (DDP's buckets) while the others
    still compute; the rule summed those waits and reported a median 2.2 times the wall time the straggler costs
    (on the 20 positives of these 80 jobs, 15.7 points off on average). It counts the wait nothing hides."""
    jobs = [_job(s, "straggler") for s in range(80)]
    results = [RULES["straggler"].evaluate(f) for g, f in jobs if g.labels["straggler"] == "positive"]
    costs = [g.costs["straggler"] for g, f in jobs if g.labels["straggler"] == "positive"]
    measured = sorted((r["impact_pct"] if r else 0.0) / c for r, c in zip(results, costs))
    assert 0.7 <= measured[len(measured) // 2] <= 1.4


def test_fp32_gemms_that_cost_no_wall_time_are_not_reported():
    """Jobs with FP32 GEMMs planted, labelled by the wall time the job loses to them: where the GPU waits for
    launches, faster GEMMs only wait longer. The rule counted half the FP32 GEMM time whatever the GPU waited,
    and fired on 10 of the 11 jobs of these 64 whose FP32 GEMMs cost under 1% of the wall time (now 1)."""
    jobs = [_job(s, "fp32-matmul") for s in range(64)]
    negatives = [f for g, f in jobs if g.labels["fp32-matmul"] == "negative"]
    positives = [f for g, f in jobs if g.labels["fp32-matmul"] == "positive"]
    assert len(negatives) >= 10 and all(f["fp32_gemm_share"] == 1.0 for f in negatives)
    assert sum(_fires("fp32-matmul", f) for f in negatives) <= 0.1 * len(negatives)
    assert sum(_fires("fp32-matmul", f) for f in positives) >= 0.95 * len(positives)


def test_a_dataloader_stall_before_the_first_kernel_is_found():
    """A trace without ProfilerStep marks (here one training iteration) loads its batch before the GPU's first
    op: the stall lies outside the GPU span, where the GPU idle overlapping __next__ is measured, and the rule
    measured 0 on every such job the generator labels dataloader-bound."""
    jobs = [_job(s, "dataloader-bound") for s in range(120)]
    zero_step = [(g, f) for g, f in jobs if f["profiler_steps"] == 0 and f["has_gpu"]]
    positives = [f for g, f in zero_step if g.labels["dataloader-bound"] == "positive"]
    negatives = [f for g, f in zero_step if g.labels["dataloader-bound"] == "negative"]
    assert len(positives) >= 5 and all(f["idle_data_ms_per_step"] == 0 for f in positives)
    assert sum(_fires("dataloader-bound", f) for f in positives) >= 0.9 * len(positives)
    assert not any(_fires("dataloader-bound", f) for f in negatives)
