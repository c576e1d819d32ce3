"""What fixing several findings together could save, without counting the same time twice.

Some rules measure a part of what another measures: launch-bound's host-bound idle, sync-point's
idle after host syncs and (on a GPU) dataloader-bound's idle while the host waits for data are
disjoint parts of the GPU idle time that idle-gpu measures whole; their rule files say
`within: idle-gpu`. Fixing the parts saves at most their sum, fixing the cause of the whole
saves the whole, so a finding and the findings within it count as the larger of the two. Findings
that measure different time add up. The total is capped at the step (100%).

Other overlaps are not modelled (host time in allocator calls can lie inside host-bound idle),
so the combination stays an upper bound, a much tighter one than the plain sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..models import Finding
from .rules import load_rules


@dataclass(frozen=True)
class CombinedImpact:
    ms_per_step: float
    pct_of_step: float
    gpu_hours_per_1000_steps: float
    patterns: tuple[str, ...]


def within_present(findings: Iterable[Finding]) -> dict[str, str]:
    """pattern -> the pattern it lies within, for the findings whose container is among them."""
    findings = list(findings)
    within = {r.id: r.within for r in load_rules()}
    present = {f.pattern for f in findings}
    return {f.pattern: within[f.pattern] for f in findings if within.get(f.pattern) in present}


def counted_shares(findings: Iterable[Finding]) -> list[float]:
    """For each finding (in order), the share of its own impact that the combined total counts:
    1 or 0 within a group (a finding and those within it: the larger side counts), times the cap's
    scale. Stored per finding, these let a SQL sum give combined totals (zoomer_ar.store)."""
    findings = list(findings)
    inside = within_present(findings)
    group = [inside.get(f.pattern, f.pattern) for f in findings]
    shares = [1.0] * len(findings)
    for key in set(inside.values()):
        whole = [i for i, f in enumerate(findings) if f.pattern == key]
        parts = [i for i, g in enumerate(group) if g == key and findings[i].pattern != key]
        whole_ms = sum(findings[i].impact.ms_per_step for i in whole)
        parts_ms = sum(findings[i].impact.ms_per_step for i in parts)
        for i in parts if whole_ms >= parts_ms else whole:
            shares[i] = 0.0
    pct = sum(s * f.impact.pct_of_step for s, f in zip(shares, findings))
    if pct > 100.0:
        shares = [s * 100.0 / pct for s in shares]
    return shares


def combined_impact(findings: Iterable[Finding]) -> CombinedImpact:
    findings = list(findings)
    shares = counted_shares(findings)
    return CombinedImpact(
        ms_per_step=sum(s * f.impact.ms_per_step for s, f in zip(shares, findings)),
        pct_of_step=sum(s * f.impact.pct_of_step for s, f in zip(shares, findings)),
        gpu_hours_per_1000_steps=sum(s * f.impact.gpu_hours_per_1000_steps for s, f in zip(shares, findings)),
        patterns=tuple(sorted({f.pattern for f in findings})),
    )
