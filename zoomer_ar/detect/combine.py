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


def _triple(fs: list[Finding]) -> tuple[float, float, float]:
    return (sum(f.impact.ms_per_step for f in fs), sum(f.impact.pct_of_step for f in fs),
            sum(f.impact.gpu_hours_per_1000_steps for f in fs))


def combined_impact(findings: Iterable[Finding]) -> CombinedImpact:
    findings = list(findings)
    within = {r.id: r.within for r in load_rules()}
    present = {f.pattern for f in findings}
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        parent = within.get(f.pattern)
        groups.setdefault(parent if parent in present else f.pattern, []).append(f)
    ms = pct = hours = 0.0
    for key, members in groups.items():
        whole = [f for f in members if f.pattern == key]
        parts = [f for f in members if f.pattern != key]
        a, b = _triple(whole), _triple(parts)
        m, p, h = a if a[0] >= b[0] else b
        ms, pct, hours = ms + m, pct + p, hours + h
    if pct > 100.0:
        scale = 100.0 / pct
        ms, pct, hours = ms * scale, 100.0, hours * scale
    return CombinedImpact(ms, pct, hours, tuple(sorted(present)))
