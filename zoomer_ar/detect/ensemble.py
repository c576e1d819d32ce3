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


_MODEL_CACHE: dict[str, Any] = {}


def models_dir() -> Path:
    from ..paths import MODELS_DIR

    return Path(os.environ.get("ZOOMER_MODELS_DIR", MODELS_DIR))


def current_model(directory: Path | None = None):
    """The CURRENT model version (None when there is none or it cannot be used here)."""
    if os.environ.get("ZOOMER_MODEL", "").lower() in ("off", "0", "none", "rules"):
        return None
    root = Path(directory) if directory else models_dir()
    pointer = root / "CURRENT"
    try:
        version = pointer.read_text().strip()
    except OSError:
        return None
    if not version or not (root / version / "meta.json").is_file():
        return None
    try:
        from ..learn.model import load_bundle

        bundle = load_bundle(root / version)
    except Exception:  # lightgbm missing or a broken model: the rules alone
        return None
    if bundle.feature_schema_version.split(".")[0] != FEATURE_SCHEMA_VERSION.split(".")[0]:
        return None
    return bundle


def apply_model(jf: JobFeatures, findings: list[Finding], model=None, rules: list[Rule] | None = None) -> list[Finding]:
    """Attach the model's votes to the rules' findings and add the model-only findings."""
    model = model if model is not None else current_model()
    if model is None:
        return findings
    features = jf.vector.model_dump()
    votes = model.votes(features)
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
            "model": ModelVote(probability=v.probability, threshold=v.threshold, top_features=v.top_features),
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
            "model": ModelVote(probability=v.probability, threshold=v.add_threshold, top_features=v.top_features),
            "confidence": round(v.probability, 3),
            "explanation": (f.explanation + "\n\n" + note).strip(),
        }))
    return rank_findings(out)
