"""A trained model version on disk and its inference: calibrated probabilities and explanations.

Layout of models/<version>/:
    meta.json            feature-schema version, feature names and vocabulary, per-label threshold,
                         add-threshold, calibration, metrics, data hash (never pickled)
    <pattern>.txt        one LightGBM booster per anti-pattern (booster.save_model text)
    model_card.md        rendered from reports/model_card.md.j2
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from . import calibrate
from .featurize import full_features, matrix


@dataclass
class Vote:
    pattern: str
    probability: float
    threshold: float
    add_threshold: float
    top_features: list[tuple[str, float]]


class ModelBundle:
    def __init__(self, directory: Path):
        import lightgbm as lgb

        self.dir = Path(directory)
        self.meta: dict[str, Any] = json.loads((self.dir / "meta.json").read_text())
        self.version: str = self.meta["version"]
        self.feature_names: list[str] = self.meta["feature_names"]
        self.vocab: dict[str, list[str]] = self.meta.get("vocab", {})
        self.labels: dict[str, dict[str, Any]] = self.meta["labels"]
        self.boosters = {}
        for p, info in self.labels.items():
            f = self.dir / info["file"]
            self.boosters[p] = lgb.Booster(model_file=str(f))

    @property
    def feature_schema_version(self) -> str:
        return self.meta["feature_schema_version"]

    def rows(self, features: list[dict[str, Any]]) -> np.ndarray:
        return matrix([full_features(f) for f in features], self.feature_names, self.vocab)

    def raw(self, pattern: str, X: np.ndarray) -> np.ndarray:
        return self.boosters[pattern].predict(X, raw_score=True)

    def probabilities(self, features: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        X = self.rows(features)
        return {p: calibrate.apply(info.get("calibration"), self.raw(p, X)) for p, info in self.labels.items()}

    def explain(self, pattern: str, x: np.ndarray, k: int = 5) -> list[tuple[str, float]]:
        """Top-k feature contributions (LightGBM pred_contrib, log-odds) for one row, largest |value| first."""
        contrib = self.boosters[pattern].predict(x.reshape(1, -1), pred_contrib=True)[0][:-1]
        order = np.argsort(-np.abs(contrib), kind="stable")[:k]
        return [(self.feature_names[i], round(float(contrib[i]), 4)) for i in order if contrib[i] != 0.0]

    def votes(self, features: dict[str, Any], explain: int = 5) -> dict[str, Vote]:
        X = self.rows([features])
        out = {}
        for p, info in self.labels.items():
            prob = float(calibrate.apply(info.get("calibration"), self.raw(p, X))[0])
            out[p] = Vote(pattern=p, probability=round(prob, 4), threshold=float(info["threshold"]),
                          add_threshold=float(info.get("add_threshold", 1.01)),
                          top_features=self.explain(p, X[0], explain) if explain else [])
        return out


@lru_cache(maxsize=8)
def _load_cached(path: str, stamp: float) -> ModelBundle:
    return ModelBundle(Path(path))


def load_bundle(directory: Path) -> ModelBundle:
    meta = Path(directory) / "meta.json"
    return _load_cached(str(Path(directory).resolve()), meta.stat().st_mtime)
