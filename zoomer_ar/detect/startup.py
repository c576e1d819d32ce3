"""Start-up inside the profile: what the analysis and `compare` say about it.

A profile that starts with the program records one-off work: first launches loading their modules,
context creation, first allocations, torch.compile compiling, CUDA-graph capture (the features
`idle_startup_ms_per_step`, `startup_calls`, `startup_compiles`, `captured_launches`, `first_step_ms`,
docs/features.md). idle-gpu and launch-bound leave its GPU idle time out of their impact (rules/);
these notes say so, flag a first step that weighs on every per-step figure, and name torch.compile
recompilations, which no anti-pattern id covers.
"""

from __future__ import annotations

from typing import Any

from ..features import JobFeatures

STARTUP_NOTE_PCT = 5.0  # start-up calls holding the GPU idle this share of the step deserve a note


def startup_note(jf: JobFeatures) -> str | None:
    """A note where start-up work (outlier runtime calls, graph captures, early in the profile) holds the GPU idle
    for a material share of the step: it is not a per-step cost, and the profile misses the steady state."""
    fv = jf.vector
    idle = fv.idle_startup_ms_per_step or 0.0
    if not fv.step_ms or 100.0 * idle / fv.step_ms < STARTUP_NOTE_PCT:
        return None
    parts = []
    if fv.startup_calls:
        n = fv.startup_calls
        parts.append(f"{n} runtime call{'s' if n != 1 else ''} at least 100 times slower than the typical call of "
                     f"{'their' if n != 1 else 'its'} API")
    if fv.startup_compiles:
        n = fv.startup_compiles
        parts.append(f"torch.compile compiling ({n} compilation{'s' if n != 1 else ''})")
    if fv.captured_launches:
        n = fv.captured_launches
        parts.append(f"a CUDA/HIP graph capture ({n} launch{'es' if n != 1 else ''} recorded into graphs, not run)")
    where = ("before the second profiled step" if fv.profiler_steps >= 2 else
             "in a trace of fewer than two profiled steps, which cannot show whether it recurs")
    worst = (jf.evidence.get("startup_calls") or [None])[0]
    longest = f"; the longest, {worst.name} for {worst.dur_ms:,.1f} ms: {worst.detail}" if worst is not None else ""
    return (
        f"Start-up inside the profile: the GPU idled for {idle:,.1f} ms per step ({100.0 * idle / fv.step_ms:.0f}% "
        f"of the step) during {' and '.join(parts)}, {where}{longest}. This is usually one-off work - a first "
        "launch loading its module, context creation, first allocations, graph capture - so idle-gpu and "
        "launch-bound leave that time out of their impact. Profile a few steps after a warm-up "
        "(torch.profiler.schedule(wait=1, warmup=2, active=3)) to see the steady state"
        f"{'' if fv.profiler_steps >= 2 else ' and whether this work recurs'}."
    )


SLOW_FIRST_STEP = 3.0  # a first step this many times the median step ...
SLOW_FIRST_STEP_SHARE = 0.1  # ... that adds at least this share to the mean step gets a note


def first_step_note(jf: JobFeatures) -> str | None:
    """The first profiled step far slower than the others (start-up inside the profile): every per-step figure
    is a mean over the steps, so that one step weighs on all of them."""
    fv = jf.vector
    first, p50 = fv.first_step_ms, fv.step_ms_p50
    if fv.profiler_steps < 3 or not first or not p50 or first < SLOW_FIRST_STEP * p50:
        return None
    if (first - p50) / fv.profiler_steps < SLOW_FIRST_STEP_SHARE * fv.step_ms:
        return None
    why = []
    if fv.startup_compiles:
        why.append("torch.compile compiling")
    if fv.startup_calls:
        why.append("outlier runtime calls")
    if fv.captured_launches:
        why.append("graph capture")
    because = f" ({', '.join(why)} in it)" if why else ""
    return (
        f"The first profiled step took {first:,.1f} ms, {first / p50:,.0f}x the median step ({p50:,.1f} ms){because}: "
        f"start-up inside the profile. Per-step figures are means over the {fv.profiler_steps} profiled steps "
        f"(step {fv.step_ms:,.1f} ms), so this one step weighs on all of them and the findings' shares of the step "
        "are understated. Profile after a few warm-up steps (torch.profiler.schedule(wait=1, warmup=2, active=3))."
    )


def recompile_note(jf: JobFeatures) -> str | None:
    """torch.compile compiling again after the first profiled step: each recompilation stalls the step it
    happens in; no anti-pattern id covers it, so a note says where and how much."""
    fv = jf.vector
    if not fv.recompiles:
        return None
    pct = 100.0 * fv.recompile_ms_per_step / fv.step_ms if fv.step_ms else 0.0
    worst = (jf.evidence.get("recompiles") or [None])[0]
    where = f"; the longest at {worst.ts_ms:,.1f} ms into the trace for {worst.dur_ms:,.1f} ms" if worst else ""
    return (
        f"torch.compile compiled again after the first profiled step: {fv.recompiles} recompilation"
        f"{'s' if fv.recompiles != 1 else ''}, {fv.recompile_ms_per_step:,.1f} ms per step ({pct:.0f}% of the step)"
        f"{where}. A recompilation happens when a guard fails (a new input shape, dtype or Python value): run with "
        "TORCH_LOGS=recompiles to see which, then mark varying dimensions dynamic "
        "(torch._dynamo.mark_dynamic, or torch.compile(dynamic=True)) or pad inputs to a few fixed shapes."
    )


def startup_notes(jf: JobFeatures) -> list[str]:
    """The notes of this module that apply to a job, in the order a report shows them."""
    return [n for n in (startup_note(jf), first_step_note(jf), recompile_note(jf)) if n is not None]


def startup_summary(f: dict[str, Any]) -> str | None:
    """What start-up work a run's profile holds, judged as the notes above judge it, in a few words (for
    `compare`); None for a run without any (or analysed before these features existed)."""
    step, n = f.get("step_ms") or 0.0, f.get("profiler_steps") or 0
    first, p50 = f.get("first_step_ms"), f.get("step_ms_p50")
    if n >= 3 and first and p50 and first >= SLOW_FIRST_STEP * p50 and (first - p50) / n >= SLOW_FIRST_STEP_SHARE * step:
        return f"first step {first:,.1f} ms, {first / p50:,.0f}x its median"
    idle = f.get("idle_startup_ms_per_step") or 0.0
    if step and 100.0 * idle / step >= STARTUP_NOTE_PCT:
        return f"GPU idle in start-up work {idle:,.1f} ms per step, {100.0 * idle / step:.0f}% of the step"
    return None
