"""An ML engineer's journey through label -> train -> evaluate -> promote: the cases that broke it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zoomer_ar.cli import main


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


# --- verdicts of another feature schema -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """A small generated trace and the findings.json `analyze` wrote for it."""
    from zoomer_ar.synth.generator import generate

    d = tmp_path_factory.mktemp("analysed")
    trace = d / "job" / "rank0.json"
    trace.parent.mkdir()
    trace.write_text(json.dumps(generate(3, plants=["sync-point"]).documents[0]))
    assert main(["analyze", str(trace), "--out", str(d / "out"), "--format", "json"]) == 0
    return trace, d / "out" / "findings.json"


def _old_findings(src: Path, dest: Path, trace: str | None = None) -> Path:
    doc = json.loads(src.read_text())
    doc["feature_schema_version"] = "1.0.0"
    doc["features"].pop("compute_ms_per_step", None)  # a field 1.0.0 did not have
    if trace is not None:
        doc["job"]["path"] = trace
    dest.mkdir(parents=True)
    (dest / "findings.json").write_text(json.dumps(doc))
    return dest / "findings.json"


def test_labelling_an_old_findings_json_refeaturises_its_trace(tmp_path, analysed, capsys):
    """A findings.json written by an older zoomer-ar (another feature schema) was recorded with its old
    features; `train` dropped the verdict as 'cases of another feature-schema version (rebuild the corpus)'
    whenever its trace could not be re-read then. Where the trace is there, `label` now reads it again and
    records this schema's features."""
    from zoomer_ar.features import FEATURE_SCHEMA_VERSION

    trace, findings = analysed
    old = _old_findings(findings, tmp_path / "old")
    store = tmp_path / "labels.jsonl"
    capsys.readouterr()
    assert main(["label", str(old), "--pattern", "sync-point", "--yes", "--store", str(store)]) == 0
    rec = json.loads(store.read_text())
    assert rec["feature_schema_version"] == FEATURE_SCHEMA_VERSION
    assert "compute_ms_per_step" in rec["features"]
    assert rec["trace_sha256"] == [r["sha256"] for r in json.loads(findings.read_text())["job"]["ranks"]]


def test_an_old_verdict_whose_trace_is_gone_is_named_at_label_and_train(tmp_path, analysed, capsys):
    """Its trace gone, an old findings.json's verdict was recorded without a word and `train` said only
    'skipped 1 cases of another feature-schema version (rebuild the corpus)', which does not bring it back.
    `label` now warns that `train` cannot use it, and `train` names the verdict's trace and what to do."""
    import numpy as np

    from zoomer_ar.learn import train as T
    from zoomer_ar.learn.cases import LabelledCase, full_labels, write_cases

    _, findings = analysed
    old = _old_findings(findings, tmp_path / "old", trace=str(tmp_path / "gone" / "rank0.json"))
    store = tmp_path / "labels.jsonl"
    capsys.readouterr()
    assert main(["label", str(old), "--pattern", "sync-point", "--yes", "--store", str(store)]) == 0
    out = capsys.readouterr()
    assert "feature schema 1.0.0" in out.err and "gone" in out.err and "rank0.json" in out.err
    assert json.loads(store.read_text())["feature_schema_version"] == "1.0.0"  # the verdict is kept as given

    rng = np.random.default_rng(0)
    cases = []
    for i in range(60):
        busy = float(rng.uniform(5, 99))
        cases.append(LabelledCase(case_id=f"s{i}", source="synth", group=f"synth:{i}", feature_schema_version=T.FEATURE_SCHEMA_VERSION,
                                  features={"gpu_busy_pct": busy, "step_ms": 10.0, "has_gpu": True},
                                  labels=full_labels({"idle-gpu": "positive" if busy < 40 else "negative"})))
    (tmp_path / "c").mkdir()
    write_cases(tmp_path / "c" / "corpus.jsonl", cases)
    logs: list[str] = []
    T.train(T.TrainConfig(data=str(tmp_path / "c"), out=str(tmp_path / "models"), labels=str(store),
                          traces=str(tmp_path / "no-traces")), log=logs.append)
    said = "\n".join(logs)
    assert "rebuild the corpus" not in said
    assert "1 human verdict" in said and "1.0.0" in said and str(tmp_path / "gone" / "rank0.json") in said


def test_label_says_how_train_finds_a_verdict_file_given_with_store(tmp_path, analysed, capsys, monkeypatch):
    """`label --store FILE` said 'the next `train` run from this folder uses it', but `train` reads
    ./training_data/labels.jsonl unless given --labels: the verdict was silently not trained on."""
    _, findings = analysed
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    store = tmp_path / "my verdicts.jsonl"
    assert main(["label", str(findings), "--pattern", "sync-point", "--yes", "--store", str(store)]) == 0
    assert f"`train --labels '{store}'` uses it" in capsys.readouterr().out
    assert main(["label", str(findings), "--pattern", "sync-point", "--yes"]) == 0
    assert "the next `train` run from this folder uses it" in capsys.readouterr().out
    assert main(["label", str(findings), "--pattern", "sync-point", "--no", "--store", "training_data/labels.jsonl"]) == 0
    assert "the next `train` run from this folder uses it" in capsys.readouterr().out


# --- evaluate: what there is to score -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fake_real(tmp_path_factory):
    from test_learn_audit_fixes import make_fake_real

    return make_fake_real(tmp_path_factory.mktemp("real"))


@pytest.fixture(scope="module")
def small_model(tmp_path_factory, fake_real):
    """A model trained on a fabricated corpus (test_learn_audit_fixes' builders), that corpus's folder and the
    fake real traces."""
    from test_learn_audit_fixes import make_corpus

    from zoomer_ar.learn import train as T

    d = tmp_path_factory.mktemp("small")
    corpus = make_corpus(d / "corpus", 260)
    traces, cache = fake_real
    vdir = T.train(T.TrainConfig(data=str(corpus), out=str(d / "models"), labels=str(d / "none.jsonl"),
                                 traces=str(traces), cache=str(cache)), log=lambda s: None)
    return vdir, d, fake_real


def _evaluate(capsys, small_model, corpus: Path) -> tuple[int, str, str]:
    vdir, _, (traces, cache) = small_model
    capsys.readouterr()
    rc = main(["evaluate", "--model", str(vdir), "--data", str(corpus), "--traces", str(traces), "--cache", str(cache)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_evaluate_on_a_corpus_with_no_held_out_case_says_so(small_model, capsys):
    """`evaluate --data` on a corpus whose cases all lie in training groups (or no case at all) printed a
    table of 0.00 for every label and exit 0, as if rules and model had scored nothing right; it is now one
    line saying there is nothing to score (exit 2), as for a corpus of another feature-schema major."""
    from test_learn_audit_fixes import make_corpus

    _, d, _ = small_model
    for name, corpus in (("train-only", make_corpus(d / "train-only", 40, seed=3, only_train_groups=True)),
                         ("empty", d / "empty")):
        corpus.mkdir(exist_ok=True)
        if name == "empty":
            (corpus / "corpus.jsonl").write_text("")
        rc, out, err = _evaluate(capsys, small_model, corpus)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and "no held-out case" in lines[0], (name, err)
        assert "0.00/0.00/0.00" not in out


def test_evaluate_prints_no_score_where_a_label_has_no_positive_case(small_model, capsys):
    """A label whose held-out cases are all negative printed '0.00/0.00/0.00' (rules, model and ensemble all
    looking wrong) though recall and F1 are undefined there and the label is not in the macro-F1; such cells
    are now '-', and a precision is printed only where something fired."""
    from zoomer_ar.learn.cases import read_cases, write_cases

    _, d, _ = small_model
    cases = list(read_cases(d / "corpus" / "corpus.jsonl"))
    for c in cases:
        if c.labels.get("memory-growth") == "positive":
            c.labels["memory-growth"] = "unknown"
    (d / "no-growth").mkdir(exist_ok=True)
    write_cases(d / "no-growth" / "corpus.jsonl", cases)
    rc, out, err = _evaluate(capsys, small_model, d / "no-growth")
    assert rc == 0, err
    row = next(ln for ln in out.splitlines() if ln.startswith("memory-growth"))
    assert " 0 " in row and "0.00/0.00/0.00" not in row and "/-/-" in row, row
    idle = next(ln for ln in out.splitlines() if ln.startswith("idle-gpu"))
    assert "-" not in idle.split("|", 1)[1].replace(" - ", ""), idle  # a scored label keeps its numbers
