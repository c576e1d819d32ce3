"""What fixing several findings together could save, without counting the same time twice.

Some rules measure a part of what another measures: launch-bound's host-bound idle, sync-point's
idle after host syncs and (on a GPU) dataloader-bound's idle while the host waits for data are
disjoint parts of the GPU idle time that idle-gpu measures whole; host time in the optimizer
(single-tensor-optimizer) and in allocator calls (allocator-churn) costs a GPU job's step only as
GPU idle too. Their rule files say `within: idle-gpu`. Whatever is fixed, no more than the whole
is saved, so where the whole is among the findings it counts and the findings within it do not;
without it, the parts add up (host-side parts may overlap each other, allocator calls inside the
optimizer step: then that sum is an upper bound). Findings that measure different time add up. The
total is capped at the step (100%).
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
    1 or 0 within a group (a finding and those within it: the whole counts where present), times the cap's
    scale. Stored per finding, these let a SQL sum give combined totals (zoomer_ar.store)."""
    findings = list(findings)
    inside = within_present(findings)
    group = [inside.get(f.pattern, f.pattern) for f in findings]
    shares = [1.0] * len(findings)
    for key in set(inside.values()):
        whole = [i for i, f in enumerate(findings) if f.pattern == key]
        parts = [i for i, g in enumerate(group) if g == key and findings[i].pattern != key]
        # the parts are time inside the whole (host-side ones may overlap each other): with the whole
        # present, it is the bound on what fixing any of them saves
        for i in parts if whole else whole:
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
