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


_CLEANUP_WORDS = ("clear", "reset", "collect", "synchronize", "free", "release")


def _cleanup_call(ctx: Context, small: cst.BaseSmallStatement | None) -> bool:
    """A bare call that frees or resets something (``torch._C._cuda_clearCublasWorkspaces()``,
    ``torch.cuda.reset_peak_memory_stats()``, ``torch.cuda.synchronize()``)."""
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return False
    name = (h.last_name(small.value.func) or "").lower()
    return any(w in name for w in _CLEANUP_WORDS)


def _after_cleanup(ctx: Context, small: cst.BaseSmallStatement) -> bool:
    """Memory was just released on purpose (a sweep dropping one model before building the next):
    the statement before is a ``del ...`` or ``gc.collect()``, or a run of clean-up calls right
    before it starts with one (``gc.collect(); torch._C._cuda_clearCublasWorkspaces();
    torch.cuda.empty_cache()``)."""
    prev = _previous(ctx, small)
    for _ in range(8):
        if isinstance(prev, cst.Del):
            return True
        if isinstance(prev, cst.Expr) and isinstance(prev.value, cst.Call) and ctx.matches(prev.value, GC_COLLECT, GC_COLLECT):
            return True
        if not _cleanup_call(ctx, prev):
            return False
        prev = _previous(ctx, prev)
    return False


_EXITS = (cst.Break, cst.Return, cst.Raise)


def _leaves_the_loop(ctx: Context, small: cst.BaseSmallStatement) -> bool:
    """The simple statements that follow ``small`` in its block include a ``break``, ``return`` or
    ``raise``: the call runs once on the way out of the loop, not every iteration (``if busy:
    torch.cuda.empty_cache(); break``). Only the straight run of simple statements after it counts
    (a compound statement in between might ``continue``)."""
    line = ctx.parent(small)
    if not isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return False
    i = next(k for k, b in enumerate(line.body) if b is small)
    if any(isinstance(b, _EXITS) for b in line.body[i + 1:]):
        return True
    if isinstance(line, cst.SimpleStatementSuite):
        return False
    where = ctx.block_of(line)
    if where is None:
        return False
    for stmt in where[0].body[where[1] + 1:]:
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        if any(isinstance(b, _EXITS) for b in stmt.body):
            return True
    return False


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
an OOM), right after a `del` or `gc.collect()` or a run of clean-up calls that starts with one
(a sweep freeing one model before building the next), and calls followed by a `break`,
`return` or `raise` in the same block (they run once, on the way out of the loop).

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
        # a clean-up run that starts with gc.collect() (torch's own leak checker, common_utils.py)
        "import gc, torch\nfor i in range(n):\n    run(i)\n    gc.collect()\n    torch._C._cuda_clearCublasWorkspaces()\n"
        "    torch.cuda.empty_cache()\n",
        # on the way out of the loop: runs once, not every iteration
        "import torch\nfor d in devices:\n    if busy(d):\n        torch.cuda.empty_cache()\n        break\n",
        "import torch\ndef f(xs):\n    for x in xs:\n        if x:\n            torch.cuda.empty_cache()\n            log(x)\n            return x\n",
        "import torch\nwhile True:\n    if done(): torch.cuda.empty_cache(); break\n",
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
        # a clean-up call that is not preceded by del/gc.collect() is not a sweep; a break behind a
        # compound statement (which may `continue`) does not make the call a one-off
        Example(
            "import torch\nfor b in loader:\n    step(b)\n    torch.cuda.synchronize()\n    torch.cuda.empty_cache()\n",
            "import torch\nfor b in loader:\n    step(b)\n    torch.cuda.synchronize()\n",
            message_contains="empty_cache",
        ),
        Example(
            "import torch\nfor b in loader:\n    torch.cuda.empty_cache()\n    if skip(b):\n        continue\n    break\n",
            "import torch\nfor b in loader:\n    if skip(b):\n        continue\n    break\n",
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
            if _in_handler(ctx, expr) or _after_cleanup(ctx, expr) or _leaves_the_loop(ctx, expr):
                continue
            message = "torch.cuda.empty_cache() in the loop returns cached blocks to the driver every iteration; the allocator then has to cudaMalloc them again"
            changes = h.remove_statement(ctx, expr)
            yield self.replace(call, message, changes) if changes else self.report(call, message)
