"""The shipped default model: loads with no set-up, and `analyze` runs rules and model together."""

from __future__ import annotations

import json

from zoomer_ar.analyze import analyze_path
from zoomer_ar.detect.ensemble import current_model, models_dir
from zoomer_ar.features import FEATURE_SCHEMA_VERSION
from zoomer_ar.features.schema import FeatureVector


def test_shipped_model_loads():
    model = current_model()
    assert model is not None, f"no usable model in {models_dir()} (CURRENT)"
    assert model.feature_schema_version.split(".")[0] == FEATURE_SCHEMA_VERSION.split(".")[0]
    # columns are matched by name: a field added since training is ignored, a removed one reads as missing
    assert model.feature_names[0] in FeatureVector.model_fields
    meta = json.loads((model.dir / "meta.json").read_text())
    mf = meta["held_out"]["macro_f1"]
    assert mf["model"] > mf["rules"]  # the reason it ships
    assert meta["real"]["ensemble_holds_all"]
    assert (model.dir / "model_card.md").is_file()


def test_analyze_attaches_model_votes_and_explanations(shared_traces):
    a = analyze_path(shared_traces / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz")
    by = {f.pattern: f for f in a.findings}
    assert {"idle-gpu", "launch-bound"} <= set(by)
    f = by["idle-gpu"]
    assert f.model is not None and 0.0 <= f.model.probability <= 1.0 and f.model.top_features
    assert "rules" in f.detected_by
    for x in a.findings:
        if x.detected_by == ["model"]:
            assert x.model.probability >= x.model.threshold and "model alone" in x.explanation


def test_model_can_be_switched_off(shared_traces, monkeypatch):
    monkeypatch.setenv("ZOOMER_MODEL", "off")
    a = analyze_path(shared_traces / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz")
    assert all(f.model is None and f.detected_by == ["rules"] for f in a.findings)


def test_no_registry_means_rules_only(tmp_path, monkeypatch, shared_traces):
    monkeypatch.setenv("ZOOMER_MODELS_DIR", str(tmp_path))
    assert current_model() is None
    a = analyze_path(shared_traces / "param/linear_kineto.json.gz")
    assert a.findings and all(f.detected_by == ["rules"] for f in a.findings)
