"""Rule titles (from the rule catalogue, ``rules/*.yaml``) and the default severity of static findings.

A static finding has no measured cost, so its severity cannot come from the rule's impact bands:
each pattern gets a fixed default (below, documented in docs/review.md), which the reviewed
repository may override per pattern id or per fixer name in ``[tool.zoomer-ar] severity``.
"""

from __future__ import annotations

from functools import lru_cache

from ..models import PATTERN_IDS, SEVERITY_ORDER

#: Severity of a static (unmeasured) finding, per pattern id. High: a per-step stall whose cost
#: grows with every step (host syncs, a serial input pipeline). Medium: measurable per-step waste
#: (allocator flushes, single-tensor optimizers, full-FP32 matmuls, pageable copies). Low: small
#: or one-off costs. Info: opt-in suggestions whose benefit depends on the model.
DEFAULT_SEVERITY: dict[str, str] = {
    "sync-point": "high",
    "dataloader-bound": "high",
    "allocator-churn": "medium",
    "single-tensor-optimizer": "medium",
    "fp32-matmul": "medium",
    "pageable-memcpy": "medium",
    "extra-copy": "low",
    "zero-grad-not-none": "low",
    "conv-bias-before-bn": "low",
    "launch-bound": "info",
    "exposed-communication": "info",
    "memory-growth": "medium",
    # patterns no fixer detects statically today (kept complete for new fixers)
    "idle-gpu": "medium",
    "sharding-imbalance": "medium",
    "straggler": "medium",
    "misaligned-gemm": "low",
}
assert set(DEFAULT_SEVERITY) == set(PATTERN_IDS)

SEVERITIES = tuple(sorted(SEVERITY_ORDER, key=SEVERITY_ORDER.__getitem__))  # info .. critical

#: SARIF result level per severity
SARIF_LEVEL = {"critical": "error", "high": "error", "medium": "warning", "low": "note", "info": "note"}


@lru_cache(maxsize=1)
def _rules() -> dict[str, tuple[str, str, str]]:
    """pattern id -> (title, summary, recommendation) from the rule catalogue."""
    try:
        from ..detect import load_rules

        return {r.id: (r.title.strip(), r.summary.strip(), r.recommendation.strip()) for r in load_rules()}
    except Exception:  # noqa: BLE001 - a broken catalogue must not stop a review: titles fall back to ids
        return {}


def title(pattern: str) -> str:
    return _rules().get(pattern, (pattern.replace("-", " ").capitalize(), "", ""))[0]


def summary(pattern: str) -> str:
    return _rules().get(pattern, ("", "", ""))[1]


def recommendation(pattern: str) -> str:
    return _rules().get(pattern, ("", "", ""))[2]


def severity_for(pattern: str, fixer: str, overrides: dict[str, str] | None = None) -> str:
    """Override by fixer name, else by pattern id, else the default."""
    overrides = overrides or {}
    if fixer in overrides:
        return overrides[fixer]
    if pattern in overrides:
        return overrides[pattern]
    return DEFAULT_SEVERITY.get(pattern, "low")


def at_least(severity: str, threshold: str) -> bool:
    return SEVERITY_ORDER[severity] >= SEVERITY_ORDER[threshold]
