"""non-blocking-h2d: blocking host-to-device copies of DataLoader batches."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.datasets import workers_rewritable
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

ITER_WRAPPERS = {"enumerate", "iter", "zip", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "islice", "itertools.islice", "prefetch"}
DATALOADER_FIXER = "dataloader-workers"


def _loader_exprs(it: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The iterables a for-loop draws from, through enumerate()/tqdm()/zip()/islice()."""
    if isinstance(it, cst.Call):
        d = h.dotted(it.func)
        if d in ITER_WRAPPERS or (d or "").endswith("tqdm"):
            out: list[cst.BaseExpression] = []
            for a in h.positionals(it)[: None if d == "zip" else 1]:
                out.extend(_loader_exprs(a.value))
            return out
    return [it]


def _derived_names(loop: cst.For) -> set[str]:
    """Names holding (parts of) the batch: loop targets, unpackings and comprehension targets."""
    names = set(h.target_names(loop.target))
    for _ in range(3):
        before = len(names)
        for node in h.walk(loop.body, into_scopes=False):
            if isinstance(node, cst.CompFor):
                it = node.iter
                plain = not isinstance(it, cst.Call) or h.is_method_call(it, ("items", "values"), 0)
                if plain and h.root_name(it) in names:
                    names |= set(h.target_names(node.target))
            elif isinstance(node, cst.Assign) and isinstance(node.value, (cst.Name, cst.Subscript, cst.Attribute)) and h.root_name(node.value) in names:
                for t in node.targets:
                    names |= set(h.target_names(t.target))
        if len(names) == before:
            break
    return names


def _data_receiver(expr: cst.BaseExpression, names: set[str]) -> bool:
    """``x``, ``batch["img"]``, ``batch[0]``, ``x.float()`` for x in names."""
    while True:
        if isinstance(expr, cst.Name):
            return expr.value in names
        if isinstance(expr, cst.Subscript):
            expr = expr.value
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            expr = expr.func.value
        else:
            return False


class NonBlockingH2D(Fixer):
    pattern = "pageable-memcpy"
    name = "non-blocking-h2d"
    summary = "batch.to(device) / .cuda() in a DataLoader loop without non_blocking=True (with a pinned loader)"
    explanation = """\
## What it does
In a `for` loop over a DataLoader (a name assigned from `DataLoader(...)` in the file, or any
name containing `loader`, also through `enumerate()`/`tqdm()`/`zip()`), finds host-to-device
copies of the batch: `x.to(device)`, `x.to("cuda")`, `batch["img"].to(device)`, `x.cuda()`,
also inside comprehensions over the batch. It adds `non_blocking=True` when the loader pins
memory: the loader in the same file has `pin_memory=True`, or will get it in the same run
(`dataloader-workers` selected). Otherwise it reports only. `.to(dtype)` and copies to the
CPU are never touched.

## Why is this bad?
A blocking copy from pageable memory makes the CPU wait for the transfer (`pageable-memcpy` in
the trace: `Memcpy HtoD (Pageable -> Device)` with the CPU stalled in `cudaMemcpyAsync`/
`cudaStreamSynchronize`). From pinned memory with `non_blocking=True` the copy is queued on the
stream and overlaps with the CPU preparing the next kernels; stream order still guarantees the
kernels that use the batch see it.

## Example
```python
loader = DataLoader(ds, batch_size=64, num_workers=4, pin_memory=True)
for x, y in loader:
    x, y = x.to(device), y.to(device)
```
Use instead:
```python
for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
```
"""

    VALID = [
        "loader = DataLoader(ds, pin_memory=True)\nfor x, y in loader:\n    x = x.to(device, non_blocking=True)\n",
        "loader = DataLoader(ds, pin_memory=True)\nfor x, y in loader:\n    x = x.to(torch.float16)\n",
        "loader = DataLoader(ds, pin_memory=True)\nfor x, y in loader:\n    out = model(x).to('cpu')\n",
        "loader = DataLoader(ds, pin_memory=True)\nfor x in items:\n    x = x.to(device)\n",
        "loader = DataLoader(ds, pin_memory=True)\nfor x, y in loader:\n    x = x.to(device)  # zoomer: ignore[pageable-memcpy]\n",
        "loader = DataLoader(ds, pin_memory=True)\nw = weights.to(device)\nfor x, y in loader:\n    out = model(x, w.to(device))\n",
    ]
    INVALID = [
        Example(
            "loader = DataLoader(ds, batch_size=64, num_workers=4, pin_memory=True)\n"
            "for x, y in loader:\n"
            "    x, y = x.to(device), y.to(device)\n",
            "loader = DataLoader(ds, batch_size=64, num_workers=4, pin_memory=True)\n"
            "for x, y in loader:\n"
            "    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)\n",
            message_contains="non_blocking=True",
        ),
        Example(
            "from torch.utils.data import DataLoader\n"
            "train_loader = DataLoader(ds, num_workers=8, pin_memory=True)\n"
            "\n"
            "def train(model, train_loader):\n"
            "    for step, batch in enumerate(train_loader):\n"
            "        batch = {k: v.to('cuda') for k, v in batch.items()}\n"
            "        images = batch['images'].cuda()\n",
            "from torch.utils.data import DataLoader\n"
            "train_loader = DataLoader(ds, num_workers=8, pin_memory=True)\n"
            "\n"
            "def train(model, train_loader):\n"
            "    for step, batch in enumerate(train_loader):\n"
            "        batch = {k: v.to('cuda', non_blocking=True) for k, v in batch.items()}\n"
            "        images = batch['images'].cuda(non_blocking=True)\n",
            message_contains="host-to-device",
        ),
        Example(
            "loader = DataLoader(ds, batch_size=64)\nfor x, y in loader:\n    x = x.to(device)\n",
            None,
            message_contains="pin_memory",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        loaders = h.dataloader_calls(ctx)
        assigned: dict[str, list[cst.Call]] = {}
        for assign in ctx.nodes(cst.Assign):
            if isinstance(assign.value, cst.Call) and any(assign.value is c for c in loaders):
                for t in assign.targets:
                    name = h.last_name(t.target)
                    if name:
                        assigned.setdefault(name, []).append(assign.value)
        for loop in ctx.nodes(cst.For):
            sources = [h.last_name(e) for e in _loader_exprs(loop.iter)]
            sources = [s for s in sources if s and (s in assigned or "loader" in s.lower())]
            if not sources:
                continue
            calls = [c for s in sources for c in assigned.get(s, [])] or loaders
            pinned = bool(calls) and all(self._pinned(ctx, c) for c in calls)
            names = _derived_names(loop)
            for call in h.walk(loop.body, into_scopes=False):
                if not isinstance(call, cst.Call):
                    continue
                m = h.method(call)
                if m is None or m[1] not in ("to", "cuda") or not _data_receiver(m[0], names):
                    continue
                if h.has_star(call) or h.kwarg(call, "non_blocking") is not None:
                    continue
                pos = h.positionals(call)
                if m[1] == "to":
                    dev = h.kwarg(call, "device")
                    target = dev.value if dev is not None else (pos[0].value if pos else None)
                    if target is None or len(pos) > 2 or not h.is_device_expr(ctx, target):
                        continue
                elif len(pos) > 1:
                    continue
                message = "host-to-device copy of a batch without non_blocking=True blocks the CPU until the transfer ends"
                if not pinned:
                    yield self.report(call, message + "; pin the loader's memory (pin_memory=True) first, then add non_blocking=True")
                    continue
                yield self.replace(call, message + "; the loader pins memory, so the copy can overlap", {call: h.add_kwargs(call, [("non_blocking", "True")])})

    @staticmethod
    def _pinned(ctx: Context, call: cst.Call) -> bool:
        pin = h.kwarg(call, "pin_memory")
        if pin is not None:
            return h.is_literal(pin.value, True)
        return (  # dataloader-workers pins it in this run: it rewrites this call (not an iterable-style loader)
            DATALOADER_FIXER in ctx.fixing
            and workers_rewritable(ctx, call)
            and not ctx.is_suppressed(call, "dataloader-bound", DATALOADER_FIXER)
        )
