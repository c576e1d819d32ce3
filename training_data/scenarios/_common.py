"""Shared command line and profiler set-up for the scenario programs (not a scenario itself).

Every scenario takes the same options:

    --out DIR          where rank-0.pt.trace.json.gz and job.json go (required)
    --steps N          steps to record (the profiler's `active` steps; default 5)
    --skip N           steps run before profiling starts (default 3; Zoomer uses ~550 on real jobs)
    --warmup N         profiler warm-up steps, traced but discarded (default 1)
    --severity LEVEL   low | mid | high: how strongly the anti-pattern is planted (default mid)
    --seed N           random seed (default 0)
    --threads N        torch intra-op threads (default 1)
    --device DEV       cpu (default), cuda, or auto (cuda when torch sees a GPU, else cpu): where the
                       GPU-only programs run. The CPU programs spell their CPU device out; on a GPU
                       they run as record.py's GPU variants. The profiler records CUDA activity
                       (kernels, memcpys, runtime calls) whenever torch sees a GPU.

One intra-op thread by default: these models are small, and on a shared 2-core machine a second
OpenMP thread makes every op wait whenever another process holds the other core, which turns a
10 ms step into hundreds of ms. Pass --threads 2 (or more) on a quiet, bigger machine.

The loop runs `--skip + --warmup + --steps` training steps in all, so a scenario takes well under a
second of training on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    from zoomer_ar.capture import SteadyStateProfiler
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from zoomer_ar.capture import SteadyStateProfiler

SEVERITIES = ("low", "mid", "high")


def parse_args(description: str | None = None, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(description or "").strip().splitlines()[0] if description else None)
    parser.add_argument("--out", required=True, help="output folder for the trace and job.json")
    parser.add_argument("--steps", type=int, default=5, help="steps to record (default 5)")
    parser.add_argument("--skip", type=int, default=3, help="steps before profiling starts (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="profiler warm-up steps (default 1)")
    parser.add_argument("--severity", choices=SEVERITIES, default="mid", help="strength of the planted pattern")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                        help="where the GPU-only programs run: cpu (default), cuda, auto (cuda when available)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    import torch

    torch.set_num_threads(args.threads)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU here")
    return args


def profiler(args: argparse.Namespace, name: str, *, profile_memory: bool = False, **metadata: object) -> SteadyStateProfiler:
    """The steady-state profiler every scenario records with."""
    return SteadyStateProfiler(
        args.out,
        skip_first=args.skip,
        warmup=args.warmup,
        active=args.steps,
        job_name=name,
        with_stack=True,
        record_shapes=True,
        with_modules=True,
        profile_memory=profile_memory,
        metadata={"scenario": name, "severity": args.severity, "seed": args.seed, "threads": args.threads, **metadata},
    )
