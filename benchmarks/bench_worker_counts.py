"""DataLoader worker counts on this machine: the dataloader_bound scenario with 0, 1, 2 and 4 workers.

The `dataloader-workers` fix writes a count computed when the program runs (zoomer_ar/fix/worker_count.py:
the usable CPUs less one, at most 8). This measures what each count gives here: for each setting of
`--cores` ("all", or a CPU list the run and its workers are pinned to) and each count, the scenario fixed with
`dataloader-workers.num_workers=N` (0: the planted program as it is) runs under the profiler (the
bench_fixes.py harness), rounds alternating the order of the counts; the median ProfilerStep per count is
printed, with the machine's load average. It asserts nothing.

    python benchmarks/bench_worker_counts.py                          # all CPUs and one CPU, 3 rounds
    python benchmarks/bench_worker_counts.py --cores 0,1/0 --counts 0,1,2 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_fixes as H  # noqa: E402 - the harness: workspace, record, step_ms, median

PROGRAM = "dataloader_bound.py"


def variant(src: Path, count: int) -> str:
    """The scenario file with `count` workers (0: as planted), written beside it; its name."""
    if count == 0:
        return PROGRAM
    from zoomer_ar.fix.api import fix_source

    name = f"dataloader_bound_w{count}.py"
    text = fix_source((src / PROGRAM).read_text(encoding="utf-8"), ["dataloader-workers"],
                      options={"dataloader-workers": {"num_workers": count}})
    (src / name).write_text(text, encoding="utf-8")
    return name


def run(src: Path, program: str, out: Path, cores: str, steps: int, skip: int) -> float:
    """The median step of one profiled run, on the CPUs `cores` ("all", or a list its workers inherit)."""
    if cores != "all":
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    try:
        trace = H.record(src, program, out, steps=steps, skip=skip)
    finally:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    return H.median(H.step_ms(trace))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", default="all/0", help="CPU settings separated by '/': 'all', or a CPU list such as 0 or 0,1")
    ap.add_argument("--counts", default="0,1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip", type=int, default=3)
    args = ap.parse_args(argv)
    settings = args.cores.split("/")
    counts = [int(c) for c in args.counts.split(",")]
    root = Path(tempfile.mkdtemp(prefix="zoomer-bench-workers-"))
    try:
        src = H.workspace(root / "src")
        programs = {n: variant(src, n) for n in counts}
        print(f"dataloader_bound, median ProfilerStep (ms) over {args.rounds} rounds of {args.steps} steps; "
              f"load average at start {os.getloadavg()[0]:.2f}")
        print(f"{'cores':<8}" + "".join(f"{f'{n} workers':>12}" for n in counts))
        for cores in settings:
            got: dict[int, list[float]] = {n: [] for n in counts}
            for r in range(args.rounds):
                order = counts if r % 2 == 0 else counts[::-1]
                for n in order:
                    got[n].append(run(src, programs[n], root / f"t_{n}", cores, args.steps, args.skip))
            print(f"{cores:<8}" + "".join(f"{H.median(got[n]):>12.1f}" for n in counts))
        print(f"load average at end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
