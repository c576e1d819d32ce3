"""Scaling of `zoomer-ar batch` on Dask: the same traces on a LocalCluster of 1, then 2, ... worker processes.

    python benchmarks/bench_batch.py                          # examples/traces + 6 real traces, twice, 1 and 2 workers
    python benchmarks/bench_batch.py --workers 1 2 4 --repeat 2
    python benchmarks/bench_batch.py --traces examples/traces/sync_point /path/to/rank_folder --copies 4

For each worker count: start a LocalCluster (processes, one thread each), import zoomer_ar on its
workers and analyse one small trace on each (warm-up, not timed), then time `run_batch` over the trace list (analysis on the workers,
recording into a fresh SQLite store in the client, as `zoomer-ar batch` does). `--copies N`
repeats the list N times (each copy is analysed again; recording finds it already stored). The
best of `--repeat` runs is kept. Reported: wall seconds, traces per second and the speed-up over
the first worker count, with the load average (other processes on the machine slow every run).
docs/service.md quotes this script's output; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("ZOOMER_SHARED_TRACES", REPO.parent / "shared" / "traces"))
REAL = ["kineto/resnet50_num_workers_0", "kineto/resnet50_num_workers_4", "param/linear_kineto.json.gz",
        "hta/ns_resolution_trace", "tracelens/b200", "hta/nccl_parser_config"]


WARMUP = REPO / "examples" / "traces" / "clean"


def default_traces() -> list[Path]:
    out = sorted(p for p in (REPO / "examples" / "traces").iterdir() if p.is_dir())
    out += [SHARED / r for r in REAL if (SHARED / r).exists()]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", nargs="*", type=Path, default=None, help="Trace files or rank folders (default: see above).")
    ap.add_argument("--workers", nargs="*", type=int, default=[1, 2], help="Worker counts to compare (default: 1 2).")
    ap.add_argument("--copies", type=int, default=2, help="Analyse the list this many times per run (default 2).")
    ap.add_argument("--repeat", type=int, default=1, help="Runs per worker count; the best is kept.")
    args = ap.parse_args()

    from distributed import Client

    from zoomer_ar.service.batch import analyze_one, local_cluster, run_batch
    from zoomer_ar.store.db import dispose_engine

    traces = [str(p) for p in (args.traces or default_traces())] * args.copies
    size = sum(f.stat().st_size for t in set(traces) for f in ([Path(t)] if Path(t).is_file() else Path(t).rglob("*"))
               if f.is_file())
    print(f"bench_batch: {len(traces)} traces ({len(set(traces))} distinct, {size / 1e6:.1f} MB on disk), "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}")
    rows = []
    base = None
    for n in args.workers:
        best = None
        for rep in range(args.repeat):
            t0 = time.perf_counter()
            cluster = local_cluster(n)
            with Client(cluster) as client:  # warm-up (not timed): imports and one small analysis on every worker
                client.run(analyze_one, str(WARMUP))
            startup = time.perf_counter() - t0
            with tempfile.TemporaryDirectory() as tmp:
                db = f"sqlite:///{tmp}/bench.db"
                try:
                    res = run_batch(traces, cluster=cluster, db=db)
                finally:
                    dispose_engine(db)
                    cluster.close()
            failed = len(res.failed)
            print(f"  {n} worker{'s' if n != 1 else ' '} run {rep + 1}: {res.seconds:6.2f} s for {len(traces)} traces "
                  f"({failed} failed), cluster start + warm-up {startup:.1f} s, load {os.getloadavg()[0]:.2f}")
            if best is None or res.seconds < best:
                best = res.seconds
        base = base or best
        rows.append((n, best, len(traces) / best, base / best))
    print("workers  seconds  traces/s  speed-up")
    for n, secs, rate, speedup in rows:
        print(f"{n:>7}  {secs:7.2f}  {rate:8.2f}  {speedup:7.2f}x")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
