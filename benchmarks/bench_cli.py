"""End-to-end benchmark: what a user waits for from `zoomer-ar analyze`, against HTA and against an
earlier revision of this tool, measured in the same run.

    python benchmarks/bench_cli.py                               # 3 traces, 5 fresh processes each
    python benchmarks/bench_cli.py --baseline-rev 17f4d17 --repeat 7
    python benchmarks/bench_cli.py --no-hta --traces kineto/resnet50_num_workers_0

bench_load.py times load + features inside a warm process; a user runs a command. Here every run is
a fresh `python -m zoomer_ar.cli analyze TRACE --out DIR --no-progress` (interpreter start, imports,
load, features, rules, model, findings.json, report.md, report.html, relaunch.yaml, optimize.ipynb),
timed from outside as wall time, with the process's CPU time and peak RSS (os.wait4's rusage of it).
Peers, each in fresh processes too:
  hta       `TraceAnalysis(trace_dir=...)` + `get_temporal_breakdown(visualize=False)`, imports
            included (HTA's own start: what its user waits for); single files are symlinked into a
            folder of their own, as HTA wants;
  baseline  (--baseline-rev REV) the same analyze command from a git worktree of REV, with this
            tree's compiled event reader copied in (both read events at the same speed), so the
            ratio is what changed between the revisions.
Each tool runs once untimed first (its modules compiled into a cache outside the checkouts, as an
installed package has them, and the files in the OS cache), then --repeat times; the medians are kept. Nothing is asserted; the script prints a table and, with --json,
writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED_TRACES = Path(os.environ.get("ZOOMER_SHARED_TRACES", REPO.parent / "shared" / "traces"))
DEFAULT_TRACES = ["kineto/resnet50_num_workers_0", "hta/df_index_resolver", "param/dlrm_8ranks"]

HTA_CODE = (
    "import logging, sys; logging.disable(logging.WARNING)\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)\n"
)


def _run(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one fresh process, from os.wait4's rusage of
    that process (its CPU and its high-water mark, children it waited for included)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}: {err.strip()[-400:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def _median(runs: list[tuple[float, float, float]]) -> dict:
    return {"wall_s": statistics.median(r[0] for r in runs), "cpu_s": statistics.median(r[1] for r in runs),
            "peak_mb": statistics.median(r[2] for r in runs), "runs": [round(r[0], 3) for r in runs]}


def _worktree(rev: str, root: Path) -> Path:
    wt = root / f"baseline-{rev}"
    subprocess.run(["git", "worktree", "add", "--detach", str(wt), rev], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for so in (REPO / "zoomer_ar" / "load").glob("_fastjson*.so"):
        shutil.copy2(so, wt / "zoomer_ar" / "load" / so.name)
    return wt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="*", default=DEFAULT_TRACES, help="paths under ../shared/traces (or absolute)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--baseline-rev", default=None, help="also time the analyze command of this git revision")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="zoomer-bench-cli-"))
    wt = _worktree(args.baseline_rev, tmp) if args.baseline_rev else None
    # compiled modules cached (outside the checkouts), as an installed package has them: a session
    # that sets PYTHONDONTWRITEBYTECODE would otherwise compile a source checkout on every run
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    base["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    results = []
    try:
        for name in args.traces:
            path = Path(name) if Path(name).is_absolute() else SHARED_TRACES / name
            row: dict = {"trace": name}
            tools: dict[str, tuple[list[str], Path, dict]] = {}
            for label, root in (("zoomer", REPO), ("baseline", wt)):
                if root is None:
                    continue
                env = dict(base, PYTHONPATH=str(root), ZOOMER_NO_PROGRESS="1")
                out = tmp / f"out-{label}"
                tools[label] = ([py, "-m", "zoomer_ar.cli", "analyze", str(path), "--out", str(out), "--no-progress"],
                                root, env)
            if not args.no_hta:
                hta_dir = path
                if path.is_file():
                    hta_dir = tmp / f"hta-{path.name}"
                    hta_dir.mkdir(exist_ok=True)
                    link = hta_dir / path.name
                    if not link.exists():
                        link.symlink_to(path)
                tools["hta"] = ([py, "-c", HTA_CODE, str(hta_dir)], tmp, dict(base))
            runs: dict[str, list] = {k: [] for k in tools}
            for cmd, cwd, env in tools.values():  # warm-up, not counted: modules compiled, files in the OS cache
                _run(cmd, cwd, env)
            for _ in range(args.repeat):  # interleaved: a slow spell of the machine hits every tool alike
                for label, (cmd, cwd, env) in tools.items():
                    runs[label].append(_run(cmd, cwd, env))
            for label in tools:
                row[label] = _median(runs[label])
            results.append(row)
            z = row["zoomer"]
            line = f"{name:<34} zoomer {z['wall_s']:6.2f} s (CPU {z['cpu_s']:5.2f}, {z['peak_mb']:4.0f} MB)"
            if "baseline" in row:
                b = row["baseline"]
                line += (f" | {args.baseline_rev} {b['wall_s']:6.2f} s ({b['peak_mb']:4.0f} MB): "
                         f"{b['wall_s'] / z['wall_s']:4.1f}x")
            if "hta" in row:
                h = row["hta"]
                line += (f" | HTA {h['wall_s']:6.2f} s (CPU {h['cpu_s']:5.2f}, {h['peak_mb']:4.0f} MB): "
                         f"{h['wall_s'] / z['wall_s']:4.1f}x")
            print(line, flush=True)
    finally:
        if wt is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=REPO, check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            subprocess.run(["git", "worktree", "prune"], cwd=REPO, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"repeat": args.repeat, "baseline_rev": args.baseline_rev, "results": results},
                                        indent=1))


if __name__ == "__main__":
    main()
