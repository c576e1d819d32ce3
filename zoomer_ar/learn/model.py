"""A trained model version on disk and its inference: calibrated probabilities and explanations.

Layout of models/<version>/:
    meta.json            feature-schema version, feature names and vocabulary, per-label threshold,
                         add-threshold, calibration, metrics, data hash (never pickled)
    <pattern>.txt        one LightGBM booster per anti-pattern (booster.save_model text)
    model_card.md        rendered from reports/model_card.md.j2
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from . import calibrate
from .featurize import full_features, matrix
from .meta_check import meta_problem
from .trees import Corrupt, TextBooster, Unsupported


class ModelLoadError(InputError):
    """A model version that cannot be loaded (no or bad meta.json, a missing or truncated booster file).
    One line naming the file; exit code 2 from the CLI."""


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0] if lines else "unreadable"


def read_meta(directory: Path) -> dict[str, Any]:
    """A version's meta.json, checked for the fields inference needs (ModelLoadError otherwise)."""
    f = Path(directory) / "meta.json"
    try:
        meta = json.loads(f.read_text())
    except OSError as exc:
        raise ModelLoadError(str(f), f"cannot read the model's meta.json ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ModelLoadError(str(f), f"not valid JSON ({_first_line(str(exc))})") from None
    if not isinstance(meta, dict):
        raise ModelLoadError(str(f), "not a model meta.json (not a JSON object)")
    missing = [k for k in ("version", "feature_schema_version", "feature_names", "labels") if k not in meta]
    if missing:
        raise ModelLoadError(str(f), f"not a model meta.json (missing {', '.join(missing)})")
    if not isinstance(meta["labels"], dict) or not all(isinstance(v, dict) and "file" in v and "threshold" in v
                                                       for v in meta["labels"].values()):
        raise ModelLoadError(str(f), "not a model meta.json (labels: expected {pattern: {file, threshold, ...}})")
    why = meta_problem(meta)
    if why:
        raise ModelLoadError(str(f), f"a damaged model meta.json ({why})")
    return meta


def _model_text(path: Path) -> str:
    """A booster file's text, with a one-line ModelLoadError for a missing, binary or truncated file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ModelLoadError(str(path), f"cannot read the booster file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ModelLoadError(str(path), "not a LightGBM text model (binary content)") from None
    if not text.startswith("tree") or "end of trees" not in text:
        raise ModelLoadError(str(path), "not a complete LightGBM text model (truncated or corrupt: no 'end of trees')")
    return text


def load_booster(path: Path, text: str | None = None):
    """One LightGBM text booster, with a one-line ModelLoadError for a missing, truncated or corrupt file
    (`text`: the file's text where the caller has read it already). LightGBM's own "[LightGBM] [Fatal] ..."
    line (printed through Python) is kept off the terminal."""
    text = _model_text(path) if text is None else text
    import lightgbm as lgb

    try:
        with _quiet_native():
            return lgb.Booster(model_str=text)
    except Exception as exc:  # LightGBMError and friends
        raise ModelLoadError(str(path), f"LightGBM cannot load it ({_first_line(str(exc))})") from None


def load_predictor(path: Path):
    """What inference predicts with: the text model evaluated in-process (learn/trees.py: the same raw
    scores and contributions, without importing LightGBM, pandas and scipy); a model that evaluator
    does not read completely (a truncated tree list, categorical splits...) is loaded by LightGBM,
    whose verdict and message stand; a damaged tree (trees.Corrupt) is a ModelLoadError, never LightGBM's
    to load (it aborts the process on such a file, or hangs predicting on a cycle)."""
    text = _model_text(path)
    try:
        return TextBooster.from_text(text)
    except Corrupt as exc:  # LightGBM would abort the process on it (or hang predicting): refused here
        raise ModelLoadError(str(path), f"a corrupt LightGBM text model ({exc})") from None
    except Unsupported:
        return load_booster(path, text)


#: threads of this package that never write to stdout or stderr (zoomer_ar.fix.nesting's parse thread,
#: which outlives the parse that started it): they do not stop _quiet_native from redirecting
SILENT_THREADS = frozenset({"zoomer-parse"})


@contextlib.contextmanager
def _quiet_native():
    """Keep LightGBM's native "[LightGBM] [Fatal] ..." line (written straight to file descriptor 2 by the C++
    library, and its Python log callback's print) off the terminal while a booster loads: the error is reported
    as a ModelLoadError instead. Only in a single-threaded process (the CLI): the descriptor and sys.stdout are
    the whole process's, so with other threads running (the service's workers) nothing is redirected."""
    import sys
    import tempfile
    import threading

    others = [t for t in threading.enumerate() if t is not threading.current_thread() and t.name not in SILENT_THREADS]
    if others:  # a server's threads would lose their output meanwhile: keep the line
        yield
        return
    saved = None
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        saved = None
    if saved is None:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@dataclass
class Vote:
    pattern: str
    probability: float
    threshold: float
    add_threshold: float
    top_features: list[tuple[str, float]]


class ModelBundle:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.meta: dict[str, Any] = read_meta(self.dir)
        self.version: str = self.meta["version"]
        self.feature_names: list[str] = self.meta["feature_names"]
        self.vocab: dict[str, list[str]] = self.meta.get("vocab", {})
        self.labels: dict[str, dict[str, Any]] = self.meta["labels"]
        self.boosters = {p: load_predictor(self.dir / info["file"]) for p, info in self.labels.items()}
        for p, b in self.boosters.items():  # a booster of another feature list would fail on its first row
            n = b.num_features if isinstance(b, TextBooster) else b.num_feature()
            if n != len(self.feature_names):
                raise ModelLoadError(str(self.dir / self.labels[p]["file"]),
                                     f"the booster reads {n} features, meta.json lists {len(self.feature_names)}")

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

    def top_features(self, pattern: str, features: dict[str, Any], k: int = 5) -> list[tuple[str, float]]:
        """The explanation of one pattern's vote (as votes(features, explain=k) gives it): TreeSHAP walks
        every tree, so callers explain only the votes they show."""
        return self.explain(pattern, self.rows([features])[0], k)

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
