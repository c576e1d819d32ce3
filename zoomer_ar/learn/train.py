"""`zoomer-ar train`: one LightGBM binary model per anti-pattern, grouped CV, calibration, thresholds.

1. Cases: the corpus (training_data/corpus/corpus.jsonl) plus the human verdicts
   (training_data/labels.jsonl, weight 5). Cases of another feature-schema version are skipped.
   A verdict joins its trace's group (verdicts.cases): the same key as the trace's corpus cases.
2. Split: the held-out part is a fixed 20% of the groups (hash of the group name; a verdict on a
   trace of a held-out group is held out with it, a verdict on a trace the corpus does not hold
   always trains). Unknown labels are left out per label.
3. Per label, on the training part: 5-fold cross-validation grouped by source (variants of one
   trace or scenario never on both sides) gives out-of-fold scores and the number of boosting
   rounds. The rounds of a fold's booster come from early stopping on an inner grouped split of
   that fold's training rows, never on the fold it scores (which would make the out-of-fold
   scores optimistic); the final rounds are the mean of those. A calibrator (isotonic, or Platt when a
   class has < 30 examples) is fitted on the out-of-fold scores; the threshold maximises
   out-of-fold F1; the ensemble's add-threshold (>= threshold) maximises out-of-fold F1 of
   `rules OR (p >= add-threshold AND guard)`. The final booster is trained on the whole training part.
4. The held-out part is scored for rules, model and ensemble (precision, recall, F1, PR-AUC).
5. Saved under models/<version>/ as LightGBM text + meta.json + model_card.md; never pickled.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..detect.ensemble import decide
from ..detect.rules import load_rules
from ..errors import InputError
from ..features import FEATURE_SCHEMA_VERSION
from ..models import PATTERN_IDS
from ..paths import MODELS_DIR, PROJECT_DIR, TRAINING_DATA_DIR
from . import calibrate
from .cases import LabelledCase, held_out
from .corpus import DEFAULT_TRACES, corpus_file as find_corpus_file, load_corpus
from .evaluate import DEFAULT_CACHE, evaluate_cases, label_matrix, real_entries, rule_matrix
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


def early_stopping_split(rows: np.ndarray, groups: list[str], y: np.ndarray, k: int, seed: int) -> np.ndarray | None:
    """A grouped subset of `rows` (indices) to early-stop on: the first of k grouped folds of those rows
    that holds both classes; None when none does. Deterministic for the rows, groups and seed."""
    if rows.size == 0 or k < 2:
        return None
    inner = group_folds([groups[i] for i in rows], k, seed + 1)
    for f in range(k):
        sel = rows[inner == f]
        if 0 < sel.size < rows.size and len(set(y[sel])) == 2 and len(set(y[rows[inner != f]])) == 2:
            return sel
    return None


def oof_scores(lgb, params, X, y, W, groups: list[str], fold_of: np.ndarray, m_tr: np.ndarray, cfg) -> tuple[np.ndarray, list[int]]:
    """Out-of-fold raw scores on the rows of m_tr, and each fold booster's number of rounds.

    Fold f's booster trains on the other folds' rows; its number of rounds comes from early stopping on an
    inner grouped split of those rows (early_stopping_split), never on fold f itself, so the scores of
    fold f are those of a model that has not seen fold f in any way."""
    oof = np.full(len(y), np.nan)
    rounds_used: list[int] = []
    for f in range(cfg.folds):
        fit_m = m_tr & (fold_of != f)
        val_m = m_tr & (fold_of == f)
        if not val_m.any() or len(set(y[fit_m])) < 2:
            continue
        fit_rows = np.flatnonzero(fit_m)
        es = early_stopping_split(fit_rows, groups, y, max(2, cfg.folds - 1), cfg.seed + f)
        if es is not None:
            inner = np.setdiff1d(fit_rows, es, assume_unique=True)
            b = _fit(lgb, params, X[inner], y[inner], W[inner], cfg.max_rounds, (X[es], y[es], W[es]))
            n = b.best_iteration if b.best_iteration > 0 else cfg.max_rounds
        else:  # too few of a class to early-stop on: the full budget, decided without fold f
            b = _fit(lgb, params, X[fit_rows], y[fit_rows], W[fit_rows], cfg.max_rounds)
            n = cfg.max_rounds
        rounds_used.append(int(n))
        oof[val_m] = b.predict(X[val_m], raw_score=True, num_iteration=n)
    return oof, rounds_used


def verdict_real_pairs(cases: list[LabelledCase], train_mask: np.ndarray) -> list[list[str]]:
    """[LABELS.yaml trace, pattern] pairs that training-side human verdicts label: the real-trace check must not
    score a model on exactly what it was trained on, so these pairs are left out of it."""
    pairs = set()
    for c, t in zip(cases, train_mask):
        rel = (c.provenance or {}).get("real_trace") if c.source == "verdict" else None
        if not (t and rel):
            continue
        for p, lab in c.labels.items():
            if lab in ("positive", "negative"):
                pairs.add((rel, p))
    return [list(x) for x in sorted(pairs)]


def is_held_out(case: LabelledCase) -> bool:
    """The held-out side: by the group's hash; a verdict only when it joined a corpus or real trace's group
    (a verdict on a trace the corpus does not hold has nothing to leak into and always trains)."""
    if case.source == "verdict" and case.group.startswith("verdict:"):
        return False
    return held_out(case.group)


def train(cfg: TrainConfig, log=print) -> Path:
    import lightgbm as lgb

    t0 = time.time()
    corpus_file = find_corpus_file(Path(cfg.data))
    all_corpus: list[LabelledCase] = load_corpus(corpus_file)
    traces = Path(cfg.traces) if cfg.traces else DEFAULT_TRACES
    real_rels = [e["rel"] for e in real_entries(traces)]
    vcases = V.cases(Path(cfg.labels), groups=V.trace_groups(all_corpus), traces=traces, real_rels=real_rels)
    skipped = [c for c in all_corpus if c.feature_schema_version != FEATURE_SCHEMA_VERSION]
    stale_verdicts = [c for c in vcases if c.feature_schema_version != FEATURE_SCHEMA_VERSION]
    cases = [c for c in all_corpus + vcases if c.feature_schema_version == FEATURE_SCHEMA_VERSION]
    if not [c for c in cases if c.source != "verdict"]:
        found = sorted({c.feature_schema_version for c in all_corpus})
        raise InputError(str(corpus_file), (f"no cases of feature schema {FEATURE_SCHEMA_VERSION} (the corpus has "
                                            f"{', '.join(found) or 'no cases'}): rebuild it with `zoomer-ar corpus build`"))
    if skipped:
        log(f"train: skipped {len(skipped)} cases of another feature-schema version (rebuild the corpus)")
    if stale_verdicts:
        log(f"train: warning: {len(stale_verdicts)} human verdict{'s' if len(stale_verdicts) != 1 else ''} not used: "
            f"recorded with another feature schema than {FEATURE_SCHEMA_VERSION} and not featurised again ("
            + "; ".join(f"{c.feature_schema_version}, {c.provenance.get('not_refeaturised', 'its trace is gone')}"
                        for c in stale_verdicts[:3])
            + (" ..." if len(stale_verdicts) > 3 else "")
            + "): analyse the trace with this zoomer-ar and label its findings.json again")
    feats = [full_features(c.features) for c in cases]
    names = feature_names()
    vocab = build_vocab(feats)
    X = matrix(feats, names, vocab)
    Y = label_matrix(cases)
    W = np.array([c.weight for c in cases])
    groups = [c.group for c in cases]
    test = np.array([is_held_out(c) for c in cases])
    tr = ~test
    rules = load_rules()
    fires, guards = rule_matrix(feats, rules)
    folds = group_folds([g for g, t in zip(groups, tr) if t], cfg.folds, cfg.seed)
    fold_of = np.full(len(cases), -1)
    fold_of[tr] = folds
    params = lgb_params(cfg)
    n_verdicts = len(verdicts_in(cases))
    held_verdicts = sum(1 for c, t in zip(cases, test) if t and c.source == "verdict")
    log(f"train: {len(cases)} cases ({int(tr.sum())} train, {int(test.sum())} held out), {len(names)} features, "
        f"{n_verdicts} from verdicts" + (f" ({held_verdicts} on held-out traces: held out with them)" if held_verdicts else ""))
    overruled = [(c, r) for c in verdicts_in(cases) for r in V.overruled(c)]
    if overruled:
        log(f"train: note: {len(overruled)} human verdict{'s' if len(overruled) != 1 else ''} overruled by a later, "
            "contrary verdict on the same trace and pattern (the latest is trained on): "
            + "; ".join(f"{r['pattern']} {r['verdict']} on {Path(str(c.provenance.get('trace'))).name} at {r['at']}"
                        for c, r in overruled[:3])
            + (" ..." if len(overruled) > 3 else ""))
    real_pairs = verdict_real_pairs(cases, tr)
    if real_pairs:
        log(f"train: warning: human verdicts on LABELS.yaml traces are trained on ({len(real_pairs)} (trace, pattern) "
            f"pair(s): {'; '.join(f'{a}: {b}' for a, b in real_pairs[:3])}{' ...' if len(real_pairs) > 3 else ''}); "
            "the real-trace check leaves those pairs out")
    labels_meta: dict[str, dict[str, Any]] = {}
    boosters: dict[str, Any] = {}
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
        oof, best_iters = oof_scores(lgb, params, X, y_all, W, groups, fold_of, m_tr, cfg)
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
        boosters[p] = _fit(lgb, params, X[m_tr], y_all[m_tr], W[m_tr], rounds)
        fname = f"{p}.txt"
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
    if not boosters:
        raise InputError(str(corpus_file), (f"no anti-pattern has {MIN_CLASS} positive and {MIN_CLASS} negative training "
                                            "examples: nothing to train, no model version written (build a larger corpus)"))
    version, final_dir = reserve_version(Path(cfg.out))
    # written in a staging folder beside it and renamed onto the reserved (empty) one when complete: an
    # interrupted or failed run leaves no half-written version for `models list` or `promote` to take
    out_dir = Path(cfg.out) / f".{version}.partial-{os.getpid()}"
    try:
        out_dir.mkdir()
        for p, b in boosters.items():
            b.save_model(str(out_dir / labels_meta[p]["file"]))
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
                     "held_out_rule": "sha1(group) % 100 < 20 (a verdict follows its trace's group; one on a trace the corpus "
                                      "does not hold always trains)",
                     "verdict_real_pairs": real_pairs},
            "config": asdict(cfg),
            "lightgbm": {"version": lgb.__version__, "params": params},
            "cv": {"early_stopping": "inner grouped split of each fold's training rows (never the scored fold)"},
            "labels": labels_meta,
            "skipped_labels": skipped_labels,
            "decision_rule": "ensemble(P) = rule(P) fires OR (p(P) >= add_threshold(P) AND guard(P)); see docs/learning.md",
        }
        (out_dir / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        # held-out evaluation with the saved model (what inference will load); held-out verdicts are not scored,
        # so the numbers are those the gate computes on the same corpus
        from .model import ModelBundle

        bundle = ModelBundle(out_dir)
        held = [c for c, t in zip(cases, test) if t and c.source != "verdict"]
        ev = evaluate_cases(bundle, held, rules)
        meta["held_out"] = ev
        if (traces / "LABELS.yaml").is_file():
            from .evaluate import evaluate_real

            meta["real"] = evaluate_real(bundle, traces, Path(cfg.cache) if cfg.cache else DEFAULT_CACHE, rules,
                                         exclude={(a, b) for a, b in real_pairs})
        meta["train_seconds"] = round(time.time() - t0, 2)
        (out_dir / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        from .card import write_card

        write_card(out_dir)
        out_dir.rename(final_dir)
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            final_dir.rmdir()
        raise
    log(f"train: wrote {final_dir} in {meta['train_seconds']:.1f} s")
    return final_dir


def reserve_version(root: Path) -> tuple[str, Path]:
    """The next version name and its folder, created empty (mkdir is atomic: two trainings at once get
    two versions, never one folder)."""
    root.mkdir(parents=True, exist_ok=True)
    while True:
        version = next_version(root)
        try:
            (root / version).mkdir()
        except FileExistsError:
            continue
        return version, root / version


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
