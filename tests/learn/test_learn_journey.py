"""An ML engineer's journey through label -> train -> evaluate -> promote: the cases that broke it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "models" / "v0001"


def _copy_shipped(dest: Path) -> Path:
    shutil.copytree(SHIPPED, dest)
    return dest


def _edit_meta(version_dir: Path, edit) -> None:
    meta = json.loads((version_dir / "meta.json").read_text())
    edit(meta)
    (version_dir / "meta.json").write_text(json.dumps(meta))


def _label(meta, pattern="sync-point"):
    return meta["labels"][pattern]


META_DAMAGE = {
    "threshold not a number": (lambda m: _label(m).update(threshold="high"), "threshold"),
    "threshold outside 0..1": (lambda m: _label(m).update(threshold=7), "threshold"),
    "add_threshold not a number": (lambda m: _label(m).update(add_threshold=None), "add_threshold"),
    "calibration of an unknown kind": (lambda m: _label(m).update(calibration={"kind": "weird"}), "calibration"),
    "platt without its coefficients": (lambda m: _label(m).update(calibration={"kind": "platt", "a": 1.0}), "calibration"),
    "isotonic with unequal lists": (lambda m: _label(m).update(calibration={"kind": "isotonic", "x": [0, 1], "y": [0.5]}),
                                    "calibration"),
    "isotonic with no points": (lambda m: _label(m).update(calibration={"kind": "isotonic", "x": [], "y": []}),
                                "calibration"),
    "a booster file outside the version": (lambda m: _label(m).update(file="../v0001/sync-point.txt"), "file"),
    "feature names not strings": (lambda m: m.update(feature_names=[1] * len(m["feature_names"])), "feature_names"),
    "a feature this schema does not have": (lambda m: m["feature_names"].__setitem__(3, "no_such_feature"),
                                            "no_such_feature"),
    "a repeated feature": (lambda m: m["feature_names"].__setitem__(3, m["feature_names"][4]), "feature_names"),
    "vocabulary not lists of strings": (lambda m: m.update(vocab={"accelerator": "nvidia"}), "vocab"),
    "version not a string": (lambda m: m.update(version=1), "version"),
}


@pytest.mark.parametrize("case", sorted(META_DAMAGE))
def test_a_damaged_meta_json_is_a_load_error_and_analyze_runs_on_the_rules(tmp_path, case):
    """A meta.json whose per-label threshold or calibration had the wrong shape loaded, and every `analyze`
    with that model current died in the vote (`internal error: KeyError: 'x'`, exit 1), as did `evaluate`;
    a booster file named outside the version folder was read from there, and a feature name the schema does
    not have was silently a missing value on every row. Each is now a ModelLoadError naming meta.json, so
    `evaluate` says it in one line (exit 2) and `analyze` notes it and reports the rules' findings."""
    from zoomer_ar.detect.ensemble import model_state
    from zoomer_ar.learn.model import ModelBundle, ModelLoadError

    edit, names = META_DAMAGE[case]
    root = tmp_path / "models"
    vdir = _copy_shipped(root / "v0001")
    _edit_meta(vdir, edit)
    (root / "CURRENT").write_text("v0001\n")
    with pytest.raises(ModelLoadError, match=names) as err:
        ModelBundle(vdir)
    assert "meta.json" in str(err.value)
    state = model_state(root)
    assert state.model is None and state.note and "could not be loaded" in state.note and names in state.note


def test_the_shipped_model_still_loads_with_the_checks():
    from zoomer_ar.learn.model import ModelBundle

    bundle = ModelBundle(SHIPPED)
    assert bundle.labels and bundle.votes({"gpu_busy_pct": 41.0, "step_ms": 80.0})
