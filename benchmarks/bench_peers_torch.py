"""Detection against two open peers: PyTorch's profiler pattern matcher and TorchFix.

For every scenario program of training_data/scenarios (MANIFEST.yaml: the planted programs and
their clean twins), in one run:

1. run the program once under torch.profiler in a subprocess (its own SteadyStateProfiler:
   record_shapes, with_stack, with_modules, as record.py records it). When the recorded window
   ends, on the live profile, before the trace is exported:
   `torch.profiler._pattern_matcher.report_all_anti_patterns(prof, ...)` (timed; its printed
   report and JSON kept) and each of its Pattern classes' matched events (for the counts, plus
   ForLoopIndexingPattern, which torch 2.13 leaves out of report_all_anti_patterns);
2. analyse that same exported trace with Zoomer (`zoomer_ar.analyze.analyze_path`: trace findings);
3. run TorchFix 0.7.0 (its API, every rule: `--select ALL`; TOR4xx, the DataLoader rule, is off by
   default in TorchFix) and Zoomer's fixers (`zoomer_ar.fix.api.static_findings`, what
   `zoomer-ar fix FILE` lists) on the scenario's source.

Each peer pattern maps to one of Zoomer's anti-pattern ids or to none (a case Zoomer cannot see:
listed as such, never dropped). A tool's detections on a scenario are judged against the manifest:
the planted id is a true positive when reported (else a false negative); an id in the scenario's
`must_not_show` is a false positive when reported (else a true negative); `incidental` ids are not
judged. Printed per tool and per pattern: TP / FP / FN, precision and recall, each tool's wall
time, and the cases where a peer is right and Zoomer wrong. Nothing about the figures is asserted.

Tools in the table: `pattern-matcher` and `torchfix` (the peers), `zoomer-trace` (analyze),
`zoomer-fix` (the fixers' findings, opt-in fixers' suggestions left out: they need --select),
`zoomer-fix+opt-in` (the same with them), `zoomer` (zoomer-trace or zoomer-fix).

    python benchmarks/bench_peers_torch.py                              # every CPU scenario
    python benchmarks/bench_peers_torch.py --scenarios sync_point,sync_point_clean --json /tmp/p.json
    python benchmarks/bench_peers_torch.py --tiny --scenarios zero_grad_not_none   # smoke test

The GPU-only programs (MANIFEST.yaml `gpu_scenarios`) need CUDA: they are listed as skipped.
Exit status: 0 when every scenario ran, 1 when one could not be recorded, 2 for bad options.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCEN = REPO / "training_data" / "scenarios"
TRACE_NAME = "rank-0.pt.trace.json.gz"
MATCHER_FILE = "pattern_matcher.json"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: torch.profiler._pattern_matcher classes -> Zoomer id (None: no Zoomer id, Zoomer cannot see it)
PATTERN_MATCHER_MAP: dict[str, str | None] = {
    "ExtraCUDACopyPattern": "extra-copy",
    "ForLoopIndexingPattern": None,
    "FP32MatMulPattern": "fp32-matmul",
    "OptimizerSingleTensorPattern": "single-tensor-optimizer",
    "SynchronizedDataLoaderPattern": "dataloader-bound",
    "GradNotSetToNonePattern": "zero-grad-not-none",
    "Conv2dBiasFollowedByBatchNorm2dPattern": "conv-bias-before-bn",
    "MatMulDimInFP16Pattern": "misaligned-gemm",
}
#: the classes report_all_anti_patterns runs in torch 2.13 (ForLoopIndexingPattern is commented out there)
REPORT_ALL_CLASSES = tuple(n for n in PATTERN_MATCHER_MAP if n != "ForLoopIndexingPattern")

#: TorchFix rule codes -> Zoomer id; codes not listed have no Zoomer id (deprecated APIs, security, ...)
TORCHFIX_MAP: dict[str, str | None] = {"TOR401": "dataloader-bound"}
TORCHFIX_DEFAULT_OFF = ("TOR3", "TOR4", "TOR9")  # torchfix.torchfix.DISABLED_BY_DEFAULT

PEERS = ("pattern-matcher", "torchfix")
ZOOMER_TOOLS = ("zoomer-trace", "zoomer-fix", "zoomer-fix+opt-in", "zoomer")
TOOLS = PEERS + ZOOMER_TOOLS
#: the Zoomer tool a peer is compared with like for like (trace against trace, source against source)
COUNTERPART = {"pattern-matcher": "zoomer-trace", "torchfix": "zoomer-fix"}

TINY = {"steps": 2, "skip": 1, "warmup": 1, "severity": "low"}
DEFAULT_TINY_SCENARIOS = ("zero_grad_not_none", "zero_grad_not_none_clean")


class BadInput(Exception):
    """Bad options or scenario names: one line, exit status 2."""


# --------------------------------------------------------------------------------------------
# Child: one scenario program under its own profiler, the pattern matcher on the live profile
# --------------------------------------------------------------------------------------------


def pattern_matcher_report(prof: Any) -> dict[str, Any]:
    """The pattern matcher on a live torch.profiler.profile: report_all_anti_patterns (timed, its
    printed text and JSON), then every Pattern class's matched events (counts, source locations)."""
    from torch.profiler import _pattern_matcher as pm

    out: dict[str, Any] = {"patterns": {}, "report_text": "", "report_json": {}, "error": None}
    with tempfile.TemporaryDirectory(prefix="zoomer-peers-") as tmp:
        printed = io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(printed):
                pm.report_all_anti_patterns(prof, should_benchmark=False, print_enable=True, json_report_dir=tmp)
        except Exception as exc:  # a torch bug (e.g. a match without a source location) is a result too
            out["error"] = f"report_all_anti_patterns: {type(exc).__name__}: {exc}"
        out["wall_s"] = time.perf_counter() - t0
        out["report_text"] = printed.getvalue()
        report = Path(tmp) / "torchtidy_report.json"
        if report.is_file():
            out["report_json"] = json.loads(report.read_text(encoding="utf-8"))
    t0 = time.perf_counter()
    for name in PATTERN_MATCHER_MAP:
        try:
            events = getattr(pm, name)(prof, False).matched_events()
        except Exception as exc:
            out["patterns"][name] = {"matched": 0, "error": f"{type(exc).__name__}: {exc}", "locations": []}
            continue
        locations = sorted({pm.source_code_location(e) for e in events})
        out["patterns"][name] = {"matched": len(events), "locations": locations[:10]}
    out["per_pattern_wall_s"] = time.perf_counter() - t0
    return out


def child_main(program: str, out_dir: str, matcher_out: str, program_args: list[str]) -> int:
    """Run a scenario program as __main__, with the pattern matcher hooked into its profiler."""
    import runpy

    sys.path.insert(0, str(Path(program).resolve().parent))
    from zoomer_ar.capture import SteadyStateProfiler

    export = SteadyStateProfiler._on_trace_ready

    def matcher_then_export(self: SteadyStateProfiler, prof: Any) -> None:
        if self._cycles_written == 0:
            report = pattern_matcher_report(prof)
            t0 = time.perf_counter()
            export(self, prof)
            report["export_wall_s"] = time.perf_counter() - t0
            Path(matcher_out).write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
        else:
            export(self, prof)

    SteadyStateProfiler._on_trace_ready = matcher_then_export  # type: ignore[method-assign]
    sys.argv = [program, "--out", out_dir, *program_args]
    runpy.run_path(program, run_name="__main__")
    return 0


# --------------------------------------------------------------------------------------------
# Parent: record, analyse, lint, judge
# --------------------------------------------------------------------------------------------


@dataclass
class ToolResult:
    """One tool on one scenario: the Zoomer ids it reports, what it reports with no Zoomer id."""

    detected: set[str] = field(default_factory=set)
    unmapped: dict[str, int] = field(default_factory=dict)  # peer pattern / rule -> occurrences
    evidence: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"detected": sorted(self.detected), "unmapped": dict(sorted(self.unmapped.items())),
                "evidence": self.evidence, "wall_s": round(self.wall_s, 4), "error": self.error}


@dataclass
class ScenarioRun:
    name: str
    entry: dict[str, Any]
    record: dict[str, Any] = field(default_factory=dict)
    tools: dict[str, ToolResult] = field(default_factory=dict)

    @property
    def planted(self) -> str | None:
        p = self.entry.get("pattern")
        return None if p in (None, "clean") else str(p)


def python_exe() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def load_manifest() -> dict[str, Any]:
    import yaml

    return yaml.safe_load((SCEN / "MANIFEST.yaml").read_text(encoding="utf-8"))


def select_scenarios(manifest: dict[str, Any], wanted: str | None) -> list[str]:
    names = list(manifest["scenarios"])
    if not wanted:
        return names
    asked = [n.strip() for n in wanted.split(",") if n.strip()]
    gpu = set(manifest.get("gpu_scenarios") or {})
    unknown = [n for n in asked if n not in names and n not in gpu]
    if unknown:
        raise BadInput(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(names)}")
    only_gpu = [n for n in asked if n in gpu]
    if only_gpu:
        raise BadInput(f"GPU-only scenario(s) need CUDA, which this benchmark does not run: {', '.join(only_gpu)}")
    if not asked:
        raise BadInput("--scenarios: no scenario named")
    return [n for n in names if n in asked]


def record(run: ScenarioRun, work: Path, knobs: dict[str, Any], timeout: float) -> Path | None:
    """The scenario under its profiler in a subprocess; the pattern matcher's result in run.tools."""
    trace_dir, peer_dir = work / run.name / "trace", work / run.name / "peer"
    shutil.rmtree(work / run.name, ignore_errors=True)
    trace_dir.mkdir(parents=True)
    peer_dir.mkdir(parents=True)
    matcher_out = peer_dir / MATCHER_FILE
    cmd = [python_exe(), str(Path(__file__).resolve()), "--child", str(SCEN / run.entry["file"]),
           "--child-out", str(trace_dir), "--child-matcher", str(matcher_out), "--"]
    for flag in ("steps", "skip", "warmup", "severity"):
        if knobs.get(flag) is not None:
            cmd += [f"--{flag}", str(knobs[flag])]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=SCEN, env=env, capture_output=True, text=True, timeout=timeout)
        rc, log = proc.returncode, (proc.stdout + proc.stderr)
    except subprocess.TimeoutExpired:
        rc, log = 124, f"timed out after {timeout:.0f} s"
    trace = trace_dir / TRACE_NAME
    ok = rc == 0 and trace.is_file() and matcher_out.is_file()
    run.record = {"rc": rc, "ok": ok, "wall_s": round(time.perf_counter() - t0, 2), "trace": str(trace)}
    if not ok:
        run.record["log_tail"] = "\n".join(log.strip().splitlines()[-12:])
        return None
    run.tools["pattern-matcher"] = matcher_result(json.loads(matcher_out.read_text(encoding="utf-8")))
    run.record["export_wall_s"] = run.tools["pattern-matcher"].evidence.pop("export_wall_s", None)
    return trace_dir


def matcher_result(report: dict[str, Any]) -> ToolResult:
    res = ToolResult(wall_s=float(report.get("wall_s") or 0.0), error=report.get("error"))
    matched: dict[str, int] = {}
    for name, info in report["patterns"].items():
        if info.get("error"):
            res.error = (res.error + "; " if res.error else "") + f"{name}: {info['error']}"
        if not info["matched"]:
            continue
        matched[name] = info["matched"]
        zid = PATTERN_MATCHER_MAP.get(name)
        if zid is None:
            res.unmapped[name] = info["matched"]
        else:
            res.detected.add(zid)
    res.evidence = {"matched": matched, "locations": {n: report["patterns"][n]["locations"] for n in matched},
                    "export_wall_s": report.get("export_wall_s"),
                    "per_pattern_wall_s": report.get("per_pattern_wall_s")}
    return res


def zoomer_trace(trace_dir: Path) -> ToolResult:
    from zoomer_ar.analyze import analyze_path

    t0 = time.perf_counter()
    try:
        analysis = analyze_path(trace_dir)
    except Exception as exc:
        return ToolResult(wall_s=time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}")
    wall = time.perf_counter() - t0
    counts: dict[str, int] = {}
    for f in analysis.findings:
        counts[f.pattern] = counts.get(f.pattern, 0) + 1
    return ToolResult(detected=set(counts), evidence={"findings": counts}, wall_s=wall)


def zoomer_fix(source: str, path: str) -> tuple[ToolResult, ToolResult]:
    """The fixers' findings (what `zoomer-ar fix FILE` lists): without and with opt-in suggestions."""
    from zoomer_ar.fix.api import static_findings

    t0 = time.perf_counter()
    try:
        matches = static_findings(source, path)
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
        wall = time.perf_counter() - t0
        return ToolResult(wall_s=wall, error=err), ToolResult(wall_s=wall, error=err)
    wall = time.perf_counter() - t0
    plain = [m for m in matches if not m.opt_in]
    lines = lambda ms: {p: sorted({m.line for m in ms if m.pattern == p}) for p in sorted({m.pattern for m in ms})}  # noqa: E731
    return (ToolResult(detected={m.pattern for m in plain}, evidence={"lines": lines(plain)}, wall_s=wall),
            ToolResult(detected={m.pattern for m in matches}, evidence={"lines": lines(matches)}, wall_s=wall))


def torchfix_lint(source: str) -> ToolResult:
    """TorchFix's visitors (every rule) on the source, as its flake8 plugin runs them."""
    import libcst as cst
    from torchfix.torchfix import GET_ALL_VISITORS

    t0 = time.perf_counter()
    try:
        wrapper = cst.MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        visitors = GET_ALL_VISITORS()
        wrapper.visit_batched(visitors)
        violations = [v for vis in visitors for v in vis.violations]
    except Exception as exc:
        return ToolResult(wall_s=time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}")
    res = ToolResult(wall_s=time.perf_counter() - t0)
    lines: dict[str, list[int]] = {}
    for v in violations:
        lines.setdefault(v.error_code, []).append(v.line)
        zid = TORCHFIX_MAP.get(v.error_code)
        if zid is None:
            res.unmapped[v.error_code] = res.unmapped.get(v.error_code, 0) + 1
        else:
            res.detected.add(zid)
    res.evidence = {"lines": {k: sorted(v) for k, v in sorted(lines.items())}}
    return res


def run_scenario(run: ScenarioRun, work: Path, knobs: dict[str, Any], timeout: float, cold: dict[str, float]) -> None:
    """Record and judge one scenario. The in-process tools' first call (lazy loading: rules,
    registries, TorchFix's tables) is timed into `cold` and repeated, so wall times compare warm calls."""
    trace_dir = record(run, work, knobs, timeout)
    if trace_dir is not None:
        if "zoomer-trace" not in cold:
            cold["zoomer-trace"] = zoomer_trace(trace_dir).wall_s
        run.tools["zoomer-trace"] = zoomer_trace(trace_dir)
    program = SCEN / run.entry["file"]
    source, rel = program.read_text(encoding="utf-8"), str(program.relative_to(REPO))
    if "torchfix" not in cold:
        cold["torchfix"] = torchfix_lint(source).wall_s
        cold["zoomer-fix"] = zoomer_fix(source, rel)[0].wall_s
    run.tools["torchfix"] = torchfix_lint(source)
    run.tools["zoomer-fix"], run.tools["zoomer-fix+opt-in"] = zoomer_fix(source, rel)
    if "zoomer-trace" in run.tools:
        a, b = run.tools["zoomer-trace"], run.tools["zoomer-fix"]
        run.tools["zoomer"] = ToolResult(detected=a.detected | b.detected, wall_s=a.wall_s + b.wall_s,
                                         error=a.error or b.error)


# --------------------------------------------------------------------------------------------
# Judging
# --------------------------------------------------------------------------------------------


def verdict(run: ScenarioRun, tool: str, pattern: str) -> str | None:
    """'tp', 'fn', 'fp', 'tn' for a judged (scenario, id), 'not-judged' for an incidental id that
    was reported, None otherwise (or when the tool did not run)."""
    res = run.tools.get(tool)
    if res is None:
        return None
    hit = pattern in res.detected
    if pattern == run.planted:
        return "tp" if hit else "fn"
    if pattern in (run.entry.get("must_not_show") or []):
        return "fp" if hit else "tn"
    return "not-judged" if hit else None


def score(runs: list[ScenarioRun], pattern_ids: tuple[str, ...]) -> dict[str, dict[str, dict[str, int]]]:
    """tool -> pattern id (and 'total') -> {tp, fp, fn, tn, not-judged}."""
    table: dict[str, dict[str, dict[str, int]]] = {}
    for tool in TOOLS:
        per: dict[str, dict[str, int]] = {}
        total = dict.fromkeys(("tp", "fp", "fn", "tn", "not-judged"), 0)
        for p in pattern_ids:
            cell = dict.fromkeys(("tp", "fp", "fn", "tn", "not-judged"), 0)
            for run in runs:
                v = verdict(run, tool, p)
                if v is not None:
                    cell[v] += 1
                    total[v] += 1
            per[p] = cell
        per["total"] = total
        table[tool] = per
    return table


def ratio(num: int, den: int) -> float | None:
    return None if den == 0 else num / den


def covered_ids(tool: str) -> set[str] | None:
    """The Zoomer ids a peer has a detector for (None: a Zoomer tool, every id)."""
    if tool == "pattern-matcher":
        return {z for z in PATTERN_MATCHER_MAP.values() if z}
    if tool == "torchfix":
        return {z for z in TORCHFIX_MAP.values() if z}
    return None


def peer_right_zoomer_wrong(runs: list[ScenarioRun], pattern_ids: tuple[str, ...]) -> list[dict[str, Any]]:
    """Judged (scenario, id) where a peer is right (TP or TN) and a Zoomer tool wrong (FN or FP)."""
    cases = []
    for run in runs:
        for peer in PEERS:
            for p in pattern_ids:
                pv = verdict(run, peer, p)
                if pv not in ("tp", "tn") or (pv == "tn" and p not in (covered_ids(peer) or set())):
                    continue  # a peer with no detector for the id is not "right" by staying quiet
                wrong = {z: verdict(run, z, p) for z in ("zoomer-trace", "zoomer-fix", "zoomer")}
                if any(v in ("fn", "fp") for v in wrong.values()):
                    cases.append({"scenario": run.name, "pattern": p, "peer": peer, "peer_verdict": pv,
                                  "zoomer": wrong})
    return cases


def zoomer_right_peer_wrong(runs: list[ScenarioRun], pattern_ids: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """peer -> id -> judged cases where Zoomer (trace or fix) is right and the peer wrong."""
    out: dict[str, dict[str, int]] = {}
    for peer in PEERS:
        for run in runs:
            for p in pattern_ids:
                if verdict(run, peer, p) in ("fn", "fp") and verdict(run, "zoomer", p) in ("tp", "tn"):
                    out.setdefault(peer, {}).setdefault(p, 0)
                    out[peer][p] += 1
    return out


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def fmt_ratio(x: float | None) -> str:
    return "  -  " if x is None else f"{x:5.2f}"


def print_report(doc: dict[str, Any]) -> None:
    pattern_ids = doc["pattern_ids"]
    scores = doc["scores"]
    print(f"# bench_peers_torch: {len(doc['scenarios'])} scenario(s), {doc['date']}, torch {doc['torch']}, "
          f"torchfix {doc['torchfix']}, knobs {doc['knobs']}")
    print("\n## Per scenario (detected Zoomer ids; [no Zoomer id] peer hits)")
    for s in doc["scenarios"]:
        print(f"{s['name']}  planted: {s['planted'] or 'clean'}  record: "
              f"{'ok' if s['record'].get('ok') else 'FAILED rc=' + str(s['record'].get('rc'))} {s['record'].get('wall_s')} s")
        for tool in TOOLS:
            t = s["tools"].get(tool)
            if t is None:
                print(f"    {tool:18s} (did not run)")
                continue
            extra = f"  [no Zoomer id: {', '.join(f'{k} x{v}' for k, v in t['unmapped'].items())}]" if t["unmapped"] else ""
            if tool == "pattern-matcher" and t["evidence"].get("matched"):
                extra += "  (matched events: " + ", ".join(f"{k} {v}" for k, v in t["evidence"]["matched"].items()) + ")"
            elif tool == "torchfix" and t["evidence"].get("lines"):
                extra += "  (" + ", ".join(f"{k} line {','.join(map(str, v))}" for k, v in t["evidence"]["lines"].items()) + ")"
            err = f"  ERROR {t['error']}" if t["error"] else ""
            print(f"    {tool:18s} {', '.join(t['detected']) or '-'}{extra}{err}")
    print("\n## Per tool and pattern (TP/FP/FN; TN; not judged = incidental ids reported)")
    print(f"{'tool':18s} {'pattern':24s} {'TP':>3s} {'FP':>3s} {'FN':>3s} {'TN':>4s} {'n.j.':>4s} {'prec':>5s} {'recall':>6s}")
    for tool in TOOLS:
        covered = covered_ids(tool)
        for p in [*pattern_ids, "total"]:
            c = scores[tool][p]
            if p != "total" and not (c["tp"] or c["fp"] or c["fn"] or c["not-judged"]):
                continue
            note = "" if covered is None or p == "total" or p in covered else "  (no detector)"
            print(f"{tool:18s} {p:24s} {c['tp']:3d} {c['fp']:3d} {c['fn']:3d} {c['tn']:4d} {c['not-judged']:4d} "
                  f"{fmt_ratio(ratio(c['tp'], c['tp'] + c['fp']))} {fmt_ratio(ratio(c['tp'], c['tp'] + c['fn']))}{note}")
        if covered is not None:
            t = {k: sum(scores[tool][p][k] for p in covered) for k in ("tp", "fp", "fn", "tn")}
            print(f"{tool:18s} {'total, ids it covers':24s} {t['tp']:3d} {t['fp']:3d} {t['fn']:3d} {t['tn']:4d} {'':4s} "
                  f"{fmt_ratio(ratio(t['tp'], t['tp'] + t['fp']))} {fmt_ratio(ratio(t['tp'], t['tp'] + t['fn']))}")
        print()
    print("## What a peer reports that has no Zoomer id (Zoomer cannot see these)")
    unmapped = doc["unmapped"]
    if not any(unmapped.values()):
        print("(none on these scenarios)")
    for peer, hits in unmapped.items():
        for name, scen in hits.items():
            print(f"{peer:18s} {name:40s} on {', '.join(scen)}")
    print("Peer patterns with no Zoomer id at all: "
          + ", ".join([f"pattern-matcher {n}" for n, z in PATTERN_MATCHER_MAP.items() if z is None]
                      + ["torchfix every rule but " + ", ".join(TORCHFIX_MAP)]))
    print("\n## Peer right, Zoomer wrong")
    if not doc["peer_right_zoomer_wrong"]:
        print("(none)")
    for c in doc["peer_right_zoomer_wrong"]:
        z = ", ".join(f"{k} {v or '-'}" for k, v in c["zoomer"].items())
        print(f"{c['scenario']:30s} {c['pattern']:24s} {c['peer']} {c['peer_verdict'].upper()}; {z}")
    print("\n## Zoomer right, peer wrong (count of judged cases)")
    for peer, per in doc["zoomer_right_peer_wrong"].items():
        print(f"{peer:18s} " + ", ".join(f"{p} {n}" for p, n in sorted(per.items())))
    print("\n## Wall time (seconds; the pattern matcher runs inside the profiled process, on the live profile)")
    print(f"{'tool':18s} {'total':>8s} {'mean':>8s} {'max':>8s}  runs")
    for tool, t in doc["timing"].items():
        print(f"{tool:18s} {t['total_s']:8.3f} {t['mean_s']:8.3f} {t['max_s']:8.3f}  {t['runs']}")
    print("first calls (lazy loading, not in the figures above): "
          + ", ".join(f"{k} {v:.3f} s" for k, v in doc.get("first_call_s", {}).items())
          + "; the pattern matcher runs once per (new) profiled process")
    if doc["skipped"]:
        print("\n## Not run")
        for name, why in doc["skipped"].items():
            print(f"{name:30s} {why}")


def timing(runs: list[ScenarioRun]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    series: dict[str, list[float]] = {t: [r.tools[t].wall_s for r in runs if t in r.tools] for t in TOOLS}
    series["record (program + profiler)"] = [r.record["wall_s"] for r in runs if r.record.get("ok")]
    series["trace export"] = [r.record["export_wall_s"] for r in runs if r.record.get("export_wall_s") is not None]
    for name, xs in series.items():
        if xs:
            out[name] = {"total_s": sum(xs), "mean_s": sum(xs) / len(xs), "max_s": max(xs), "runs": len(xs)}
    return out


def build_doc(runs: list[ScenarioRun], manifest: dict[str, Any], knobs: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    from zoomer_ar.models import PATTERN_IDS
    import torch
    from importlib.metadata import version

    unmapped: dict[str, dict[str, list[str]]] = {p: {} for p in PEERS}
    for run in runs:
        for peer in PEERS:
            for name in (run.tools[peer].unmapped if peer in run.tools else {}):
                unmapped[peer].setdefault(name, []).append(run.name)
    ran = {r.name for r in runs}
    skipped = {n: "GPU-only program (needs CUDA; not run on CPU)" for n in manifest.get("gpu_scenarios") or {}}
    return {
        "schema": "zoomer-ar.bench-peers-torch/1",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", "benchmarks/bench_peers_torch.py", *argv]),
        "host": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "torch": torch.__version__,
        "torchfix": version("torchfix"),
        "knobs": knobs,
        "pattern_ids": list(PATTERN_IDS),
        "mapping": {"pattern-matcher": PATTERN_MATCHER_MAP, "torchfix": TORCHFIX_MAP,
                    "torchfix_selection": "ALL (TorchFix's default leaves out " + ", ".join(TORCHFIX_DEFAULT_OFF) + ")"},
        "scenarios": [{"name": r.name, "planted": r.planted, "record": r.record,
                       "tools": {t: r.tools[t].as_json() for t in TOOLS if t in r.tools}} for r in runs],
        "scores": score(runs, PATTERN_IDS),
        "unmapped": unmapped,
        "peer_right_zoomer_wrong": peer_right_zoomer_wrong(runs, PATTERN_IDS),
        "zoomer_right_peer_wrong": zoomer_right_peer_wrong(runs, PATTERN_IDS),
        "timing": timing(runs),
        "skipped": {n: why for n, why in skipped.items() if n not in ran},
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Zoomer's detection against torch's profiler pattern matcher and TorchFix.")
    ap.add_argument("--scenarios", help="comma-separated scenario names (default: every CPU scenario)")
    ap.add_argument("--json", metavar="OUT", help="write the figures as JSON to OUT")
    ap.add_argument("--tiny", action="store_true",
                    help=f"smoke test: {TINY} (default scenarios {','.join(DEFAULT_TINY_SCENARIOS)})")
    ap.add_argument("--steps", type=int, help="recorded steps per program (default: the program's, 5)")
    ap.add_argument("--skip", type=int, help="steps before profiling (default: the program's, 3)")
    ap.add_argument("--warmup", type=int, help="profiler warm-up steps (default: the program's, 1)")
    ap.add_argument("--severity", choices=("low", "mid", "high"), help="default: the program's, mid")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per program (default 300)")
    ap.add_argument("--work", help="folder for the traces and peer reports (default: a temporary one, removed)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--child-matcher", help=argparse.SUPPRESS)
    ap.add_argument("program_args", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for name in ("steps", "skip", "warmup"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "steps" else 0):
            raise BadInput(f"--{name} {value}: must be >= {1 if name == 'steps' else 0}")
    if args.timeout <= 0:
        raise BadInput("--timeout must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
        if args.child:
            return child_main(args.child, args.child_out, args.child_matcher, args.program_args)
        manifest = load_manifest()
        if args.scenarios is not None and not args.scenarios.strip(", "):
            raise BadInput("--scenarios: no scenario named")
        wanted = args.scenarios or (",".join(DEFAULT_TINY_SCENARIOS) if args.tiny else None)
        names = select_scenarios(manifest, wanted)
        for mod in ("torch", "torchfix"):
            try:
                __import__(mod)
            except ImportError as exc:
                raise BadInput(f"{mod} is not importable ({exc}); install it (torchfix: pip install --no-deps torchfix==0.7.0)")
        if args.json and (Path(args.json).is_dir() or not Path(args.json).resolve().parent.is_dir()):
            raise BadInput(f"--json {args.json}: is a folder, or its folder does not exist")
        if args.work and Path(args.work).exists() and not Path(args.work).is_dir():
            raise BadInput(f"--work {args.work}: not a folder")
    except BadInput as exc:
        print(f"bench_peers_torch: {exc}", file=sys.stderr)
        return 2
    knobs = dict(TINY) if args.tiny else {}
    knobs.update({k: getattr(args, k) for k in ("steps", "skip", "warmup", "severity") if getattr(args, k) is not None})
    # import every tool before the clock starts: no tool's first run pays for imports
    import zoomer_ar.analyze  # noqa: F401
    import zoomer_ar.fix.api  # noqa: F401
    import torchfix.torchfix  # noqa: F401

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="zoomer-bench-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = [ScenarioRun(n, manifest["scenarios"][n]) for n in names]
    cold: dict[str, float] = {}
    try:
        for run in runs:
            run_scenario(run, work, knobs, args.timeout, cold)
            if not run.record.get("ok"):
                print(f"bench_peers_torch: {run.name}: recording failed (rc {run.record.get('rc')}):\n"
                      f"{run.record.get('log_tail', '')}", file=sys.stderr)
        doc = build_doc(runs, manifest, knobs, argv)
        doc["first_call_s"] = {k: round(v, 4) for k, v in cold.items()}
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print_report(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    return 0 if all(r.record.get("ok") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
