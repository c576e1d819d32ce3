"""Where the streaming load's memory peak is set: resident memory (VmRSS) and its peak so far (VmHWM)
around each step of `load_job_streaming` on one trace, in this process.

    python benchmarks/stream_memory.py --size-gb 2           # tiles gen_trace.py's default trace
    python benchmarks/stream_memory.py --trace path/to/rank.json.gz

The steps (zoomer_ar/stream/load.py): reading (the kept rows as column parts, the reader's buffers),
check (are second passes needed), finish (the parts joined into columns), rebase_times, prune (the
rows no feature reads), and the end; with --features, the feature pass's parts after it. A step that raises VmHWM above the value it had at the end of
reading sets the load's peak. docs/huge-traces.md quotes its output.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

LINES: list[str] = []


def _mb() -> tuple[int, int]:
    d = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS", "VmHWM")):
                d[line.split(":")[0]] = int(line.split()[1]) // 1024
    return d["VmRSS"], d["VmHWM"]


def _note(what: str) -> None:
    rss, hwm = _mb()
    LINES.append(f"  {what:<28} RSS {rss:>6} MB   peak so far {hwm:>6} MB")


def _watch(owner, name: str) -> None:
    real = getattr(owner, name)

    def watched(*args, **kwargs):
        _note(f"before {name}")
        out = real(*args, **kwargs)
        _note(f"after {name}")
        return out

    setattr(owner, name, watched)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--trace", type=Path, help="a trace file (default: generate one)")
    ap.add_argument("--size-gb", type=float, default=1.0, help="size of the generated trace")
    ap.add_argument("--prune-rows", type=int, default=None,
                    help="prune above this many kept rows (default: the reader's, ZOOMER_STREAM_PRUNE_ROWS)")
    ap.add_argument("--features", action="store_true",
                    help="then run the feature pass (features.extract) and note its parts too")
    args = ap.parse_args(argv)
    import zoomer_ar.stream.compact as compact
    import zoomer_ar.stream.load as load

    for name in ("rebase_times", "prune"):
        _watch(load, name)
    for name in ("check", "finish"):
        _watch(compact.CompactBuilder, name)
    if args.features:
        import zoomer_ar.features.gpu as gpu
        import zoomer_ar.features.rank as rank

        extract = sys.modules["zoomer_ar.features.extract"]  # (the package's `extract` is the function)

        for name in ("gpu_features", "host_features", "operator_features", "memory_features"):
            _watch(rank, name)
        _watch(gpu, "idle_gaps")
        _watch(extract, "rank_phases")  # the phase split (features.phases), per rank
    tmp = None
    path = args.trace
    if path is None:  # generated in a child process: its memory is not this one's
        tmp = Path(tempfile.mkdtemp(prefix="zoomer-mem-"))
        path = tmp / f"tiled_{args.size_gb:g}gb.json"
        subprocess.run([sys.executable, str(HERE / "gen_trace.py"), "--size-gb", str(args.size_gb), "--out", str(path)],
                       check=True, stdout=subprocess.DEVNULL)
    try:
        import bench_huge

        bench_huge._reset_peak()  # VmHWM from here (imports and argument parsing aside)
        _note("start (imports done)")
        job = load.load_job_streaming(path, workers=1, prune_rows=args.prune_rows)
        _note("end")
        if args.features:
            from zoomer_ar.features.extract import extract as run_features

            run_features(job)
            _note("features done")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = sum(len(r) for r in job.ranks)
    print(f"{path.name}: {rows:,} rows kept; RSS and its peak around each step of the streaming load"
          + (" and the feature pass" if args.features else ""))
    print("\n".join(LINES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
