"""Detection benchmark: what Zoomer AR and its open peers CONCLUDE on the labelled real traces.

    python benchmarks/bench_peers_trace.py                       # every labelled trace (~1 min on 2 cores)
    python benchmarks/bench_peers_trace.py --traces param/dlrm_8ranks,kineto/resnet50_num_workers_0
    python benchmarks/bench_peers_trace.py --tiny --json out.json   # two small traces (the smoke test's run)

bench_load.py compares speed; this script compares verdicts. For every trace in
../shared/traces/LABELS.yaml of kind `trace` or `rank-set` (labels: `positive` / `negative` per
anti-pattern id, `expect` figures), in one process and one run:

  zoomer  `zoomer_ar.analyze.analyze_path(path)`: a pattern's verdict is "found" when a finding
          carries its id; figures are the features named like the `expect` keys.
  hta     HTA (`traceinsight`, import name `hta`): `TraceAnalysis(trace_dir=folder,
          include_last_profiler_step=True)` (every step: the labels' figures span the whole trace;
          a single file is symlinked into a temporary folder of its own, a rank-set folder is used
          as it is), then get_temporal_breakdown, get_idle_time_breakdown (every rank, every
          stream), get_comm_comp_overlap, get_gpu_kernel_breakdown (memory kernels included, every
          kernel listed: duration_ratio=1, num_kernels unbounded), get_cuda_kernel_launch_stats
          (every rank), get_profiler_steps, get_queue_length_summary (its longest queue is printed;
          no pattern's rule reads it) and, on two or more ranks, get_potential_stragglers
          (num_candidates=1). Not run: get_memory_bw_summary (copy bandwidths: no rule here judges
          bandwidth) and MemoryAnalysis (it reads export_memory_timeline files, not Kineto traces).
  TraceLens  (AMD) is NOT run: the PyPI project named `TraceLens` (versions 0.1.0-0.7.0) is an
          unrelated evaluation framework for AI agents (github.com/ssf0409/tracelens), and AMD's
          TraceLens (github.com/AMD-AGI/TraceLens) is published only as a git repository, which
          this machine's package registries do not carry. The output says so on every run (and
          says where an `import TraceLens` finds a module, were one installed by hand).

HTA gives figures, not verdicts. The rules below are what a user of HTA would apply to them, with
the thresholds of Zoomer's rules (rules/*.yaml, quoted) so that the comparison is about the
analysis, not the threshold. "span" is HTA's per-rank GPU span (`kernel_time(us)` of the temporal
breakdown); "busy" is 100 - idle_time(us) / span * 100, averaged over ranks (Zoomer's job figure is
the same average). A rule whose HTA analysis failed on a trace gives no verdict there.

  idle-gpu               busy < 50.                          (idle-gpu: gpu_busy_pct < 50)
  launch-bound           busy < 95 and median GPU duration / median CPU launch duration (launch
                         stats, all ranks) < 1.0 and host_wait share of idle time (idle breakdown,
                         summed over streams and ranks) > 0.5 and host_wait share * idle % >= 5.
                         No launch statistics (CUDA-graph replay): not applicable, negative.
                         (launch-bound: gpu_busy_pct < 95 and kernel_to_launch_ratio < 1.0 and
                         host_idle_share > 0.5 and impact_pct >= 5)
  exposed-communication  communication kernels exist and the kernel-type time of communication
                         with no computation beside it ("COMMUNICATION", "COMMUNICATION overlapping
                         MEMORY") is >= 5% of the summed spans. The overlap % is printed beside it.
                         HTA has no straggler-wait figure to subtract, Zoomer does.
                         (exposed-communication: impact_pct >= 5)
  extra-copy             "Memcpy DtoD" time (kernel breakdown) >= 2% of the summed spans.
                         (extra-copy: impact_pct >= 2 and memcpy_dtod_count > 0)
  pageable-memcpy        half the time of memcpys whose name says Pageable >= 1% of the spans.
                         (pageable-memcpy: memcpy_pageable_count > 0 and impact_pct >= 1)
  sharding-imbalance     two or more ranks, and per-rank compute time (temporal breakdown):
                         max / median >= 1.1 and (max - median) >= 5% of the median span.
                         (sharding-imbalance: rank_compute_ms_max_over_median >= 1.1 and impact_pct >= 5)
  straggler              two or more ranks and get_potential_stragglers names a rank. HTA gives
                         no cost, so Zoomer's 5% threshold cannot be applied: HTA names a candidate
                         on every multi-rank job it can analyse. (straggler: impact_pct >= 5 and
                         straggler_last_share >= 0.3)
  sync-point             a proxy only: HTA's "other" idle time (summed over streams) >= 2% of the
                         span. HTA documents "other" as idle of unknown cause such as a kernel
                         waiting on another stream's event; host synchronisations leave their idle
                         under host_wait, mixed with launch overhead. (sync-point: impact_pct >= 2
                         and sync_calls_per_step >= 1)

HTA cannot decide at all (no HTA analysis measures them; its verdict is "no verdict"):
  dataloader-bound       the DataLoader wait is CPU-side; HTA's idle breakdown files it under
                         host_wait with every other host delay
  allocator-churn        no analysis of cudaMalloc/cudaFree calls
  memory-growth          HTA's MemoryAnalysis reads export_memory_timeline files, not Kineto traces
  single-tensor-optimizer, zero-grad-not-none, conv-bias-before-bn, fp32-matmul, misaligned-gemm
                         operator-level patterns (optimizer frames, fill ops, conv/BN pairs, GEMM
                         dtypes and shapes) that no HTA analysis reports

Scoring: for every (trace, pattern) with a label, each tool's verdict is TP / FN (positive label,
found / not found), FP / TN (negative label) or NV (no verdict: pattern undecidable by the tool,
trace not opened, or analysis failed); precision = TP / (TP + FP), recall = TP / (TP + FN).
Figures: each `expect` figure against each tool's, with the error and whether it is within the
labels' tolerance (0.5 points for percentages, 2% relative for other floats, exact for integers).
HTA's figures: gpu_busy_pct as above; profiler_steps = len(get_profiler_steps()); memcpy_dtod_count
= sum / mean of the "Memcpy DtoD" rows of the kernel breakdown; slowest_rank = the straggler
candidate; dataloader_ms_per_step has no HTA figure. Timing: wall seconds of each tool's work on
each trace (imports excluded and printed apart), in the same process, Zoomer first.
The script asserts nothing about the figures: it prints them (and, with --json, writes them).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import io
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED_TRACES = Path(os.environ.get("ZOOMER_SHARED_TRACES", REPO.parent / "shared" / "traces"))
TINY_TRACES = ["tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz", "param/dlrm_8ranks"]
PCT_FIGURES = {"gpu_busy_pct"}

# Zoomer's thresholds (rules/*.yaml), applied to HTA's figures.
IDLE_BUSY_PCT = 50.0
LAUNCH_BUSY_PCT = 95.0
LAUNCH_RATIO = 1.0
LAUNCH_HOST_SHARE = 0.5
LAUNCH_IMPACT_PCT = 5.0
EXPOSED_COMM_PCT = 5.0
EXTRA_COPY_PCT = 2.0
PAGEABLE_PCT = 1.0
IMBALANCE_RATIO = 1.1
IMBALANCE_PCT = 5.0
SYNC_PCT = 2.0

# the numbers each HTA rule borrows from the Zoomer rule's `condition` (tests check they are still there)
ZOOMER_THRESHOLDS = {
    "idle-gpu": [IDLE_BUSY_PCT],
    "launch-bound": [LAUNCH_BUSY_PCT, LAUNCH_RATIO, LAUNCH_HOST_SHARE, LAUNCH_IMPACT_PCT],
    "exposed-communication": [EXPOSED_COMM_PCT],
    "extra-copy": [EXTRA_COPY_PCT],
    "pageable-memcpy": [PAGEABLE_PCT],
    "sharding-imbalance": [IMBALANCE_RATIO, IMBALANCE_PCT],
    "sync-point": [SYNC_PCT],
}

HTA_RULES = {
    "idle-gpu": f"busy < {IDLE_BUSY_PCT:g}",
    "launch-bound": f"busy < {LAUNCH_BUSY_PCT:g} and gpu/launch p50 < {LAUNCH_RATIO:g} and host_wait share > "
                    f"{LAUNCH_HOST_SHARE:g} and host_wait share * idle% >= {LAUNCH_IMPACT_PCT:g}",
    "exposed-communication": f"comm without compute >= {EXPOSED_COMM_PCT:g}% of span",
    "extra-copy": f"Memcpy DtoD time >= {EXTRA_COPY_PCT:g}% of span",
    "pageable-memcpy": f"pageable memcpy time / 2 >= {PAGEABLE_PCT:g}% of span",
    "sharding-imbalance": f"ranks >= 2, compute max/median >= {IMBALANCE_RATIO:g}, (max-median) >= "
                          f"{IMBALANCE_PCT:g}% of span",
    "straggler": "ranks >= 2 and get_potential_stragglers names a rank",
    "sync-point": f"(proxy) 'other' idle >= {SYNC_PCT:g}% of span",
}
HTA_CANNOT_DECIDE = {
    "dataloader-bound": "DataLoader waits are CPU-side; HTA files the GPU idle they cause under host_wait",
    "allocator-churn": "no HTA analysis of cudaMalloc/cudaFree calls",
    "memory-growth": "HTA's MemoryAnalysis reads export_memory_timeline files, not Kineto traces",
    "single-tensor-optimizer": "operator-level: no HTA analysis of optimizer implementations",
    "zero-grad-not-none": "operator-level: no HTA analysis of zero_grad fills",
    "conv-bias-before-bn": "operator-level: no HTA analysis of layer pairs",
    "fp32-matmul": "operator-level: no HTA analysis of GEMM dtypes",
    "misaligned-gemm": "operator-level: no HTA analysis of GEMM shapes",
}


# ------------------------------------------------------------------------------------------------
# cases and tool runs
# ------------------------------------------------------------------------------------------------


@dataclass
class Case:
    rel: str
    kind: str
    positive: list[str]
    negative: list[str]
    expect: dict[str, Any]


@dataclass
class ToolRun:
    tool: str
    opened: bool = False
    error: str | None = None  # why the trace could not be opened
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    verdicts: dict[str, bool | None] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # analysis -> why it failed
    timings: dict[str, float] = field(default_factory=dict)


def labelled_cases(labels: dict) -> list[Case]:
    return [
        Case(rel, v["kind"], list(v.get("positive") or []), list(v.get("negative") or []), dict(v.get("expect") or {}))
        for rel, v in labels.items()
        if v.get("kind") in ("trace", "rank-set") and (v.get("positive") or v.get("negative") or v.get("expect"))
    ]


def select(cases: list[Case], wanted: list[str]) -> list[Case]:
    """The cases whose path equals or starts with one of `wanted` (each must match at least one)."""
    chosen: list[Case] = []
    for w in wanted:
        hits = [c for c in cases if c.rel == w or c.rel.startswith(w.rstrip("/") + "/")]
        if not hits:
            raise ValueError(f"--traces: {w!r} names no labelled trace in {SHARED_TRACES / 'LABELS.yaml'}")
        chosen += [c for c in hits if c not in chosen]
    return chosen


def _why(exc: BaseException) -> str:
    """One line: the exception and where it was raised."""
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" at {Path(frame.filename).name}:{frame.lineno} ({(frame.line or '').strip()})" if frame else ""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}{': ' + text[:200] if text else ''}{where}"


def cpu_seconds() -> float:
    """CPU seconds of this process and of its waited-for children (HTA parses in a process pool)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(run: ToolRun, work: Callable[[ToolRun], None]) -> ToolRun:
    """Run `work(run)`, recording its wall and CPU seconds on `run`."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    try:
        work(run)
    finally:
        run.seconds, run.cpu_seconds = time.perf_counter() - t0, cpu_seconds() - c0
    return run


def run_zoomer(path: Path) -> ToolRun:
    return timed(ToolRun("zoomer"), lambda run: _zoomer(path, run))


def _zoomer(path: Path, run: ToolRun) -> None:
    from zoomer_ar.analyze import analyze_path

    try:
        analysis = analyze_path(path)
    except Exception as exc:  # noqa: BLE001 - a benchmark reports every failure and goes on
        run.error = _why(exc)
        return
    run.opened = True
    found = {f.pattern for f in analysis.findings}
    from zoomer_ar.detect.rules import load_rules

    run.verdicts = {r.id: r.id in found for r in load_rules()}
    run.figures = {k: v for k, v in analysis.features.items() if k != "per_rank"}


class HtaFigures:
    """HTA's analyses of one trace folder, each timed, each failure kept with its reason."""

    def __init__(self, analysis: Any, run: ToolRun) -> None:
        self.a, self.run = analysis, run
        self.ranks = sorted(analysis.t.traces)

    def call(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return fn()
        except Exception as exc:  # noqa: BLE001
            self.run.failed[name] = _why(exc)
            return None
        finally:
            self.run.timings[name] = time.perf_counter() - t0

    def collect(self) -> dict[str, Any]:
        a, ranks, fig = self.a, self.ranks, {"n_ranks": len(self.ranks)}
        temporal = self.call("get_temporal_breakdown", lambda: a.get_temporal_breakdown(visualize=False))
        if temporal is not None and len(temporal):
            span = [float(x) for x in temporal["kernel_time(us)"]]
            idle = [float(x) for x in temporal["idle_time(us)"]]
            fig["span_us"] = span
            fig["idle_pct"] = [100 * i / s if s > 0 else math.nan for i, s in zip(idle, span)]
            fig["gpu_busy_pct"] = statistics.fmean(100 - p for p in fig["idle_pct"])
            fig["compute_us"] = [float(x) for x in temporal["compute_time(us)"]]
        idle_bd = self.call("get_idle_time_breakdown",
                            lambda: a.get_idle_time_breakdown(ranks=ranks, visualize=False)[0])
        if idle_bd is not None:
            by_cat = idle_bd.groupby("idle_category")["idle_time"].sum()
            total = float(by_cat.sum())
            fig["idle_by_category_us"] = {str(k): float(v) for k, v in by_cat.items()}
            fig["host_wait_share"] = float(by_cat.get("host_wait", 0.0)) / total if total > 0 else None
            per_rank_other = idle_bd[idle_bd["idle_category"] == "other"].groupby("rank")["idle_time"].sum()
            fig["other_idle_us"] = [float(per_rank_other.get(r, 0.0)) for r in ranks]
        overlap = self.call("get_comm_comp_overlap", lambda: a.get_comm_comp_overlap(visualize=False))
        if overlap is not None:
            pct = [float(x) for x in overlap["comp_comm_overlap_pctg"] if not math.isnan(float(x))]
            fig["comm_overlap_pct"] = statistics.fmean(pct) if pct else None
        kb = self.call("get_gpu_kernel_breakdown", lambda: a.get_gpu_kernel_breakdown(
            visualize=False, duration_ratio=1.0, num_kernels=10**9, include_memory_kernels=True))
        if kb is not None:
            by_type, per_kernel = kb
            types = {str(k): float(v) for k, v in zip(by_type["kernel_type"], by_type["sum"])}
            fig["kernel_type_us"] = types
            fig["comm_us"] = sum(v for k, v in types.items() if "COMMUNICATION" in k)
            fig["exposed_comm_us"] = sum(v for k, v in types.items() if "COMMUNICATION" in k and "COMPUTATION" not in k)
            names = per_kernel["name"].astype(str)
            dtod = per_kernel[names.str.startswith("Memcpy DtoD")]
            fig["memcpy_dtod_us"] = float(dtod["sum (us)"].sum())
            fig["memcpy_dtod_count"] = int(sum(round(float(s) / float(m)) for s, m in
                                               zip(dtod["sum (us)"], dtod["mean (us)"]) if float(m) > 0))
            fig["memcpy_pageable_us"] = float(per_kernel[names.str.startswith("Memcpy") &
                                                         names.str.contains("Pageable")]["sum (us)"].sum())
        launch = self.call("get_cuda_kernel_launch_stats",
                           lambda: a.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False))
        if launch is not None:
            import pandas as pd

            frames = [df for df in launch.values() if df is not None and len(df)]
            both = pd.concat(frames) if frames else None
            gpu = float(both["gpu_duration"].median()) if both is not None else math.nan
            cpu = float(both["cpu_duration"].median()) if both is not None else math.nan
            fig["gpu_dur_p50_us"], fig["launch_dur_p50_us"] = gpu, cpu
            fig["kernel_to_launch_ratio"] = gpu / cpu if cpu > 0 and not math.isnan(gpu) else None
        steps = self.call("get_profiler_steps", a.get_profiler_steps)
        if steps is not None:
            fig["profiler_steps"] = len(steps)
        queue = self.call("get_queue_length_summary", lambda: a.get_queue_length_summary(ranks=ranks))
        if queue is not None and len(queue):
            fig["queue_length_max"] = float(queue.max(numeric_only=True).max())
        if len(ranks) >= 2:
            cands = self.call("get_potential_stragglers", lambda: a.get_potential_stragglers(num_candidates=1))
            if cands is not None:
                fig["straggler_candidates"] = [int(r) for r in cands]
                fig["slowest_rank"] = int(cands[0]) if len(cands) else None
        return fig


def run_hta(folder: Path) -> ToolRun:
    return timed(ToolRun("hta"), lambda run: _hta(folder, run))


def _hta(folder: Path, run: ToolRun) -> None:
    from hta.trace_analysis import TraceAnalysis

    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            analysis = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - HTA may also sys.exit on a folder it cannot read
        run.error = _why(exc)
        return
    run.timings["load"] = time.perf_counter() - t0
    run.opened = True
    run.figures = HtaFigures(analysis, run).collect()
    run.verdicts = hta_verdicts(run.figures)


# ------------------------------------------------------------------------------------------------
# HTA's figures -> verdicts (the rules of the docstring)
# ------------------------------------------------------------------------------------------------


def _span_total(f: dict) -> float | None:
    return sum(f["span_us"]) if f.get("span_us") else None


def _share_of_span(f: dict, key: str) -> float | None:
    total = _span_total(f)
    return None if total is None or key not in f or total <= 0 else 100 * f[key] / total


def hta_verdicts(f: dict) -> dict[str, bool | None]:
    busy = f.get("gpu_busy_pct")
    v: dict[str, bool | None] = {p: None for p in HTA_CANNOT_DECIDE}
    v["idle-gpu"] = None if busy is None else busy < IDLE_BUSY_PCT
    ratio, share = f.get("kernel_to_launch_ratio"), f.get("host_wait_share")
    if busy is None or share is None or "gpu_dur_p50_us" not in f:
        v["launch-bound"] = None
    elif ratio is None:  # no launch statistics (CUDA-graph replay): the rule does not apply
        v["launch-bound"] = False
    else:
        v["launch-bound"] = (busy < LAUNCH_BUSY_PCT and ratio < LAUNCH_RATIO and share > LAUNCH_HOST_SHARE
                             and share * (100 - busy) >= LAUNCH_IMPACT_PCT)
    exposed = _share_of_span(f, "exposed_comm_us")
    v["exposed-communication"] = None if exposed is None else f["comm_us"] > 0 and exposed >= EXPOSED_COMM_PCT
    dtod = _share_of_span(f, "memcpy_dtod_us")
    v["extra-copy"] = None if dtod is None else f["memcpy_dtod_count"] > 0 and dtod >= EXTRA_COPY_PCT
    pageable = _share_of_span(f, "memcpy_pageable_us")
    v["pageable-memcpy"] = None if pageable is None else f["memcpy_pageable_us"] > 0 and pageable / 2 >= PAGEABLE_PCT
    if f["n_ranks"] < 2:  # one rank: nothing to compare, as in Zoomer's applies_when
        v["sharding-imbalance"] = v["straggler"] = False
    else:
        compute, span = f.get("compute_us"), f.get("span_us")
        if compute and span:
            med, top = statistics.median(compute), max(compute)
            v["sharding-imbalance"] = (med > 0 and top / med >= IMBALANCE_RATIO
                                       and 100 * (top - med) / statistics.median(span) >= IMBALANCE_PCT)
        else:
            v["sharding-imbalance"] = None
        cands = f.get("straggler_candidates")
        v["straggler"] = None if cands is None else len(cands) > 0
    if f.get("other_idle_us") is not None and f.get("span_us"):
        v["sync-point"] = statistics.fmean(100 * o / s for o, s in zip(f["other_idle_us"], f["span_us"]) if s > 0) >= SYNC_PCT
    else:
        v["sync-point"] = None
    return v


# ------------------------------------------------------------------------------------------------
# scoring
# ------------------------------------------------------------------------------------------------


def outcome(label: bool, verdict: bool | None) -> str:
    if verdict is None:
        return "NV"
    return ("TP" if verdict else "FN") if label else ("FP" if verdict else "TN")


def score(results: list[dict], tools: list[str]) -> dict[str, dict[str, dict]]:
    """pattern -> tool -> {TP, FP, FN, TN, NV, labels, precision, recall}."""
    table: dict[str, dict[str, dict]] = {}
    for r in results:
        for pattern, label in r["labels"].items():
            for tool in tools:
                row = table.setdefault(pattern, {}).setdefault(
                    tool, {"TP": 0, "FP": 0, "FN": 0, "TN": 0, "NV": 0, "labels": 0})
                row[r["outcomes"][tool][pattern]] += 1
                row["labels"] += 1
    for per_tool in table.values():
        for row in per_tool.values():
            row["precision"] = row["TP"] / (row["TP"] + row["FP"]) if row["TP"] + row["FP"] else None
            row["recall"] = row["TP"] / (row["TP"] + row["FN"]) if row["TP"] + row["FN"] else None
    return dict(sorted(table.items()))


def figure_error(name: str, expected: Any, got: Any) -> dict:
    if got is None or (isinstance(got, float) and math.isnan(got)):
        return {"value": None, "error": None, "within": False}
    err = float(got) - float(expected)
    if name in PCT_FIGURES:
        within = abs(err) <= 0.5
    elif isinstance(expected, float):
        within = abs(err) <= 0.02 * abs(expected)
    else:
        within = got == expected
    return {"value": got, "error": err, "within": within}


def evaluate(case: Case, runs: dict[str, ToolRun]) -> dict:
    labels = {p: True for p in case.positive} | {p: False for p in case.negative}
    outcomes = {tool: {p: outcome(lab, run.verdicts.get(p)) for p, lab in labels.items()} for tool, run in runs.items()}
    figures = {name: {"expected": exp} | {tool: figure_error(name, exp, run.figures.get(name)) for tool, run in runs.items()}
               for name, exp in case.expect.items()}
    return {"rel": case.rel, "kind": case.kind, "labels": labels, "outcomes": outcomes, "figures": figures,
            "runs": {tool: asdict(run) for tool, run in runs.items()}}


def right_and_wrong(results: list[dict], right: str, wrong: str) -> list[str]:
    """Cases where tool `right` agrees with the label (verdict, or `expect` figure within tolerance) and tool
    `wrong` does not (wrong, no verdict, or no figure)."""
    lines = []
    for r in results:
        for p, lab in r["labels"].items():
            a, b = r["outcomes"][right][p], r["outcomes"][wrong][p]
            if a in ("TP", "TN") and b not in ("TP", "TN"):
                lines.append(f"{r['rel']}: {p} labelled {'positive' if lab else 'negative'}: {right} {a}, {wrong} {b}")
        for name, row in r["figures"].items():
            if row[right]["within"] and not row[wrong]["within"]:
                lines.append(f"{r['rel']}: {name} = {row['expected']}: {right} {_fmt(row[right]['value'])}, "
                             f"{wrong} {_fmt(row[wrong]['value'])}")
    return lines


def peer_right_zoomer_wrong(results: list[dict], peers: list[str]) -> list[str]:
    return [line for peer in peers for line in right_and_wrong(results, peer, "zoomer")]


def zoomer_right_peer_wrong(results: list[dict], peer: str) -> list[str]:
    return right_and_wrong(results, "zoomer", peer)


def unlabelled_disagreements(results: list[dict], peer: str) -> list[str]:
    """(trace, pattern) pairs without a label where both tools decide and disagree: no score, worth a look."""
    lines = []
    for r in results:
        z, o = r["runs"]["zoomer"]["verdicts"], r["runs"][peer]["verdicts"]
        for p in sorted(o):
            if p not in r["labels"] and o[p] is not None and z.get(p) is not None and o[p] != z[p]:
                lines.append(f"{r['rel']}: {p}: zoomer {'found' if z[p] else 'not found'}, "
                             f"{peer} {'found' if o[p] else 'not found'}")
    return lines


# ------------------------------------------------------------------------------------------------
# output
# ------------------------------------------------------------------------------------------------


def _fmt(x: Any, nd: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.{nd}f}"
    return str(x)


def _short(rel: str, width: int = 44) -> str:
    return rel if len(rel) <= width else "..." + rel[-(width - 3):]


def tracelens_status() -> dict:
    spec = importlib.util.find_spec("TraceLens")
    found = spec.origin if spec is not None else None
    return {
        "run": False,
        "found_module": found,
        "why": "not installable here: the PyPI project 'TraceLens' (0.1.0-0.7.0) is an unrelated AI-agent "
               "evaluation framework (github.com/ssf0409/tracelens); AMD's TraceLens (github.com/AMD-AGI/TraceLens) "
               "is published only as a git repository, which this machine's registries do not carry"
               + (f"; an 'import TraceLens' finds {found}, but this benchmark has no adapter for it" if found else ""),
    }


def print_report(doc: dict) -> None:
    results, tools = doc["results"], doc["tools"]
    print(f"\n== verdicts per trace (labels: +positive -negative; outcome per tool; time s) {doc['date']}")
    for r in results:
        times = "  ".join(f"{t} {r['runs'][t]['seconds']:.2f}s" + ("" if r["runs"][t]["opened"] else " NOT OPENED")
                          for t in tools)
        print(f"{_short(r['rel'], 70)}  [{times}]")
        for p, lab in r["labels"].items():
            outs = "  ".join(f"{t}={r['outcomes'][t][p]}" for t in tools)
            print(f"    {'+' if lab else '-'}{p:<24} {outs}")
    print("\n== per pattern and tool (NV: no verdict)")
    print(f"{'pattern':<24}{'tool':<8}{'labels':>7}{'TP':>4}{'FP':>4}{'FN':>4}{'TN':>4}{'NV':>4}{'prec':>7}{'recall':>8}")
    for pattern, per_tool in doc["scores"].items():
        for t in tools:
            s = per_tool[t]
            print(f"{pattern:<24}{t:<8}{s['labels']:>7}{s['TP']:>4}{s['FP']:>4}{s['FN']:>4}{s['TN']:>4}{s['NV']:>4}"
                  f"{_fmt(s['precision']):>7}{_fmt(s['recall']):>8}")
    totals = doc["totals"]
    for t in tools:
        s = totals[t]
        print(f"{'ALL':<24}{t:<8}{s['labels']:>7}{s['TP']:>4}{s['FP']:>4}{s['FN']:>4}{s['TN']:>4}{s['NV']:>4}"
              f"{_fmt(s['precision']):>7}{_fmt(s['recall']):>8}")
    print("\n== expect figures (value, error against the label; * = outside the labels' tolerance)")
    for r in results:
        for name, row in r["figures"].items():
            cells = []
            for t in tools:
                c = row[t]
                cells.append(f"{t} {_fmt(c['value'])} ({'+' if (c['error'] or 0) >= 0 else ''}{_fmt(c['error'])})"
                             f"{'' if c['within'] else '*'}")
            print(f"{_short(r['rel'], 50):<50} {name:<22} label {row['expected']!s:<7} " + "  ".join(cells))
    if "hta" in tools:
        print("\n== HTA figures behind its verdicts (busy %, gpu/launch p50, host_wait share, exposed comm %, "
              "overlap %, DtoD %, other idle %, longest queue)")
        for r in results:
            f = r["runs"]["hta"]["figures"]
            if not r["runs"]["hta"]["opened"]:
                continue
            other = (statistics.fmean(100 * o / s for o, s in zip(f["other_idle_us"], f["span_us"]) if s > 0)
                     if f.get("other_idle_us") and f.get("span_us") else None)
            print(f"{_short(r['rel'], 50):<50} busy {_fmt(f.get('gpu_busy_pct'))}  ratio "
                  f"{_fmt(f.get('kernel_to_launch_ratio'))}  host {_fmt(f.get('host_wait_share'))}  exposed "
                  f"{_fmt(_share_of_span(f, 'exposed_comm_us'))}  overlap {_fmt(f.get('comm_overlap_pct'))}  dtod "
                  f"{_fmt(_share_of_span(f, 'memcpy_dtod_us'))}  other {_fmt(other)}  queue {_fmt(f.get('queue_length_max'), 0)}")
        print("\n== HTA: traces it could not open (and why)")
        for line in doc["hta_not_opened"] or ["(none)"]:
            print("  " + line)
        print("== HTA: analyses that failed (and why)")
        for line in doc["hta_failed"] or ["(none)"]:
            print("  " + line)
        print("== HTA cannot decide at all: " + "; ".join(f"{p} ({why})" for p, why in HTA_CANNOT_DECIDE.items()))
        print("== HTA decision rules (Zoomer's thresholds): " + "; ".join(f"{p}: {r}" for p, r in HTA_RULES.items()))
    print("\n== cases where a peer is right and Zoomer wrong")
    for line in doc["peer_right_zoomer_wrong"] or ["(none)"]:
        print("  " + line)
    for t in tools[1:]:
        print(f"== cases where Zoomer is right and {t} is not (wrong, or no verdict / no figure)")
        for line in doc["zoomer_right_peer_wrong"][t] or ["(none)"]:
            print("  " + line)
    for t in tools[1:]:
        print(f"== no label, both decide, they disagree ({t}; not scored)")
        for line in doc["unlabelled_disagreements"][t] or ["(none)"]:
            print("  " + line)
    print(f"\n== TraceLens (AMD): not run: {doc['tracelens']['why']}")
    print("\n== time (s, work only, same process, imports apart; cpu = this process and its children)")
    for t in tools:
        print(f"  {t:<7} import {doc['import_s'][t]:.2f}  work {doc['time_s'][t]:.2f} wall, "
              f"{doc['cpu_s'][t]:.2f} cpu over {len(results)} trace{'s' if len(results) != 1 else ''}")


def totals(scores: dict[str, dict[str, dict]], tools: list[str]) -> dict[str, dict]:
    out = {}
    for t in tools:
        row = {k: sum(per_tool[t][k] for per_tool in scores.values()) for k in ("TP", "FP", "FN", "TN", "NV", "labels")}
        row["precision"] = row["TP"] / (row["TP"] + row["FP"]) if row["TP"] + row["FP"] else None
        row["recall"] = row["TP"] / (row["TP"] + row["FN"]) if row["TP"] + row["FN"] else None
        out[t] = row
    return out


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------


def hta_folder(src: Path, rel: str, tmp: Path) -> Path:
    """A folder for HTA: a rank-set folder as it is, a single file symlinked into a folder of its own."""
    if src.is_dir():
        return src
    folder = tmp / rel.replace("/", "__")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / src.name).symlink_to(src)
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", help="comma-separated LABELS.yaml paths (or folder prefixes); default: every labelled trace")
    ap.add_argument("--tiny", action="store_true", help=f"only {', '.join(TINY_TRACES)} (unless --traces is given)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="write every figure, verdict and time to OUT")
    ap.add_argument("--no-hta", action="store_true", help="run Zoomer alone")
    args = ap.parse_args(argv)

    labels_file = SHARED_TRACES / "LABELS.yaml"
    if not labels_file.is_file():
        print(f"error: the real-trace corpus is missing: {labels_file} not found (set ZOOMER_SHARED_TRACES)",
              file=sys.stderr)
        return 2
    cases = labelled_cases(yaml.safe_load(labels_file.read_text()))
    wanted = args.traces.split(",") if args.traces else TINY_TRACES if args.tiny else None
    try:
        cases = select(cases, [w.strip() for w in wanted if w.strip()]) if wanted else cases
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not cases:
        print("error: --traces selects no trace", file=sys.stderr)
        return 2
    if args.json and not args.json.parent.is_dir():
        print(f"error: cannot write {args.json}: no folder {args.json.parent}", file=sys.stderr)
        return 2
    hta_missing = importlib.util.find_spec("hta") is None
    tools = ["zoomer"] if args.no_hta or hta_missing else ["zoomer", "hta"]
    if hta_missing and not args.no_hta:
        print("note: HTA is not installed (pip install traceinsight): Zoomer alone", file=sys.stderr)

    import_s: dict[str, float] = {}
    t0 = time.perf_counter()
    import zoomer_ar.analyze  # noqa: F401
    import zoomer_ar.detect.rules  # noqa: F401

    import_s["zoomer"] = time.perf_counter() - t0
    if "hta" in tools:
        t0 = time.perf_counter()
        import hta.trace_analysis  # noqa: F401

        import_s["hta"] = time.perf_counter() - t0
        logging.disable(logging.WARNING)  # HTA logs a warning per trace for ordinary files

    results = []
    with tempfile.TemporaryDirectory(prefix="bench_peers_trace_") as tmp:
        for i, case in enumerate(cases, 1):
            src = SHARED_TRACES / case.rel
            print(f"[{i}/{len(cases)}] {case.rel}", file=sys.stderr, flush=True)
            runs = {"zoomer": run_zoomer(src)}
            if "hta" in tools:
                runs["hta"] = run_hta(hta_folder(src, case.rel, Path(tmp)))
            results.append(evaluate(case, runs))

    scores = score(results, tools)
    peers = tools[1:]
    doc = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python benchmarks/bench_peers_trace.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": {"python": platform.python_version(), "cores": os.cpu_count(), "platform": platform.platform()},
        "versions": _versions(tools),
        "tools": tools,
        "results": results,
        "scores": scores,
        "totals": totals(scores, tools),
        "peer_right_zoomer_wrong": peer_right_zoomer_wrong(results, peers),
        "zoomer_right_peer_wrong": {p: zoomer_right_peer_wrong(results, p) for p in peers},
        "unlabelled_disagreements": {p: unlabelled_disagreements(results, p) for p in peers},
        "hta_not_opened": [f"{r['rel']}: {r['runs']['hta']['error']}" for r in results
                           if "hta" in r["runs"] and not r["runs"]["hta"]["opened"]],
        "hta_failed": [f"{r['rel']}: {name}: {why}" for r in results if "hta" in r["runs"]
                       for name, why in r["runs"]["hta"]["failed"].items()],
        "hta_cannot_decide": HTA_CANNOT_DECIDE,
        "hta_rules": HTA_RULES,
        "tracelens": tracelens_status(),
        "import_s": import_s,
        "time_s": {t: sum(r["runs"][t]["seconds"] for r in results) for t in tools},
        "cpu_s": {t: sum(r["runs"][t]["cpu_seconds"] for r in results) for t in tools},
    }
    print_report(doc)
    if args.json:
        try:
            args.json.write_text(json.dumps(doc, indent=1, default=str))
        except OSError as exc:
            print(f"error: cannot write {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"\nwrote {args.json}")
    return 0


def _versions(tools: list[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for tool, dist in (("zoomer", "zoomer-ar"), ("hta", "traceinsight")):
        if tool in tools:
            try:
                out[tool] = version(dist)
            except PackageNotFoundError:
                out[tool] = "unknown"
    return out


if __name__ == "__main__":
    sys.exit(main())
