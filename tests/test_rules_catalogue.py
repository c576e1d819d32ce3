"""The rule catalogue tests itself (Fixit-style): every rule's VALID and INVALID examples become tests."""

from __future__ import annotations


import pytest

from zoomer_ar.cli import main
from zoomer_ar.detect.rules import RuleError, example_features, load_rule, load_rules
from zoomer_ar.models import PATTERN_IDS
from zoomer_ar.paths import RULES_DIR

RULES = load_rules()
VALID = [(r.id, i, ex) for r in RULES for i, ex in enumerate(r.valid)]
INVALID = [(r.id, i, ex) for r in RULES for i, ex in enumerate(r.invalid)]
BY_ID = {r.id: r for r in RULES}


def test_rule_files_read_the_same_with_libyaml_and_pure_python():
    """load_rule reads with libyaml's loader where PyYAML has it: the same documents as SafeLoader."""
    import yaml

    from zoomer_ar.detect.rules import SAFE_LOADER

    for p in sorted(RULES_DIR.glob("*.yaml")):
        text = p.read_text(encoding="utf-8")
        assert yaml.load(text, Loader=SAFE_LOADER) == yaml.safe_load(text), p.name


def test_one_rule_file_per_pattern():
    assert sorted(BY_ID) == sorted(PATTERN_IDS)
    assert sorted(p.stem for p in RULES_DIR.glob("*.yaml")) == sorted(PATTERN_IDS)


@pytest.mark.parametrize("rule_id,i,example", VALID, ids=[f"{r}-valid{i}" for r, i, _ in VALID])
def test_valid_examples_do_not_fire(rule_id, i, example):
    assert BY_ID[rule_id].evaluate(example_features(example)) is None, example.note


@pytest.mark.parametrize("rule_id,i,example", INVALID, ids=[f"{r}-invalid{i}" for r, i, _ in INVALID])
def test_invalid_examples_fire_with_expected_impact(rule_id, i, example):
    result = BY_ID[rule_id].evaluate(example_features(example))
    assert result is not None, example.note
    if example.impact_pct is not None:
        assert result["impact_pct"] == pytest.approx(example.impact_pct, abs=1.0)
    assert 0.0 <= result["confidence"] <= 1.0


BROKEN = {
    "unknown feature in condition": "condition: gpu_busy_percent < 50\n",
    "bad expression syntax": "condition: gpu_busy_pct <\n",
    "forbidden syntax (attribute access)": "condition: gpu_busy_pct.__class__ == 1\n",
    "unknown pattern id": None,
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_bad_rule_file_is_a_clear_error(case, tmp_path):
    text = (RULES_DIR / "idle-gpu.yaml").read_text()
    if BROKEN[case] is None:
        text = text.replace("id: idle-gpu", "id: idle-gpus")
    else:
        text = "\n".join(l for l in text.splitlines() if not l.startswith("condition:")) + "\n" + BROKEN[case]
    p = tmp_path / "idle-gpu.yaml"
    p.write_text(text)
    with pytest.raises(RuleError) as exc:
        load_rule(p)
    assert "idle-gpu.yaml" in str(exc.value)


def test_rule_without_examples_is_rejected(tmp_path):
    text = (RULES_DIR / "idle-gpu.yaml").read_text().split("\nvalid:")[0] + "\n"
    p = tmp_path / "idle-gpu.yaml"
    p.write_text(text)
    with pytest.raises(RuleError, match="VALID and one INVALID"):
        load_rule(p)


def test_rules_list_and_explain(capsys):
    assert main(["rules", "list"]) == 0
    out = capsys.readouterr().out
    assert all(pid in out for pid in PATTERN_IDS)
    assert main(["rules", "explain", "sync-point"]) == 0
    page = capsys.readouterr().out
    for heading in ("## What it detects", "## Why it costs time", "## Example", "## How to fix it"):
        assert heading in page
    assert ".item()" in page


def test_explain_unknown_rule_exit_code(capsys):
    assert main(["rules", "explain", "no-such-rule"]) == 2  # an unknown id is bad input
    assert "no rule with id" in capsys.readouterr().err


def test_none_feature_never_fires():
    """A figure the trace does not have (None) must not satisfy a threshold."""
    r = BY_ID["idle-gpu"]
    feats = example_features(r.invalid[0])
    feats["gpu_busy_pct"] = None
    assert r.evaluate(feats) is None
