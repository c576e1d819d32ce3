"""A job of many large ranks, streamed: memory against the number of ranks.

    python benchmarks/bench_rank_folder.py                          # 1, 2, 4 and 8 ranks of 0.25 GB
    python benchmarks/bench_rank_folder.py --rank-gb 1 --ranks 1,4 --keep

benchmarks/gen_trace.py tiles a real trace (hta/ns_resolution_trace, GPU-dense) into one rank file of
--rank-gb GB of JSON; copies whose distributedInfo says ranks 1..N-1 make job folders of each size
in --ranks. Each folder is analysed in a fresh process (bench_huge.py's children: the streaming load,
features, rules and model; imports excluded from the times), two ways, in the same run:

  summaries   what `zoomer-ar analyze` does: each rank is read in a worker process, which computes the
              rank's features and sends back its summary (zoomer_ar/load/stub.py); the main process
              combines the summaries
  rows        the way before it: each worker sends back the rank's compact rows, and the main
              process holds every rank's rows and computes all features

The process tree (the command and its worker processes, ZOOMER_STREAM_WORKERS, default the CPU
count) is sampled every 5 ms: the largest sum of their PSS is what the machine needs. Printed: the
main process's own peak RSS (VmHWM over the load and over the rest), the largest worker's
(ru_maxrss of the waited-for children), the tree's peak, wall and CPU time, and whether
the two ways give the same features (the script exits 1 if not).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_huge  # noqa: E402  (its measured children and trace generator)
from bench_merged import _rank_copy  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--rank-gb", type=float, default=0.25, help="JSON per rank file, GB")
    ap.add_argument("--ranks", default="1,2,4,8", help="job sizes in ranks, comma separated")
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("ZOOMER_HUGE_DIR", "/tmp/zoomer-huge")))
    ap.add_argument("--keep", action="store_true", help="keep the generated traces")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per measurement")
    args = ap.parse_args(argv)
    sizes = sorted({int(x) for x in args.ranks.split(",") if x.strip()})
    if not sizes or sizes[0] < 1:
        raise SystemExit("--ranks: positive numbers of ranks, e.g. 1,2,4")
    root = args.dir / f"rank_folder_{args.rank_gb:g}gb"
    shutil.rmtree(root, ignore_errors=True)
    src = root / "src"
    src.mkdir(parents=True)
    print(f"Zoomer AR rank-folder benchmark - {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"command: python benchmarks/bench_rank_folder.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
          f"ZOOMER_STREAM_WORKERS={os.environ.get('ZOOMER_STREAM_WORKERS', '(the CPU count)')}")
    meta = bench_huge._gen(src / "rank-0.json", args.rank_gb, None, False)
    (src / "rank-0.json.meta").unlink(missing_ok=True)
    rank_mb = (src / "rank-0.json").stat().st_size / 1e6
    print(f"rank file: {rank_mb:,.0f} MB of JSON, {meta['events']:,} events (tiled from {Path(meta['source']).name})")
    for r in range(1, sizes[-1]):
        _rank_copy(src / "rank-0.json", src / f"rank-{r}.json", r)
    print(f"{'ranks':>5} {'way':<10} {'wall s':>7} {'CPU s':>7} {'main MB':>8} {'worker MB':>10} {'tree PSS MB':>12} "
          f"{'procs':>5}  findings")
    same = True
    for n in sizes:
        job = root / f"job{n}"
        job.mkdir()
        for r in range(n):
            os.link(src / f"rank-{r}.json", job / f"rank-{r}.json")
        bench_huge.warm_page_cache(job)  # alike for both ways
        shas = set()
        for way, kind in (("summaries", "zoomer"), ("rows", "zoomer-rows")):
            res = bench_huge.measure(kind, job, args.timeout, tree=True)
            if "error" in res:
                print(f"{n:>5} {way:<10} failed: {res['error']}", flush=True)
                same = False
                continue
            shas.add(res["features_sha"])
            main_mb = max(res["peak_self_mb"], res.get("load_peak_mb") or 0.0)  # the load's peak and the rest's
            print(f"{n:>5} {way:<10} {res['work_s']:7.2f} {res['cpu_s']:7.2f} {main_mb:8.0f} "
                  f"{res['peak_children_mb']:10.0f} {res['tree_pss_mb']:12.0f} {res['tree_processes']:5d}  "
                  f"{', '.join(res['findings']) or 'none'}", flush=True)
        same &= len(shas) == 1
        shutil.rmtree(job)
    print(f"features identical both ways at every size: {'yes' if same else 'NO'}")
    return bench_huge.finish(root, args.keep, same)


if __name__ == "__main__":
    bench_huge.run_timed(main)
