"""The analysis pipeline: load -> features -> detect, producing the typed `Analysis`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import __version__
from .detect import classify, run_rules
from .detect.startup import startup_notes
from .detect.rules import Rule
from .features import FEATURE_SCHEMA_VERSION, JobFeatures, extract
from .load import Job, load_job
from .load.folder import EARLIER_RUN
from .load.reader import Progress
from .models import SEVERITY_ORDER, Analysis, Finding
from .program_match import program_names, signature


IMPLAUSIBLE_WALL_MS = 7 * 86_400_000.0  # a profiler session lasts seconds to hours, not a week
TOO_FEW_EVENTS = 20  # a hand-made fixture or a cut-off capture, not a profile of a training step


def _capped(findings: list[Finding], most: str) -> list[Finding]:
    """The findings with no severity above `most` (shares of a window too small to judge stay, their weight goes)."""
    top = SEVERITY_ORDER[most]
    return [f if SEVERITY_ORDER[f.severity] <= top else f.model_copy(update={"severity": most}) for f in findings]


def build_analysis(job: Job, jf: JobFeatures, findings: list[Finding]) -> Analysis:
    features = jf.vector.model_dump()
    notes = []
    if jf.vector.device_not_recorded:
        devices = sorted({d for r in job.info.ranks for d in r.devices})
        listed = f"lists {', '.join(devices[:3])}{' ...' if len(devices) > 3 else ''}" if devices else \
            "holds GPU runtime calls"
        notes.append(
            f"The trace {listed} but no device events (kernels, copies, memsets): it was recorded without the "
            "device activity or in CUPTI range-profiler mode. Host op times of a GPU job are dispatch times, not "
            "compute, so the bottleneck is not measured and GPU-side and host-compute rules were not applied. "
            "Record with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]).")
    elif not jf.vector.has_accelerator:
        notes.append("No GPU or accelerator activity in this trace: GPU-side rules were not applied.")
    elif not jf.vector.has_gpu:
        notes.append(f"Accelerator {jf.vector.accelerator}: no CUDA/HIP kernels, GPU rules were not applied.")
    notes += startup_notes(jf)
    earlier = []
    for s in job.info.skipped:
        if s.reason.startswith(EARLIER_RUN):
            earlier.append(s)
        else:
            notes.append(f"Skipped {s.path}: {s.reason}")
    if earlier:  # a log folder of many runs: one note, not one a file (findings.json lists each in job.skipped)
        names = ", ".join(Path(s.path).name for s in earlier[:3]) + (f" and {len(earlier) - 3} more" if len(earlier) > 3 else "")
        notes.append(f"Skipped {len(earlier)} file{'s' if len(earlier) != 1 else ''} of earlier runs ({names}): the folder "
                     f"holds several runs; the latest one's {len(job.ranks)} rank file{'s' if len(job.ranks) != 1 else ''} "
                     "are analysed. Move a run's files to a folder of its own to analyse it.")
    declared = max((r.world_size or 0 for r in job.info.ranks), default=0)  # distributedInfo's world size
    if declared > len(job.ranks) == 1:  # one rank's file
        notes.append(f"Rank {job.ranks[0].rank} alone of the job's {declared} ranks: stragglers and imbalance need the "
                     "other ranks' traces (analyse the folder of every rank's trace).")
    elif declared > len(job.ranks):  # a sample of the ranks
        seen_ranks = sorted(r.rank for r in job.info.ranks)
        which = ", ".join(map(str, seen_ranks[:8])) + (", ..." if len(seen_ranks) > 8 else "")
        notes.append(f"{len(job.ranks)} of the job's {declared} ranks analysed ({which}): stragglers and imbalance "
                     f"compare these {len(job.ranks)} only (analyse the folder of every rank's trace for the whole job).")
    n_events = sum(r.n_events for r in job.info.ranks)
    if n_events < TOO_FEW_EVENTS and findings:
        findings = _capped(findings, "low")
        notes.append(
            f"The trace holds only {n_events} event{'s' if n_events != 1 else ''}: too few to stand for a training "
            "step, so the findings' shares are of that fragment and their severity is capped at low."
        )
    if jf.vector.wall_ms > IMPLAUSIBLE_WALL_MS:  # one corrupt or missing timestamp stretches the window
        notes.append(
            f"The profiled window spans {jf.vector.wall_ms / 86_400_000:.3g} days: some events carry impossible "
            "timestamps (missing, negative or corrupt), so figures over the window (GPU busy, idle, per-step "
            "times) are unreliable."
        )
    seen: set[str] = set()
    for tr in job.ranks:
        if tr.path in seen:  # the ranks of a merged trace share its file: one note each
            continue
        seen.add(tr.path)
        if tr.time_unit_note:
            notes.append(f"{Path(tr.path).name}: {tr.time_unit_note}")
        if n := (tr.metadata or {}).get("repaired_names"):
            notes.append(
                f"{Path(tr.path).name} is not valid JSON as the profiler wrote it: {n} event name{'s' if n != 1 else ''} "
                "(such as with_stack Python frames, thread names or record_function labels) held unescaped quotes, backslashes or "
                "control characters "
                f"(a PyTorch/Kineto bug: pytorch/pytorch#146900). Zoomer AR re-escaped {'it' if n == 1 else 'them'} and "
                "analysed the trace; other tools (HTA, Perfetto, json.load) refuse the file as it is: "
                "`zoomer-ar trace repair FILE OUT.json.gz` writes a copy they open."
            )
        if merged := (tr.metadata or {}).get("merged_from"):  # a `zoomer-ar trace merge` output, split on load
            notes.append(f"{Path(tr.path).name} merges {len(merged)} ranks (zoomer-ar trace merge): analysed as those "
                         "ranks, as their rank files would be.")
    return Analysis(
        tool_version=__version__,
        feature_schema_version=FEATURE_SCHEMA_VERSION,
        job=job.info,
        features=features | {"per_rank": jf.per_rank},
        bottleneck=classify(jf.vector),
        findings=findings,
        timeline=jf.timeline,
        notes=notes,
    )


def analyze_job(job: Job, rules: list[Rule] | None = None) -> Analysis:
    jf = extract(job)
    from .detect.ensemble import run_model  # rules, then the model (docs/learning.md)

    findings, model_version, model_notes = run_model(jf, run_rules(jf, rules), rules=rules)
    analysis = build_analysis(job, jf, findings)
    analysis.program = signature(program_names(job.ranks))  # what compare checks a later run against (None: streamed)
    analysis.model_version = model_version  # findings.json records which model voted (None: the rules alone)
    analysis.notes.extend(model_notes)  # e.g. "The current model v0003 could not be loaded (...)"
    return analysis


def analyze_path(
    path: str | Path,
    *,
    name: str | None = None,
    rules: list[Rule] | None = None,
    progress_factory: Callable[[Path], Progress | None] | None = None,
    stream: bool | None = None,
) -> Analysis:
    # --- hook (zoomer_ar/stream, docs/huge-traces.md): jobs above ZOOMER_STREAM_THRESHOLD (or
    # stream=True) are read in a streaming pass that keeps only what the features use; same results.
    from .stream import load_job_streaming, should_stream

    chosen = stream is None
    if should_stream(path) if chosen else stream:
        job = load_job_streaming(path, name=name, progress_factory=progress_factory, summarise=True)
        analysis = analyze_job(job, rules)
        analysis.notes.append("Large trace: analysed in a streaming pass (docs/huge-traces.md)." if chosen else
                              "Analysed in a streaming pass, as asked (docs/huge-traces.md).")
        windowed = [(r.path, r.metadata["streamed"]["windows"]) for r in job.ranks
                    if isinstance((r.metadata or {}).get("streamed"), dict) and r.metadata["streamed"].get("windows")]
        for where, count in windowed:
            analysis.notes.append(f"{Path(where).name}: too large to hold at once: read in {count} windows of "
                                  "consecutive steps and their figures merged (the figures are a one-pass analysis'; "
                                  "evidence ties and frames at the cuts can differ: docs/huge-traces.md, Windows).")
        return analysis
    # --- end hook
    job = load_job(path, name=name, progress_factory=progress_factory)
    return analyze_job(job, rules)
