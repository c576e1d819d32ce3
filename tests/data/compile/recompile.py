"""Record a real CPU trace of a torch.compile'd training loop that compiles in its first step and
recompiles in its third (the batch grows from 32 to 48 rows: a failed shape guard).

    .venv/bin/python tests/data/compile/recompile.py --out tests/data/compile/recompile.pt.trace.json.gz

Five profiled steps (torch.profiler.schedule(wait=0, warmup=0, active=5)), profiling from the
program's start: the first compilation (forward and backward, seconds on a CPU) is inside step 0,
the recompilation inside step 2. tests/test_startup_calls.py reads the recorded trace."""

from __future__ import annotations

import argparse
import gzip
import shutil
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--with-stack", action="store_true", help="record Python frames (tests/data/broken_names/cut.py)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    step = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [32, 32, 48, 48, 48]  # the third step's new shape fails a guard: a recompilation
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        with profile(activities=[ProfilerActivity.CPU], with_stack=args.with_stack,
                     schedule=schedule(wait=0, warmup=0, active=len(batches), repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
            for n in batches:
                x = torch.randn(n, 64)
                loss = step(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                prof.step()
        with raw.open("rb") as src, gzip.open(args.out, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)


if __name__ == "__main__":
    main()
