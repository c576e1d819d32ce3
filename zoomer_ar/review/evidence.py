"""Measured cost for static findings: from a trace of this code (``--trace``) or the store (``--db``).

* ``--trace PATH``: the trace is analysed (``zoomer_ar.analyze.analyze_path``); a static finding
  whose pattern the trace also shows gets that finding's measured impact (ms and % of a step,
  GPU-hours per 1,000 steps) and, unless ``[tool.zoomer-ar] severity`` sets it, the higher of its
  static severity and the measured one. Trace frames that point into the reviewed file are named.
  The hours are named after the trace's device as the reports name them (GPU-hours, accelerator-
  hours on an MTIA trace: ``features.names.device_noun``); a CPU-only trace has none to give.
* ``--db URL``: the store (``zoomer_ar.store``) is asked what the pattern cost in the reference
  week (default: last ISO week; ``--db-week`` sets it), else in the latest of the 4 weeks before
  it that has data: GPU-hours (and dollars, with a price) in the job where it cost most, and in
  all jobs (accelerator-hours for MTIA jobs, as the reports name them). The store is read, never written; a store that cannot be read is a note, not an error.
"""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ..models import SEVERITY_ORDER
from .models import Evidence, ReviewFinding

if TYPE_CHECKING:
    from ..models import Analysis

LOOKBACK_WEEKS = 4


def _gh(v: float) -> str:
    """Device-hours: whole from 10, one decimal from 1, else three significant digits written out
    (0.000043, as the reports write it: never 4.3e-05)."""
    if v >= 10:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:,.1f}"
    return format(Decimal(f"{v:.3g}"), "f")


# --------------------------------------------------------------------------------------------
# Trace
# --------------------------------------------------------------------------------------------


def trace_evidence(path: str | os.PathLike[str]) -> tuple[dict[str, dict[str, Any]], str]:
    """pattern -> measured figures, and the job name of the trace."""
    from ..analyze import analyze_path

    analysis = analyze_path(path)
    return analysis_evidence(analysis), analysis.job.name


def analysis_evidence(analysis: "Analysis") -> dict[str, dict[str, Any]]:
    """pattern -> the measured figures of an analysed trace's finding of it. `hours_unit` names the
    device-hours as the reports do ("GPU-hours", "accelerator-hours"); None on a CPU-only trace,
    which has no device-hours (the reports show "-")."""
    from ..features.names import device_noun

    features = analysis.features
    unit = f"{device_noun(features)}-hours" if features.get("has_accelerator") else None
    out: dict[str, dict[str, Any]] = {}
    for f in analysis.findings:
        frames = f.all_frames()
        out[f.pattern] = {
            "job": analysis.job.name,
            "severity": f.severity,
            "ms_per_step": f.impact.ms_per_step,
            "pct_of_step": f.impact.pct_of_step,
            "gpu_hours_per_1000_steps": f.impact.gpu_hours_per_1000_steps,
            "hours_unit": unit,
            "frames": [(fr.resolved_path or fr.file, fr.resolved_line or fr.line, fr.function) for fr in frames],
        }
    return out


def trace_text(m: Mapping[str, Any]) -> str:
    """The sentence a finding's trace evidence reads (analysis_evidence's figures)."""
    text = f"measured in this code's trace ({m['job']}): {m['ms_per_step']:,.2f} ms per step ({m['pct_of_step']:.1f}% of the step)"
    if m.get("hours_unit") or m["gpu_hours_per_1000_steps"]:
        text += f", {_gh(m['gpu_hours_per_1000_steps'])} {m.get('hours_unit') or 'GPU-hours'} per 1,000 steps"
    return text


def _same_file(frame_file: str, path: str) -> bool:
    a = frame_file.replace("\\", "/")
    return a == path or a.endswith("/" + path)


# --------------------------------------------------------------------------------------------
# Store
# --------------------------------------------------------------------------------------------


def store_costs(db: str, patterns: Iterable[str], week: str | None = None) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """pattern -> {week, relative, job, job_gpu_hours, job_usd, job_hours_unit, total_gpu_hours, total_usd,
    total_hours_unit, jobs}; the ``*_gpu_hours`` keep their names, the units name the devices."""
    from sqlalchemy import func, select

    from ..features.names import device_noun
    from ..store import weeks as W
    from ..store.db import StoreError, get_engine, parse_url, redact, resolve_url
    from ..store.orm import Analysis, Finding, Job

    patterns = sorted(set(patterns))
    if not patterns:
        return {}, []
    url = resolve_url(db)
    try:
        u = parse_url(db)
    except StoreError as exc:  # a URL that does not parse (the evidence is optional: a note, as below)
        return {}, [f"the store could not be read ({exc}): no measured cost attached"]
    if u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:") and not Path(u.database).is_file():
        return {}, [f"no store at {redact(url)}: no measured cost attached"]
    now_week = W.week_of(W.now())
    ref = W.parse_week(week) if week else W.shift(now_week, -1)
    since = W.shift(ref, -LOOKBACK_WEEKS)
    try:
        engine = get_engine(db)
        price = func.coalesce(Analysis.gpu_hour_cost, Job.gpu_hour_cost)
        # the device each run recorded (features.has_gpu / has_accelerator), so the hours are named
        # as the reports name them: accelerator-hours for an MTIA job (features.names.device_noun)
        has_gpu = Analysis.features["has_gpu"].as_boolean()
        has_accelerator = Analysis.features["has_accelerator"].as_boolean()
        stmt = (
            select(Finding.pattern, Finding.week, Job.name, func.sum(Finding.wasted_gpu_hours),
                   func.sum(Finding.wasted_gpu_hours * price), func.count(price), has_gpu, has_accelerator)
            .join(Job, Job.id == Finding.job_id)
            .join(Analysis, Analysis.id == Finding.analysis_id)
            .where(Finding.pattern.in_(patterns), Finding.week >= since, Finding.week <= ref)
            .group_by(Finding.pattern, Finding.week, Job.name, has_gpu, has_accelerator)
        )
        with engine.connect() as conn:
            rows = conn.execute(stmt).all()
    except StoreError as exc:
        return {}, [f"the store could not be read ({exc}): no measured cost attached"]
    except Exception as exc:  # noqa: BLE001 - evidence is optional: report, do not fail the review
        msg = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        return {}, [f"the store {redact(url)} could not be read ({type(exc).__name__}: {msg[0] if msg else ''}): no measured cost attached"]
    by: dict[str, dict[str, dict[str, _JobCost]]] = {}
    for pattern, wk, job, gph, usd, priced, gpu, accelerator in rows:
        cost = by.setdefault(pattern, {}).setdefault(wk, {}).setdefault(job, _JobCost(job))
        cost.add(float(gph or 0.0), float(usd) if priced else None,
                 device_noun({"has_gpu": gpu, "has_accelerator": accelerator}))
    out: dict[str, dict[str, Any]] = {}
    for pattern, weeks in by.items():
        wk = max(weeks)
        jobs = sorted(weeks[wk].values(), key=lambda r: (-r.hours, r.job))
        top = jobs[0]
        if top.hours <= 0:
            continue
        usd_known = [r.usd for r in jobs if r.usd is not None]
        relative = "last week" if wk == W.shift(now_week, -1) else "this week" if wk == now_week else f"in week {wk}"
        out[pattern] = {
            "week": wk,
            "relative": relative,
            "job": top.job,
            "job_gpu_hours": top.hours,
            "job_usd": top.usd,
            "job_hours_unit": _hours_unit(top.nouns),
            "total_gpu_hours": sum(r.hours for r in jobs),
            "total_usd": sum(usd_known) if usd_known else None,
            "total_hours_unit": _hours_unit({n for r in jobs for n in r.nouns}),
            "jobs": len(jobs),
        }
    return out, []


class _JobCost:
    """One job's cost of a pattern in a week, summed over its runs (their devices named)."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.hours = 0.0
        self.usd: float | None = None
        self.nouns: set[str] = set()

    def add(self, hours: float, usd: float | None, noun: str) -> None:
        self.hours += hours
        if usd is not None:
            self.usd = (self.usd or 0.0) + usd
        self.nouns.add(noun)


def _hours_unit(nouns: set[str]) -> str:
    """"GPU-hours", "accelerator-hours", or both named where GPU and MTIA jobs are summed."""
    if nouns == {"accelerator"}:
        return "accelerator-hours"
    if "accelerator" in nouns and len(nouns) > 1:
        return "GPU- and accelerator-hours"
    return "GPU-hours"


# --------------------------------------------------------------------------------------------
# Attaching
# --------------------------------------------------------------------------------------------


def attach(
    findings: list[ReviewFinding],
    *,
    trace: str | os.PathLike[str] | None = None,
    db: str | None = None,
    week: str | None = None,
    overrides: Mapping[str, str] | None = None,
) -> list[str]:
    """Add Evidence to ``findings`` in place; returns notes for the review."""
    notes: list[str] = []
    overrides = overrides or {}
    if trace is not None:
        measured, job = trace_evidence(trace)
        notes.append(f"measured cost from trace {Path(trace).name} (job {job}): {len(measured)} pattern{'s' if len(measured) != 1 else ''} found in it")
        for f in findings:
            m = measured.get(f.rule_id)
            if m is None:
                continue
            text = trace_text(m)
            hits = [fr for fr in m["frames"] if fr[0] and _same_file(str(fr[0]), f.path)]
            if hits:
                text += f"; the trace's frames point at this file (line {hits[0][1]}, `{hits[0][2]}`)"
            f.evidence.append(Evidence(source="trace", text=text, data={k: v for k, v in m.items() if k != "frames"}))
            if f.fixer not in overrides and f.rule_id not in overrides and SEVERITY_ORDER[m["severity"]] > SEVERITY_ORDER[f.severity]:
                f.severity = m["severity"]
    if db is not None:
        costs, extra = store_costs(db, {f.rule_id for f in findings}, week)
        notes.extend(extra)
        for f in findings:
            c = costs.get(f.rule_id)
            if c is None:
                continue
            usd = f" (${c['job_usd']:,.0f})" if c["job_usd"] is not None else ""
            text = f"this pattern cost {_gh(c['job_gpu_hours'])} {c['job_hours_unit']}{usd} in job {c['job']} {c['relative']}"
            if c["jobs"] > 1:
                text += f"; {_gh(c['total_gpu_hours'])} {c['total_hours_unit']} across {c['jobs']} jobs"
            f.evidence.append(Evidence(source="store", text=text, data=c))
    return notes
