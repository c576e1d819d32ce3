"""Benchmark `zoomer-ar trace ...` (trace surgery) against what a user would do without it.

    python benchmarks/bench_surgery.py                          # a 0.2 GB tiled trace in /tmp/zoomer-bench
    python benchmarks/bench_surgery.py --size-gb 1 --reps 3
    python benchmarks/bench_surgery.py --trace path/to/trace.json --ref /tmp/surgery-ref   # before/after
    python benchmarks/bench_surgery.py --size-gb 0.002 --reps 1 --json out.json            # smoke run

Each command runs in a fresh process (`python -m zoomer_ar.cli trace ...`, as a user runs it), `--reps`
times; the median wall time is reported with the input's JSON megabytes per second and the peak
resident memory of the process (ru_maxrss). Next to it, a peer measured in the same run:

- slice, filter: the naive script a user would write: load the whole document (`json.load`),
  select the same events in Python (the steps' window by their ProfilerStep annotations / the
  categories), `json.dump` the result (and the same with msgspec, the fastest whole-document
  decoder): memory grows with the file where the surgery streams;
- compress: gzip's own speed on the same bytes (`gzip -6 -c`), the floor for a gzip output;
- split, merge, sample, check: no peer (the surgery's own figures).

`--ref DIR` also runs every command with another checkout (e.g. a git worktree of the code before a
change) and prints the speed-up. The trace is generated with benchmarks/gen_trace.py (tiling the
corpus's hta/ns_resolution_trace; `--synthetic` without the corpus) and reused when it exists; a job
folder of 4 ranks (each a quarter of the size) is made next to it for merge and sample.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import gen_trace  # noqa: E402

_NAIVE = r"""
import json, re, sys
mode, src, dst, a, b, lib = sys.argv[1:7]
if lib == "msgspec":
    import msgspec
    doc = msgspec.json.decode(open(src, "rb").read())
else:
    with open(src) as fh:
        doc = json.load(fh)
events = doc["traceEvents"]
if mode == "slice":  # the steps' window, then every event that overlaps it (metadata kept)
    lo, hi = int(a), int(b)
    steps = [e for e in events if e.get("ph") == "X" and re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))
             and lo <= int(e["name"].split("#")[1]) <= hi]
    w0 = min(e["ts"] for e in steps)
    w1 = max(e["ts"] + e["dur"] for e in steps)
    keep = [e for e in events
            if e.get("ph") == "M" or ("ts" in e and e["ts"] <= w1 and e["ts"] + e.get("dur", 0) >= w0)]
else:  # filter: drop a category
    keep = [e for e in events if e.get("ph") == "M" or e.get("cat") != a]
doc["traceEvents"] = keep
if lib == "msgspec":
    open(dst, "wb").write(msgspec.json.encode(doc))
else:
    with open(dst, "w") as fh:
        json.dump(doc, fh)
print(len(keep))
"""


_HWM = r"""
import atexit, os, runpy, sys
def _hwm():  # this process's own peak resident memory (not the parent's, which a fork starts from)
    try:
        with open("/proc/self/status") as fh:
            kb = next(int(l.split()[1]) for l in fh if l.startswith("VmHWM"))
    except (OSError, StopIteration):
        import resource
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(os.environ["BENCH_HWM_FILE"], "w") as fh:
        fh.write(str(kb))
atexit.register(_hwm)
mode, rest = sys.argv[1], sys.argv[2:]
if mode == "-m":
    sys.argv = [rest[0]] + rest[1:]
    runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = ["-c"] + rest
    exec(compile(mode, "<naive>", "exec"))
"""


def _run_rusage(cmd: list[str], *, env: dict | None = None, cwd: Path | None = None) -> dict:
    """Run one process: wall seconds, CPU seconds (os.wait4) and peak RSS in MB. A Python command
    (`python -m mod ...` or `python -c code ...`) reports its own peak (VmHWM) from inside: the
    ru_maxrss of a child counts the parent's memory it was forked from."""
    env = dict(os.environ if env is None else env)
    hwm = None
    if cmd[0] == sys.executable and cmd[1] in ("-m", "-c"):
        fd, hwm = tempfile.mkstemp(prefix="bench-hwm-")
        os.close(fd)
        env["BENCH_HWM_FILE"] = hwm
        cmd = [sys.executable, "-c", _HWM, "-m" if cmd[1] == "-m" else cmd[2], *cmd[2 if cmd[1] == "-m" else 3:]]
    t = time.perf_counter()
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, cwd=cwd)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read().decode(errors="replace"), fe.read().decode(errors="replace")
    rss = None
    if hwm is not None:
        try:
            rss = int(Path(hwm).read_text() or 0) / 1024
        except (OSError, ValueError):
            rss = None
        Path(hwm).unlink(missing_ok=True)
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_mb": rss, "rc": proc.returncode, "out": out,
            "err": err}


def _median_run(cmd: list[str], reps: int, *, env: dict | None = None, cwd: Path | None = None,
                clean: Path | None = None) -> dict:
    runs = []
    for _ in range(reps):
        if clean is not None:
            shutil.rmtree(clean, ignore_errors=True) if clean.is_dir() else clean.unlink(missing_ok=True)
        r = _run_rusage(cmd, env=env, cwd=cwd)
        if r["rc"] != 0:
            return {"error": f"exit {r['rc']}: {(r['err'] or r['out']).strip()[-400:]}", "cmd": cmd}
        runs.append(r)
    return {"wall": statistics.median(r["wall"] for r in runs), "cpu": statistics.median(r["cpu"] for r in runs),
            "rss_mb": max((r["rss_mb"] or 0) for r in runs) or None, "walls": [round(r["wall"], 3) for r in runs],
            "line": runs[-1]["out"].strip().splitlines()[-1] if runs[-1]["out"].strip() else ""}


def _facts(path: Path) -> tuple[list[int], float, float]:
    """The ProfilerStep numbers in the file and where most of its `ts` values lie (the 2nd and 98th
    percentiles: a stray timestamp does not stretch the range), read in chunks."""
    found: set[int] = set()
    ts: list[float] = []
    tail = b""
    with path.open("rb") as fh:
        while chunk := fh.read(8 << 20):
            data = tail + chunk
            found.update(int(m) for m in re.findall(rb'"ProfilerStep#(\d+)"', data))
            ts += [float(m) for m in re.findall(rb'"ts":\s*(-?\d+(?:\.\d+)?)', data)[::50]]
            tail = data[-64:]
    ts.sort()
    if not ts:
        return sorted(found), 0.0, 0.0
    return sorted(found), ts[len(ts) // 50], ts[len(ts) * 49 // 50]


def _make_job(trace: Path, size_gb: float, synthetic: bool) -> Path:
    """A job folder of 4 ranks next to the trace, each a quarter of its size."""
    job = trace.with_name(trace.name.split(".json")[0] + "_job4")
    job.mkdir(parents=True, exist_ok=True)
    part = job / ".rank.src"
    gen_trace.generate(part, max(size_gb / 4, 0.001), synthetic=synthetic, quiet=True,
                       source=None if synthetic else gen_trace.SHARED_TRACES / gen_trace.DEFAULT_SOURCE)
    for r in range(4):
        f = job / f"rank{r}.json"
        if not f.exists() or f.stat().st_size != part.stat().st_size:
            shutil.copyfile(part, f)
    return job


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, default=0.2, help="size of the generated trace (default 0.2)")
    ap.add_argument("--trace", type=Path, help="use this trace instead of generating one")
    ap.add_argument("--synthetic", action="store_true", help="generate a synthetic trace (no corpus needed)")
    ap.add_argument("--reps", type=int, default=3, help="runs of each command (median reported; default 3)")
    ap.add_argument("--ref", type=Path, help="another checkout to run the same commands with (before/after)")
    ap.add_argument("--no-peers", action="store_true", help="skip the naive scripts and gzip")
    ap.add_argument("--commands", nargs="*", default=None,
                    help="subset: slice slice-window split filter filter-cat compress check merge sample")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder for the outputs (default: a temp folder)")
    ap.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = ap.parse_args(argv)

    trace = args.trace or gen_trace.default_out(args.size_gb, args.synthetic)
    if args.trace is None:
        gen_trace.generate(trace, args.size_gb, synthetic=args.synthetic,
                           source=None if args.synthetic else gen_trace.SHARED_TRACES / gen_trace.DEFAULT_SOURCE)
    size_mb = trace.stat().st_size / 1e6
    steps, lo, hi = _facts(trace)
    if len(steps) < 3:
        print(f"{trace}: needs at least 3 ProfilerStep annotations", file=sys.stderr)
        return 2
    mid = steps[len(steps) // 2]
    a, b = mid, mid + 2
    job = _make_job(trace, size_mb / 1e3, args.synthetic)
    job_mb = sum(f.stat().st_size for f in job.glob("rank*.json")) / 1e6
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-surgery-"))
    work.mkdir(parents=True, exist_ok=True)
    t = str(trace)
    span_ms = (hi - lo) / (1e6 if lo > 1e17 else 1e3)  # ns or us timestamps
    window = f"{span_ms * 0.4:.1f}..{span_ms * 0.46:.1f}"  # ms from the first event: about 6% of the trace
    commands = {  # name -> (argv after `trace`, output to clean, input MB)
        "slice": (["slice", t, str(work / "slice.json"), "--steps", f"{a}..{b}"], work / "slice.json", size_mb),
        "slice-window": (["slice", t, str(work / "win.json"), "--window", window], work / "win.json", size_mb),
        "split": (["split", t, str(work / "split"), "--steps-per-file", "5"], work / "split", size_mb),
        "filter": (["filter", t, str(work / "filter.json"), "--exclude-cat", "python_function"],
                   work / "filter.json", size_mb),
        "filter-cat": (["filter", t, str(work / "kern.json.gz"), "--cat", "kernel", "--cat", "cuda_runtime"],
                       work / "kern.json.gz", size_mb),
        "compress": (["compress", t, str(work / "c.json.gz")], work / "c.json.gz", size_mb),
        "check": (["check", t], None, size_mb),
        "merge": (["merge", str(job), str(work / "merged.json")], work / "merged.json", job_mb),
        "sample": (["sample", str(job), str(work / "sample"), "-k", "2"], work / "sample", job_mb),
    }
    chosen = args.commands or list(commands)
    # compiled modules cached outside the checkouts (as an installed package has them), for both
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    base_env["PYTHONPYCACHEPREFIX"] = str(gen_trace.DEFAULT_DIR / "pycache")
    env_new = dict(base_env, PYTHONPATH=str(REPO))
    env_ref = dict(base_env, PYTHONPATH=str(args.ref)) if args.ref else None
    py = sys.executable
    tiny = work / "tiny.json"
    tiny.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}))
    for env, cwd in ((env_new, REPO), (env_ref, args.ref)):  # warm-up: compile the modules once
        if env is not None:
            for cmd in (["check", str(tiny)], ["slice", str(tiny), str(work / "t.json"), "--window", "0..1"],
                        ["filter", str(tiny), str(work / "t.json.gz")]):
                _run_rusage([py, "-m", "zoomer_ar.cli", "trace", *cmd], env=env, cwd=cwd)
    rows = []
    print(f"trace {trace} ({size_mb:.0f} MB of JSON, steps {steps[0]}..{steps[-1]}); job {job} ({job_mb:.0f} MB); "
          f"{args.reps} runs each, medians; {os.cpu_count()} cores; {platform.python_version()}")
    print(f"{'command':14s} {'time s':>7s} {'MB/s':>6s} {'peak MB':>8s} {'CPU s':>6s} | {'peer':24s} {'time s':>7s} "
          f"{'MB/s':>6s} {'peak MB':>8s} {'ratio':>6s}" + (" | before: time s, CPU s; speed-up (time, CPU)"
                                                          if args.ref else ""))
    for name in chosen:
        argv_, out, mb = commands[name]
        row: dict = {"command": name, "argv": ["zoomer-ar", "trace", *argv_], "input_mb": round(mb, 1)}
        if args.ref:  # alternate: before, after, before, after ...
            ref_runs, new_runs = [], []
            for _ in range(args.reps):
                ref_runs.append(_median_run([py, "-m", "zoomer_ar.cli", "trace", *argv_], 1, env=env_ref,
                                            cwd=args.ref, clean=out))
                new_runs.append(_median_run([py, "-m", "zoomer_ar.cli", "trace", *argv_], 1, env=env_new,
                                            cwd=REPO, clean=out))
            row["zoomer"] = _merge_runs(new_runs)
            row["before"] = _merge_runs(ref_runs)
        else:
            row["zoomer"] = _median_run([py, "-m", "zoomer_ar.cli", "trace", *argv_], args.reps, env=env_new,
                                        cwd=REPO, clean=out)
        if not args.no_peers:
            peer = _peer(name, trace, work, a, b, args.reps)
            if peer:
                row["peers"] = peer
        rows.append(row)
        _print_row(row, mb)
    if args.json:
        args.json.write_text(json.dumps({"trace": str(trace), "size_mb": size_mb, "job_mb": job_mb, "reps": args.reps,
                                         "cores": os.cpu_count(), "command": "python benchmarks/bench_surgery.py "
                                         + " ".join(argv if argv is not None else sys.argv[1:]),
                                         "rows": rows}, indent=1))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any("error" in r["zoomer"] for r in rows) else 0


def _merge_runs(runs: list[dict]) -> dict:
    bad = [r for r in runs if "error" in r]
    if bad:
        return bad[0]
    return {"wall": statistics.median(r["wall"] for r in runs), "cpu": statistics.median(r["cpu"] for r in runs),
            "rss_mb": max((r["rss_mb"] or 0) for r in runs) or None, "walls": [r["walls"][0] for r in runs],
            "line": runs[-1]["line"]}


def _peer(name: str, trace: Path, work: Path, a: int, b: int, reps: int) -> list[dict]:
    py = sys.executable
    peers = []
    if name in ("slice", "filter"):
        for lib in ("json", "msgspec"):
            mode_args = ["slice", str(trace), str(work / "naive.json"), str(a), str(b), lib] if name == "slice" else \
                ["filter", str(trace), str(work / "naive.json"), "python_function", "0", lib]
            r = _median_run([py, "-c", _NAIVE, *mode_args], reps, clean=work / "naive.json")
            peers.append({"peer": f"naive {lib} load+dump", **r})
    if name == "compress" and shutil.which("gzip"):
        r = _median_run(["sh", "-c", f"gzip -6 -c '{trace}' > '{work / 'peer.json.gz'}'"], reps)
        peers.append({"peer": "gzip -6 -c", **r})
    return peers


def _fmt(r: dict, mb: float) -> str:
    if "error" in r:
        return f"{'error':>7s} {'':>6s} {'':>8s}"
    rss = f"{r['rss_mb']:8.0f}" if r.get("rss_mb") else f"{'-':>8s}"
    return f"{r['wall']:7.2f} {mb / r['wall']:6.1f} {rss}"


def _print_row(row: dict, mb: float) -> None:
    z = row["zoomer"]
    before = ""
    if "before" in row:
        bz = row["before"]
        before = (f" | {bz['wall']:6.2f} {bz['cpu']:6.2f}  {bz['wall'] / z['wall']:.1f}x, {bz['cpu'] / z['cpu']:.1f}x"
                  if "error" not in bz and "error" not in z else " | error")
    peers = row.get("peers") or [None]
    cpu = f"{z['cpu']:6.2f}" if "error" not in z else f"{'':6s}"
    for k, p in enumerate(peers):
        left = f"{row['command'] if k == 0 else '':14s} {_fmt(z, mb) + ' ' + cpu if k == 0 else ' ' * 30}"
        if p is None:
            right = f"{'-':24s} {'':>7s} {'':>6s} {'':>8s} {'':>6s}"
        else:
            ratio = f"{p['wall'] / z['wall']:6.1f}" if "error" not in p and "error" not in z else f"{'-':>6s}"
            right = f"{p['peer']:24s} {_fmt(p, mb)} {ratio}"
        print(f"{left} | {right}" + (before if k == 0 else ""))
        if k == 0 and "error" in z:
            print(f"    {z['error']}")


if __name__ == "__main__":
    sys.exit(main())
