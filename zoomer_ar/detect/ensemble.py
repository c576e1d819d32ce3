"""Rules and model together: the ensemble's decision rule (docs/learning.md).

For each anti-pattern P, with the rule's verdict and the model's calibrated probability q
(threshold t, add-threshold t_add >= t, both chosen on out-of-fold predictions of the corpus):

- the rule fires                 -> reported (detected_by ["rules", "model"] when q >= t, else
                                    ["rules"] with the model's low probability attached);
- the rule does not fire, q >= t_add and the *guard* holds
                                 -> reported as a model-only finding (detected_by ["model"]) with
                                    the rule's impact formula as the estimate;
- otherwise                      -> not reported.

The guard keeps the model to what the trace can show: the rule's `applies_when` holds, and the
rule's own impact estimate is at least 1% of the step (LABELS.yaml's negative band is < 1%) where
the impact formula measures time; for idle-gpu the GPU is busy <= 90% and for launch-bound <= 95%
(their negative bands). The model never removes a rule finding: the rules stay the floor, the model
adds recall and says how sure it is. Without a model (none installed, lightgbm missing,
ZOOMER_MODEL=off, or a feature-schema major version that differs) findings are the rules' alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..features import FEATURE_SCHEMA_VERSION, JobFeatures
from ..models import Finding, ModelVote
from .engine import finding_from_rule, rank_findings
from .expr import Expr
from .rules import Rule, load_rules

NEGATIVE_PCT = 1.0
BUSY_GUARD = {"idle-gpu": 90.0, "launch-bound": 95.0}


@lru_cache(maxsize=256)
def _expr(source: str) -> Expr:
    return Expr(source)


def guard(rule: Rule, features: dict[str, Any]) -> bool:
    """May the model report this pattern on its own on these features?"""
    if not _expr(rule.applies_when)(features):
        return False
    busy_max = BUSY_GUARD.get(rule.id)
    if busy_max is not None:
        busy = features.get("gpu_busy_pct")
        return busy is not None and busy <= busy_max
    if rule.impact_ms.strip() in ("0", "0.0"):
        return True
    pct = impact_pct(rule, features)
    return pct is not None and pct >= NEGATIVE_PCT


def impact_pct(rule: Rule, features: dict[str, Any]) -> float | None:
    ms = _expr(rule.impact_ms)(features)
    step = features.get("step_ms") or 0.0
    if ms is None or step <= 0:
        return None
    return 100.0 * max(0.0, float(ms)) / step


def decide(rule_fires: bool, probability: float | None, add_threshold: float, guard_ok: bool) -> bool:
    """The ensemble's verdict for one pattern."""
    if rule_fires:
        return True
    return probability is not None and probability >= add_threshold and guard_ok


def models_dir() -> Path:
    from ..paths import MODELS_DIR

    return Path(os.environ.get("ZOOMER_MODELS_DIR", MODELS_DIR))


def schema_compatible(model_schema: str | None, code_schema: str = FEATURE_SCHEMA_VERSION) -> bool:
    """May a model trained on feature schema `model_schema` run on this code's feature vectors?
    Same major version (a minor bump only adds fields, which the model reads as missing). The one rule used
    at inference (current_model), by `models promote` and by `evaluate`."""
    if not isinstance(model_schema, str) or not model_schema.strip():
        return False
    return model_schema.strip().split(".")[0] == code_schema.split(".")[0]


def schema_mismatch_reason(version: str, model_schema: str | None) -> str:
    return (f"model {version} was trained on feature schema {model_schema}, this zoomer-ar extracts "
            f"{FEATURE_SCHEMA_VERSION} (another major version): retrain it on a corpus rebuilt with "
            "`zoomer-ar corpus build`")


@dataclass
class ModelState:
    """What `analyze` runs: the model (None: the rules alone), its version, and why a named model is not used."""

    model: Any = None
    version: str | None = None
    note: str | None = None


def model_state(directory: Path | None = None) -> ModelState:
    """The CURRENT model version, or why there is none. No note when no model is promoted or the model
    is switched off (ZOOMER_MODEL=off); a note when CURRENT names a version that cannot be used."""
    if os.environ.get("ZOOMER_MODEL", "").lower() in ("off", "0", "none", "rules"):
        return ModelState()
    root = Path(directory) if directory else models_dir()
    if directory is None and os.environ.get("ZOOMER_MODELS_DIR") and not root.is_dir():  # a typo, not "no model"
        return ModelState(note=f"ZOOMER_MODELS_DIR names {root}, which is not a folder; findings are the rules' alone.")
    pointer = root / "CURRENT"
    try:
        version = pointer.read_text(encoding="utf-8", errors="replace").strip()  # damaged: a note below, not a crash
    except OSError:
        return ModelState()
    if not version:
        return ModelState()
    rules_only = "findings are the rules' alone"
    if not (root / version / "meta.json").is_file():
        return ModelState(note=f"The current model could not be loaded: {pointer} names {version}, which has no "
                               f"{root / version / 'meta.json'}; {rules_only}.")
    try:
        from ..learn.model import load_bundle

        bundle = load_bundle(root / version)
    except ImportError as exc:
        return ModelState(note=f"The current model {version} was not used: {exc} (is lightgbm installed?); {rules_only}.")
    except Exception as exc:  # a broken model: the rules alone, and say so
        reason = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        return ModelState(note=f"The current model {version} could not be loaded ({reason}); {rules_only}.")
    if not schema_compatible(bundle.feature_schema_version):
        return ModelState(note=f"The current model was not used: {schema_mismatch_reason(version, bundle.feature_schema_version)}; "
                               f"{rules_only}.")
    return ModelState(model=bundle, version=version)  # the registry name (models/CURRENT), as `models list` shows it


def current_model(directory: Path | None = None):
    """The CURRENT model version (None when there is none or it cannot be used here; model_state says why)."""
    return model_state(directory).model


def run_model(jf: JobFeatures, findings: list[Finding], rules: list[Rule] | None = None,
              directory: Path | None = None) -> tuple[list[Finding], str | None, list[str]]:
    """`analyze`'s model step: (findings, the model version used or None for the rules alone, notes)."""
    state = model_state(directory)
    if state.model is not None:
        findings = apply_model(jf, findings, model=state.model, rules=rules)
    return findings, state.version, [state.note] if state.note else []


def apply_model(jf: JobFeatures, findings: list[Finding], model=None, rules: list[Rule] | None = None) -> list[Finding]:
    """Attach the model's votes to the rules' findings and add the model-only findings."""
    model = model if model is not None else current_model()
    if model is None:
        return findings
    features = jf.vector.model_dump()
    votes = model.votes(features, explain=0)  # explained below (model.top_features), only the patterns a finding shows
    by_rule = {r.id: r for r in (rules if rules is not None else load_rules())}
    out: list[Finding] = []
    seen = set()
    for f in findings:
        v = votes.get(f.pattern)
        seen.add(f.pattern)
        if v is None:
            out.append(f)
            continue
        agrees = v.probability >= v.threshold
        conf = 1.0 - (1.0 - f.confidence) * (1.0 - v.probability) if agrees else min(f.confidence, (f.confidence + v.probability) / 2.0)
        out.append(f.model_copy(update={
            "detected_by": ["rules", "model"] if agrees else ["rules"],
            "model": ModelVote(probability=v.probability, threshold=v.threshold, top_features=model.top_features(f.pattern, features)),
            "confidence": round(max(0.0, min(1.0, conf)), 3),
        }))
    for p, v in votes.items():
        rule = by_rule.get(p)
        if p in seen or rule is None:
            continue
        if not decide(False, v.probability, v.add_threshold, guard(rule, features)):
            continue
        pct = impact_pct(rule, features) or 0.0
        step = features.get("step_ms") or 0.0
        result = {"impact_ms": pct * step / 100.0, "impact_pct": pct, "confidence": v.probability}
        f = finding_from_rule(rule, result, jf, features)
        note = (f"Reported by the model alone (probability {v.probability:.2f}, threshold {v.add_threshold:.2f}): "
                f"the rule's condition `{rule.condition.strip()}` does not hold on this trace; the impact shown is the "
                "rule's estimate.")
        out.append(f.model_copy(update={
            "detected_by": ["model"],
            "model": ModelVote(probability=v.probability, threshold=v.add_threshold, top_features=model.top_features(p, features)),
            "confidence": round(v.probability, 3),
            "explanation": (f.explanation + "\n\n" + note).strip(),
        }))
    return rank_findings(out)
