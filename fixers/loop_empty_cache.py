"""loop-empty-cache: torch.cuda.empty_cache() called every iteration."""

from __future__ import annotations

import re
from typing import Iterable, Iterator

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import SCOPE_BOUNDARIES, Context, Edit, Example, Fixer, iter_children

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


def _neighbours(ctx: Context, small: cst.BaseSmallStatement, step: int) -> Iterator[cst.CSTNode]:
    """The statements run right before (``step=-1``) or right after (``step=1``) ``small`` in its
    block, nearest first: the other small statements of its line (``a; b``), then the block's
    statements (the small statements of a line one by one, a compound statement as a whole)."""
    line = ctx.parent(small)
    if not isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return
    i = next(k for k, b in enumerate(line.body) if b is small)
    yield from (reversed(line.body[:i]) if step < 0 else line.body[i + 1:])
    if isinstance(line, cst.SimpleStatementSuite):
        return  # `if x: a; b`: the line is the whole block
    where = ctx.block_of(line)
    if where is None:
        return
    block, k = where
    for stmt in (reversed(block.body[:k]) if step < 0 else block.body[k + 1:]):
        if isinstance(stmt, cst.SimpleStatementLine):
            yield from (reversed(stmt.body) if step < 0 else stmt.body)
        else:
            yield stmt


def _previous(ctx: Context, small: cst.BaseSmallStatement) -> cst.BaseSmallStatement | None:
    """The small statement run right before ``small`` in the same block (``a; b`` or the line
    before), if it is a simple one."""
    prev = next(_neighbours(ctx, small, -1), None)
    return prev if isinstance(prev, cst.BaseSmallStatement) else None


_CLEANUP_WORDS = ("clear", "reset", "collect", "synchronize", "free", "release")


def _cleanup_call(ctx: Context, small: cst.BaseSmallStatement | None) -> bool:
    """A bare call that frees or resets something (``torch._C._cuda_clearCublasWorkspaces()``,
    ``torch.cuda.reset_peak_memory_stats()``, ``torch.cuda.synchronize()``)."""
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return False
    name = (h.last_name(small.value.func) or "").lower()
    return any(w in name for w in _CLEANUP_WORDS)


def _releases(small: cst.CSTNode | None) -> bool:
    """Drops references on purpose: ``del a, b`` or ``a = None`` / ``a, b = None, None`` /
    ``a = b = None``."""
    if isinstance(small, cst.Del):
        return True
    if not isinstance(small, cst.Assign):
        return False
    values = [e.value for e in small.value.elements] if isinstance(small.value, cst.Tuple) else [small.value]
    return bool(values) and all(h.is_literal(v, None) for v in values)


def _after_cleanup(ctx: Context, small: cst.BaseSmallStatement) -> bool:
    """Memory was just released on purpose (a sweep dropping one model before building the next;
    a chunked forward dropping the last chunk's tensors): the statement before is a ``del ...``,
    an ``a, b = None, None`` or ``gc.collect()``, or a run of clean-up calls right before it starts
    with one (``gc.collect(); torch._C._cuda_clearCublasWorkspaces(); torch.cuda.empty_cache()``)."""
    prev = _previous(ctx, small)
    for _ in range(8):
        if _releases(prev):
            return True
        if isinstance(prev, cst.Expr) and isinstance(prev.value, cst.Call) and ctx.matches(prev.value, GC_COLLECT, GC_COLLECT):
            return True
        if not _cleanup_call(ctx, prev):
            return False
        prev = _previous(ctx, prev)
    return False


#: words of a function name that say it runs a whole phase with its own memory profile:
#: autoregressive generation (a KV cache sized to batch x (prompt + new tokens), hundreds of
#: forward steps per call), RL rollouts, an evaluation or validation pass
_PHASE_WORDS = frozenset({"generate", "generation", "rollout", "rollouts", "evaluate", "evaluation", "validate", "validation"})
#: ... unless the name says it does one step of it (`validation_step`, `generate_next_token`)
_STEP_WORDS = frozenset({"step", "steps", "token", "tokens", "next", "batch"})


def _phase_name(name: str | None) -> bool:
    words = {w.lower() for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name or "")}
    return bool(words & _PHASE_WORDS) and not words & _STEP_WORDS


def _runs_phase(stmt: cst.CSTNode) -> bool:
    """``stmt`` calls a phase function (``self.generate_trajectory(...)``, ``model.generate(...)``,
    ``evaluate(model, val_loader)``), also inside a ``with``/``for`` block, but not under an
    ``if`` (a generation every 1000 steps does not make the call next to it a phase boundary) or
    in a nested function."""
    stack: list[cst.CSTNode] = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.If, *SCOPE_BOUNDARIES)):
            continue
        if isinstance(node, cst.Call) and _phase_name(h.last_name(node.func)):
            return True
        stack.extend(iter_children(node))
    return False


def _quiet(ctx: Context, node: cst.CSTNode) -> bool:
    """A statement that only frees memory or waits (``del``, ``x = None``, ``gc.collect()``, a
    clean-up call, a barrier, another ``empty_cache()``): skipped when looking for the phase next
    to an ``empty_cache()``."""
    if _releases(node) or _cleanup_call(ctx, node):
        return True
    if not (isinstance(node, cst.Expr) and isinstance(node.value, cst.Call)):
        return False
    return ctx.matches(node.value, EMPTY_CACHE | GC_COLLECT, {"torch.cuda.empty_cache", "gc.collect"}) or (
        h.last_name(node.value.func) or "") in ("barrier", "empty_cache")


def _phase_boundary(ctx: Context, small: cst.BaseSmallStatement) -> bool:
    """The call sits right before or right after a generation / rollout / evaluation phase (clean-up
    statements in between skipped): it releases the blocks cached by one phase before the next, which
    allocates differently (torchtune's GRPO recipe empties the cache around each
    ``generate_trajectory``). It runs once per phase, not once per training step."""
    for step in (-1, 1):
        for i, node in enumerate(_neighbours(ctx, small, step)):
            if i >= 8 or not _quiet(ctx, node):
                if i < 8 and _runs_phase(node):
                    return True
                break
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
statement becomes `pass`; comments are kept). An `if` left holding nothing (`if step % 100 == 0:`
around the call, no `elif`/`else`) goes too when its test has no side effects (names, attribute
reads, literals, comparisons but `in` and arithmetic of those); one that calls something keeps
its test, as `if f(): pass`. A clause left holding nothing goes where dropping it changes
nothing: an `else:`, the `finally:` of a `try` with a handler, a last `elif` with such a test (a
middle `elif` or a clause with a comment keeps `pass`). An import that the removal leaves unused (`from torch.cuda import
empty_cache`, when nothing else in the file names it: code, `__all__`, any string but a
docstring) is removed with the calls; not in a package's `__init__.py` or a notebook (magics
and cells left out of the analysis may use it). Calls outside loops (e.g. once after
evaluation) are left alone, and so are calls that release memory on purpose: in an
`except`/`finally` block (recovering from `torch.cuda.OutOfMemoryError`, which runs only after
an OOM), right after a `del`, an `a, b = None, None` or `gc.collect()`, or a run of clean-up
calls that starts with one (a sweep freeing one model before building the next, a chunked
forward dropping the last chunk's tensors), and calls followed by a `break`, `return` or
`raise` in the same block (they run once, on the way out of the loop).

Calls at a phase boundary are left alone too: right before or right after (clean-up
statements, barriers and other `empty_cache()` calls in between skipped) a statement that runs
a generation, rollout, evaluation or validation phase, i.e. calls a function whose name says so
(`model.generate(...)`, `self.generate_trajectory(...)`, `rollout(...)`, `evaluate(...)`,
`validate(...)`), also inside a `with`/`for` block. Such a phase allocates unlike the training
step around it (generation builds a KV cache sized to batch x (prompt + new tokens) and runs
hundreds of forward steps per call), so emptying the cache between the phases is deliberate
(torchtune's GRPO recipe brackets each `generate_trajectory` with it) and costs one
re-allocation per phase, not per step. Names of one step of a phase (`validation_step`,
`eval_step`, `generate_next_token`, `evaluate_batch`) do not count, nor does a phase under an
`if` (a sample generated every 1000 steps does not stop the call next to it running every step).

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
        # a chunked forward dropping the previous chunk's tensors first (MONAI's VISTA3D)
        "import torch\nmasks = []\nfor chunk in chunks:\n    # free the last chunk's tensors before the next forward\n"
        "    src, out = None, None\n    torch.cuda.empty_cache()\n    src, out = run(chunk)\n    masks.append(out)\n",
        # phase boundaries: generation (its KV cache) vs the forward/backward around it, as in
        # torchtune's GRPO recipe, which brackets each generate_trajectory() with empty_cache()
        "import torch\n\n\nclass Recipe:\n    def trajectories(self, ids, chunk):\n        out = []\n"
        "        with torch.no_grad():\n            for start in range(0, len(ids), chunk):\n"
        "                torch.cuda.empty_cache()\n                out.append(self.generate_trajectory(ids[start:start + chunk]))\n"
        "                torch.cuda.empty_cache()\n        return out\n",
        "import torch\nfor batch in loader:\n    with torch.no_grad():\n"
        "        rollouts = policy.generate(batch[\"prompt\"], max_new_tokens=256)\n"
        "    torch.distributed.barrier()\n    torch.cuda.empty_cache()\n    loss = train_step(rollouts)\n",
        "import torch\nfor epoch in range(epochs):\n    train_one_epoch(model, loader)\n    torch.cuda.empty_cache()\n"
        "    evaluate(model, val_loader)\n",
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
        # an `if` left empty goes when its test has no side effects; one that calls something stays
        Example(
            "import torch\nfor i, b in enumerate(loader):\n    step(b)\n    if i % 100 == 0:\n        torch.cuda.empty_cache()\n",
            "import torch\nfor i, b in enumerate(loader):\n    step(b)\n",
            message_contains="allocator",
        ),
        Example(
            "import torch\nfor i, b in enumerate(loader):\n    if i % 100 == 0:  # every 100 steps\n"
            "        if self.low_memory: torch.cuda.empty_cache()\n    step(b)\n",
            "import torch\nfor i, b in enumerate(loader):\n    # every 100 steps\n    step(b)\n",
            message_contains="allocator",
        ),
        Example(
            "import torch\nfor b in loader:\n    step(b)\n    if memory_low(b):\n        torch.cuda.empty_cache()\n"
            "    if not (b := next(it)):\n        torch.cuda.empty_cache()\n    if 0 in stream:\n        torch.cuda.empty_cache()\n",
            "import torch\nfor b in loader:\n    step(b)\n    if memory_low(b):\n        pass\n"
            "    if not (b := next(it)):\n        pass\n    if 0 in stream:\n        pass\n",
            message_contains="allocator",
        ),
        # the import the removal leaves unused goes too; one still used elsewhere stays
        Example(
            "from torch.cuda import empty_cache\nfor b in loader: step(b); empty_cache()\n",
            "for b in loader: step(b)\n",
            message_contains="from torch.cuda import empty_cache",
        ),
        Example(
            "import torch\nfrom torch.cuda import empty_cache, synchronize as sync\n\nfor b in loader:\n    step(b)\n"
            "    empty_cache()\n    sync()\n    empty_cache()\n",
            "import torch\nfrom torch.cuda import synchronize as sync\n\nfor b in loader:\n    step(b)\n    sync()\n",
            message_contains="empty_cache",
        ),
        Example(
            "from torch.cuda import empty_cache\nfor b in loader:\n    step(b)\n    empty_cache()\nempty_cache()\n",
            "from torch.cuda import empty_cache\nfor b in loader:\n    step(b)\nempty_cache()\n",
            message_contains="empty_cache",
        ),
        Example(
            "\"\"\"Calls empty_cache() every step.\"\"\"\nfrom torch.cuda import empty_cache\n\n\ndef train(loader):\n"
            "    \"\"\"Trains; empty_cache() after each batch.\"\"\"\n    for b in loader:\n        step(b)\n        empty_cache()\n",
            "\"\"\"Calls empty_cache() every step.\"\"\"\n\n\ndef train(loader):\n"
            "    \"\"\"Trains; empty_cache() after each batch.\"\"\"\n    for b in loader:\n        step(b)\n",
            message_contains="is left unused",
        ),
        Example(
            "from torch.cuda import empty_cache\n__all__ = [\"empty_cache\"]\nfor b in loader:\n    step(b)\n    empty_cache()\n",
            "from torch.cuda import empty_cache\n__all__ = [\"empty_cache\"]\nfor b in loader:\n    step(b)\n",
            message_contains="empty_cache",
        ),
        Example(
            "from torch.cuda import empty_cache\nfor b in loader:\n    step(b)\n    empty_cache()  # zoomer: ignore[allocator-churn]\n"
            "for b in loader:\n    empty_cache()\n",
            "from torch.cuda import empty_cache\nfor b in loader:\n    step(b)\n    empty_cache()  # zoomer: ignore[allocator-churn]\n"
            "for b in loader:\n    pass\n",
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
        # one step of a phase is not a phase: validation_step runs per batch
        Example(
            "import torch\nfor b in val_loader:\n    out = model.validation_step(b)\n    torch.cuda.empty_cache()\n",
            "import torch\nfor b in val_loader:\n    out = model.validation_step(b)\n",
            message_contains="empty_cache",
        ),
        # a generation under an if (every 1000 steps) leaves the call running every step
        Example(
            "import torch\nfor step, b in enumerate(loader):\n    train_step(b)\n    if step % 1000 == 0:\n"
            "        sample = model.generate(prompt)\n    torch.cuda.empty_cache()\n",
            "import torch\nfor step, b in enumerate(loader):\n    train_step(b)\n    if step % 1000 == 0:\n"
            "        sample = model.generate(prompt)\n",
            message_contains="empty_cache",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        message = "torch.cuda.empty_cache() in the loop returns cached blocks to the driver every iteration; the allocator then has to cudaMalloc them again"
        found: list[tuple[cst.Call, dict]] = []
        for call in ctx.nodes(cst.Call):
            if not ctx.matches(call, EMPTY_CACHE, {"torch.cuda.empty_cache"}):
                continue
            expr = ctx.parent(call)
            if not isinstance(expr, cst.Expr) or not ctx.in_loop(call):
                continue
            if _in_handler(ctx, expr) or _after_cleanup(ctx, expr) or _leaves_the_loop(ctx, expr) or _phase_boundary(ctx, expr):
                continue
            found.append((call, h.remove_statement(ctx, expr, drop_empty_if=True)))
        removed = [(call, changes) for call, changes in found if changes and not ctx.is_suppressed(call, self.pattern, self.name)]
        with_import = h.drop_imports_left_unused(ctx, removed)
        for call, changes in found:
            if call in with_import:
                changes, imported = with_import[call]
                yield self.replace(call, message + f"; `{imported}` is left unused: removed too", changes)
            else:
                yield self.replace(call, message, changes) if changes else self.report(call, message)
