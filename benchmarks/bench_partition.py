"""Trace partition benchmark: `partition_trace` (zoomer_ar/surgery/partition.py) on a large trace,
with the compiled scanner (partition_fast.py) and with the original msgspec passes.

    python benchmarks/bench_partition.py                          # 0.5 GB tiled trace, 8 windows
    python benchmarks/bench_partition.py --trace /tmp/zoomer-huge/tiled_2gb.json --windows 16
    python benchmarks/bench_partition.py --size-gb 0.2 --no-original   # quick look

Without --trace, benchmarks/gen_trace.py tiles the corpus's hta/ns_resolution_trace (GPU-dense:
kernels, runtime calls, flows) into an uncompressed JSON file of --size-gb under --dir (default
/tmp/zoomer-bench, reused when it is there). Each measurement runs in a fresh process: wall time of
the cut (imports excluded), CPU time (user + system, all threads: the reader, the hashing and the
writer threads count), and peak RSS (VmHWM) over the process's floor after its imports. The window
files go to a temporary folder, removed afterwards. With both paths measured, their window files
are compared byte for byte. "Per core" throughput is JSON bytes over CPU seconds (MB = 1e6 bytes).
The target (issue #8): at least 200 MB/s per core for the partition, so that the windowed analysis
as a whole can sustain 100 MB/s.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TARGET_MB_PER_CORE_S = 200.0

_CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path

def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'):
            return int(line.split()[1]) / 1024

from zoomer_ar.surgery import partition_fast
from zoomer_ar.surgery.partition import partition_trace
partition_fast.FAST = sys.argv[4] == 'fast'
floor = hwm()
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
p = partition_trace(Path(sys.argv[1]), Path(sys.argv[2]), windows=int(sys.argv[3]))
wall = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(json.dumps({"wall": wall, "cpu": cpu, "floor_mb": floor, "peak_mb": hwm(), "json_bytes": p.json_bytes,
                  "files": [str(f) for f in p.files], "events": p.events_in,
                  "scanner": partition_fast.available()}))
"""


def measure(trace: Path, out: Path, windows: int, path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(trace), str(out), str(windows), path],
                          capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"{path}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def line(name: str, r: dict) -> str:
    mb = r["json_bytes"] / 1e6
    return (f"{name:9s} {r['wall']:7.2f} s wall {r['cpu']:7.2f} s CPU   {mb / r['wall']:6.0f} MB/s wall "
            f"{mb / r['cpu']:6.0f} MB/s per core   peak +{r['peak_mb'] - r['floor_mb']:.1f} MB over "
            f"{r['floor_mb']:.1f} MB   {len(r['files'])} windows, {r['events']:,} events")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, help="an existing trace (default: a generated one)")
    ap.add_argument("--size-gb", type=float, default=0.5, help="size of the generated trace (default 0.5)")
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("ZOOMER_BENCH_DIR", "/tmp/zoomer-bench")))
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--no-original", action="store_true", help="measure the compiled scanner's path only")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each path; the fastest (CPU) is kept")
    args = ap.parse_args(argv)
    trace = args.trace
    if trace is None:
        sys.path.insert(0, str(HERE))
        import gen_trace

        trace = args.dir / f"tiled_{args.size_gb:g}gb.json"
        source = gen_trace.SHARED_TRACES / gen_trace.DEFAULT_SOURCE  # as bench_huge: synthetic without the corpus
        gen_trace.generate(trace, args.size_gb, source=source, synthetic=not source.is_file(), quiet=True)
    print(f"trace: {trace} ({trace.stat().st_size / 1e9:.2f} GB as stored), {args.windows} windows, "
          f"{os.cpu_count()} CPUs")
    paths = ["fast"] if args.no_original else ["fast", "original"]
    results: dict[str, dict] = {}
    tmp = Path(tempfile.mkdtemp(prefix="zoomer-bench-partition-", dir=args.dir if args.dir.is_dir() else None))
    try:
        for path in paths:
            best = None
            for i in range(args.repeat):
                r = {**measure(trace, tmp / f"{path}{i}", args.windows, path), "out": tmp / f"{path}{i}"}
                if best is None or r["cpu"] < best["cpu"]:
                    if best is not None:
                        shutil.rmtree(best["out"], ignore_errors=True)
                    best = r
                else:
                    shutil.rmtree(r["out"], ignore_errors=True)
            results[path] = best  # type: ignore[assignment]
            if path == "fast" and not best["scanner"]:  # type: ignore[index]
                print("(the compiled scanner is not built: 'fast' is the original passes)")
            print(line(path, best))  # type: ignore[arg-type]
        if "original" in results:
            a, b = results["fast"]["files"], results["original"]["files"]
            same = [Path(x).name for x in a] == [Path(y).name for y in b] and all(
                filecmp.cmp(x, y, shallow=False) for x, y in zip(a, b))
            print(f"window files byte for byte the same: {same}; speed-up "
                  f"{results['original']['cpu'] / results['fast']['cpu']:.1f}x CPU, "
                  f"{results['original']['wall'] / results['fast']['wall']:.1f}x wall")
            if not same:
                return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fast = results["fast"]
    per_core = fast["json_bytes"] / 1e6 / fast["cpu"]
    print(f"target: {TARGET_MB_PER_CORE_S:.0f} MB/s per core: {per_core:.0f} "
          f"({'met' if per_core >= TARGET_MB_PER_CORE_S else 'MISSED'})")
    return 0 if per_core >= TARGET_MB_PER_CORE_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
