"""`zoomer-ar train`: one LightGBM binary model per anti-pattern, grouped CV, calibration, thresholds.

1. Cases: the corpus (training_data/corpus/corpus.jsonl) plus the human verdicts
   (training_data/labels.jsonl, weight 5). Cases of another feature-schema version are skipped.
2. Split: the held-out part is a fixed 20% of the groups (hash of the group name; verdicts always
   train). Unknown labels are left out per label.
3. Per label, on the training part: 5-fold cross-validation grouped by source (variants of one
   trace or scenario never on both sides) gives out-of-fold scores and the number of boosting
   rounds (early stopping per fold, mean best iteration); a calibrator (isotonic, or Platt when a
   class has < 30 examples) is fitted on the out-of-fold scores; the threshold maximises
   out-of-fold F1; the ensemble's add-threshold (>= threshold) maximises out-of-fold F1 of
   `rules OR (p >= add-threshold AND guard)`. The final booster is trained on the whole training part.
4. The held-out part is scored for rules, model and ensemble (precision, recall, F1, PR-AUC).
5. Saved under models/<version>/ as LightGBM text + meta.json + model_card.md; never pickled.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..detect.ensemble import decide
from ..detect.rules import load_rules
from ..features import FEATURE_SCHEMA_VERSION
from ..models import PATTERN_IDS
from ..paths import MODELS_DIR, PROJECT_DIR, TRAINING_DATA_DIR
from . import calibrate
from .cases import LabelledCase, held_out
from .corpus import DEFAULT_TRACES, load_corpus
from .evaluate import DEFAULT_CACHE, evaluate_cases, label_matrix, rule_matrix
from .featurize import build_vocab, feature_names, full_features, matrix
from .metrics import best_threshold, group_folds, prf
from . import verdicts as V

MIN_CLASS = 8


@dataclass
class TrainConfig:
    data: str = str(TRAINING_DATA_DIR / "corpus")
    out: str = str(MODELS_DIR)
    labels: str = str(V.DEFAULT_LABELS)
    seed: int = 0
    folds: int = 5
    max_rounds: int = 200
    learning_rate: float = 0.1
    num_leaves: int = 7
    min_data_in_leaf: int = 10
    max_bin: int = 63
    threads: int = 1  # OpenMP threads spin on a shared 2-core machine: one thread is faster and deterministic
    traces: str = ""  # real traces for the card's real-trace table ("" = ../shared/traces when present)
    cache: str = ""


def lgb_params(cfg: TrainConfig) -> dict[str, Any]:
    return {
        "objective": "binary", "learning_rate": cfg.learning_rate, "num_leaves": cfg.num_leaves,
        "min_data_in_leaf": cfg.min_data_in_leaf, "max_bin": cfg.max_bin, "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1,
        "lambda_l2": 1.0, "seed": cfg.seed, "deterministic": True, "force_row_wise": True,
        "num_threads": cfg.threads, "verbose": -1,
    }


def data_hash(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        if p.is_file():
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def next_version(root: Path) -> str:
    nums = [int(p.name[1:]) for p in root.glob("v[0-9][0-9][0-9][0-9]") if p.is_dir()] if root.is_dir() else []
    return f"v{(max(nums) + 1 if nums else 1):04d}"


def _fit(lgb, params, X, y, w, rounds, valid=None):
    ds = lgb.Dataset(X, label=y, weight=w, free_raw_data=True)
    if valid is None:
        return lgb.train(params, ds, num_boost_round=rounds)
    vX, vy, vw = valid
    vs = lgb.Dataset(vX, label=vy, weight=vw, reference=ds)
    return lgb.train(params, ds, num_boost_round=rounds, valid_sets=[vs],
                     callbacks=[lgb.early_stopping(30, verbose=False)])


def train(cfg: TrainConfig, log=print) -> Path:
    import lightgbm as lgb

    t0 = time.time()
    data_path = Path(cfg.data)
    corpus_file = data_path / "corpus.jsonl" if data_path.is_dir() else data_path
    cases: list[LabelledCase] = load_corpus(corpus_file)
    vcases = V.cases(Path(cfg.labels))
    skipped = [c for c in cases + vcases if c.feature_schema_version != FEATURE_SCHEMA_VERSION]
    cases = [c for c in cases + vcases if c.feature_schema_version == FEATURE_SCHEMA_VERSION]
    if skipped:
        log(f"train: skipped {len(skipped)} cases of another feature-schema version (rebuild the corpus)")
    if not cases:
        raise ValueError(f"no cases of feature schema {FEATURE_SCHEMA_VERSION} in {corpus_file}")
    feats = [full_features(c.features) for c in cases]
    names = feature_names()
    vocab = build_vocab(feats)
    X = matrix(feats, names, vocab)
    Y = label_matrix(cases)
    W = np.array([c.weight for c in cases])
    groups = [c.group for c in cases]
    test = np.array([c.source != "verdict" and held_out(c.group) for c in cases])
    tr = ~test
    rules = load_rules()
    fires, guards = rule_matrix(feats, rules)
    folds = group_folds([g for g, t in zip(groups, tr) if t], cfg.folds, cfg.seed)
    fold_of = np.full(len(cases), -1)
    fold_of[tr] = folds
    params = lgb_params(cfg)
    log(f"train: {len(cases)} cases ({int(tr.sum())} train, {int(test.sum())} held out), {len(names)} features, "
        f"{len(verdicts_in(cases))} from verdicts")
    version = next_version(Path(cfg.out))
    out_dir = Path(cfg.out) / version
    out_dir.mkdir(parents=True, exist_ok=True)
    labels_meta: dict[str, dict[str, Any]] = {}
    skipped_labels: dict[str, str] = {}
    cv_report: dict[str, dict[str, Any]] = {}
    for j, p in enumerate(PATTERN_IDS):
        known = ~np.isnan(Y[:, j])
        m_tr = tr & known
        y_all = np.nan_to_num(Y[:, j]).astype(int)
        n_pos, n_neg = int((y_all[m_tr] == 1).sum()), int((y_all[m_tr] == 0).sum())
        if n_pos < MIN_CLASS or n_neg < MIN_CLASS:
            skipped_labels[p] = f"too few examples ({n_pos} positive, {n_neg} negative)"
            log(f"  {p:25s} skipped: {skipped_labels[p]}")
            continue
        oof = np.full(len(cases), np.nan)
        best_iters = []
        for f in range(cfg.folds):
            fit_m = m_tr & (fold_of != f)
            val_m = m_tr & (fold_of == f)
            if not val_m.any() or len(set(y_all[fit_m])) < 2:
                continue
            valid = (X[val_m], y_all[val_m], W[val_m]) if len(set(y_all[val_m])) == 2 else None
            b = _fit(lgb, params, X[fit_m], y_all[fit_m], W[fit_m], cfg.max_rounds, valid)
            best_iters.append(b.best_iteration if (valid is not None and b.best_iteration > 0) else cfg.max_rounds)
            oof[val_m] = b.predict(X[val_m], raw_score=True, num_iteration=best_iters[-1])
        has = m_tr & ~np.isnan(oof)
        cal = calibrate.fit(oof[has], y_all[has], W[has])
        p_oof = calibrate.apply(cal, oof[has])
        thr = best_threshold(y_all[has], p_oof, W[has])
        r_oof, g_oof = fires[has, j], guards[has, j]
        best_f, t_add = -1.0, 1.01
        for t in [1.01] + [round(x, 2) for x in np.arange(max(thr, 0.3), 0.995, 0.01)]:
            ens = np.array([decide(bool(a), float(q), t, bool(g)) for a, q, g in zip(r_oof, p_oof, g_oof)], dtype=bool)
            fval = prf(y_all[has], ens, W[has])["f1"]
            if fval > best_f + 1e-9:
                best_f, t_add = fval, t
        rounds = max(10, int(round(float(np.mean(best_iters))))) if best_iters else cfg.max_rounds
        final = _fit(lgb, params, X[m_tr], y_all[m_tr], W[m_tr], rounds)
        fname = f"{p}.txt"
        final.save_model(str(out_dir / fname))
        cv_report[p] = {
            "model": prf(y_all[has], p_oof >= thr, W[has]),
            "rules": prf(y_all[has], r_oof, W[has]),
            "ensemble": prf(y_all[has], np.array([decide(bool(a), float(q), t_add, bool(g)) for a, q, g in zip(r_oof, p_oof, g_oof)]), W[has]),
        }
        labels_meta[p] = {"file": fname, "threshold": thr, "add_threshold": t_add, "calibration": cal, "rounds": rounds,
                          "train_positive": n_pos, "train_negative": n_neg, "cv": cv_report[p]}
        log(f"  {p:25s} pos {n_pos:5d} neg {n_neg:5d}  rounds {rounds:3d}  threshold {thr:.2f}  add {t_add:.2f}  "
            f"CV F1 model {cv_report[p]['model']['f1']:.3f} rules {cv_report[p]['rules']['f1']:.3f} "
            f"ensemble {cv_report[p]['ensemble']['f1']:.3f}")
    sources = {}
    for c in cases:
        sources[c.source] = sources.get(c.source, 0) + 1
    meta: dict[str, Any] = {
        "version": version,
        "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "feature_schema_version": FEATURE_SCHEMA_VERSION,
        "feature_names": names,
        "vocab": vocab,
        "data": {"corpus": project_relative(corpus_file), "labels": project_relative(Path(cfg.labels)),
                 "hash": data_hash([corpus_file, Path(cfg.labels)]), "cases": len(cases),
                 "train": int(tr.sum()), "held_out": int(test.sum()), "by_source": sources,
                 "held_out_rule": "sha1(group) % 100 < 20 (verdicts always train)"},
        "config": asdict(cfg),
        "lightgbm": {"version": lgb.__version__, "params": params},
        "labels": labels_meta,
        "skipped_labels": skipped_labels,
        "decision_rule": "ensemble(P) = rule(P) fires OR (p(P) >= add_threshold(P) AND guard(P)); see docs/learning.md",
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    # held-out evaluation with the saved model (what inference will load)
    from .model import ModelBundle

    bundle = ModelBundle(out_dir)
    held = [c for c, t in zip(cases, test) if t]
    ev = evaluate_cases(bundle, held, rules)
    meta["held_out"] = ev
    traces = Path(cfg.traces) if cfg.traces else DEFAULT_TRACES
    if (traces / "LABELS.yaml").is_file():
        from .evaluate import evaluate_real

        meta["real"] = evaluate_real(bundle, traces, Path(cfg.cache) if cfg.cache else DEFAULT_CACHE, rules)
    meta["train_seconds"] = round(time.time() - t0, 2)
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    from .card import write_card

    write_card(out_dir)
    log(f"train: wrote {out_dir} in {meta['train_seconds']:.1f} s")
    return out_dir


def project_relative(path: Path) -> str:
    """A path inside the project as a relative path (models/ is committed; absolute paths are not portable)."""
    try:
        return str(Path(path).resolve().relative_to(PROJECT_DIR.resolve()))
    except ValueError:
        return str(Path(path).resolve())


def resolve_project_path(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else PROJECT_DIR / p


def verdicts_in(cases: list[LabelledCase]) -> list[LabelledCase]:
    return [c for c in cases if c.source == "verdict"]
