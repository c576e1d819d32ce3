"""`analyze --steps` on a rank folder: the ranks' cuts in worker processes against one after the other.

    python benchmarks/bench_steps.py                      # two ranks of 0.5 GB, 3 rounds (about 2 min on 2 cores)
    python benchmarks/bench_steps.py --rank-gb 1 --ranks 4 --repeat 2 --keep

benchmarks/gen_trace.py tiles a real trace into one rank file of --rank-gb GB of JSON; copies whose
distributedInfo says ranks 1..N-1 make a job folder. `zoomer-ar analyze JOB --steps N..M` (five
steps mid-trace) then runs in fresh processes, rounds interleaving the two settings:

  pooled      the default: the ranks cut in up to the CPU count of worker processes (stream/pool.py)
  one by one  ZOOMER_STREAM_WORKERS=1: the ranks cut in the command's own process, in turn

and the same two on param/dlrm_8ranks (eight small files: the default cuts them in-process, under
step_window.POOL_MIN_BYTES; here ZOOMER_STREAM_WORKERS=2 forces the workers). Wall and CPU time
(the command and the workers it waited for: RUSAGE_CHILDREN) are the medians of the rounds; the
script prints the ratio of the two settings' wall times and exits 1 if their findings (pattern and
impact) differ.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import bench_huge  # noqa: E402  (trace generator, step choice)
from bench_merged import _rank_copy  # noqa: E402

import gen_trace  # noqa: E402

DLRM = gen_trace.SHARED_TRACES / "param" / "dlrm_8ranks"


def _zoomer() -> str:
    exe = Path(sys.executable).with_name("zoomer-ar")
    return str(exe) if exe.exists() else "zoomer-ar"


def run_once(path: Path, steps: str, workers: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ZOOMER_STREAM_WORKERS"}
    if workers is not None:
        env["ZOOMER_STREAM_WORKERS"] = workers
    t = time.perf_counter()
    proc = subprocess.Popen([_zoomer(), "analyze", str(path), "--steps", steps, "--no-files", "--no-progress",
                             "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = proc.communicate()
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"analyze --steps {steps} {path} failed ({proc.returncode}): {err.decode()[-500:]}")
    res = json.loads(out)
    return {"wall_s": wall, "findings": [(f["pattern"], f["impact"]) for f in res["findings"]]}


def measure(path: Path, steps: str, settings: dict[str, str | None], repeat: int) -> dict[str, dict]:
    import resource

    runs: dict[str, list[dict]] = {k: [] for k in settings}
    for _ in range(repeat):
        for label, workers in settings.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            r = run_once(path, steps, workers)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            r["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)  # with its workers
            runs[label].append(r)
    out = {}
    for label, rs in runs.items():
        out[label] = {"wall_s": statistics.median(r["wall_s"] for r in rs),
                      "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                      "walls": [round(r["wall_s"], 2) for r in rs], "findings": rs[0]["findings"]}
    return out


def _print(title: str, res: dict[str, dict], base: str, other: str) -> bool:
    print(f"\n{title}")
    for label, r in res.items():
        print(f"  {label:<34} wall {r['wall_s']:6.2f} s (runs {r['walls']})  cpu {r['cpu_s']:6.2f} s")
    print(f"  {other} / {base}: {res[other]['wall_s'] / res[base]['wall_s']:.2f}x the wall time")
    same = res[base]["findings"] == res[other]["findings"]
    print(f"  findings (pattern, impact) {'identical' if same else 'DIFFER'}")
    return same


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--rank-gb", type=float, default=0.5, help="GB of JSON per rank file")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="rounds (medians are printed)")
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("ZOOMER_HUGE_DIR", "/tmp/zoomer-huge")))
    ap.add_argument("--keep", action="store_true", help="keep the generated traces")
    args = ap.parse_args(argv)
    print(f"Zoomer AR analyze --steps benchmark - {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
    m = bench_huge.machine()
    print(f"machine: {m.get('cpu')}, {m.get('cores')} cores; load average at start: {os.getloadavg()[0]:.2f}")
    root = args.dir / f"steps_{args.ranks}x{args.rank_gb:g}gb"
    shutil.rmtree(root, ignore_errors=True)
    job = root / "job"
    job.mkdir(parents=True)
    ok = True
    try:
        first = job / "rank-0.json"
        bench_huge._gen(first, args.rank_gb, None, False)
        for r in range(1, args.ranks):
            _rank_copy(first, job / f"rank-{r}.json", r)
        steps = bench_huge._middle_steps(first, 5)
        res = measure(job, steps, {"pooled (default)": None, "one by one (ZOOMER_STREAM_WORKERS=1)": "1"},
                      args.repeat)
        ok &= _print(f"{args.ranks} ranks x {args.rank_gb:g} GB, --steps {steps}", res, "pooled (default)",
                     "one by one (ZOOMER_STREAM_WORKERS=1)")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if DLRM.is_dir():
        res = measure(DLRM, "10..10", {"in-process (default, small files)": None,
                                       "pooled (ZOOMER_STREAM_WORKERS=2)": "2"}, args.repeat)
        ok &= _print("param/dlrm_8ranks (8 x 55 kB), --steps 10..10", res, "in-process (default, small files)",
                     "pooled (ZOOMER_STREAM_WORKERS=2)")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
