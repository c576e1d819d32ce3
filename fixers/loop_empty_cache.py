"""loop-empty-cache: torch.cuda.empty_cache() called every iteration."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import SCOPE_BOUNDARIES, Context, Edit, Example, Fixer

EMPTY_CACHE = {"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"}
GC_COLLECT = {"gc.collect"}


def _in_handler(ctx: Context, node: cst.CSTNode) -> bool:
    """Whether ``node`` is in an ``except``/``finally`` block (of its own function)."""
    for anc in ctx.ancestors(node):
        if isinstance(anc, SCOPE_BOUNDARIES):
            return False
        if isinstance(anc, (cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)):
            return True
    return False


def _previous(ctx: Context, small: cst.BaseSmallStatement) -> cst.BaseSmallStatement | None:
    """The small statement run right before ``small`` in the same block (``a; b`` or the line
    before), if it is a simple one."""
    line = ctx.parent(small)
    if not isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return None
    i = next(k for k, b in enumerate(line.body) if b is small)
    if i > 0:
        return line.body[i - 1]
    where = ctx.block_of(line)
    if where is None or where[1] == 0:
        return None
    prev = where[0].body[where[1] - 1]
    return prev.body[-1] if isinstance(prev, cst.SimpleStatementLine) and prev.body else None


def _after_cleanup(ctx: Context, small: cst.BaseSmallStatement) -> bool:
    """The statement before is a ``del ...`` or ``gc.collect()``: memory was just released on
    purpose (a sweep dropping one model before building the next)."""
    prev = _previous(ctx, small)
    if isinstance(prev, cst.Del):
        return True
    return (
        isinstance(prev, cst.Expr)
        and isinstance(prev.value, cst.Call)
        and ctx.matches(prev.value, GC_COLLECT, GC_COLLECT)
    )


class LoopEmptyCache(Fixer):
    pattern = "allocator-churn"
    name = "loop-empty-cache"
    summary = "torch.cuda.empty_cache() inside a loop: remove it"
    explanation = """\
## What it does
Removes `torch.cuda.empty_cache()` statements inside the body of a `for`/`while` loop (an only
statement becomes `pass`; comments are kept). Calls outside loops (e.g. once after
evaluation) are left alone, and so are calls that release memory on purpose: in an
`except`/`finally` block (recovering from `torch.cuda.OutOfMemoryError`, which runs only after
an OOM) and right after a `del` or `gc.collect()` (a sweep freeing one model before building
the next).

## Why is this bad?
`empty_cache()` hands the caching allocator's free blocks back to the driver. The next step
then allocates them again with `cudaMalloc`/`cudaFree`, which synchronise the device: the trace
shows `allocator-churn` (many `cudaMalloc`/`cudaFree` calls, idle gaps each step). It does not
make more memory available to PyTorch itself; it only helps other processes on the same GPU.

## Caveats
If another process shares the GPU and needs the memory between steps, keep the call and
suppress the finding (`# zoomer: ignore[allocator-churn]`).

## Example
```python
for batch in loader:
    loss = step(batch)
    torch.cuda.empty_cache()
```
Use instead:
```python
for batch in loader:
    loss = step(batch)
```
"""

    VALID = [
        "import torch\ntrain()\ntorch.cuda.empty_cache()\n",
        "import torch\nfor batch in loader:\n    step(batch)\n    torch.cuda.empty_cache()  # zoomer: ignore[allocator-churn]\n",
        "import torch\nfor batch in loader:\n    def hook():\n        torch.cuda.empty_cache()\n",
        "import torch\nfor x in xs:\n    freed = torch.cuda.empty_cache()\n",
        # OOM recovery: runs only after an OOM
        "import gc\nimport torch\nfor b in loader:\n    try:\n        step(b)\n"
        "    except torch.cuda.OutOfMemoryError:\n        gc.collect()\n        torch.cuda.empty_cache()\n        continue\n",
        "import torch\nfor b in loader:\n    try:\n        step(b)\n    finally:\n        torch.cuda.empty_cache()\n",
        # a sweep: one model freed before the next is built
        "import torch\nfor cfg in cfgs:\n    m = build(cfg).cuda()\n    evaluate(m)\n    del m\n    torch.cuda.empty_cache()\n",
        "import gc, torch\nfor cfg in cfgs:\n    run(cfg); del cfg; gc.collect(); torch.cuda.empty_cache()\n",
    ]
    INVALID = [
        Example(
            "import torch\nfor batch in loader:\n    loss = step(batch)\n    torch.cuda.empty_cache()\n",
            "import torch\nfor batch in loader:\n    loss = step(batch)\n",
            message_contains="empty_cache",
        ),
        Example(
            "import torch\nwhile True:\n    # free memory\n    torch.cuda.empty_cache()  # every step\n    step()\n",
            "import torch\nwhile True:\n    # free memory\n    # every step\n    step()\n",
            message_contains="empty_cache",
        ),
        Example(
            "import torch\nfor i, b in enumerate(loader):\n    if i % 100 == 0:\n        torch.cuda.empty_cache()\n",
            "import torch\nfor i, b in enumerate(loader):\n    if i % 100 == 0:\n        pass\n",
            message_contains="allocator",
        ),
        Example(
            "from torch.cuda import empty_cache\nfor b in loader: step(b); empty_cache()\n",
            "from torch.cuda import empty_cache\nfor b in loader: step(b)\n",
            message_contains="empty_cache",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        for call in ctx.nodes(cst.Call):
            if not ctx.matches(call, EMPTY_CACHE, {"torch.cuda.empty_cache"}):
                continue
            expr = ctx.parent(call)
            if not isinstance(expr, cst.Expr) or not ctx.in_loop(call):
                continue
            if _in_handler(ctx, expr) or _after_cleanup(ctx, expr):
                continue
            message = "torch.cuda.empty_cache() in the loop returns cached blocks to the driver every iteration; the allocator then has to cudaMalloc them again"
            changes = h.remove_statement(ctx, expr)
            yield self.replace(call, message, changes) if changes else self.report(call, message)
