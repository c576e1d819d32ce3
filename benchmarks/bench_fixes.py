"""Verified fixes: per planted scenario, the gain the finding predicted beside the gain measured.

For each planted program of training_data/scenarios (MANIFEST.yaml), in a scratch copy of the
scenario folder:

1. record the program as planted and analyse the trace: the planted finding's
   `impact.ms_per_step` is the *predicted* gain;
2. fix the planted file with the planted pattern's fixers only (`fix_source(select=[pattern])`,
   so an incidental finding's fix, e.g. bf16 autocast for the fp32 GEMMs every program has, does
   not blur the figure) and record it again;
3. repeat 1-2 `--repeat` times, alternating before/after runs so that machine load hits both
   alike; the *measured* gain is median(before step medians) - median(after step medians).

Step times are the ProfilerStep durations of the recorded traces (the same instrument the
prediction comes from). A table is printed; `--json` writes the figures. Should a planted
pattern have no fix, the "after" runs are its hand-made clean twin, marked as such (`--no-twins`
lists it without measurements); today every planted pattern has one.

    python benchmarks/bench_fixes.py                         # all planted scenarios, 3 rounds
    python benchmarks/bench_fixes.py --only extra_copy,sync_point --repeat 5 --steps 10
    python benchmarks/bench_fixes.py --json /tmp/fixes.json

The functions here are also the harness of tests/test_verified_fixes.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCEN = REPO / "training_data" / "scenarios"
TRACE = "rank-0.pt.trace.json.gz"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


# --------------------------------------------------------------------------------------------
# Harness (shared with tests/test_verified_fixes.py)
# --------------------------------------------------------------------------------------------


def python() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def manifest() -> dict:
    import yaml

    return yaml.safe_load((SCEN / "MANIFEST.yaml").read_text(encoding="utf-8"))["scenarios"]


def planted() -> dict[str, dict]:
    return {n: e for n, e in manifest().items() if e["pattern"] != "clean"}


def git(src: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_AUTHOR_NAME="zoomer", GIT_AUTHOR_EMAIL="z@example.invalid",
               GIT_COMMITTER_NAME="zoomer", GIT_COMMITTER_EMAIL="z@example.invalid")
    return subprocess.run(["git", *args], cwd=src, env=env, capture_output=True, text=True, check=check)


def workspace(dst: Path) -> Path:
    """A scratch git repository holding a copy of the scenario programs (and nothing else)."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in SCEN.iterdir():
        if p.is_file() and (p.suffix == ".py" or p.name == "MANIFEST.yaml"):
            shutil.copy2(p, dst / p.name)
    git(dst, "init", "-q")
    git(dst, "add", "-A")
    git(dst, "commit", "-q", "-m", "scenarios")
    return dst


def record(src: Path, program: str, out: Path, *, steps: int = 6, skip: int = 2, warmup: int = 1,
           timeout: float = 300.0) -> Path:
    """Run one scenario program under the profiler; returns the trace folder."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    cmd = [python(), program, "--out", str(out), "--steps", str(steps), "--skip", str(skip), "--warmup", str(warmup)]
    proc = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not (out / TRACE).is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{program} failed (rc {proc.returncode}):\n{tail}")
    return out


def step_ms(trace_dir: Path) -> list[float]:
    """ProfilerStep#N durations (ms), in order."""
    import gzip

    with gzip.open(trace_dir / TRACE, "rt", encoding="utf-8") as fh:
        events = json.load(fh)["traceEvents"]
    steps = sorted((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    return [e["dur"] / 1000.0 for e in steps]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def analyze(trace_dir: Path):
    from zoomer_ar.analyze import analyze_path

    return analyze_path(trace_dir)


def analyze_with_source(trace_dir: Path, src: Path, out: Path, fix_select: str | None = None):
    """`zoomer-ar analyze TRACE --source SRC --out OUT [--fix-select IDS]`: (Analysis from
    findings.json, patch.diff or None)."""
    from zoomer_ar.cli import main
    from zoomer_ar.models import Analysis

    argv = ["analyze", str(trace_dir), "--source", str(src), "--out", str(out), "--no-progress"]
    rc = main(argv + (["--fix-select", fix_select] if fix_select else []))
    if rc not in (0, None):
        raise RuntimeError(f"zoomer-ar analyze exited {rc}")
    analysis = Analysis.model_validate(json.loads((out / "findings.json").read_text()))
    patch = out / "patch.diff"
    return analysis, (patch if patch.is_file() else None)


def patch_selection(analysis, fix_select: str | None = None) -> list[str]:
    """The fixers `analyze --source [--fix-select IDS]` builds its patch with."""
    from zoomer_ar.analyze_cli import patch_fixers

    return patch_fixers(analysis.findings, fix_select)[0]


def patch_files(analysis) -> list[str] | None:
    """The files `analyze --source` patches (empty when nothing resolves: no file is patched): see sourcemap.files_ran."""
    from zoomer_ar.sourcemap import files_ran

    return files_ran(analysis)


def finding(analysis, pattern: str):
    return next((f for f in analysis.findings if f.pattern == pattern), None)


def planted_fix(source: str, pattern: str) -> str:
    """The planted file fixed by the planted pattern's fixers only."""
    from zoomer_ar.fix.api import fix_source

    return fix_source(source, [pattern])


# --------------------------------------------------------------------------------------------
# Benchmark
# --------------------------------------------------------------------------------------------


def bench_one(name: str, entry: dict, root: Path, *, repeat: int, steps: int, skip: int, twins: bool = True) -> dict:
    pattern = entry["pattern"]
    src = workspace(root / name / "src")
    path = src / entry["file"]
    original = path.read_text(encoding="utf-8")
    fixed = planted_fix(original, pattern)
    row: dict = {"scenario": name, "pattern": pattern}
    program = {"before": entry["file"], "after": entry["file"]}
    if fixed == original:
        if not twins:
            row["note"] = "no fix (report only)"
            return row
        # report only: measure the hand-made clean twin instead (not a behaviour-preserving fix)
        program["after"] = manifest()[entry["twin"]]["file"]
        row["after_is_twin"] = True
    befores, afters, predicted, gone = [], [], [], None
    for r in range(repeat):
        for label, text in (("before", original), ("after", fixed)) if r % 2 == 0 else (("after", fixed), ("before", original)):
            path.write_text(text, encoding="utf-8")
            trace = record(src, program[label], root / name / f"{label}-{r}", steps=steps, skip=skip)
            ms = median(step_ms(trace))
            if label == "before":
                befores.append(ms)
                f = finding(analyze(trace), pattern)
                predicted.append(f.impact.ms_per_step if f is not None else 0.0)
            else:
                afters.append(ms)
                if r == repeat - 1 or gone is None:
                    gone = finding(analyze(trace), pattern) is None
    path.write_text(original, encoding="utf-8")
    b, a, p = median(befores), median(afters), median(predicted)
    row.update(
        predicted_ms=round(p, 3),
        measured_ms=round(b - a, 3),
        ratio=round((b - a) / p, 2) if p > 0 else None,
        before_ms=round(b, 3),
        after_ms=round(a, 3),
        before_runs=[round(x, 3) for x in befores],
        after_runs=[round(x, 3) for x in afters],
        finding_gone=gone,
    )
    return row


def render(rows: list[dict]) -> str:
    head = f"{'scenario':26s} {'pattern':24s} {'predicted':>10s} {'measured':>10s} {'ratio':>7s} {'before':>9s} {'after':>9s}  gone"
    lines = [head, "-" * len(head)]
    for r in rows:
        if "note" in r:
            lines.append(f"{r['scenario']:26s} {r['pattern']:24s} {r['note']}")
            continue
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(
            f"{r['scenario']:26s} {r['pattern']:24s} {r['predicted_ms']:10.3f} {r['measured_ms']:10.3f} {ratio:>7s} "
            f"{r['before_ms']:9.3f} {r['after_ms']:9.3f}  {'yes' if r['finding_gone'] else 'no'}"
            + ("  (after = the clean twin: report only)" if r.get("after_is_twin") else "")
        )
    lines.append("ms per step; predicted = the finding's impact.ms_per_step; measured = median step before - after;"
                 " ratio = measured / predicted")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", help="comma-separated scenario names")
    ap.add_argument("--repeat", type=int, default=3, help="before/after rounds (default 3)")
    ap.add_argument("--steps", type=int, default=10, help="profiled steps per run (default 10)")
    ap.add_argument("--skip", type=int, default=3, help="steps before profiling (default 3)")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed)")
    ap.add_argument("--json", dest="json_out", default=None, help="write the rows as JSON here")
    ap.add_argument("--no-twins", action="store_true",
                    help="skip report-only scenarios instead of measuring their clean twin")
    args = ap.parse_args(argv)
    scen = planted()
    names = list(scen)
    if args.only:
        wanted = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(scen))
        if unknown:
            ap.error(f"unknown scenario(s): {', '.join(unknown)}")
        names = [n for n in names if n in wanted]
    import tempfile

    root = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="zoomer-bench-fixes-"))
    rows = []
    t0 = time.perf_counter()
    try:
        for name in names:
            t1 = time.perf_counter()
            row = bench_one(name, scen[name], root, repeat=args.repeat, steps=args.steps, skip=args.skip, twins=not args.no_twins)
            rows.append(row)
            print(f"  {name}: {time.perf_counter() - t1:.0f} s", file=sys.stderr, flush=True)
    finally:
        if not args.work:
            shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(render(rows))
    print(f"{len(rows)} scenarios, {args.repeat} rounds, {args.steps} steps per run, "
          f"{time.perf_counter() - t0:.0f} s, load average {load:.1f} on {os.cpu_count()} CPUs")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
