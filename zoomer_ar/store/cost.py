"""Cost attribution of one analysed job: its GPU-hours and dollars split by phase and by anti-pattern.

- GPU count: `--gpus`, else the job's stored count, else the trace's world size (0 without an accelerator).
- GPU-hours: `--gpu-hours` (the job's GPU-hours the run stands for, e.g. per week), else the
  profiled wall time x GPU count.
- By phase: GPU-hours x the phase's share of wall time (zoomer_ar/features/phases.py).
- By anti-pattern: GPU-hours x the finding's `impact.pct_of_step` / 100 (its avoidable time).
  The avoidable total combines them (zoomer_ar.detect.combine): a finding within another
  (rules' `within`: launch-bound, sync-point, dataloader-bound and the host-side optimizer and
  allocator findings within idle-gpu's idle time) counts once, and the total stays under the step;
  other overlaps remain, so it is an upper bound.
- Dollars: GPU-hours x the hourly price (`--gpu-hour-cost`, else the job's stored price); none without a price.

Pure Python: importable without the database packages.
"""

from __future__ import annotations

from typing import Any

from ..detect.combine import combined_impact
from ..features.names import device_noun
from ..features.phases import PHASES
from ..models import Finding

MS_PER_HOUR = 3_600_000.0


def default_gpus(features: dict[str, Any]) -> int:
    """The trace's device count: world size (at least 1) with an accelerator, else 0 (same rule as findings' impact)."""
    if not features.get("has_accelerator"):
        return 0
    return max(1, int(features.get("world_size") or 1))


def gpu_hours_basis(features: dict[str, Any], gpus: int, *, wall: bool = True) -> str:
    """How profiled device-hours were counted: "profiled wall time 13,340.0 ms x 1 accelerator"."""
    noun = device_noun(features)
    ms = f" {float(features.get('wall_ms') or 0.0):,.1f} ms" if wall else ""
    return f"profiled wall time{ms} x {gpus} {noun}{'s' if gpus != 1 else ''}"


def profiled_gpu_hours(features: dict[str, Any], gpus: int) -> float:
    return float(features.get("wall_ms") or 0.0) / MS_PER_HOUR * gpus


def _usd(gpu_hours: float, price: float | None) -> float | None:
    return None if price is None else gpu_hours * price


def cost_attribution(
    features: dict[str, Any],
    findings: list[Finding],
    *,
    gpus: int | None = None,
    gpu_hours: float | None = None,
    gpu_hour_cost: float | None = None,
) -> dict[str, Any]:
    n = default_gpus(features) if gpus is None else int(gpus)
    source = "option" if gpu_hours is not None else "profiled"
    hours = float(gpu_hours) if gpu_hours is not None else profiled_gpu_hours(features, n)
    phases = []
    for p in PHASES:
        pct = features.get(f"phase_{p}_pct")
        if pct is None:
            continue
        h = hours * pct / 100.0
        phases.append({"phase": p, "pct": round(pct, 3), "gpu_hours": h, "usd": _usd(h, gpu_hour_cost)})
    patterns = []
    for f in findings:
        h = hours * f.impact.pct_of_step / 100.0
        patterns.append({"pattern": f.pattern, "pct": f.impact.pct_of_step, "gpu_hours": h, "usd": _usd(h, gpu_hour_cost)})
    combined = combined_impact(findings)
    avoidable = hours * combined.pct_of_step / 100.0
    return {
        "gpus": n,
        "gpu_hours": hours,
        "gpu_hours_source": source,
        "gpu_hours_basis": (
            "given with --gpu-hours" if source == "option"
            else gpu_hours_basis(features, n)
        ),
        # the unit of every `gpu_hours` figure here, for readers of the JSON: "GPU-hours", or
        # "accelerator-hours" where the device is not a GPU (the keys keep their names)
        "hours_unit": f"{device_noun(features)}-hours",
        "gpu_hour_cost": gpu_hour_cost,
        "usd": _usd(hours, gpu_hour_cost),
        "phase_basis": features.get("phase_basis"),
        "phases": phases,
        "patterns": patterns,
        "avoidable_gpu_hours": avoidable,
        "avoidable_usd": _usd(avoidable, gpu_hour_cost),
        "avoidable_pct": combined.pct_of_step,
    }
