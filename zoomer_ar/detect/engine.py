"""Detect stage: evaluate the rule catalogue over a job's features and build ranked findings."""

from __future__ import annotations

from typing import Any

from ..features import JobFeatures
from ..models import Evidence, EvidenceEvent, Finding, Impact, SourceFrame
from .rules import Rule, load_rules

MS_PER_HOUR = 3_600_000.0


def impact_for(rule_result: dict[str, Any], features: dict[str, Any]) -> Impact:
    gpus = max(1, int(features.get("world_size") or 1)) if features.get("has_accelerator") else 0
    ms = rule_result["impact_ms"]
    return Impact(
        ms_per_step=round(ms, 4),
        pct_of_step=round(rule_result["impact_pct"], 3),
        gpu_hours_per_1000_steps=round(ms * 1000.0 * gpus / MS_PER_HOUR, 6),
    )


def _figures(rule: Rule, features: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in rule.figures:
        v = features.get(name)
        out[name] = round(v, 4) if isinstance(v, float) else v
    return out


def _frames(events: list[EvidenceEvent]) -> list[SourceFrame]:
    seen: set[tuple[str, int, str]] = set()
    out: list[SourceFrame] = []
    for e in events:
        for f in e.frames[:1]:  # the innermost user frame of each event
            key = (f.file, f.line, f.function)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def finding_from_rule(rule: Rule, result: dict[str, Any], jf: JobFeatures, features: dict[str, Any]) -> Finding:
    events: list[EvidenceEvent] = []
    for key in rule.evidence:
        events.extend(jf.evidence.get(key, []))
    events = events[:8]
    fixable = rule.fix_applies(features)  # fix.when: the automatic fix's premise holds on this job
    title, explanation, recommendation, unless = rule.text_for(features)  # a CPU or ROCm trace's own wording
    recommendation = recommendation.strip()
    if not fixable and unless:
        recommendation += "\n\n" + unless.strip()
    return Finding(
        pattern=rule.id,
        title=title,
        severity=rule.severity_for(result["impact_pct"]),
        confidence=round(result["confidence"], 3),
        impact=impact_for(result, features),
        evidence=Evidence(figures=_figures(rule, features), events=events, frames=_frames(events)),
        recommendation=recommendation,
        explanation=explanation.strip(),
        references=rule.references,
        fixers=rule.fix.fixers if fixable else [],
        relaunch=rule.fix.relaunch if fixable else {},
        detected_by=["rules"],
    )


def run_rules(jf: JobFeatures, rules: list[Rule] | None = None) -> list[Finding]:
    rules = load_rules() if rules is None else rules
    features = jf.vector.model_dump()
    findings = []
    for rule in rules:
        result = rule.evaluate(features)
        if result is not None:
            findings.append(finding_from_rule(rule, result, jf, features))
    return rank_findings(findings)


def rank_findings(findings: list[Finding]) -> list[Finding]:
    order = {"critical": 4, "high": 3, "medium": 2, "low": 1, "info": 0}
    return sorted(findings, key=lambda f: (-f.impact.ms_per_step, -order[f.severity], f.pattern))
