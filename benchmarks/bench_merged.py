"""A `zoomer-ar trace merge` output against the rank files it came from: time, memory, features.

    python benchmarks/bench_merged.py                    # two ranks of 0.25 GB each (about a minute)
    python benchmarks/bench_merged.py --size-gb 2 --keep

benchmarks/gen_trace.py tiles a real trace into one rank file of --size-gb / 2 GB of JSON; a copy
whose distributedInfo says rank 1 makes a two-rank job folder, and `trace merge` writes its merged
trace (compact JSON: smaller than the two files). Each is then analysed in a fresh process
(bench_huge.py's children, imports excluded from the times):

  merged, streamed    `load_job_streaming(merged)` + analysis: the events split by pid while read
                      (zoomer_ar/stream/split.py), one process
  folder, streamed    the same on the rank folder: a worker process per rank
  merged, in memory   `analyze_path(merged, stream=False)`: read whole, split after reading

Peak RSS is the process's own and, for the folder, the largest worker's (not their sum). The three
must give the same features (a digest of each analysis' `features` is compared); the script exits 1
when they do not.
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


def _rank_copy(src: Path, dst: Path, rank: int) -> None:
    """Copy a generated rank file, its distributedInfo saying `rank` (the header is the first bytes)."""
    with src.open("rb") as fi, dst.open("wb") as fo:
        head = fi.read(1 << 16)
        key = b'"rank":0'
        if head.count(key) != 1:
            raise SystemExit(f"{src}: no single {key!r} in its header to rewrite")
        fo.write(head.replace(key, b'"rank":%d' % rank))
        shutil.copyfileobj(fi, fo, 16 << 20)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--size-gb", type=float, default=0.5, help="the job's JSON in GB (two ranks of half of it)")
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("ZOOMER_HUGE_DIR", "/tmp/zoomer-huge")))
    ap.add_argument("--keep", action="store_true", help="keep the generated traces")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per measurement")
    args = ap.parse_args(argv)
    from zoomer_ar.surgery.ops import merge_job

    root = args.dir / f"merged_{args.size_gb:g}gb"
    shutil.rmtree(root, ignore_errors=True)
    job = root / "job"
    job.mkdir(parents=True)
    print(f"Zoomer AR merged-trace benchmark - {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"command: python benchmarks/bench_merged.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    meta = bench_huge._gen(job / "rank-0.json", args.size_gb / 2, None, False)
    (job / "rank-0.json.meta").unlink(missing_ok=True)
    _rank_copy(job / "rank-0.json", job / "rank-1.json", 1)
    merged = root / "merged.json"
    merge_job(job, merged)
    sizes = {p.name: p.stat().st_size for p in (job / "rank-0.json", job / "rank-1.json", merged)}
    print(f"job: 2 rank files of {sizes['rank-0.json'] / 1e6:,.0f} MB ({meta['events']:,} events each, tiled from "
          f"{Path(meta['source']).name}); merged trace {sizes['merged.json'] / 1e6:,.0f} MB")
    runs = [("merged, streamed", "zoomer", merged), ("folder, streamed", "zoomer", job),
            ("merged, in memory", "zoomer-memory", merged)]
    results = {}
    for label, kind, path in runs:
        bench_huge.warm_page_cache(path)  # alike for the three
        r = bench_huge.measure(kind, path, args.timeout)
        results[label] = r
        if "error" in r:
            print(f"  {label:<18} failed: {r['error']}")
            continue
        print(f"  {label:<18} {r['work_s']:7.2f} s  cpu {r['cpu_s']:7.2f} s  peak RSS {r['peak_mb']:6.0f} MB  "
              f"{r['ranks']} ranks  findings {', '.join(r['findings']) or 'none'}", flush=True)
    ok = [r for r in results.values() if "error" not in r]
    ref = results.get("folder, streamed")
    if ref is not None and "error" not in ref:
        for label in ("merged, streamed", "merged, in memory"):
            r = results.get(label)
            if r is not None and "error" not in r:
                print(f"  {label} / folder, streamed: time {r['work_s'] / ref['work_s']:.2f}x, CPU "
                      f"{r['cpu_s'] / ref['cpu_s']:.2f}x, peak {r['peak_mb'] / ref['peak_mb']:.2f}x")
    same = len(ok) == len(runs) and len({r["features_sha"] for r in ok}) == 1
    print(f"features identical in all three: {'yes' if same else 'NO'}")
    return bench_huge.finish(root, args.keep, same)


if __name__ == "__main__":
    bench_huge.run_timed(main)
