"""learn/trees.py evaluates LightGBM text models without LightGBM: the same raw scores (bit for bit)
and contributions as lightgbm.Booster.predict, on the shipped models and on models trained here to
reach every kind of split (NaN and zero as missing, single-leaf trees); what it does not read goes
to LightGBM."""

from __future__ import annotations

import json
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

from zoomer_ar.learn.model import load_bundle, load_predictor
from zoomer_ar.learn.trees import TextBooster, Unsupported

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(REPO.glob("models/v[0-9]*/*.txt"))  # every shipped version's boosters


def _rows(rng, n_rows: int, n_features: int, thresholds: np.ndarray | None = None) -> np.ndarray:
    X = rng.lognormal(0, 3, size=(n_rows, n_features)) * (rng.random((n_rows, n_features)) < 0.6)
    X[rng.random(X.shape) < 0.05] = np.nan
    X[rng.random(X.shape) < 0.03] = 1e-40  # below LightGBM's zero threshold: read as 0.0
    X[rng.random(X.shape) < 0.03] *= -1
    if thresholds is not None and thresholds.size:  # values exactly at a split, and the doubles next to it
        pick = rng.choice(thresholds, size=X.shape)
        at = rng.random(X.shape) < 0.2
        X[at] = pick[at]
        nudged = rng.random(X.shape) < 0.1
        X[nudged] = np.nextafter(pick[nudged], np.where(rng.random(nudged.sum()) < 0.5, -np.inf, np.inf))
    return X


def _same(text: str, X: np.ndarray) -> None:
    ours, ref = TextBooster.from_text(text), lgb.Booster(model_str=text)
    want_raw = ref.predict(X, raw_score=True)
    assert np.array_equal(ours.predict(X, raw_score=True), want_raw)  # many rows: the vectorised walk
    for lo in range(0, 40, 5):  # a few rows at a time: the walk in Python (analysis scores one row)
        assert np.array_equal(ours.predict(X[lo:lo + 5], raw_score=True), want_raw[lo:lo + 5])
    got, want = ours.predict(X[:25], pred_contrib=True), ref.predict(X[:25], pred_contrib=True)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("path", SHIPPED, ids=[f"{p.parent.name}/{p.stem}" for p in SHIPPED])
def test_shipped_models_score_as_lightgbm(path):
    text = path.read_text()
    model = TextBooster.from_text(text)
    thresholds = np.concatenate([t.threshold for t in model.trees])
    _same(text, _rows(np.random.default_rng(len(text)), 400, model.num_features, thresholds))


def _train(X, y, **params) -> str:
    base = {"objective": "binary", "num_leaves": 7, "min_data_in_leaf": 5, "verbose": -1, "seed": 1,
            "deterministic": True, "num_threads": 1}
    return lgb.train(base | params, lgb.Dataset(X, y), num_boost_round=25).model_to_string()


def test_missing_values_zero_as_missing_and_single_leaf_trees():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(600, 6))
    X[rng.random(X.shape) < 0.15] = np.nan
    X[rng.random(X.shape) < 0.15] = 0.0
    y = ((np.nan_to_num(X[:, 0]) > 0.2) ^ (np.isnan(X[:, 1])) ^ (X[:, 2] == 0.0)).astype(int)
    for params in ({}, {"zero_as_missing": True}, {"use_missing": False}, {"min_data_in_leaf": 400}):
        text = _train(X, y, **params)
        model = TextBooster.from_text(text)
        kinds = {int(m) for t in model.trees for m in t.missing}
        if params.get("zero_as_missing"):
            assert 1 in kinds  # missing type Zero reached
        if params.get("min_data_in_leaf") == 400:
            assert any(t.num_leaves == 1 for t in model.trees)
        thresholds = np.concatenate([t.threshold for t in model.trees] + [np.zeros(1)])
        _same(text, _rows(np.random.default_rng(3), 300, 6, thresholds))


def test_what_it_does_not_read_goes_to_lightgbm(tmp_path):
    rng = np.random.default_rng(2)
    X = rng.integers(0, 5, size=(300, 3)).astype(float)
    y = (X[:, 0] == 3).astype(int)
    text = lgb.train({"objective": "binary", "verbose": -1, "min_data_in_leaf": 5, "num_threads": 1},
                     lgb.Dataset(X, y, categorical_feature=[0]), num_boost_round=5).model_to_string()
    with pytest.raises(Unsupported):
        TextBooster.from_text(text)
    f = tmp_path / "cat.txt"
    f.write_text(text)
    assert isinstance(load_predictor(f), lgb.Booster)
    truncated = tmp_path / "cut.txt"  # a tree list cut short: refused here, LightGBM decides
    truncated.write_text(SHIPPED[0].read_text()[:3000] + "\nend of trees\n")
    with pytest.raises(Unsupported):
        TextBooster.from_text(truncated.read_text())
    cyclic = SHIPPED[0].read_text().replace("left_child=1 -1", "left_child=0 -1", 1)  # a node its own child
    assert cyclic != SHIPPED[0].read_text()
    with pytest.raises(Unsupported, match="do not lead down"):
        TextBooster.from_text(cyclic)
    whole = tmp_path / "whole.txt"
    whole.write_text(SHIPPED[0].read_text())
    assert isinstance(load_predictor(whole), TextBooster)


def test_bundle_votes_equal_with_lightgbm_and_analysis_does_not_import_it(fresh_analyze):
    bundle = load_bundle(REPO / "models" / "v0001")
    assert all(isinstance(b, TextBooster) for b in bundle.boosters.values())
    features = {"gpu_busy_pct": 41.0, "idle_host_ms_per_step": 12.0, "step_ms": 80.0, "kernel_count": 900}
    ours = bundle.votes(features)
    saved = bundle.boosters
    try:
        bundle.boosters = {p: lgb.Booster(model_str=(bundle.dir / i["file"]).read_text()) for p, i in bundle.labels.items()}
        ref = bundle.votes(features)
    finally:
        bundle.boosters = saved
    assert ours == ref
    imported, out = fresh_analyze(("lightgbm", "pandas", "scipy"))
    assert imported == []
    assert json.loads((out / "findings.json").read_text())["model_version"]  # the model voted


def test_a_booster_of_another_feature_list_is_refused_at_load(tmp_path):
    from zoomer_ar.learn.model import ModelBundle, ModelLoadError

    src = REPO / "models" / "v0001"
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    meta = json.loads((src / "meta.json").read_text())
    meta["feature_names"] = meta["feature_names"][:-1]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ModelLoadError, match="reads 122 features, meta.json lists 121"):
        ModelBundle(tmp_path)


def test_a_damaged_tree_is_a_load_error_not_lightgbms(tmp_path):
    """A booster whose tree breaks LightGBM's invariants was handed to LightGBM, which aborted the whole
    process ('terminate called without an active exception', exit 134: every `analyze` with that model
    current died) on arrays of the wrong length or a split on a feature the model lacks, and loaded a cycle
    whose prediction never ended (analyze hung). Now each is a one-line ModelLoadError naming the file, so
    analyze notes it and runs on the rules. Run in a child process: before, the load killed it."""
    import re
    import subprocess
    import sys

    src = SHIPPED[0].read_text()
    cases = {"sizes": re.sub(r"leaf_value=.*", "leaf_value=nan nan nan nan nan nan nan", src, count=1),
             "feature": re.sub(r"split_feature=(\d+)", "split_feature=99999", src, count=1),
             "child": re.sub(r"right_child=(-?\d+)", "right_child=777", src, count=1),
             "cycle": src.replace("left_child=1 -1", "left_child=0 -1", 1)}
    for name, text in cases.items():
        assert text != src, name
        (tmp_path / f"{name}.txt").write_text(text)
    script = ("import sys, numpy as np\nfrom pathlib import Path\nfrom zoomer_ar.learn.model import ModelLoadError, "
              "load_predictor\nfor f in sorted(Path(sys.argv[1]).glob('*.txt')):\n    try:\n        b = load_predictor(f)\n"
              "        b.predict(np.zeros((1, b.num_feature() if hasattr(b, 'num_feature') else b.num_features)), "
              "raw_score=True)\n        print(f.stem, 'loaded')\n    except ModelLoadError as e:\n"
              "        print(f.stem, 'refused', e)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    lines = dict(ln.split(" ", 1) for ln in done.stdout.splitlines())
    assert set(lines) == set(cases) and all(v.startswith("refused") for v in lines.values()), done.stdout
    assert "a corrupt LightGBM text model" in lines["cycle"] and "cycle.txt" in lines["cycle"]
