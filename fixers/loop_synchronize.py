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
#: streams, events and CUDA graphs: work PyTorch does not order against the default stream for you
STREAM_CALLS = {
    "torch.cuda.stream", "torch.cuda.Stream", "torch.cuda.ExternalStream", "torch.cuda.StreamContext",
    "torch.cuda.set_stream", "torch.cuda.Event", "torch.cuda.graph", "torch.cuda.CUDAGraph",
    "torch.cuda.make_graphed_callables", "torch.cuda.graph_pool_handle", "torch.Stream", "torch.Event",
    "torch.cuda.streams.Stream", "torch.cuda.streams.Event", "torch.cuda.graphs.graph", "torch.cuda.graphs.CUDAGraph",
}
STREAM_BARE = STREAM_CALLS | {"cuda.stream", "cuda.Stream", "cuda.Event", "cuda.graph", "cuda.CUDAGraph"}
#: any callee ending in one of these names counts, whatever it is bound to
STREAM_LAST = {"Stream", "ExternalStream", "StreamContext", "Event", "CUDAGraph", "make_graphed_callables", "graph_pool_handle"}
STREAM_METHODS = {"wait_stream", "wait_event", "record_event", "record_stream", "replay", "capture_begin", "capture_end"}


def _stream_work(ctx: Context, scope: cst.CSTNode) -> cst.Call | None:
    """A call in ``scope`` (a function, or the module's own code) that uses a side stream, a
    CUDA event or a CUDA graph, if any."""
    for n in h.walk(scope, into_scopes=False):
        if not isinstance(n, cst.Call):
            continue
        m = h.method(n)
        if m is not None and m[1] in STREAM_METHODS:
            return n
        d = h.dotted(n.func) or ""
        if d.split(".")[-1] in STREAM_LAST or ctx.matches(n, STREAM_CALLS, STREAM_BARE):
            return n
    return None


def _async_copy(scope: cst.CSTNode) -> cst.Call | None:
    """A copy in ``scope`` (a function, or the module's own code) that runs asynchronously to the host
    and that a synchronize may be ordering, if any: ``.copy_(src, non_blocking=True)`` (either
    direction); a device-to-host ``.to("cpu", non_blocking=True)``, whose result the host may read
    before it has arrived; a host-to-device ``.to(..., non_blocking=True)``/``.cuda(non_blocking=True)``
    of a tensor the scope also writes in place (``staging.copy_(batch)``: a pinned buffer the copy may
    still be reading)."""
    calls = [n for n in h.walk(scope, into_scopes=False) if isinstance(n, cst.Call)]
    written = {h.dotted(m[0]) for n in calls if (m := h.method(n)) is not None and m[1].endswith("_") and not m[1].startswith("_")}
    for n in calls:
        m = h.method(n)
        if m is None or m[1] not in ("copy_", "to", "cuda"):
            continue
        flag = h.arg_at(n, "non_blocking", 1) if m[1] == "copy_" else h.kwarg(n, "non_blocking")
        if flag is None or h.is_literal(flag.value, False):
            continue
        if m[1] == "copy_" or (m[1] == "to" and _to_cpu(n)):
            return n
        source = h.dotted(m[0])
        if source is not None and source in written:
            return n
    return None


def _to_cpu(call: cst.Call) -> bool:
    """``.to(...)`` whose device reads like the CPU: ``"cpu"``, ``torch.device("cpu")``, ``cpu_device``."""
    device = h.arg_at(call, "device", 0)
    if device is None:
        return False
    return "cpu" in cst.Module(body=[]).code_for_node(device.value).lower()


def _has_timing(ctx: Context, stmt: cst.CSTNode) -> bool:
    for n in h.walk(stmt, into_scopes=False):
        if isinstance(n, cst.Call):
            if ctx.matches(n, TIMERS, TIMERS_BARE):
                return True
            m = h.method(n)
            if m is not None and m[1] in TIMER_METHODS:
                return True
    return False


def _clock_in_loops(ctx: Context, call: cst.Call) -> cst.CSTNode | None:
    """A clock read in a loop around ``call`` - its header (`while time.time() - t0 < budget:`) or its
    body, outside nested functions - if any: the loop times something, and the synchronize may be what
    makes the clock see the GPU's work (a warm-up or benchmark loop run for a time budget; a time taken
    a few statements later)."""
    for loop in ctx.loops_around(call):
        for n in h.walk(loop, into_scopes=False):
            if isinstance(n, cst.Call) and (ctx.matches(n, TIMERS, TIMERS_BARE)
                                            or ((m := h.method(n)) is not None and m[1] in TIMER_METHODS)):
                return n
    return None


#: words in a function's name that say it measures time (a benchmark, a warm-up, a latency probe)
TIMING_WORDS = ("bench", "timing", "time", "measure", "profil", "warmup", "warm_up", "latency", "throughput")


def _timing_function(ctx: Context, call: cst.Call) -> cst.FunctionDef | None:
    """The function around ``call`` (any level) whose name says it measures time, if any: its caller
    holds the clock (`timeit.timeit(bench)`, `triton.testing.do_bench(fn)`), out of this loop's sight."""
    for a in ctx.ancestors(call):
        if isinstance(a, cst.FunctionDef) and any(w in a.name.value.lower() for w in TIMING_WORDS):
            return a
    return None


def _explained(ctx: Context, line: cst.CSTNode | None) -> int | None:
    """The line of a comment on the synchronize's own line, or of the comment lines right above it
    (no blank line between), if any: the author says why it is there."""
    if not isinstance(line, cst.SimpleStatementLine):
        return None
    start = ctx.pos(line).start.line
    if line.trailing_whitespace.comment is not None:
        return start
    above = 0
    for empty in reversed(line.leading_lines):
        if empty.comment is None:
            break
        above += 1
    return start - above if above else None


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
becomes `pass`; comments are kept. An `if` left holding nothing (no `elif`/`else`) goes too
when its test has no side effects (names, attribute reads, literals, comparisons but `in`
and arithmetic of those), as does a clause left holding nothing where dropping it changes nothing
(an `else:`, the `finally:` of a `try` with a handler, a last `elif` with such a test; a middle
`elif` or a clause with a comment keeps `pass`), and so does an import the removal leaves unused (`from torch.cuda import
synchronize`, when nothing else in the file, `__all__` or any string included, names it; not
in a package's `__init__.py` or a notebook).

It reports, and keeps, a call in a loop that reads a clock elsewhere - in its header or further
away in its body, in any loop around it: a warm-up or benchmark loop that runs for a time budget
(`while time.time() - t0 < budget:`), or a time taken a few statements later, may be measuring
exactly what the synchronize waits for; so is one in a notebook cell that `%%time`, `%%timeit` or
`%%prun` times as a whole, and one in a function whose name says it measures time (`benchmark`,
`bench_*`, `*_timing`, `measure_*`, `profile_*`, `warmup`, `*latency*`, `*throughput*`, a name with
`time` in it): its caller holds the clock (`timeit.timeit(bench)`, `triton.testing.do_bench(fn)`).

It reports, and keeps, a call with a comment on its line or right above it: the author says why
it is there (`# ensure the allreduce completed: a broken join would hang here`), which the fixer
cannot weigh - a test may synchronize so that a hang or an asynchronous CUDA error surfaces at
that point.

It reports, and keeps, a call in a function (or module code) that uses side streams, CUDA
events or CUDA graphs (`torch.cuda.stream(...)`, `Stream(...)`, `wait_stream`, `Event(...)`,
`record_event`, `torch.cuda.graph`/`CUDAGraph`/`replay()`): there the synchronize may be what
orders the side stream's work before the host reads it (`y.cpu()` after
`with torch.cuda.stream(s): y = model(x)`). So is one in a function (or module code) that copies
with `non_blocking=True` where the host may see the copy unfinished: a device-to-host
`.to("cpu", non_blocking=True)` (its result is read on the host before it has arrived without the
synchronize), any `.copy_(src, non_blocking=True)`, or a host-to-device copy of a tensor the same
code writes in place (`staging.copy_(batch)` then `staging.to("cuda", non_blocking=True)`: a
pinned buffer overwritten while the last copy may still be reading it).

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
        # an `if` left empty goes when its test has no side effects, and so does an import left unused
        Example(
            "from torch.cuda import synchronize\nfor i, x in enumerate(loader):\n    step(x)\n    if i % log_every == 0:\n"
            "        synchronize()\n    if ready(i):\n        synchronize()\n",
            "for i, x in enumerate(loader):\n    step(x)\n    if ready(i):\n        pass\n",
            message_contains="from torch.cuda import synchronize",
        ),
        Example(
            "import torch\n\n\ndef train(loader):\n    for x in loader:\n        torch.cuda.synchronize(device)\n\n        out = model(x)\n",
            "import torch\n\n\ndef train(loader):\n    for x in loader:\n\n        out = model(x)\n",
            message_contains="synchronize",
        ),
        # side-stream work: the synchronize orders it before the default stream's .cpu()
        Example(
            "import torch\n"
            "s = torch.cuda.Stream()\n"
            "for x in loader:\n"
            "    with torch.cuda.stream(s):\n"
            "        y = model(x)\n"
            "    torch.cuda.synchronize()\n"
            "    out = y.cpu()\n",
            None,
            message_contains="stream",
        ),
        # a device-to-host copy with non_blocking=True: without the synchronize numpy() reads the buffer
        # before the copy has filled it
        Example(
            "import torch\n\n\ndef infer(model, loader, results):\n    for batch in loader:\n"
            "        host = model(batch.cuda()).to(\"cpu\", non_blocking=True)\n        torch.cuda.synchronize()\n"
            "        results.append(host.numpy())\n",
            None,
            message_contains="line 6 copies with non_blocking=True",
        ),
        # a pinned staging buffer written each step: the synchronize keeps the write behind the last copy
        Example(
            "import torch\n\n\ndef feed(model, loader, staging):\n    for batch in loader:\n        torch.cuda.synchronize()\n"
            "        staging.copy_(batch)\n        model(staging.to(\"cuda\", non_blocking=True))\n",
            None,
            message_contains="line 8 copies with non_blocking=True",
        ),
        # a host-to-device copy of each batch, nothing written in place: removed
        Example(
            "import torch\n\n\ndef train(model, loader):\n    for x in loader:\n"
            "        loss = model(x.to(\"cuda\", non_blocking=True)).sum()\n        loss.backward()\n        torch.cuda.synchronize()\n",
            "import torch\n\n\ndef train(model, loader):\n    for x in loader:\n"
            "        loss = model(x.to(\"cuda\", non_blocking=True)).sum()\n        loss.backward()\n",
            message_contains="blocks",
        ),
        Example(
            "import torch\n\n"
            "def run(g, loader, static_x, static_y):\n"
            "    for x in loader:\n"
            "        static_x.copy_(x)\n"
            "        g.replay()\n"
            "        torch.cuda.synchronize()\n"
            "        out = static_y.cpu()\n",
            None,
            message_contains="graph",
        ),
        # a loop run for a time budget (torch's vendored quack autotuner warms the GPU up this way): without the
        # synchronize the host would queue work for the budget instead of the GPU running it
        Example(
            "import time\nimport torch\n\n"
            "def warmup(a, budget):\n"
            "    t0 = time.time()\n"
            "    while time.time() - t0 < budget:\n"
            "        for _ in range(100):\n"
            "            a = a @ a\n"
            "        torch.cuda.synchronize()\n",
            None,
            message_contains="reads a clock",
        ),
        # the caller holds the clock: a function whose name says it measures time
        Example(
            "import timeit\nimport torch\n\n"
            "def bench_matmul(a):\n"
            "    for _ in range(10):\n"
            "        a @ a\n"
            "        torch.cuda.synchronize()\n\n"
            "print(timeit.timeit(lambda: bench_matmul(a), number=5))\n",
            None,
            message_contains="whose name says it measures time",
        ),
        # the time is taken further on in the iteration, not next to the synchronize
        Example(
            "import time\nimport torch\n"
            "for x in loader:\n"
            "    t0 = time.perf_counter()\n"
            "    out = model(x)\n"
            "    torch.cuda.synchronize()\n"
            "    log(out)\n"
            "    times.append(time.perf_counter() - t0)\n",
            None,
            message_contains="not removed",
        ),
        # a comment says why it is there (torch's distributed_test.py: a join test that must hang here if broken)
        Example(
            "import torch\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
            "    # Ensure completion of GPU kernels (including allreduce). If the\n"
            "    # join API is not properly implemented, this should hang.\n"
            "    torch.cuda.synchronize(device=rank)\n",
            None,
            message_contains="says why it is there",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        streams_in: dict[int, cst.Call | None] = {}
        edits = list(self._edits(ctx, streams_in))
        removed = [(e.node, e.changes) for e in edits if e.changes and not ctx.is_suppressed(e.node, self.pattern, self.name)]
        with_import = h.drop_imports_left_unused(ctx, removed)  # type: ignore[arg-type]
        for edit in edits:
            if edit.node in with_import:
                changes, imported = with_import[edit.node]  # type: ignore[index]
                edit = self.replace(edit.node, edit.message + f"; `{imported}` is left unused: removed too", changes)
            yield edit

    def _edits(self, ctx: Context, streams_in: dict[int, cst.Call | None]) -> Iterable[Edit]:
        copies_in: dict[int, cst.Call | None] = {}
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
            comment = _explained(ctx, line)
            if comment is not None:
                yield self.report(call, message + f"; not removed: the comment at line {comment} says why it is there "
                                  "(a deliberate synchronize: a hang or a CUDA error surfacing there, work PyTorch does not "
                                  "track); remove it by hand if the reason does not hold")
                continue
            if ctx.timed(call):
                yield self.report(call, message + "; not removed: the notebook cell is timed (%%time, %%timeit, "
                                  "%%prun), and the synchronize may be what its time waits for")
                continue
            clock = _clock_in_loops(ctx, call)
            if clock is not None:
                yield self.report(call, message + f"; not removed: line {ctx.pos(clock).start.line} reads a clock in "
                                  "the loop, and the synchronize may be what its time waits for")
                continue
            bench = _timing_function(ctx, call)
            if bench is not None:
                yield self.report(call, message + f"; not removed: it runs in `{bench.name.value}` (line "
                                  f"{ctx.pos(bench).start.line}), whose name says it measures time, and the "
                                  "synchronize may be what the measurement waits for")
                continue
            scope = ctx.enclosing_scope(call)
            if id(scope) not in streams_in:
                streams_in[id(scope)] = _stream_work(ctx, scope)
            streams = streams_in[id(scope)]
            if streams is not None:
                yield self.report(call, message + f"; not removed: line {ctx.pos(streams).start.line} uses a CUDA stream, event or graph, which the synchronize may be ordering")
                continue
            if id(scope) not in copies_in:
                copies_in[id(scope)] = _async_copy(scope)
            copy = copies_in[id(scope)]
            if copy is not None:
                yield self.report(call, message + f"; not removed: line {ctx.pos(copy).start.line} copies with "
                                  "non_blocking=True, and the synchronize may be what makes the copy's result safe to "
                                  "read on the host, or its source safe to overwrite")
                continue
            changes = h.remove_statement(ctx, expr, drop_empty_if=True)
            yield self.replace(call, message, changes) if changes else self.report(call, message)
