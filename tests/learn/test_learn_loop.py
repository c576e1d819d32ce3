"""The whole loop on a small corpus in a tmp dir: corpus build -> train -> evaluate -> promote (gate) -> rollback.

Also: a human verdict recorded with `zoomer-ar label` is used by the next `train`, and a sabotaged
model (adding findings everywhere) is refused by the gate. Runs in well under 5 minutes on 2 cores.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.learn.registry import current, history

pytestmark = pytest.mark.xdist_group("learn-loop")


def test_corpus_train_evaluate_promote_rollback(tmp_path, shared_traces, capsys):
    t0 = time.time()
    corpus, models, cache, store = tmp_path / "corpus", tmp_path / "models", tmp_path / "cache", tmp_path / "labels.jsonl"
    common = ["--traces", str(shared_traces)]

    # 1. corpus (small)
    assert main(["corpus", "build", "--small", "--n-synth", "250", "--augment", "4", "--workers", "2",
                 "--out", str(corpus), *common]) == 0
    manifest = json.loads((corpus / "MANIFEST.json").read_text())
    assert manifest["by_source"]["synth"] == 250 and manifest["by_source"]["augment"] > 0
    assert manifest["by_source"]["example"] >= 0
    lines = (corpus / "corpus.jsonl").read_text().splitlines()
    case = json.loads(lines[0])
    assert {"case_id", "source", "group", "feature_schema_version", "features", "labels", "provenance"} <= set(case)

    # 2. a human verdict, then train: the verdict is used
    trace = shared_traces / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
    assert main(["label", str(trace), "--pattern", "idle-gpu", "--yes", "--note", "8% busy", "--store", str(store)]) == 0
    rec = json.loads(store.read_text().splitlines()[0])
    assert rec["pattern"] == "idle-gpu" and rec["verdict"] == "positive" and rec["features"]["has_gpu"] is True
    capsys.readouterr()
    assert main(["train", "--data", str(corpus), "--out", str(models), "--labels", str(store), "--cache", str(cache),
                 *common]) == 0
    out = capsys.readouterr()
    assert "1 from verdicts" in out.err
    assert "Held-out corpus" in out.out and "macro-F1" in out.out
    v1 = models / "v0001"
    meta = json.loads((v1 / "meta.json").read_text())
    assert meta["data"]["by_source"].get("verdict") == 1
    assert meta["feature_schema_version"] and meta["labels"]
    for p, info in meta["labels"].items():
        assert (v1 / info["file"]).read_text().startswith("tree")  # LightGBM text, not a pickle
        assert 0.0 < info["threshold"] < 1.0
    assert (v1 / "model_card.md").read_text().startswith("# Model card")
    assert not list(v1.glob("*.pkl"))

    # 3. evaluate: rules vs model vs ensemble tables
    assert main(["evaluate", "--models", str(models), "--model", "v0001", "--cache", str(cache), *common]) == 0
    out = capsys.readouterr().out
    assert "rules P/R/F1" in out and "Real traces" in out

    # 4. promote through the gate (no current model: judged against the rules)
    assert main(["models", "promote", "v0001", "--models", str(models), "--cache", str(cache), *common]) == 0
    assert current(models) == "v0001"

    # a sabotaged copy (says yes to everything) is refused: its held-out macro-F1 collapses (on the real
    # traces the guard alone keeps it off every negative label)
    bad = models / "v0002"
    shutil.copytree(v1, bad)
    meta_bad = json.loads((bad / "meta.json").read_text())
    meta_bad["version"] = "v0002"
    for info in meta_bad["labels"].values():
        info["add_threshold"] = 0.0
        info["threshold"] = 0.0
    (bad / "meta.json").write_text(json.dumps(meta_bad))
    rc = main(["models", "promote", "v0002", "--models", str(models), "--cache", str(cache), *common])
    err = capsys.readouterr().err
    assert rc != 0 and "promotion refused" in err and "held-out macro-F1 drops" in err
    assert current(models) == "v0001"

    # a retrained model (same data, new seed) goes through the gate against v0001
    assert main(["train", "--data", str(corpus), "--out", str(models), "--labels", str(store), "--cache", str(cache),
                 "--seed", "1", *common]) == 0
    capsys.readouterr()
    rc = main(["models", "promote", "v0003", "--models", str(models), "--cache", str(cache), *common])
    capsys.readouterr()
    if rc == 0:
        assert current(models) == "v0003"
        # 5. rollback returns to v0001
        assert main(["models", "rollback", "--models", str(models)]) == 0
        assert current(models) == "v0001"
    else:
        assert current(models) == "v0001"
    assert main(["models", "rollback", "--models", str(models)]) == 0
    assert current(models) is None  # back to the rules alone
    assert [h["action"] for h in history(models)][-1] == "rollback"
    assert main(["models", "list", "--models", str(models)]) == 0
    assert time.time() - t0 < 300


def test_gate_refuses_a_model_that_loses_a_real_label(tmp_path, monkeypatch, shared_traces):
    """The real-trace condition, isolated: a label the rules get right and the candidate gets wrong blocks it."""
    from zoomer_ar.learn import registry

    root = tmp_path / "models"
    shipped = Path(__file__).resolve().parents[2] / "models"
    version = current(shipped)
    shutil.copytree(shipped / version, root / version)
    real = {"items": [{"trace": "t", "pattern": "idle-gpu", "label": "negative", "probability": 0.9,
                       "rules": True, "model": False, "ensemble": False}],
            "labelled": 1, "correct": {"rules": 1, "model": 0, "ensemble": 0}}
    monkeypatch.setattr(registry, "real_features", lambda traces, cache: [{"rel": "t"}])
    monkeypatch.setattr(registry, "evaluate_real", lambda *a, **k: real)
    rep = registry.gate(root, version, shared_traces, None)
    assert not rep["ok"] and "loses 1 real-trace label" in rep["reasons"][0]
    with pytest.raises(registry.GateError):
        registry.promote(root, version, shared_traces, None)
    assert registry.current(root) is None
