"""Regression tests for the learning-stack audit (docs/learning.md): gate, schema checks, bad input, verdict
grouping, model provenance in findings, out-of-fold CV.

Everything here runs on small fabricated corpora (feature dicts with clean, learnable labels) and a fake
real-trace folder whose feature vectors are pre-seeded in the feature cache, so no trace is loaded and no
corpus is built: the whole file takes seconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from zoomer_ar.cli import main
from zoomer_ar.features import FEATURE_SCHEMA_VERSION
from zoomer_ar.learn import registry
from zoomer_ar.learn import train as T
from zoomer_ar.learn import verdicts as V
from zoomer_ar.learn.cases import LabelledCase, full_labels, held_out, write_cases
from zoomer_ar.learn.evaluate import _sha_of, extractor_fingerprint

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "traces" / "extra_copy"
HELD_REL, TRAIN_REL = "fake/a1.json", "fake/a0.json"  # held_out("real:fake/a1.json") is True, a0 is False
FOUR = ("idle-gpu", "dataloader-bound", "sync-point", "memory-growth")


# --- fabricated data ------------------------------------------------------------------------------------------

def _features(rng: np.random.Generator) -> dict:
    step = float(rng.uniform(5, 50))
    busy = float(rng.uniform(5, 99))
    dl = float(rng.uniform(0, 0.2)) * step
    sync = float(rng.uniform(0, 0.2)) * step
    grow = float(rng.choice([0.0, 0.0, 0.0, rng.uniform(2e6, 9e6)]))
    return {"has_gpu": True, "has_accelerator": True, "accelerator": "nvidia", "profiler_steps": 3, "step_ms": step,
            "wall_ms": 3 * step, "gpu_busy_pct": busy, "dataloader_ms_per_step": dl, "dataloader_pct": 100 * dl / step,
            "idle_sync_ms_per_step": sync, "sync_calls_per_step": 2.0, "memory_events": 10,
            "memory_growth_bytes_per_step": grow, "kernel_count": 100, "launch_count": 100}


def _labels(f: dict, known: tuple[str, ...]) -> dict[str, str]:
    def band(v, lo, hi):
        return "positive" if v > hi else "negative" if v < lo else "unknown"

    lab = {"idle-gpu": band(100 - f["gpu_busy_pct"], 45, 55),
           "dataloader-bound": band(f["dataloader_pct"], 2, 8),
           "sync-point": band(100 * f["idle_sync_ms_per_step"] / f["step_ms"], 2, 8),
           "memory-growth": "positive" if f["memory_growth_bytes_per_step"] > 0 else "negative"}
    return full_labels({p: v for p, v in lab.items() if p in known})


def make_corpus(path: Path, n: int, seed: int = 0, known: tuple[str, ...] = FOUR, first: int = 0,
                schema: str = FEATURE_SCHEMA_VERSION, augment_of: str | None = None, sha: str = "f" * 64,
                only_train_groups: bool = False) -> Path:
    rng = np.random.default_rng(seed)
    cases = []
    i = first
    while len(cases) < n:
        group = f"synth:{i}"
        i += 1
        if only_train_groups and held_out(group):
            continue
        f = _features(rng)
        cases.append(LabelledCase(case_id=f"synth-{i}", source="synth", group=group, feature_schema_version=schema,
                                  features=f, labels=_labels(f, known), provenance={"trace_sha256": [f"{group}-sha"]}))
    if augment_of:
        for k in range(4):
            f = _features(rng)
            cases.append(LabelledCase(case_id=f"augment-{augment_of}#{k}", source="augment", group=f"real:{augment_of}",
                                      feature_schema_version=schema, features=f, labels=_labels(f, known),
                                      provenance={"real_trace": augment_of, "trace_sha256": [sha]}))
    path.mkdir(parents=True, exist_ok=True)
    write_cases(path / "corpus.jsonl", cases)
    return path


@pytest.fixture(scope="module")
def fake_real(tmp_path_factory):
    """A real-traces folder (LABELS.yaml + two stand-in files) and a cache holding their feature vectors."""
    return make_fake_real(tmp_path_factory.mktemp("real"))


def make_fake_real(d: Path) -> tuple[Path, Path]:
    """fake_real's folders, made under `d` (for other test modules)."""
    traces, cache = d / "traces", d / "cache"
    (traces / "fake").mkdir(parents=True)
    cache.mkdir()
    labels = {HELD_REL: {"kind": "trace", "positive": ["idle-gpu"], "negative": ["sync-point"]},
              TRAIN_REL: {"kind": "trace", "positive": ["dataloader-bound"], "negative": ["idle-gpu"]}}
    (traces / "LABELS.yaml").write_text(yaml.safe_dump(labels))
    feats = {HELD_REL: dict(_features(np.random.default_rng(1)), gpu_busy_pct=20.0, idle_sync_ms_per_step=0.0),
             TRAIN_REL: dict(_features(np.random.default_rng(2)), gpu_busy_pct=97.0, dataloader_pct=30.0,
                             dataloader_ms_per_step=6.0, step_ms=20.0)}
    lines = []
    for rel, f in feats.items():
        (traces / rel).write_text(json.dumps({"stand-in": rel}))
        lines.append(json.dumps({"key": f"{rel}::{_sha_of(traces / rel)}", "features": f}))
    (cache / f"real-features-{FEATURE_SCHEMA_VERSION}-{extractor_fingerprint()}.jsonl").write_text("\n".join(lines) + "\n")
    return traces, cache


def train_into(models: Path, corpus: Path, fake_real, labels: Path | None = None, seed: int = 0, log=None) -> Path:
    traces, cache = fake_real
    cfg = T.TrainConfig(data=str(corpus), out=str(models), labels=str(labels or models.parent / "no-labels.jsonl"),
                        seed=seed, traces=str(traces), cache=str(cache))
    return T.train(cfg, log=log or (lambda s: None))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, fake_real):
    """Model A (four labels, corpus A) and model B (two labels, a disjoint corpus B) in one registry."""
    d = tmp_path_factory.mktemp("trained")
    ca = make_corpus(d / "ca", 260, seed=0)
    cb = make_corpus(d / "cb", 200, seed=1, known=("idle-gpu", "sync-point"), first=10_000)
    models = d / "models"
    a = train_into(models, ca, fake_real)
    b = train_into(models, cb, fake_real)
    assert (a.name, b.name) == ("v0001", "v0002")
    return models, ca, cb


def _registry(tmp_path, trained) -> Path:
    root = tmp_path / "models"
    shutil.copytree(trained[0], root)
    return root


def _cli(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("zoomer-ar: error:") and "internal error" not in err, err
    return lines[0]


# --- 1. the gate: one set of cases, one set of labels, no dropped label -------------------------------------

def test_macro_f1_scores_a_label_without_a_booster_as_the_rules():
    from zoomer_ar.learn.evaluate import summarize
    from zoomer_ar.learn.metrics import macro_f1

    m = lambda f: {"f1": f, "precision": f, "recall": f}  # noqa: E731
    per = {"a": {"support_pos": 3, "support_neg": 5, "rules": m(0.5), "model": m(1.0), "ensemble": m(0.6)},
           "b": {"support_pos": 3, "support_neg": 5, "rules": m(0.7), "model": None, "ensemble": m(0.7)},
           "c": {"support_pos": 0, "support_neg": 5, "rules": m(0.0), "model": m(0.0), "ensemble": m(0.0)}}
    assert macro_f1(per, "model") == pytest.approx(0.85)  # (1.0 + rules' 0.7) / 2; c has one class only
    assert macro_f1(per, "rules") == pytest.approx(0.6)
    s = summarize(per)
    assert s["model"] == pytest.approx(0.85) and s["model_covered"] == pytest.approx(1.0)


def test_gate_compares_on_the_common_held_out_cases_and_refuses_dropped_labels(tmp_path, trained, fake_real, capsys):
    models, ca, cb = trained
    root = _registry(tmp_path, trained)
    traces, cache = fake_real
    rc, out, err = _cli(capsys, "models", "promote", "v0001", "--models", root, "--traces", traces, "--cache", cache)
    assert rc == 0, err
    promote_out = out
    rep = registry.gate(root, "v0002", traces, cache)
    n_a = sum(1 for line in (ca / "corpus.jsonl").read_text().splitlines() if held_out(json.loads(line)["group"]))
    n_b = sum(1 for line in (cb / "corpus.jsonl").read_text().splitlines() if held_out(json.loads(line)["group"]))
    assert rep["held_out"]["cases"] == n_a + n_b  # both corpora's held-out parts, not the candidate's alone
    assert rep["held_out"]["labels"] == 4  # the union of labels, each scored for both models
    assert rep["coverage"]["dropped"] == ["dataloader-bound", "memory-growth"]
    assert not rep["ok"] and any("drops 2 label(s)" in r for r in rep["reasons"])
    rc, out, err = _cli(capsys, "models", "promote", "v0002", "--models", root, "--traces", traces, "--cache", cache)
    assert rc != 0 and "dataloader-bound" in err and registry.current(root) == "v0001"
    rep2 = registry.gate(root, "v0002", traces, cache, allow_dropped_labels=True)
    assert not any("label(s) the current model" in r for r in rep2["reasons"]) and any("allowed" in n for n in rep2["notes"])
    assert "labels with a booster: 4 of 16" in promote_out  # per-label coverage is reported


def test_evaluate_real_falls_back_to_the_rules_where_the_model_has_no_booster(trained, fake_real):
    from zoomer_ar.learn.evaluate import evaluate_real, real_features
    from zoomer_ar.learn.model import ModelBundle

    traces, cache = fake_real
    b = ModelBundle(trained[0] / "v0002")  # no booster for dataloader-bound
    ev = evaluate_real(b, traces, cache, entries=real_features(traces, cache))
    it = next(x for x in ev["items"] if x["pattern"] == "dataloader-bound")
    assert it["model_abstained"] and it["model"] == it["rules"]
    assert ev["correct"]["model"] == sum(int(x["model"]) for x in ev["items"]) and ev["model_abstained"] == 1


# --- 2. feature schema: one compatibility rule, refused by promote and evaluate; empty held-out fails -------

def _copy_version(root: Path, src: str, dst: str, **meta_updates) -> Path:
    shutil.copytree(root / src, root / dst)
    meta = json.loads((root / dst / "meta.json").read_text())
    meta.update(version=dst, **meta_updates)
    meta.pop("promotion", None)
    (root / dst / "meta.json").write_text(json.dumps(meta))
    return root / dst


def test_other_schema_major_is_refused_by_promote_evaluate_and_inference(tmp_path, trained, fake_real, capsys):
    from zoomer_ar.detect.ensemble import model_state, schema_compatible

    root = _registry(tmp_path, trained)
    traces, cache = fake_real
    _copy_version(root, "v0001", "v0009", feature_schema_version="9.0.0")
    rc, out, err = _cli(capsys, "models", "promote", "v0009", "--models", root, "--traces", traces, "--cache", cache)
    assert rc == 2 and "feature schema 9.0.0" in _one_line_error(err) and registry.current(root) is None
    rc, out, err = _cli(capsys, "models", "promote", "v0009", "--force", "--models", root, "--traces", traces, "--cache", cache)
    assert rc == 2 and registry.current(root) is None  # --force does not override an unusable model
    rc, out, err = _cli(capsys, "evaluate", "--models", root, "--model", "v0009", "--traces", traces, "--cache", cache)
    assert rc == 2 and "feature schema 9.0.0" in _one_line_error(err)
    assert schema_compatible(FEATURE_SCHEMA_VERSION) and not schema_compatible("9.0.0") and not schema_compatible(None)
    (root / "CURRENT").write_text("v0009\n")
    st = model_state(root)
    assert st.model is None and st.version is None and "feature schema 9.0.0" in st.note


def test_an_empty_held_out_set_fails_the_gate(tmp_path, fake_real, capsys):
    corpus = make_corpus(tmp_path / "c", 200, only_train_groups=True)
    models = tmp_path / "models"
    train_into(models, corpus, fake_real)
    traces, cache = fake_real
    rc, out, err = _cli(capsys, "models", "promote", "v0001", "--models", models, "--traces", traces, "--cache", cache)
    assert rc != 0 and "no held-out corpus cases" in err and registry.current(models) is None


# --- 3. train: old-schema corpus, nothing to train ------------------------------------------------------------

def test_train_on_an_old_schema_corpus_is_an_input_error(tmp_path, fake_real, capsys):
    corpus = make_corpus(tmp_path / "old", 60, schema="0.9.0")
    traces, cache = fake_real
    rc, out, err = _cli(capsys, "train", "--data", corpus, "--out", tmp_path / "models", "--traces", traces, "--cache", cache)
    line = _one_line_error(err)
    assert rc == 2 and "feature schema" in line and "zoomer-ar corpus build" in line
    assert not (tmp_path / "models").exists()


def test_train_writes_no_version_when_every_label_is_skipped(tmp_path, fake_real, capsys):
    corpus = make_corpus(tmp_path / "c", 12)  # too few examples of a class for any label
    traces, cache = fake_real
    rc, out, err = _cli(capsys, "train", "--data", corpus, "--out", tmp_path / "models", "--traces", traces, "--cache", cache)
    assert rc == 2 and "no model version written" in err
    assert not list((tmp_path / "models").glob("v*"))


# --- 4. verdicts: one group per trace; no silent training on what the real-trace check scores -------------

def _verdict(store: Path, trace: str, pattern: str, verdict: str, sha: str, features: dict) -> None:
    rec = {"trace": trace, "job": Path(trace).name, "trace_sha256": [sha], "pattern": pattern, "verdict": verdict,
           "note": "", "at": "2026-01-01T00:00:00Z", "feature_schema_version": FEATURE_SCHEMA_VERSION, "features": features}
    with store.open("a") as fh:
        fh.write(json.dumps(rec) + "\n")


def test_a_verdict_joins_its_traces_group_and_is_held_out_with_it(tmp_path, fake_real):
    traces, _ = fake_real
    corpus = make_corpus(tmp_path / "c", 200, augment_of=HELD_REL, sha="abc")
    store = tmp_path / "labels.jsonl"
    feats = _features(np.random.default_rng(5))
    _verdict(store, "/elsewhere/copy.json", "sync-point", "positive", "abc", feats)  # matched by sha256
    _verdict(store, str(traces / TRAIN_REL), "idle-gpu", "negative", "zzz", feats)  # matched by path
    _verdict(store, "/elsewhere/other.json", "idle-gpu", "positive", "nomatch", feats)
    from zoomer_ar.learn.corpus import load_corpus

    vc = {c.provenance["trace"]: c for c in V.cases(store, groups=V.trace_groups(load_corpus(corpus)), traces=traces,
                                                      real_rels=[HELD_REL, TRAIN_REL])}
    assert vc["/elsewhere/copy.json"].group == f"real:{HELD_REL}"  # the augmentations' group: held out together
    assert vc[str(traces / TRAIN_REL)].group == f"real:{TRAIN_REL}"
    assert vc["/elsewhere/other.json"].group.startswith("verdict:")
    assert T.is_held_out(vc["/elsewhere/copy.json"]) and not T.is_held_out(vc["/elsewhere/other.json"])
    logs: list[str] = []
    d = train_into(tmp_path / "models", corpus, fake_real, labels=store, log=logs.append)
    meta = json.loads((d / "meta.json").read_text())
    assert meta["data"]["by_source"]["verdict"] == 3
    assert meta["data"]["verdict_real_pairs"] == [[TRAIN_REL, "idle-gpu"]]  # the held-out one did not train
    assert any("warning" in s and TRAIN_REL in s for s in logs)
    assert {"trace": TRAIN_REL, "pattern": "idle-gpu", "label": "negative"} in meta["real"]["excluded"]
    assert not any(it["trace"] == TRAIN_REL and it["pattern"] == "idle-gpu" for it in meta["real"]["items"])


# --- 5. which model made the findings -------------------------------------------------------------------------

def test_model_state_says_why_a_named_model_is_not_used(tmp_path, trained, capfd):
    from zoomer_ar.detect.ensemble import model_state, run_model

    root = _registry(tmp_path, trained)
    (root / "CURRENT").write_text("v0042\n")
    st = model_state(root)
    assert st.model is None and "v0042" in st.note and "rules' alone" in st.note
    (root / "CURRENT").write_text("v0001\n")
    booster = root / "v0001" / "idle-gpu.txt"
    booster.write_text(booster.read_text()[:2000])  # truncated
    capfd.readouterr()
    st = model_state(root)
    assert st.model is None and "could not be loaded" in st.note and "idle-gpu.txt" in st.note
    findings, version, notes = run_model(None, [], directory=root)
    assert findings == [] and version is None and notes == [st.note]
    booster.write_text("tree\nversion=v4\nnum_class=1\nend of trees\n")  # complete-looking, LightGBM refuses it
    st = model_state(root)
    assert st.model is None and "LightGBM cannot load it" in st.note
    out = capfd.readouterr()
    assert "[Fatal]" not in out.out + out.err  # LightGBM's native line is kept off the terminal


def _analysis(version):
    from zoomer_ar.analyze import analyze_path

    a = analyze_path(EXAMPLE)
    a.model_version = version
    return a


def test_findings_json_records_the_model_version_and_compare_notices_a_change(monkeypatch):
    from zoomer_ar.compare import compare
    from zoomer_ar.models import Analysis
    from zoomer_ar.render.report import findings_json

    monkeypatch.setenv("ZOOMER_MODEL", "off")
    a1, a2 = _analysis("v0001"), _analysis("v0002")
    assert json.loads(findings_json(a1))["model_version"] == "v0001"
    rules_only = Analysis.model_validate(json.loads(findings_json(_analysis(None))))
    assert rules_only.model_version is None and "model_version" in rules_only.model_fields_set
    r = compare(a1, a2)
    assert r["model_version"] == {"before": "v0001", "after": "v0002"} and "different models" in r["model_note"]
    assert compare(a1, _analysis("v0001"))["model_note"] is None
    old = json.loads(findings_json(a1))
    del old["model_version"]  # a findings.json written before versions were recorded
    assert "unknown" in compare(Analysis.model_validate(old), a2)["model_note"]


def test_analyze_records_the_model_version_and_notes_a_broken_model(tmp_path, trained, monkeypatch, capsys):
    from zoomer_ar.analyze import analyze_path

    root = _registry(tmp_path, trained)
    monkeypatch.setenv("ZOOMER_MODELS_DIR", str(root))
    (root / "CURRENT").write_text("v0001\n")
    assert analyze_path(EXAMPLE).model_version == "v0001"
    (root / "CURRENT").write_text("v0042\n")
    a = analyze_path(EXAMPLE)
    assert a.model_version is None and any("v0042" in n for n in a.notes)


# --- 6. label: a findings.json that analyze did not write ----------------------------------------------------

@pytest.mark.parametrize("content", ["{}", '{"x":', "[1,2]", '{"features": {"a": 1}, "job": {}}'])
def test_label_refuses_a_bogus_findings_json(tmp_path, capsys, content):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "findings.json").write_text(content)
    store = tmp_path / "labels.jsonl"
    rc, out, err = _cli(capsys, "label", tmp_path / "job", "--pattern", "sync-point", "--yes", "--store", store)
    assert rc == 2 and "findings.json" in _one_line_error(err) and not store.exists()


# --- 7. / 8. bad or missing input: one line naming the file, exit 2 ------------------------------------------

def test_bad_corpus_inputs_are_one_line_input_errors(tmp_path, trained, fake_real, capsys):
    traces, cache = fake_real
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a":1}\n')
    (tmp_path / "empty").mkdir()
    root = _registry(tmp_path, trained)
    for args, needle in [
        (["corpus", "stats", tmp_path / "nonexistent"], "nonexistent"),
        (["corpus", "stats", bad], f"{bad}:1"),
        (["train", "--data", bad, "--out", tmp_path / "m"], f"{bad}:1"),
        (["train", "--data", tmp_path / "empty", "--out", tmp_path / "m"], "empty"),
        (["evaluate", "--models", root, "--model", "v0001", "--data", bad, "--traces", traces, "--cache", cache], f"{bad}:1"),
    ]:
        rc, out, err = _cli(capsys, *args)
        assert rc == 2 and needle in _one_line_error(err), (args, err)


def test_truncated_booster_and_bad_verdict_line_are_one_line_input_errors(tmp_path, trained, fake_real, capsys):
    traces, cache = fake_real
    root = _registry(tmp_path, trained)
    booster = root / "v0002" / "sync-point.txt"
    booster.write_text(booster.read_text()[:1500])
    for args in (["evaluate", "--models", root, "--model", "v0002", "--traces", traces, "--cache", cache],
                 ["models", "promote", "v0002", "--models", root, "--traces", traces, "--cache", cache]):
        rc, out, err = _cli(capsys, *args)
        assert rc == 2 and "sync-point.txt" in _one_line_error(err) and "[Fatal]" not in out + err
    store = tmp_path / "labels.jsonl"
    _verdict(store, "/x.json", "sync-point", "positive", "abc", _features(np.random.default_rng(0)))
    with store.open("a") as fh:
        fh.write("{not json\n")
    rc, out, err = _cli(capsys, "train", "--data", trained[1], "--out", tmp_path / "m", "--labels", store,
                        "--traces", traces, "--cache", cache)
    assert rc == 2 and f"{store}:2" in _one_line_error(err)
    assert not (tmp_path / "m").exists()


def test_explicit_paths_that_do_not_exist_are_errors(tmp_path, trained, fake_real, capsys):
    traces, cache = fake_real
    root = _registry(tmp_path, trained)
    missing = tmp_path / "typo.jsonl"
    cases = [
        ["train", "--data", trained[1], "--out", tmp_path / "m", "--labels", missing, "--traces", traces],
        ["evaluate", "--models", root, "--model", "v0001", "--data", missing, "--traces", traces, "--cache", cache],
        ["evaluate", "--models", root, "--model", "v0001", "--traces", missing, "--cache", cache],
        ["corpus", "build", "--n-synth", "0", "--augment", "0", "--workers", "1", "--traces", missing,
         "--out", tmp_path / "corpus"],
    ]
    for args in cases:
        rc, out, err = _cli(capsys, *args)
        assert rc == 2 and str(missing) in _one_line_error(err), (args, err)
    assert not (tmp_path / "m").exists() and not (tmp_path / "corpus").exists()
    old = make_corpus(tmp_path / "old", 60, schema="0.9.0")
    rc, out, err = _cli(capsys, "evaluate", "--models", root, "--model", "v0001", "--data", old, "--traces", traces,
                        "--cache", cache)
    assert rc == 2 and "feature schema 0.9.0" in _one_line_error(err)


def test_evaluate_scores_cases_of_a_newer_minor_schema_as_analyze_runs_the_model(tmp_path, trained, fake_real, capsys):
    """evaluate kept only held-out cases of exactly the model's feature schema, and advised rebuilding the corpus,
    which gives cases of this code's schema: the shipped v0001 (1.0.0) could never be evaluated, though analyze
    runs it on 1.5.0 features (same major version). Cases of the same major version are scored now, with a
    warning; another major version is still refused."""
    traces, cache = fake_real
    root = _registry(tmp_path, trained)
    major, minor = FEATURE_SCHEMA_VERSION.split(".")[:2]
    newer = f"{major}.{int(minor) + 1}.0"
    corpus = make_corpus(tmp_path / "newer", 60, schema=newer)
    rc, out, err = _cli(capsys, "evaluate", "--models", root, "--model", "v0001", "--data", corpus, "--traces", traces,
                        "--cache", cache, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["held_out"]["n"] > 0
    assert any(f"feature schema {newer} scored by a model trained on {FEATURE_SCHEMA_VERSION}" in w for w in doc["warnings"])


# --- 9. promoting the current version is a no-op ----------------------------------------------------------------

def test_promoting_the_current_version_changes_nothing(tmp_path, trained, fake_real, capsys):
    traces, cache = fake_real
    root = _registry(tmp_path, trained)
    assert _cli(capsys, "models", "promote", "v0001", "--models", root, "--traces", traces, "--cache", cache)[0] == 0
    before = (root / "HISTORY.jsonl").read_text()
    rc, out, err = _cli(capsys, "models", "promote", "v0001", "--models", root, "--traces", traces, "--cache", cache)
    assert rc == 0 and "already the current model" in out
    assert (root / "HISTORY.jsonl").read_text() == before
    assert registry.promote(root, "v0001", traces, cache).get("noop")
    assert (root / "HISTORY.jsonl").read_text() == before
    assert _cli(capsys, "models", "rollback", "--models", root)[0] == 0 and registry.current(root) is None


# --- 10. out-of-fold scores never come from a booster early-stopped on the fold it scores -----------------

def test_oof_scores_are_not_early_stopped_on_the_scored_fold(tmp_path, fake_real, monkeypatch):
    corpus = make_corpus(tmp_path / "c", 200, known=("idle-gpu",))
    real_fit = T._fit
    overlaps: list[int] = []
    fits_with_valid = []

    class Spy:
        def __init__(self, booster, valid_rows):
            self._b, self._valid = booster, valid_rows

        def __getattr__(self, name):
            return getattr(self._b, name)

        def predict(self, X, *a, **k):
            overlaps.append(sum(1 for r in X if r.tobytes() in self._valid))
            return self._b.predict(X, *a, **k)

    def spy_fit(lgb, params, X, y, w, rounds, valid=None):
        b = real_fit(lgb, params, X, y, w, rounds, valid)
        if valid is None:
            return b
        fits_with_valid.append(1)
        return Spy(b, {r.tobytes() for r in valid[0]})

    monkeypatch.setattr(T, "_fit", spy_fit)
    train_into(tmp_path / "models", corpus, fake_real)
    assert fits_with_valid and overlaps and sum(overlaps) == 0


def test_training_is_reproducible(tmp_path, fake_real):
    corpus = make_corpus(tmp_path / "c", 200, known=("idle-gpu", "sync-point"))
    a = train_into(tmp_path / "m1", corpus, fake_real)
    b = train_into(tmp_path / "m2", corpus, fake_real)
    files = sorted(p.name for p in a.glob("*.txt"))
    assert files == ["idle-gpu.txt", "sync-point.txt"]
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes()


def test_a_booster_load_redirects_no_output_while_other_threads_run(tmp_path, capfd):
    """The native "[Fatal]" line is kept off a single-threaded CLI's terminal by redirecting the
    process's stderr; with other threads running (the service's workers) that would swallow their
    output too, so nothing is redirected and LightGBM's line stays."""
    import threading

    from zoomer_ar.learn.model import ModelLoadError, load_booster

    bad = tmp_path / "sync-point.txt"
    bad.write_text((REPO / "models" / "v0001" / "sync-point.txt").read_text()[:2000] + "\nend of trees\n")
    gate = threading.Event()
    other = threading.Thread(target=gate.wait)
    other.start()
    try:
        with pytest.raises(ModelLoadError):
            load_booster(bad)
    finally:
        gate.set()
        other.join()
    assert "[Fatal]" in capfd.readouterr().err


# --- 9. label --store / corpus --out that are not what they should be: refused, left as they were -----------

@pytest.mark.parametrize("content", [b"SQLite format 3\x00" + bytes(range(256)) * 4, b'{\n  "schema_version": 3\n}\n',
                                     b"not a verdict\n"], ids=["binary", "findings-json", "text"])
def test_label_does_not_append_to_a_file_that_is_not_a_verdict_file(tmp_path, capsys, content):
    """--store naming a database or a findings.json by mistake got a JSON line appended to it."""
    store = tmp_path / "store.db"
    store.write_bytes(content)
    rc, _out, err = _cli(capsys, "label", EXAMPLE, "--pattern", "sync-point", "--yes", "--store", store)
    assert rc == 2 and str(store) in _one_line_error(err)
    assert store.read_bytes() == content


def test_label_after_a_last_line_without_newline_keeps_both_records(tmp_path, capsys):
    """A verdict file whose last line has no newline (edited by hand) had the new record glued to that line:
    both were lost (the next `train` refused the file)."""
    store = tmp_path / "labels.jsonl"
    assert _cli(capsys, "label", EXAMPLE, "--pattern", "sync-point", "--yes", "--store", store)[0] == 0
    store.write_bytes(store.read_bytes().rstrip(b"\n"))
    assert _cli(capsys, "label", EXAMPLE, "--pattern", "extra-copy", "--no", "--store", store)[0] == 0
    assert [(r["pattern"], r["verdict"]) for r in V.read(store)] == [("sync-point", "positive"), ("extra-copy", "negative")]


@pytest.mark.parametrize("args", [
    ["label", EXAMPLE, "--pattern", "sync-point", "--yes", "--store", "{dir}"],
    ["corpus", "build", "--small", "--n-synth", "2", "--augment", "0", "--out", "{file}"],
    ["corpus", "sample", "1", "--out", "{file}"],
    ["corpus", "build", "--small", "--n-synth", "2", "--augment", "0", "--workers", "0", "--out", "{dir}/c"],
    ["corpus", "build", "--small", "--n-synth", "-1", "--augment", "0", "--out", "{dir}/c"],
], ids=["label-store-dir", "build-out-file", "sample-out-file", "build-workers-0", "build-n-synth-negative"])
def test_learn_paths_and_counts_of_the_wrong_kind_are_usage_errors(tmp_path, capsys, args):
    """--store a folder (IsADirectoryError), --out a file (FileExistsError, after the whole build) were internal
    errors; --workers 0 and negative counts were taken silently. Now click refuses them: exit 2, nothing written."""
    f = tmp_path / "file"
    f.write_text("keep\n")
    rc, _out, err = _cli(capsys, *[str(a).format(dir=tmp_path, file=f) for a in args])
    assert rc == 2 and "Invalid value" in err and "internal error" not in err, err
    assert f.read_text() == "keep\n" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_an_interrupted_training_leaves_no_half_written_version(tmp_path, fake_real, monkeypatch):
    """Ctrl-C during the real-trace evaluation left models/vNNNN with boosters and a first meta.json but no
    evaluation or model card, listed by `models list` (macro-F1 '-') and promotable; now a version is built
    in a staging folder and renamed into place when complete, and an interrupted run leaves nothing."""
    from zoomer_ar.learn import evaluate as E

    corpus = make_corpus(tmp_path / "c", 200, known=("idle-gpu", "sync-point"))

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(E, "evaluate_real", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_into(tmp_path / "models", corpus, fake_real)
    assert list((tmp_path / "models").iterdir()) == []
    monkeypatch.undo()
    # a training still running elsewhere holds its (empty) version folder: the next one takes the number after
    (tmp_path / "models" / "v0001").mkdir()
    done = train_into(tmp_path / "models", corpus, fake_real)
    assert done.name == "v0002" and (done / "meta.json").is_file() and (done / "model_card.md").is_file()
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["v0001", "v0002"]


def test_a_current_pointer_that_is_not_text_is_no_crash(tmp_path, trained, fake_real, capsys):
    """models/CURRENT holding bytes that are not UTF-8 (a damaged pointer) made `analyze` (the model's note),
    `evaluate` and `models list` an internal error (UnicodeDecodeError); now analyze runs on the rules with a
    note, evaluate says the pointer names no version here (exit 2), list lists, and promote mends it."""
    from zoomer_ar.detect.ensemble import model_state

    root = _registry(tmp_path, trained)
    (root / "CURRENT").write_bytes(b"\xff\xfe\n")
    st = model_state(root)
    assert st.model is None and "rules' alone" in st.note
    rc, _, err = _cli(capsys, "evaluate", "--models", root, "--traces", fake_real[0], "--cache", fake_real[1])
    assert rc == 2 and "not a model version folder" in _one_line_error(err)
    rc, out, err = _cli(capsys, "models", "list", "--models", root)
    assert rc == 0 and "v0001" in out and "internal error" not in err
    rc, out, err = _cli(capsys, "models", "promote", "v0001", "--models", root, "--traces", fake_real[0],
                        "--cache", fake_real[1], "--force")
    assert rc == 0 and (root / "CURRENT").read_text() == "v0001\n", err


def test_models_list_says_when_current_names_a_missing_version(tmp_path, trained, capsys):
    """CURRENT naming a version that is not there (deleted, a typo) left `models list` marking nothing and
    saying nothing, while analyze notes the broken pointer and runs on the rules; now list says so."""
    root = _registry(tmp_path, trained)
    (root / "CURRENT").write_text("v0042\n")
    rc, out, err = _cli(capsys, "models", "list", "--models", root)
    assert rc == 0 and "v0001" in out and "* " not in out
    assert f"{root / 'CURRENT'} names v0042, which is not a model version here" in err
    (root / "CURRENT").write_text("v0001\n")
    rc, out, err = _cli(capsys, "models", "list", "--models", root)
    assert rc == 0 and "* v0001" in out and err == ""


def test_promote_rewrites_the_versions_meta_json_whole_or_not_at_all(tmp_path, trained, fake_real, capsys,
                                                                       monkeypatch):
    """promote records the gate in the version's meta.json after making it current; the file was rewritten
    in place, so a write cut short (a full disk, a kill) left the now-current model with a truncated
    meta.json that no command could load. Now it is replaced whole (a temporary file renamed over it)."""
    root = _registry(tmp_path, trained)
    meta_f = root / "v0001" / "meta.json"
    before = meta_f.read_text()
    real_write_text = Path.write_text

    def disk_full(self, data, *a, **k):
        if self.name == "meta.json":
            real_write_text(self, data[:100], *a, **k)
            raise OSError(28, "No space left on device")
        return real_write_text(self, data, *a, **k)

    monkeypatch.setattr(Path, "write_text", disk_full)
    main(["models", "promote", "v0001", "--models", str(root), "--traces", str(fake_real[0]), "--cache",
          str(fake_real[1]), "--force"])
    monkeypatch.undo()
    json.loads(meta_f.read_text())  # a whole JSON document, whatever the outcome
    assert meta_f.read_text() != before  # the gate's record is in it
