"""loop-synchronize: torch.cuda.synchronize() in the step loop that does not bracket timing code."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

SYNCHRONIZE = {"torch.cuda.synchronize", "torch.cuda.current_stream.synchronize"}
TIMERS = {
    "time.time", "time.perf_counter", "time.monotonic", "time.process_time", "time.thread_time",
    "time.time_ns", "time.perf_counter_ns", "time.monotonic_ns", "time.process_time_ns", "time.thread_time_ns",
    "time.clock_gettime", "time.clock_gettime_ns", "timeit.default_timer",
    # wall-clock timestamps: `t0 = datetime.now()` ... `dt = datetime.now() - t0`
    "datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today",
}
#: spellings accepted when nothing in the file binds their root (snippets, star imports)
TIMERS_BARE = TIMERS | {
    "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time", "time_ns", "default_timer",
    "datetime.now", "datetime.utcnow", "datetime.today",
}
TIMER_METHODS = {"record", "elapsed_time"}


def _has_timing(ctx: Context, stmt: cst.CSTNode) -> bool:
    for n in h.walk(stmt, into_scopes=False):
        if isinstance(n, cst.Call):
            if ctx.matches(n, TIMERS, TIMERS_BARE):
                return True
            m = h.method(n)
            if m is not None and m[1] in TIMER_METHODS:
                return True
    return False


class LoopSynchronize(Fixer):
    pattern = "sync-point"
    name = "loop-synchronize"
    summary = "torch.cuda.synchronize() in a loop body that does not bracket timing code: remove it"
    explanation = """\
## What it does
Removes a `torch.cuda.synchronize()` statement inside a `for`/`while` loop body, unless the
statement next to it (before or after, in the same block) reads a clock (`time.time()`,
`time.perf_counter()`, `time.monotonic()`, `time.process_time()`, their `_ns` variants,
`timeit.default_timer()`, `datetime.now()`/`utcnow()`/`today()`, CUDA event
`record()`/`elapsed_time()`): there it brackets timing code and is needed. An only statement
becomes `pass`; comments are kept.

## Why is this bad?
`synchronize()` blocks the Python thread until every queued kernel has finished, so the CPU
cannot run ahead and queue the next step's kernels: the GPU idles while the CPU launches
(`sync-point` in the trace: `cudaDeviceSynchronize` followed by a gap). PyTorch orders the work
on a stream by itself; results do not depend on the call.

## Caveats
Keep it (and suppress with `# zoomer: ignore[sync-point]`) when it orders work against
something PyTorch does not track (a custom CUDA extension on another stream, host code reading
memory a kernel writes).

## Example
```python
for x, y in loader:
    loss = train_step(x, y)
    torch.cuda.synchronize()
```
Use instead:
```python
for x, y in loader:
    loss = train_step(x, y)
```
"""

    VALID = [
        "import time, torch\nfor x in loader:\n    torch.cuda.synchronize()\n    t0 = time.perf_counter()\n    step(x)\n    torch.cuda.synchronize()\n    dt = time.perf_counter() - t0\n",
        "import torch\nstep()\ntorch.cuda.synchronize()\n",
        "import torch\nfor x in loader:\n    step(x)\n    torch.cuda.synchronize()  # zoomer: ignore[sync-point]\n",
        "import torch\nfor x in loader:\n    start.record()\n    step(x)\n    end.record()\n    torch.cuda.synchronize()\n",
        # timing with wall-clock timestamps (datetime), module and class forms
        "import torch\nfrom datetime import datetime\n\nfor x in loader:\n    t0 = datetime.now()\n    step(x)\n"
        "    torch.cuda.synchronize()\n    dt = datetime.now() - t0\n",
        "import datetime\nimport torch\nfor x in loader:\n    step(x)\n    torch.cuda.synchronize()\n"
        "    elapsed = datetime.datetime.utcnow() - t0\n",
        "import torch\nfrom datetime import datetime as DT\nfor x in loader:\n    step(x)\n    torch.cuda.synchronize()\n"
        "    t1 = DT.today()\n",
        "import torch\nfor x in loader:\n    step(x)\n    torch.cuda.synchronize()\n    t1 = datetime.now()\n",
        "import time, torch\nfor x in loader:\n    t0 = time.time_ns()\n    step(x)\n    torch.cuda.synchronize()\n"
        "    dt = time.time_ns() - t0\n",
        "import torch\nfrom time import process_time_ns as clock\nfor x in loader:\n    step(x)\n    torch.cuda.synchronize()\n"
        "    dt = clock() - t0\n",
        "import torch\nimport time as tm\nfor x in loader:\n    step(x)\n    torch.cuda.synchronize()\n"
        "    dt = tm.thread_time() - t0\n",
        # every clock the file's timing loops use, imported in its usual forms
        "import torch\nimport time\nfrom time import perf_counter as pc\nfrom datetime import datetime\n\n"
        "for x in loader:\n    t0 = time.perf_counter_ns()\n    step(x)\n    torch.cuda.synchronize()\n    dt = time.perf_counter_ns() - t0\n\n"
        "for x in loader:\n    t0 = pc()\n    step(x)\n    torch.cuda.synchronize()\n    dt = pc() - t0\n\n"
        "for x in loader:\n    t0 = datetime.now()\n    step(x)\n    torch.cuda.synchronize()\n    dt = datetime.now() - t0\n\n"
        "for x in loader:\n    t0 = time.time_ns()\n    step(x)\n    torch.cuda.synchronize()\n    dt = time.time_ns() - t0\n",
        # CUDA events: the synchronize lets elapsed_time read both events
        "import torch\nfor x in loader:\n    end.record()\n    torch.cuda.synchronize()\n    ms = start.elapsed_time(end)\n",
    ]
    INVALID = [
        Example(
            "import torch\nfor x, y in loader:\n    loss = train_step(x, y)\n    torch.cuda.synchronize()\n",
            "import torch\nfor x, y in loader:\n    loss = train_step(x, y)\n",
            message_contains="synchronize",
        ),
        Example(
            "import torch\nwhile step < n:\n    torch.cuda.synchronize()\n",
            "import torch\nwhile step < n:\n    pass\n",
            message_contains="blocks",
        ),
        Example(
            "import torch\n\n\ndef train(loader):\n    for x in loader:\n        torch.cuda.synchronize(device)\n\n        out = model(x)\n",
            "import torch\n\n\ndef train(loader):\n    for x in loader:\n\n        out = model(x)\n",
            message_contains="synchronize",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        for call in ctx.nodes(cst.Call):
            if not ctx.matches(call, SYNCHRONIZE, {"torch.cuda.synchronize"}):
                continue
            expr = ctx.parent(call)
            if not isinstance(expr, cst.Expr) or not ctx.in_loop(call):
                continue
            line = ctx.parent(expr)
            where = ctx.block_of(line) if line is not None else None
            if where is not None:
                block, i = where
                neighbours = [block.body[j] for j in (i - 1, i + 1) if 0 <= j < len(block.body)]
                if any(_has_timing(ctx, s) for s in neighbours) or (len(line.body) > 1 and _has_timing(ctx, line)):
                    continue
            message = "torch.cuda.synchronize() in the loop blocks the CPU until the GPU drains, every iteration"
            changes = h.remove_statement(ctx, expr)
            yield self.replace(call, message, changes) if changes else self.report(call, message)
