"""Record the scenario programs into trace folders, one sub-folder per program.

    python training_data/scenarios/record.py                      # all, into examples/traces/
    python training_data/scenarios/record.py --out /tmp/traces --only sync_point,sync_point_clean
    python training_data/scenarios/record.py --list
    python training_data/scenarios/record.py --device cuda --out examples/gpu   # on a GPU machine

With `--device cuda` every program runs on the GPU (the profiler then records kernels, memcpys and
runtime calls too) and the GPU-only programs (MANIFEST.yaml `gpu_scenarios`: patterns a CPU cannot
show, such as pageable-memcpy and allocator-churn) are recorded as well. The CPU programs spell
their device out (`torch.device("cpu")`: the CPU-only fixers key on it), so on a GPU each runs as
its *GPU variant*: a copy, in a temporary folder, with the line-preserving substitutions in
GPU_SUBSTITUTIONS (the device, the autocast device type, pinned DataLoader memory). Line numbers
and function names are those of the committed programs, so the traces' stacks map onto them.

Each program in MANIFEST.yaml runs as its own subprocess (the project's .venv python when there is
one, else this interpreter) and writes `<out>/<name>/rank-0.pt.trace.json.gz` and
`<out>/<name>/job.json`. Programs run one after another so their timings do not disturb each
other. A recording whose step times are uneven (slowest step more than --max-jitter times the
fastest: the machine was busy with something else) is recorded again, up to --retries times, and
the steadiest attempt is kept; before each recording it waits (up to --quiet-wait seconds) for
other processes to leave the CPUs idle. Exit status: 0 when every program recorded a trace, 1 otherwise.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MANIFEST = HERE / "MANIFEST.yaml"
DEFAULT_OUT = REPO / "examples" / "traces"
TRACE_NAME = "rank-0.pt.trace.json.gz"


# A CPU program's GPU variant: these replacements, each within one line, in every program that
# spells out the CPU device. The GPU-only programs read `--device` and are copied unchanged.
GPU_SUBSTITUTIONS = (
    ('torch.device("cpu")', 'torch.device("cuda")'),
    ('torch.autocast("cpu", ', 'torch.autocast("cuda", '),
    ("pin_memory=False", "pin_memory=True"),
)


def gpu_variants(dest: Path, src: Path = HERE) -> Path:
    """Write the GPU variant of every program (and _common.py) in `src` into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if 'torch.device("cpu")' in text:
            for old, new in GPU_SUBSTITUTIONS:
                text = text.replace(old, new)
        (dest / path.name).write_text(text, encoding="utf-8")
    return dest


def load_manifest(path: Path = MANIFEST) -> dict:
    import yaml

    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def default_python() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def select(scenarios: dict, only: list[str] | None) -> list[str]:
    names = list(scenarios)
    if not only:
        return names
    wanted: list[str] = []
    for item in only:
        wanted.extend(n.strip() for n in item.split(",") if n.strip())
    unknown = [n for n in wanted if n not in scenarios]
    if unknown:
        raise SystemExit(f"record.py: unknown scenario(s): {', '.join(unknown)}; known: {', '.join(names)}")
    return [n for n in names if n in wanted]


def step_durations(trace: Path) -> list[float]:
    """Durations (ms) of the host-side ProfilerStep#N annotations in a trace, in order."""
    with gzip.open(trace, "rt", encoding="utf-8") as fh:
        events = json.load(fh)["traceEvents"]
    steps = sorted(
        (e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
         and e.get("cat") != "gpu_user_annotation"),  # a GPU trace repeats each step on the GPU's timeline
        key=lambda e: e["ts"],
    )
    return [e["dur"] / 1000.0 for e in steps]


def jitter(durations: list[float]) -> float:
    """Slowest step over the fastest step (1.0 = perfectly even)."""
    if not durations or min(durations) <= 0:
        return float("inf")
    return max(durations) / min(durations)


def cpu_busy(interval: float = 0.5) -> float | None:
    """Fraction of all CPUs busy over `interval` seconds (Linux /proc/stat), None elsewhere."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return idle, sum(fields)

    try:
        idle0, total0 = sample()
        time.sleep(interval)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return 1.0 - (idle1 - idle0) / total if total > 0 else None


def wait_until_quiet(max_wait: float, threshold: float = 0.25) -> float | None:
    """Wait (up to max_wait seconds) until other processes leave the CPUs mostly idle; returns
    the last busy fraction seen."""
    deadline = time.monotonic() + max_wait
    busy = cpu_busy()
    while busy is not None and busy > threshold and time.monotonic() < deadline:
        time.sleep(1.0)
        busy = cpu_busy()
    return busy


def record_one(
    name: str,
    entry: dict,
    out_root: Path,
    *,
    python: str,
    steps: int | None,
    skip: int | None,
    warmup: int | None,
    severity: str | None,
    timeout: float,
    device: str = "cpu",
    programs: Path = HERE,
) -> dict:
    out_dir = out_root / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    cmd = [python, entry["file"], "--out", str(out_dir), "--device", device]
    for flag, value in (("--steps", steps), ("--skip", skip), ("--warmup", warmup), ("--severity", severity)):
        if value is not None:
            cmd += [flag, str(value)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=programs, env=env, capture_output=True, text=True, timeout=timeout)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = 124, exc.stdout or "", (exc.stderr or "") + f"\ntimed out after {timeout}s"
        if isinstance(stdout, bytes):
            stdout = stdout.decode(errors="replace")
        if isinstance(stderr, bytes):
            stderr = stderr.decode(errors="replace")
    wall = time.perf_counter() - t0
    trace = out_dir / TRACE_NAME
    ok = rc == 0 and trace.exists() and (out_dir / "job.json").exists()
    durations = step_durations(trace) if ok else []
    result = {
        "name": name,
        "ok": ok,
        "rc": rc,
        "wall_s": round(wall, 2),
        "trace": str(trace),
        "size_bytes": trace.stat().st_size if trace.exists() else 0,
        "pattern": entry.get("pattern"),
        "step_ms": [round(d, 2) for d in durations],
        "jitter": round(jitter(durations), 2) if ok else None,
    }
    if not ok:
        tail = "\n".join((stdout + "\n" + stderr).strip().splitlines()[-15:])
        result["log_tail"] = tail
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record the scenario programs into trace folders.")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--only", action="append", help="comma-separated scenario names (repeatable)")
    parser.add_argument("--steps", type=int, help="steps to record (default: each program's, 5)")
    parser.add_argument("--skip", type=int, help="steps before profiling (default: each program's, 3)")
    parser.add_argument("--warmup", type=int, help="profiler warm-up steps (default: each program's, 1)")
    parser.add_argument("--severity", choices=("low", "mid", "high"), help="default: each program's, mid")
    parser.add_argument("--python", default=default_python(), help="interpreter to run the programs with")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per program (default 180)")
    parser.add_argument("--retries", type=int, default=3, help="re-recordings of an uneven trace (default 3)")
    parser.add_argument("--max-jitter", type=float, default=1.6,
                        help="slowest/fastest step time above which a trace counts as uneven (default 1.6)")
    parser.add_argument("--quiet-wait", type=float, default=30.0,
                        help="seconds to wait, before each recording, for other processes to leave the "
                             "CPUs idle (default 30; 0 = do not wait)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="run the programs on the CPU (default) or the GPU; cuda adds the GPU-only programs")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)

    manifest = load_manifest()
    scenarios = dict(manifest["scenarios"])
    if args.device == "cuda" or args.list:
        scenarios.update(manifest.get("gpu_scenarios") or {})
    if args.list:
        for name, entry in scenarios.items():
            extra = f"twin of {entry['twin_of']}" if entry.get("twin_of") else entry.get("pattern", "")
            print(f"{name:32s} {entry['file']:36s} {extra}")
        return 0

    names = select(scenarios, args.only)
    out_root = Path(args.out).resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    programs = gpu_variants(Path(tempfile.mkdtemp(prefix="zoomer-scenarios-cuda-"))) if args.device == "cuda" else HERE
    results = []
    t0 = time.perf_counter()
    if hasattr(os, "getloadavg") and os.getloadavg()[0] > 0.75 * (os.cpu_count() or 1):
        print(f"warning: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: timings will be noisy",
              file=sys.stderr)
    for name in names:
        best = None
        for attempt in range(1 + max(0, args.retries)):
            if args.quiet_wait > 0:
                wait_until_quiet(args.quiet_wait)
            res = record_one(
                name,
                scenarios[name],
                out_root / ".attempt" if attempt else out_root,
                python=args.python,
                steps=args.steps,
                skip=args.skip,
                warmup=args.warmup,
                severity=args.severity,
                timeout=args.timeout,
                device=args.device,
                programs=programs,
            )
            if attempt and res["ok"] and (best is None or not best["ok"] or res["jitter"] < best["jitter"]):
                # keep the steadier attempt in place
                shutil.rmtree(out_root / name, ignore_errors=True)
                shutil.move(str(out_root / ".attempt" / name), str(out_root / name))
                res["trace"] = str(out_root / name / TRACE_NAME)
                res["attempts"] = attempt + 1
                best = res
            elif best is None:
                best = res
            if not best["ok"] or best["jitter"] <= args.max_jitter:
                break
        shutil.rmtree(out_root / ".attempt", ignore_errors=True)
        res = best
        results.append(res)
        status = "ok  " if res["ok"] else "FAIL"
        uneven = "" if not res["ok"] or res["jitter"] <= args.max_jitter else "  (uneven)"
        steps_ms = " ".join(f"{d:.1f}" for d in res["step_ms"])
        print(f"{status} {name:32s} {res['size_bytes'] / 1024:8.1f} KiB {res['wall_s']:6.1f} s  "
              f"steps ms: {steps_ms}{uneven}", flush=True)
        if not res["ok"]:
            print("     " + res.get("log_tail", "").replace("\n", "\n     "), file=sys.stderr)
    if programs != HERE:
        shutil.rmtree(programs, ignore_errors=True)
    total = sum(r["size_bytes"] for r in results)
    failed = [r["name"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)}/{len(results)} recorded into {out_root}: "
          f"{total / 1024:.1f} KiB, {time.perf_counter() - t0:.1f} s")
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
