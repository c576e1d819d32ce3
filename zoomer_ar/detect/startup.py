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

STARTUP_NOTE_PCT = 5.0  # start-up work holding the GPU idle this share of the step deserves a note
SLOW_FIRST_STEP = 3.0  # a first step this many times the median step ...
SLOW_FIRST_STEP_SHARE = 0.1  # ... that adds at least this share to the mean step gets a note


def _s(n: int, word: str, plural: str = "s") -> str:
    return f"{n} {word}{plural if n != 1 else ''}"


def _startup_share(f: dict[str, Any]) -> float | None:
    """GPU idle in start-up work as a % of the step, where it reaches STARTUP_NOTE_PCT; else None."""
    step, idle = f.get("step_ms") or 0.0, f.get("idle_startup_ms_per_step") or 0.0
    pct = 100.0 * idle / step if step else 0.0
    return pct if pct >= STARTUP_NOTE_PCT else None


def _slow_first_step(f: dict[str, Any]) -> bool:
    """A first profiled step >= SLOW_FIRST_STEP times the median that adds >= SLOW_FIRST_STEP_SHARE to the mean."""
    step, n = f.get("step_ms") or 0.0, f.get("profiler_steps") or 0
    first, p50 = f.get("first_step_ms"), f.get("step_ms_p50")
    return bool(n >= 3 and first and p50 and first >= SLOW_FIRST_STEP * p50
                and (first - p50) / n >= SLOW_FIRST_STEP_SHARE * step)


def _kinds(f: dict[str, Any], *, counted: bool) -> list[str]:
    """The start-up work a profile holds, counted (`counted`) or in a word each."""
    out = []
    if n := f.get("startup_calls"):
        out.append(f"{_s(n, 'runtime call')} at least 100 times slower than the typical call of "
                   f"{'their' if n != 1 else 'its'} API" if counted else "outlier runtime calls")
    if n := f.get("startup_compiles"):
        out.append(f"torch.compile compiling ({_s(n, 'compilation')})" if counted else "torch.compile compiling")
    if n := f.get("captured_launches"):
        out.append(f"a CUDA/HIP graph capture ({_s(n, 'launch', 'es')} recorded into graphs, not run)" if counted
                   else "graph capture")
    return out


def startup_note(jf: JobFeatures) -> str | None:
    """A note where start-up work (outlier runtime calls, compilation, graph captures, early in the profile) holds
    the GPU idle for a material share of the step: it is not a per-step cost, and the profile misses the steady
    state."""
    fv, f = jf.vector, jf.vector.model_dump()
    pct = _startup_share(f)
    if pct is None:
        return None
    where = ("before the second profiled step" if fv.profiler_steps >= 2 else
             "in a trace of fewer than two profiled steps, which cannot show whether it recurs")
    worst = (jf.evidence.get("startup_calls") or [None])[0]
    longest = f"; the longest, {worst.name} for {worst.dur_ms:,.1f} ms: {worst.detail}" if worst is not None else ""
    return (
        f"Start-up inside the profile: the GPU idled for {fv.idle_startup_ms_per_step:,.1f} ms per step ({pct:.0f}% "
        f"of the step) during {' and '.join(_kinds(f, counted=True))}, {where}{longest}. This is usually one-off "
        "work - a first launch loading its module, context creation, first allocations, graph capture - so idle-gpu "
        "and launch-bound leave that time out of their impact. Profile a few steps after a warm-up "
        "(torch.profiler.schedule(wait=1, warmup=2, active=3)) to see the steady state"
        f"{'' if fv.profiler_steps >= 2 else ' and whether this work recurs'}."
    )


def first_step_note(jf: JobFeatures) -> str | None:
    """The first profiled step far slower than the others (start-up inside the profile): every per-step figure
    is a mean over the steps, so that one step weighs on all of them."""
    fv, f = jf.vector, jf.vector.model_dump()
    if not _slow_first_step(f):
        return None
    first, p50 = fv.first_step_ms, fv.step_ms_p50
    why = _kinds(f, counted=False)
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
        f"torch.compile compiled again after the first profiled step: {_s(fv.recompiles, 'recompilation')}, "
        f"{fv.recompile_ms_per_step:,.1f} ms per step ({pct:.0f}% of the step){where}. A recompilation happens when "
        "a guard fails (a new input shape, dtype or Python value): run with TORCH_LOGS=recompiles to see which, then "
        "mark varying dimensions dynamic (torch._dynamo.mark_dynamic, or torch.compile(dynamic=True)) or pad inputs "
        "to a few fixed shapes."
    )


def startup_notes(jf: JobFeatures) -> list[str]:
    """The notes of this module that apply to a job, in the order a report shows them."""
    return [n for n in (startup_note(jf), first_step_note(jf), recompile_note(jf)) if n is not None]


def startup_summary(f: dict[str, Any]) -> str | None:
    """What start-up work a run's profile holds, judged as the notes above judge it, in a few words (for
    `compare`: `f` is an analysis' features); None for a run without any (or analysed before these features
    existed)."""
    if _slow_first_step(f):
        return f"first step {f['first_step_ms']:,.1f} ms, {f['first_step_ms'] / f['step_ms_p50']:,.0f}x its median"
    pct = _startup_share(f)
    if pct is not None:
        return f"GPU idle in start-up work {f['idle_startup_ms_per_step']:,.1f} ms per step, {pct:.0f}% of the step"
    return None
