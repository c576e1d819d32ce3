"""`zoomer-ar compare BEFORE AFTER`: step time, GPU busy and findings of two runs, with the measured speedup."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import click
import msgspec

from .analyze import analyze_path
from .detect.combine import combined_impact
from .detect.startup import startup_summary
from .errors import InputError
from .load.job import missing_reason
from .models import Analysis
from .program_match import ProgramNames, from_signature, mismatch_note
from .render.filters import fmt_ms, fmt_num


#: a findings document is a few hundred kB at most: a larger file is taken for a trace without being read
FINDINGS_MAX_BYTES = 64 << 20
_TOP_KEYS = msgspec.json.Decoder(dict[str, msgspec.Raw])  # the top-level keys, their values left unparsed
_FINDINGS_KEYS = ("schema_version", "job", "features", "bottleneck", "findings")


def _is_findings(path: Path) -> bool:
    """A findings.json, under that name or another (``analyze --format json > before.json``, a copy
    pretty-printed or with its keys sorted): a JSON object with findings.json's keys and no
    `traceEvents`, or (when the rest is not valid JSON, for load_findings to say why) one that opens
    with its schema_version key, which no Kineto trace has (their key is `schemaVersion`). Files above
    FINDINGS_MAX_BYTES and compressed files are traces; only a plain file up to that size is read."""
    if path.name == "findings.json":
        return True
    try:
        if path.stat().st_size > FINDINGS_MAX_BYTES:
            return False
        data = path.read_bytes()
    except OSError:
        return False
    if re.match(rb'\s*\{\s*"schema_version"\s*:', data[:256]):
        return True
    if not data.lstrip()[:1] == b"{":  # a bare array of events, a gzip or zstd file
        return False
    try:
        keys = _TOP_KEYS.decode(data)
    except (msgspec.DecodeError, RecursionError):  # not JSON (a trace the loader repairs, say) or not an object
        return False
    return "traceEvents" not in keys and any(k in keys for k in _FINDINGS_KEYS)


def _findings_doc(path: Path) -> Path | None:
    """The findings.json that `path` names (itself, or the one in its folder), None for a trace or rank folder."""
    if path.is_dir() and (path / "findings.json").is_file():
        path = path / "findings.json"
    if path.name == "findings.json" or (path.is_file() and _is_findings(path)):  # a FIFO is not opened here
        return path
    return None


#: the features compare reads (with detect.startup's summary): numbers of 0 or more, or null where not measured
_NUMBERS = ("step_ms", "step_ms_p50", "step_ms_p95", "step_ms_cv", "first_step_ms", "gpu_busy_pct", "idle_startup_ms_per_step", "profiler_steps",
            "startup_calls", "startup_compiles", "captured_launches")


def _load_findings(path: Path) -> Analysis:
    from .findings_file import load_findings

    analysis = load_findings(path)
    for key in _NUMBERS:  # a hand-edited value ("137", NaN) made the comparison an internal error or nonsense
        v = (analysis.features or {}).get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
            raise InputError(str(path), f"not a findings.json: features.{key}: {v!r} is not a finite number of 0 or more")
    return analysis


def _load(path: Path) -> Analysis:
    doc = _findings_doc(path)
    return _load_findings(doc) if doc is not None else analyze_path(path)


def _analyse_trace(path: Path) -> tuple[Analysis, ProgramNames | None]:
    """A trace's (or rank folder's) analysis, as analyze_path makes it, with the names that identify its
    program (its `program`; None for a job read in a streaming pass: its events are not kept)."""
    analysis = analyze_path(path)
    return analysis, from_signature(analysis.program)


def _load_both(before: Path, after: Path) -> tuple[tuple[Analysis, Analysis], tuple[ProgramNames | None, ProgramNames | None]]:
    """Both runs' analyses, and the names of their programs (None for a findings document); what can be
    refused at once is refused before a trace is analysed (minutes for a large one): a side that does
    not exist, and a findings document that is not one."""
    for path in (before, after):
        if not path.exists():
            raise InputError(str(path), missing_reason(path))
    docs = {path: _findings_doc(path) for path in (before, after)}
    loaded: dict[Path, tuple[Analysis, ProgramNames | None]] = {
        path: (a, from_signature(a.program)) for path, a in
        ((path, _load_findings(doc)) for path, doc in docs.items() if doc is not None)}
    (b, nb), (a, na) = (loaded[p] if p in loaded else _analyse_trace(p) for p in (before, after))
    return (b, a), (nb, na)


def compare(before: Analysis, after: Analysis,
            programs: tuple[ProgramNames | None, ProgramNames | None] | None = None) -> dict:
    """The comparison; ``programs`` (the runs' names, :func:`program_match.program_names`; by default the
    analyses' own `program`) adds the warning that the two sides do not look like runs of one program."""
    if programs is None:
        programs = (from_signature(before.program), from_signature(after.program))
    fb, fa = before.features, after.features
    b_step, a_step = fb.get("step_ms"), fa.get("step_ms")  # None: a findings.json that does not record it
    pb = {f.pattern: f for f in before.findings}
    pa = {f.pattern: f for f in after.findings}
    resolved = set(pb) - set(pa)
    reduced = {p for p in set(pb) & set(pa)  # a finding of no impact before (an info) is not reduced by staying so
               if pb[p].impact.ms_per_step > 0 and pa[p].impact.ms_per_step <= REDUCED * pb[p].impact.ms_per_step}
    return {
        "before": before.job.name,
        "after": after.job.name,
        "step_ms": {"before": b_step, "after": a_step},
        "speedup": (b_step / a_step) if b_step is not None and a_step else None,
        "gpu_busy_pct": {"before": fb.get("gpu_busy_pct"), "after": fa.get("gpu_busy_pct")},
        "resolved": sorted(resolved),
        "reduced": sorted(reduced),
        "new": sorted(set(pa) - set(pb)),
        "persisting": [
            {"pattern": p, "before_ms": pb[p].impact.ms_per_step, "after_ms": pa[p].impact.ms_per_step}
            for p in sorted(set(pb) & set(pa))
        ],
        # what the before-run's analysis predicted for the findings the change acted on: those it
        # resolved, and those it cut to at most half (a fix that left a remainder still counts)
        "predicted_gain_ms": round(combined_impact(pb[p] for p in resolved | reduced).ms_per_step, 4),
        "measured_gain_ms": round(b_step - a_step, 4) if b_step is not None and a_step is not None else None,
        "feature_schema_version": {"before": before.feature_schema_version, "after": after.feature_schema_version},
        "model_version": {"before": _model_version(before), "after": _model_version(after)},
        "model_note": model_note(before, after),
        # one line when the traces look like two programs (None otherwise, or when it cannot be told)
        "program_warning": mismatch_note(*programs),
        "notes": run_notes(before, after),
    }


#: a persisting finding whose impact fell to at most this share of its before-impact was acted on
REDUCED = 0.5


def _hardware(a: Analysis) -> str:
    devices = sorted({d for r in a.job.ranks for d in r.devices})
    if devices:
        return ", ".join(devices)
    accel = (a.features or {}).get("accelerator")
    return f"{accel} (no device name recorded)" if accel and accel != "none" else "CPU only"


def run_notes(before: Analysis, after: Analysis) -> list[str]:
    """Why the two runs may not be comparable: other feature definitions, other hardware, another world
    size or rank count."""
    notes = []
    vb, va = before.feature_schema_version, after.feature_schema_version
    if vb != va:  # e.g. 1.3.1 and 1.3.2 redefined the step: a saved findings.json of an older zoomer-ar
        notes.append(f"the analyses measure with different feature definitions (feature schema before {vb}, after "
                     f"{va}): step time, GPU busy and findings may differ for that alone; analyse both traces with "
                     "one zoomer-ar version to compare them")
    hb, ha = _hardware(before), _hardware(after)
    if hb != ha:
        notes.append(f"the runs ran on different hardware (before {hb}, after {ha}): the speedup and the findings "
                     "compare machines as much as code")
    wb, wa = before.job.world_size, after.job.world_size
    if wb != wa:
        notes.append(f"the runs have different world sizes (before {wb}, after {wa}): per-step times and "
                     "communication are not comparable")
    nb, na = len(before.job.ranks), len(after.job.ranks)
    if nb != na and wb == wa:
        notes.append(f"the runs hold different numbers of rank traces (before {nb}, after {na}): cross-rank "
                     "findings (straggler, imbalance) are measured on different sets")
    sb, sa = startup_summary(before.features or {}), startup_summary(after.features or {})
    if sb or sa:
        which = " and ".join(f"{name}'s ({what})" for name, what in (("before", sb), ("after", sa)) if what)
        pb, pa = (before.features or {}).get("step_ms_p50"), (after.features or {}).get("step_ms_p50")
        median = (f"; median steps: before {pb:,.2f} ms, after {pa:,.2f} ms, {pb / pa:.2f}x" if pb and pa else "")
        notes.append(f"start-up inside the profile: {which} - the mean step time, and with it the speedup, "
                     f"counts one-off work{median}. Profile both runs after the same warm-up to compare them")
    uneven = uneven_steps_note(before, after, started=(bool(sb), bool(sa)))
    if uneven:
        notes.append(uneven)
    return notes


#: a run whose step times vary more than this (coefficient of variation) is measured on uneven steps: the
#: real-trace corpus's steadiest-to-noisiest runs span 0 to 0.16, and the scenario traces (recorded on a
#: quiet machine) stay under 0.21 but for one whose DataLoader workers deliver in bursts (0.55)
UNEVEN_STEP_CV = 0.3


def uneven_steps_note(before: Analysis, after: Analysis, started: tuple[bool, bool] = (False, False)) -> str | None:
    """Why the speedup may be noise: a side's step times vary widely (a busy machine, a loader that
    delivers in bursts), so the mean over its few profiled steps is uncertain. A side whose spread the
    start-up note explains already is left to it."""
    sides = []
    for name, a, said in (("before", before, started[0]), ("after", after, started[1])):
        f = a.features or {}
        cv = f.get("step_ms_cv")
        if said or cv is None or cv < UNEVEN_STEP_CV:
            continue
        spread = ", ".join(x for x in (
            f"median {_ms(f.get('step_ms_p50'))}" if f.get("step_ms_p50") is not None else "",
            f"p95 {_ms(f.get('step_ms_p95'))}" if f.get("step_ms_p95") is not None else "",
            f"{f['profiler_steps']} steps" if f.get("profiler_steps") else "") if x)
        sides.append(f"{name} varies {cv:.0%} around its mean" + (f" ({spread})" if spread else ""))
    if not sides:
        return None
    pb, pa = (before.features or {}).get("step_ms_p50"), (after.features or {}).get("step_ms_p50")
    median = f"; the medians give {pb / pa:.2f}x" if pb and pa else ""
    return (f"uneven step times: {' and '.join(sides)} - the speedup may be the machine's (or the input "
            f"pipeline's) as much as the change's{median}. Record both runs on a quiet machine, with more "
            "profiled steps, to compare them")


def _model_version(a: Analysis) -> str | None:
    """The model version that made the findings; "unknown" for a findings.json written before it was recorded."""
    if "model_version" not in a.model_fields_set:
        return "unknown"
    return a.model_version


def model_note(before: Analysis, after: Analysis) -> str | None:
    """Why findings may differ for a reason other than the run: the two analyses were made by different models."""
    b, a = _model_version(before), _model_version(after)
    if b == a and b != "unknown":
        return None
    if b == "unknown" and a == "unknown":
        return None  # both written before versions were recorded: nothing to say either way
    name = lambda v: "rules only" if v is None else ("unknown (older findings.json)" if v == "unknown" else f"model {v}")  # noqa: E731
    if "unknown" in (a, b):
        return (f"the model behind the findings: before {name(b)}, after {name(a)}: new or resolved findings may be "
                "the model's doing, not the run's")
    return (f"the findings were made by different models (before {name(b)}, after {name(a)}): new or resolved "
            "findings may be the model's doing, not the run's; re-analyse both with one model to compare findings")


def _ms(v: float | None) -> str:
    """Milliseconds in the reports' style (render.filters.fmt_ms: 13,250.65 ms), and a small non-zero value to
    three significant digits (0.00412 ms), not rounded to 0.00."""
    if v is not None and v != 0 and abs(v) < 0.01:
        return f"{fmt_num(v)} ms"
    return fmt_ms(v)


@click.command("compare")
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def compare_cmd(before: Path, after: Path, fmt: str) -> None:
    """Compare two runs (traces, rank folders, or findings.json): speedup and findings resolved.

    Says when the two may not compare: traces that do not look like one program (a warning line
    first), other hardware, world sizes, models or feature definitions, start-up inside the profile,
    uneven steps (notes last).
    """
    analyses, programs = _load_both(before, after)
    result = compare(*analyses, programs=programs)
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
        return
    if result["program_warning"]:
        click.echo(f"warning     {result['program_warning']}")
    s = result["step_ms"]
    sp = result["speedup"]
    click.echo(f"step time   {_ms(s['before'])} -> {_ms(s['after'])}" + (f"  ({sp:.2f}x)" if sp else ""))
    g = result["gpu_busy_pct"]
    if g["before"] is not None or g["after"] is not None:
        fmt_pct = lambda v: "-" if v is None else f"{v:.1f}%"  # noqa: E731
        click.echo(f"GPU busy    {fmt_pct(g['before'])} -> {fmt_pct(g['after'])}")
    click.echo(f"resolved    {', '.join(result['resolved']) or '-'}")
    if result["reduced"]:
        click.echo(f"reduced     {', '.join(result['reduced'])} (to half or less)")
    click.echo(f"new         {', '.join(result['new']) or '-'}")
    for p in result["persisting"]:
        click.echo(f"persisting  {p['pattern']}: {_ms(p['before_ms'])} -> {_ms(p['after_ms'])} per step")
    click.echo(f"gain        predicted {_ms(result['predicted_gain_ms'])} per step, measured "
               f"{_ms(result['measured_gain_ms'])} per step")
    for note in ([result["model_note"]] if result["model_note"] else []) + result["notes"]:
        click.echo(f"note        {note}")


commands = [compare_cmd]
