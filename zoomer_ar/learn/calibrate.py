"""Probability calibration, implemented simply: isotonic regression (pool-adjacent-violators) or Platt.

Both map a raw LightGBM score (log-odds) to a probability and serialise to plain JSON.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -50, 50)))


def fit_isotonic(scores: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> dict[str, Any]:
    """Non-decreasing step function from score to P(y=1), by pool-adjacent-violators."""
    w = np.ones_like(scores, dtype=float) if w is None else w.astype(float)
    order = np.argsort(scores, kind="stable")
    x, yy, ww = scores[order], y[order].astype(float), w[order]
    # blocks: [sum w*y, sum w, x_lo, x_hi]
    vals: list[float] = []
    wts: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    for xi, yi, wi in zip(x, yy, ww):
        vals.append(yi * wi)
        wts.append(wi)
        lo.append(xi)
        hi.append(xi)
        while len(vals) > 1 and vals[-2] / wts[-2] >= vals[-1] / wts[-1]:
            v, wt, h = vals.pop(), wts.pop(), hi.pop()
            lo.pop()
            vals[-1] += v
            wts[-1] += wt
            hi[-1] = h
    means = [v / wt for v, wt in zip(vals, wts)]
    # interpolate between block centres (smoother than a pure step, still monotone)
    centres = [(a + b) / 2.0 for a, b in zip(lo, hi)]
    return {"kind": "isotonic", "x": [round(float(c), 6) for c in centres], "y": [round(float(m), 6) for m in means]}


def fit_platt(scores: np.ndarray, y: np.ndarray, w: np.ndarray | None = None, iters: int = 100) -> dict[str, Any]:
    """P = sigmoid(a * score + b), fitted by Newton's method on the weighted log-loss (Platt's targets)."""
    w = np.ones_like(scores, dtype=float) if w is None else w.astype(float)
    n_pos, n_neg = float(w[y == 1].sum()), float(w[y == 0].sum())
    t = np.where(y == 1, (n_pos + 1) / (n_pos + 2), 1.0 / (n_neg + 2))
    a, b = 1.0, 0.0
    for _ in range(iters):
        p = _sigmoid(a * scores + b)
        g = p - t
        ga, gb = float((w * g * scores).sum()), float((w * g).sum())
        h = w * p * (1 - p)
        haa, hab, hbb = float((h * scores * scores).sum()) + 1e-9, float((h * scores).sum()), float(h.sum()) + 1e-9
        det = haa * hbb - hab * hab
        if abs(det) < 1e-12:
            break
        da = (hbb * ga - hab * gb) / det
        db = (haa * gb - hab * ga) / det
        a, b = a - da, b - db
        if abs(da) < 1e-9 and abs(db) < 1e-9:
            break
    return {"kind": "platt", "a": round(float(a), 6), "b": round(float(b), 6)}


def fit(scores: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> dict[str, Any]:
    """Isotonic when both classes have >= 30 examples, else Platt (isotonic overfits small samples)."""
    if int((y == 1).sum()) >= 30 and int((y == 0).sum()) >= 30:
        return fit_isotonic(scores, y, w)
    return fit_platt(scores, y, w)


def apply(cal: dict[str, Any] | None, scores: np.ndarray) -> np.ndarray:
    scores = np.asarray(scores, dtype=float)
    if not cal:
        return _sigmoid(scores)
    if cal["kind"] == "platt":
        return _sigmoid(cal["a"] * scores + cal["b"])
    x, yv = np.asarray(cal["x"]), np.asarray(cal["y"])
    if x.size == 1:
        return np.full(scores.shape, float(yv[0]))
    return np.clip(np.interp(scores, x, yv), 0.0, 1.0)


def logit(p: float) -> float:
    p = min(max(p, 1e-9), 1 - 1e-9)
    return math.log(p / (1 - p))
