"""`zoomer-ar fix` on a large tree: one process against worker processes (`--jobs`), same run.

    python benchmarks/bench_fix_tree.py                       # torch's own optim/nn/utils/testing sources
    python benchmarks/bench_fix_tree.py --tree ~/src/repo --jobs 2,4 --repeat 2

Each measurement is a fresh `python -m zoomer_ar.cli fix TREE --diff --jobs N` process (imports
included: what a user waits for); the diffs of all runs must be byte-identical (the script stops
if not). Prints wall time per job count, the speed-up against --jobs 1 measured in the same run,
and the machine's load average before and after (other work on the machine slows every run).
The default tree is copied from the installed torch package (about 1,000 files; needs torch).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_PARTS = ("optim", "nn", "utils", "testing", "distributed", "_dynamo", "ao")


def default_tree(dest: Path) -> Path:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        sys.exit("no --tree given and torch is not installed (the default tree is torch's own sources)")
    src = Path(spec.origin).parent
    for part in DEFAULT_PARTS:
        if (src / part).is_dir():
            shutil.copytree(src / part, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyi"))
    return dest


def run_once(tree: Path, jobs: int) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "zoomer_ar.cli", "fix", str(tree), "--diff", "--jobs", str(jobs)],
                          capture_output=True, check=False)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"fix --jobs {jobs} exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-500:]}")
    return took, hashlib.sha256(proc.stdout).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, help="the folder to fix (default: a copy of parts of torch)")
    ap.add_argument("--jobs", default=f"{os.cpu_count() or 1}", help="comma-separated worker counts to compare with 1")
    ap.add_argument("--repeat", type=int, default=1, help="runs per job count (alternating); the best is kept")
    args = ap.parse_args(argv)
    counts = [1] + [int(j) for j in args.jobs.split(",") if int(j) > 1]
    with tempfile.TemporaryDirectory(prefix="zoomer-fix-bench-") as tmp:
        tree = args.tree or default_tree(Path(tmp))
        n = sum(1 for p in tree.rglob("*") if p.suffix in (".py", ".ipynb"))
        size = sum(p.stat().st_size for p in tree.rglob("*") if p.suffix in (".py", ".ipynb"))
        print(f"tree: {tree} ({n} files, {size / 1e6:.1f} MB); cpus {os.cpu_count()}; load average {os.getloadavg()[0]:.2f}")
        best: dict[int, float] = {}
        digests: set[str] = set()
        for _ in range(args.repeat):
            for jobs in counts:
                took, digest = run_once(tree, jobs)
                digests.add(digest)
                best[jobs] = min(best.get(jobs, float("inf")), took)
        if len(digests) != 1:
            sys.exit("the diffs differ between job counts")
        for jobs in counts:
            print(f"  --jobs {jobs}: {best[jobs]:7.1f} s   speed-up vs --jobs 1 (same run): {best[1] / best[jobs]:.2f}x")
        print(f"identical diffs: yes; load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
