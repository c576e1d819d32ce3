"""non-blocking-h2d: blocking host-to-device copies of DataLoader batches."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import flow
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


def _cpu_device_value(ctx: Context, value: cst.BaseExpression) -> bool:
    """``"cpu"``, ``"cpu:0"``, ``torch.device("cpu")``, ``torch.device("cpu", 0)``."""
    if isinstance(value, cst.Call):
        if not value.args or (h.dotted(value.func) or "").split(".")[-1] != "device" or not ctx.matches(value, {"torch.device"}, {"torch.device"}):
            return False
        value = value.args[0].value
    s = h.string_value(value)
    return s is not None and s.strip().lower().split(":")[0] == "cpu"


def _cpu_device_name(ctx: Context, target: cst.BaseExpression) -> bool:
    """A plain name whose every binding, in the nearest scope that binds it, is a CPU device spelled
    out (``device = torch.device("cpu")``): ``x.to(device)`` then copies to the CPU, which
    h.is_device_expr, seeing only the name, takes for an accelerator. A parameter, a loop target
    or any other binding leaves the name an accelerator."""
    if not isinstance(target, cst.Name):
        return False
    inner = ctx.enclosing_scope(target)
    scopes = [inner, *(a for a in ctx.ancestors(inner) if isinstance(a, cst.FunctionDef))]
    if inner is not ctx.module:
        scopes.append(ctx.module)
    for scope in scopes:
        if flow.declared_nonlocal(scope, target.value) or (isinstance(scope, cst.FunctionDef) and flow.is_param(scope, target.value)):
            return False
        stores = [n for n in flow.names_in(ctx, scope, target.value) if flow.is_store(ctx, n)]
        if not stores:
            continue
        for n in stores:
            assign_target = ctx.parent(n)
            assign = ctx.parent(assign_target) if isinstance(assign_target, cst.AssignTarget) else None
            if not isinstance(assign, cst.Assign) or assign_target.target is not n or not _cpu_device_value(ctx, assign.value):
                return False
        return True
    return False


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


#: methods whose result may be (part of) the receiver's own memory: views, no-op conversions,
#: container reads
HOST_ALIAS_METHODS = flow.VIEW_METHODS | {"cpu", "numpy", "pin_memory", "get", "items", "values", "__getitem__"}
#: attributes that are views of the tensor itself (transparent); other attributes are fields
VIEW_ATTRS = {"T", "mT", "H", "mH", "real", "imag", "data"}
#: functions that write their first argument (besides names ending in `_`)
WRITE_FUNCTIONS = {"copyto", "put", "place", "putmask"}
MODULE_ROOTS = {"torch", "nn", "F", "init", "np", "numpy"}

Key = str | None  # a literal subscript/field key, None: unknown
HostPath = tuple[str, list[Key]]


def _key(sub: cst.Subscript) -> Key:
    if len(sub.slice) == 1 and isinstance(sub.slice[0].slice, cst.Index):
        v = h.literal(sub.slice[0].slice.value)
        if isinstance(v, (str, int)) and not isinstance(v, bool):
            return repr(v)
    return None


def _host_path(ctx: Context, expr: cst.CSTNode | None) -> HostPath | None:
    """``(root name, keys)`` of the memory an expression may share: ``batch["img"].float()`` ->
    ``("batch", ["'img'"])``; None for a fresh value (a call, arithmetic, a device copy)."""
    keys: list[Key] = []
    while True:
        if isinstance(expr, cst.Name):
            return expr.value, keys[::-1]
        if isinstance(expr, cst.Subscript):
            keys.append(_key(expr))
            expr = expr.value
        elif isinstance(expr, cst.Attribute):
            if expr.attr.value not in VIEW_ATTRS:
                keys.append("." + expr.attr.value)
            expr = expr.value
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            name = expr.func.attr.value
            if name not in HOST_ALIAS_METHODS or h.kwarg(expr, "out") is not None:
                return None
            if name == "to":
                dev = h.kwarg(expr, "device")
                pos = h.positionals(expr)
                target = dev.value if dev is not None else (pos[0].value if pos else None)
                if target is not None and h.is_device_expr(ctx, target):
                    return None  # a device copy: fresh memory (`.to(dtype)` may return the receiver)
            if name in ("get", "__getitem__") and expr.args:
                v = h.literal(expr.args[0].value)
                keys.append(repr(v) if isinstance(v, (str, int)) and not isinstance(v, bool) else None)
            elif name in ("items", "values", "chunk", "split", "unbind"):
                keys.append(None)  # some element of the receiver
            expr = expr.func.value
        else:
            return None


def _overlap(a: list[Key], b: list[Key]) -> bool:
    """Whether two key paths under one root may share memory (one is a prefix of the other)."""
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def _written_targets(ctx: Context, node: cst.CSTNode) -> list[cst.CSTNode]:
    """Expressions ``node`` writes into in place (not names it merely rebinds)."""
    out: list[cst.CSTNode] = []
    if isinstance(node, cst.Call):
        m = h.method(node)
        pos = h.positionals(node)
        if m is not None and m[1].endswith("_"):
            out.append(m[0])
        dotted = h.dotted(node.func) or ""
        last = dotted.split(".")[-1]
        if (last.endswith("_") or last in WRITE_FUNCTIONS) and pos and (
            m is None
            or dotted.split(".")[0] in MODULE_ROOTS
            or any(q.split(".")[0] in ("torch", "numpy") for q in ctx.qualnames(node.func))
        ):  # `torch.nn.init.zeros_(x)`, `np.copyto(x, y)`: the first argument is written
            out.append(pos[0].value)
        inplace = h.kwarg(node, "inplace")
        if inplace is not None and not h.is_literal(inplace.value, False) and pos:
            out.append(pos[0].value)
        dest = h.kwarg(node, "out")
        if dest is not None:
            out.append(dest.value)
    elif isinstance(node, cst.AssignTarget):  # `batch["img"][0] = ...` writes; rebinding a plain name does not
        out.extend(t for t in _target_leaves(node.target) if not isinstance(t, cst.Name))
    elif isinstance(node, cst.AugAssign):
        out.append(node.target)  # `x += 1` on a tensor is in place
    elif isinstance(node, cst.Del):
        out.extend(_target_leaves(node.target))
    return out


def _target_leaves(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The single targets of an assignment or `del` target, through tuples, lists and starred items."""
    leaves, todo = [], [target]
    while todo:
        t = todo.pop()
        if isinstance(t, (cst.Tuple, cst.List)):
            todo.extend(e.value for e in t.elements)
        elif isinstance(t, cst.StarredElement):
            todo.append(t.value)
        else:
            leaves.append(t)
    return leaves


def _bound_names(small: cst.CSTNode) -> list[str]:
    if isinstance(small, cst.Assign):
        return [n for t in small.targets for n in h.target_names(t.target)]
    if isinstance(small, cst.AnnAssign) and small.value is not None:
        return h.target_names(small.target)
    return []


class _LoopFacts:
    """What the host-write check needs from one loop body, computed once per loop: its
    assignments (bound names, the memory their value may share, order, enclosing block) and its
    in-place writes (order, node, the memory written), in document order."""

    def __init__(self, ctx: Context, loop: cst.For):
        self.assigns: list[tuple[cst.CSTNode, list[str], HostPath | None, int, cst.CSTNode | None, bool]] = []
        self.writes: list[tuple[int, cst.CSTNode, list[HostPath]]] = []
        for node in h.walk(loop.body, into_scopes=False):
            if isinstance(node, (cst.Assign, cst.AnnAssign)):
                line = ctx.parent(node)
                block = ctx.parent(line) if line is not None else None
                single = not isinstance(node, cst.Assign) or (len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name))
                self.assigns.append((node, _bound_names(node), _host_path(ctx, node.value), ctx.order(node), block, single))
            paths = [q for q in (_host_path(ctx, t) for t in _written_targets(ctx, node)) if q is not None]
            if paths:
                self.writes.append((ctx.order(node), node, paths))


def _host_write(ctx: Context, facts: _LoopFacts, call: cst.Call, receiver: cst.BaseExpression) -> cst.CSTNode | None:
    """A later node of the loop body that writes, in place, the host memory ``call`` copies
    from (through aliases), before every name for it is bound to something else."""
    start = _host_path(ctx, receiver)
    if start is None:
        return None
    group: dict[str, list[Key]] = {start[0]: start[1]}
    around = {id(a) for a in ctx.ancestors(call)}
    for comp in (a for a in ctx.ancestors(call) if isinstance(a, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp))):
        cf: cst.CompFor | None = comp.for_in
        while cf is not None:  # `{k: v.to(dev) for k, v in batch.items()}`: v is part of batch
            if start[0] in h.target_names(cf.target):
                src = _host_path(ctx, cf.iter)
                if src is not None and src[0] not in group:
                    group[src[0]] = [*src[1], None]
            cf = cf.inner_for_in
    at = ctx.order(call)
    after = max(ctx.order(n) for n in h.walk(call))  # the last node of the call itself
    kcache: dict[str, float] = {}

    def aliases(p: HostPath | None) -> bool:
        return p is not None and p[0] in group and _overlap(group[p[0]], p[1])

    def kill(name: str) -> float:
        """Where ``name`` stops naming the host memory: an unconditional later binding."""
        if name not in kcache:
            kcache[name] = min(
                (
                    order
                    for small, names, value, order, block, _ in facts.assigns
                    if name in names and not aliases(value) and id(block) in around and (id(small) in around or order > at)
                ),
                default=float("inf"),
            )
        return kcache[name]

    for _ in range(4):
        grew = False
        for _small, names, value, order, _block, single in facts.assigns:
            if aliases(value) and not (order > at and order > kill(value[0])):  # type: ignore[index]
                # `img = batch["img"]`: img shares the host memory
                held = group[value[0]]  # type: ignore[index]
                rest = held[len(value[1]):] if len(value[1]) <= len(held) else []  # type: ignore[index]
                for n in names:
                    if n not in group:
                        group[n] = list(rest) if single else []
                        grew = True
            elif order < at and value is not None and value[0] not in group and any(n in group for n in names):
                group[value[0]] = [*value[1], None]  # `x = batch["img"]` before `x.cuda()`
                grew = True
        if not grew:
            break
        kcache.clear()
    for order, node, paths in facts.writes:
        if order <= after:
            continue
        if any(aliases(p) and order < kill(p[0]) for p in paths):
            return node
    return None


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
CPU (also `.to(device)` where every binding of `device` in its scope is `torch.device("cpu")`
or `"cpu"`) are never touched. It reports only, too, when the loop body later writes the copied host
tensor (or its container) in place before rebinding it: `batch["img"].zero_()`, `.copy_(...)`,
any `x.op_()`, `x[...] = ...`, `x += ...`, `out=x`, `del x`; an asynchronous copy could read
the modified buffer.

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
        # the host batch is written in place after the copy is queued
        Example(
            "loader = DataLoader(ds, pin_memory=True)\n"
            "for batch in loader:\n"
            "    x = batch['img'].cuda()\n"
            "    batch['img'].zero_()\n",
            None,
            message_contains="writes the host tensor",
        ),
        Example(
            "loader = DataLoader(ds, pin_memory=True)\n"
            "for batch in loader:\n"
            "    img = batch['img']\n"
            "    x = img.to(device)\n"
            "    batch['img'][:, 0] = 0\n",
            None,
            message_contains="line 5",
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
            # pinned already, or only once dataloader-workers' rewrite of the loader (same run) is applied
            by_fix = pinned and not all(self._pinned_in_source(c) for c in calls)
            names = _derived_names(loop)
            facts: _LoopFacts | None = None
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
                    if target is None or len(pos) > 2 or not h.is_device_expr(ctx, target) or _cpu_device_name(ctx, target):
                        continue  # not a device, or a name bound to the CPU: a copy to the CPU
                elif len(pos) > 1:
                    continue
                message = "host-to-device copy of a batch without non_blocking=True blocks the CPU until the transfer ends"
                if facts is None:
                    facts = _LoopFacts(ctx, loop)
                written = _host_write(ctx, facts, call, m[0])
                if written is not None:
                    yield self.report(call, message + f"; not added: line {ctx.pos(written).start.line} writes the host tensor in place, which an asynchronous copy could still be reading")
                    continue
                if not pinned:
                    yield self.report(call, message + "; pin the loader's memory (pin_memory=True) first, then add non_blocking=True")
                    continue
                why = ("; the loader gets pin_memory=True in the same fix (dataloader-workers), so the copy can overlap"
                       if by_fix else "; the loader pins memory, so the copy can overlap")
                yield self.replace(call, message + why, {call: h.add_kwargs(call, [("non_blocking", "True")])})

    @staticmethod
    def _pinned_in_source(call: cst.Call) -> bool:
        pin = h.kwarg(call, "pin_memory")
        return pin is not None and h.is_literal(pin.value, True)

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
