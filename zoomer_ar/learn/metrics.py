"""Per-label metrics (precision, recall, F1, PR-AUC) and grouped folds (no scikit-learn needed)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def prf(y: np.ndarray, pred: np.ndarray, w: np.ndarray | None = None) -> dict[str, float]:
    w = np.ones(y.size) if w is None else w
    tp = float(w[(y == 1) & pred].sum())
    fp = float(w[(y == 0) & pred].sum())
    fn = float(w[(y == 1) & ~pred].sum())
    p = tp / (tp + fp) if tp + fp > 0 else 0.0
    r = tp / (tp + fn) if tp + fn > 0 else 0.0
    f1 = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return {"precision": round(p, 4), "recall": round(r, 4), "f1": round(f1, 4), "tp": int(round(tp)),
            "fp": int(round(fp)), "fn": int(round(fn))}


def pr_auc(y: np.ndarray, score: np.ndarray) -> float | None:
    """Average precision (area under the precision-recall curve, step-wise)."""
    if y.size == 0 or not (y == 1).any():
        return None
    order = np.argsort(-score, kind="stable")
    ys = y[order]
    tp = np.cumsum(ys == 1)
    fp = np.cumsum(ys == 0)
    precision = tp / np.maximum(tp + fp, 1)
    # only at the last position of each distinct score (ties count together)
    s = score[order]
    last = np.r_[s[1:] != s[:-1], True]
    recall_inc = np.diff(np.r_[0, tp[last]]) / max((ys == 1).sum(), 1)
    return round(float((precision[last] * recall_inc).sum()), 4)


def best_threshold(y: np.ndarray, p: np.ndarray, w: np.ndarray | None = None, lo: float = 0.05, hi: float = 0.95) -> float:
    """The probability threshold with the best F1 (ties: the higher threshold)."""
    best, best_t = -1.0, 0.5
    for t in np.round(np.arange(lo, hi + 1e-9, 0.01), 2):
        f = prf(y, p >= t, w)["f1"]
        if f >= best:
            best, best_t = f, float(t)
    return best_t


def group_folds(groups: list[str], k: int = 5, seed: int = 0) -> np.ndarray:
    """Fold index per row: whole groups per fold, balanced by size (GroupKFold's greedy rule, with a
    seeded hash to break ties so the assignment is deterministic)."""
    uniq: dict[str, int] = {}
    for g in groups:
        uniq[g] = uniq.get(g, 0) + 1
    key = lambda g: (-uniq[g], hashlib.sha1(f"{seed}:{g}".encode()).hexdigest())  # noqa: E731
    load = [0] * k
    fold_of: dict[str, int] = {}
    for g in sorted(uniq, key=key):
        f = int(np.argmin(load))
        fold_of[g] = f
        load[f] += uniq[g]
    return np.array([fold_of[g] for g in groups], dtype=int)


def scored_labels(per_label: dict[str, dict[str, Any]]) -> list[str]:
    """The labels a macro-F1 averages over: those with both classes among the scored cases. The set depends on
    the cases only, never on which labels a model has, so two models scored on one set of cases average over
    the same labels."""
    return [p for p, m in per_label.items() if m.get("support_pos", 0) > 0 and m.get("support_neg", 0) > 0]


def macro_f1(per_label: dict[str, dict[str, Any]], key: str, fallback: str | None = "rules") -> float | None:
    """Mean F1 of `key` over scored_labels(). A label where `key` has no score (a model with no booster for
    it) counts with `fallback`'s F1 (the rules: what the ensemble does at inference without a booster);
    fallback=None leaves such labels out (the mean over the covered labels only, not comparable across models)."""
    vals = []
    for p in scored_labels(per_label):
        m = per_label[p]
        if m.get(key):
            vals.append(m[key]["f1"])
        elif fallback is not None and m.get(fallback):
            vals.append(m[fallback]["f1"])
    return round(float(np.mean(vals)), 4) if vals else None


def coverage(per_label: dict[str, dict[str, Any]], key: str = "model") -> dict[str, Any]:
    """Which scored labels `key` has a score for (a booster), and which it falls back to the rules on."""
    scored = scored_labels(per_label)
    covered = [p for p in scored if per_label[p].get(key)]
    return {"scored": len(scored), "covered": covered, "rules_fallback": [p for p in scored if not per_label[p].get(key)]}
