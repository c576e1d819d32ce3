"""Unit tests of the learning stack: generator, augmentation, calibration, folds, metrics, ensemble rule."""

from __future__ import annotations

import numpy as np
import pytest

from zoomer_ar.detect.ensemble import apply_model, decide, guard
from zoomer_ar.detect.rules import get_rule
from zoomer_ar.features import extract
from zoomer_ar.features.schema import FeatureVector
from zoomer_ar.learn import calibrate
from zoomer_ar.learn.cases import LabelledCase, held_out, read_cases, write_cases
from zoomer_ar.learn.featurize import feature_names, row
from zoomer_ar.learn.metrics import group_folds, pr_auc, prf
from zoomer_ar.models import PATTERN_IDS
from zoomer_ar.synth import augment as A
from zoomer_ar.synth.documents import load_documents
from zoomer_ar.synth.generator import generate, sample_spec


def test_generator_is_deterministic_and_labels_every_pattern():
    a, b = generate(11), generate(11)
    assert a.labels == b.labels and a.costs == b.costs
    assert [len(d["traceEvents"]) for d in a.documents] == [len(d["traceEvents"]) for d in b.documents]
    assert set(a.labels) == set(PATTERN_IDS)
    assert set(a.labels.values()) <= {"positive", "negative", "unknown"}


def test_generated_documents_go_through_the_real_loader_and_extractor():
    g = generate(3, ["dataloader-bound"])
    job = load_documents(g.documents, "synth-3")
    assert len(job.ranks) == len(g.documents)
    fv = extract(job).vector
    assert fv.has_gpu and fv.kernel_count > 0
    assert fv.dataloader_ms_per_step > 0


@pytest.mark.parametrize("pattern", ["sync-point", "single-tensor-optimizer", "fp32-matmul"])
def test_a_planted_pattern_is_labelled_by_its_counterfactual_cost(pattern):
    for seed in range(40):
        g = generate(seed, [pattern])
        cost = g.costs.get(pattern)
        assert cost is not None
        lab = g.labels[pattern]
        assert lab == ("positive" if cost >= 5 else "negative" if cost < 1 else "unknown")


def test_multi_rank_plants_need_ranks():
    spec = sample_spec(5, ["straggler"])
    assert spec.planted == ["straggler"]
    g = generate(7, [])
    assert g.labels["straggler"] in ("negative", "unknown")


def test_insert_times_moves_later_events_and_stretches_open_ranges(shared_traces):
    from zoomer_ar.load import load_job

    job = load_job(shared_traces / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz")
    t = A.clone_trace(job.ranks[0])
    wall0, busy0 = A.wall_us(t), A.busy_pct(t)
    rng = np.random.default_rng(0)
    inserted = A.inject_sync(t, rng, 3, 500.0)
    assert inserted > 0
    assert A.wall_us(t) == pytest.approx(wall0 + inserted, rel=1e-6)
    assert A.busy_pct(t) < busy0
    fv = extract(type(job)(info=job.info, ranks=[t])).vector
    assert fv.sync_calls >= 3 and fv.item_calls >= 3


def test_isotonic_and_platt_are_monotone():
    rng = np.random.default_rng(0)
    s = rng.normal(size=400)
    y = (rng.random(400) < 1 / (1 + np.exp(-2 * s))).astype(int)
    for cal in (calibrate.fit_isotonic(s, y), calibrate.fit_platt(s, y)):
        p = calibrate.apply(cal, np.sort(s))
        assert np.all(np.diff(p) >= -1e-12) and p.min() >= 0 and p.max() <= 1


def test_group_folds_never_split_a_group():
    groups = [f"g{i % 37}" for i in range(500)]
    folds = group_folds(groups, 5, 0)
    for g in set(groups):
        assert len({f for gg, f in zip(groups, folds) if gg == g}) == 1
    assert len(set(folds)) == 5


def test_metrics():
    y = np.array([1, 1, 0, 0])
    m = prf(y, np.array([True, False, True, False]))
    assert m["precision"] == 0.5 and m["recall"] == 0.5 and m["f1"] == 0.5
    assert pr_auc(y, np.array([0.9, 0.8, 0.1, 0.0])) == 1.0


def test_feature_rows_follow_the_feature_vector_order():
    names = feature_names()
    fields = [n for n in FeatureVector.model_fields if n not in ("slowest_rank", "most_compute_rank", "trace_start_unix_s")]
    assert names[: len(fields)] == fields
    f = FeatureVector(has_gpu=True, step_ms=10.0, idle_sync_ms_per_step=2.0).model_dump()
    r = row(f, names, {})
    assert r[names.index("has_gpu")] == 1.0
    assert np.isnan(r[names.index("gpu_busy_pct")])
    assert r[names.index("pct_step:idle_sync_ms_per_step")] == pytest.approx(20.0)


def test_cases_roundtrip_and_held_out_is_stable(tmp_path):
    c = LabelledCase(case_id="x", source="synth", group="synth:1", feature_schema_version="1",
                     features={"step_ms": 1.0}, labels={p: "unknown" for p in PATTERN_IDS})
    write_cases(tmp_path / "c.jsonl", [c, c])
    assert [x.case_id for x in read_cases(tmp_path / "c.jsonl")] == ["x", "x"]
    assert held_out("real:a") == held_out("real:a")
    share = np.mean([held_out(f"synth:{i}") for i in range(2000)])
    assert 0.15 < share < 0.25


def test_decision_rule_and_guard():
    assert decide(True, 0.0, 0.9, False)  # the model never removes a rule finding
    assert decide(False, 0.95, 0.9, True)
    assert not decide(False, 0.95, 0.9, False)  # the guard blocks
    assert not decide(False, 0.5, 0.9, True)
    rule = get_rule("sync-point")
    f = FeatureVector(has_gpu=True, step_ms=10.0, idle_sync_ms_per_step=0.05, sync_calls_per_step=2).model_dump()
    assert not guard(rule, f)  # 0.5% of the step: inside the negative band
    f["idle_sync_ms_per_step"] = 0.5
    assert guard(rule, f)
    idle = get_rule("idle-gpu")
    assert not guard(idle, FeatureVector(has_gpu=True, gpu_busy_pct=95.0, step_ms=10).model_dump())
    assert guard(idle, FeatureVector(has_gpu=True, gpu_busy_pct=70.0, step_ms=10).model_dump())


class _StubModel:
    """A model stand-in with fixed votes (the ensemble's logic without LightGBM)."""

    def __init__(self, probs):
        from zoomer_ar.learn.model import Vote

        self._votes = {p: Vote(p, q, 0.5, 0.8, [("gpu_busy_pct", -1.2)]) for p, q in probs.items()}

    def votes(self, features, explain=5):
        return self._votes

    def top_features(self, pattern, features, k=5):
        return self._votes[pattern].top_features[:k]


def test_apply_model_marks_agreement_disagreement_and_model_only(shared_traces):
    from zoomer_ar.detect import run_rules
    from zoomer_ar.load import load_job

    job = load_job(shared_traces / "param/linear_kineto.json.gz")
    jf = extract(job)
    rules_only = run_rules(jf)
    found = {f.pattern for f in rules_only}
    assert {"idle-gpu", "launch-bound"} <= found
    stub = _StubModel({"idle-gpu": 0.99, "launch-bound": 0.1, "sync-point": 0.97, "straggler": 0.99})
    out = {f.pattern: f for f in apply_model(jf, rules_only, model=stub)}
    assert out["idle-gpu"].detected_by == ["rules", "model"] and out["idle-gpu"].model.probability == 0.99
    assert out["launch-bound"].detected_by == ["rules"] and out["launch-bound"].model.probability == 0.1
    assert "straggler" not in out  # one rank: the guard (applies_when n_ranks >= 2) blocks it
    if "sync-point" in out and "sync-point" not in found:
        assert out["sync-point"].detected_by == ["model"]
        assert out["sync-point"].model.top_features
