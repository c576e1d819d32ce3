"""Source mapping for trace findings: the statements of one function that relate to a pattern.

Kineto python frames name ``file(LINE): func`` where LINE is the function's first line (the
``def``, or its first decorator: ``co_firstlineno``). :func:`locate` finds that function and
returns, inside it, the fixers' static findings for the pattern plus "candidate sites": the
statements a pattern is about even when nothing is statically wrong (the ``.item()``, the
``DataLoader(...)``, the ``.to(...)``, the optimizer construction...).
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

import libcst as cst

from ..errors import InputError
from ..models import PATTERN_IDS
from . import helpers as h
from .base import Context, StaticMatch, collect_matches

Site = tuple[cst.CSTNode, str]
Locator = Callable[[Context, cst.CSTNode], Iterator[Site]]

TORCH_FACTORIES = {f"torch.{n}" for n in ("zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "tensor", "cat", "stack")}
MATMUL = {f"torch.{n}" for n in ("matmul", "mm", "bmm", "einsum", "addmm", "baddbmm")} | {"torch.nn.functional.linear"}
COMM = {
    f"torch.distributed.{n}"
    for n in ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "broadcast", "barrier", "all_to_all", "all_to_all_single", "reduce", "gather", "scatter")
}
WRAPPERS = {
    "torch.nn.parallel.DistributedDataParallel",
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
}


def _calls(ctx: Context, region: cst.CSTNode) -> Iterator[cst.Call]:
    for n in _walk_region(region):
        if isinstance(n, cst.Call):
            yield n


def _walk_region(region: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Nodes executed by the frame of ``region`` (not the bodies of nested defs/classes)."""
    body = region.body if isinstance(region, cst.FunctionDef) else region
    yield from h.walk(body, into_scopes=False)


def _method_sites(ctx: Context, region: cst.CSTNode, names: set[str], what: str) -> Iterator[Site]:
    for c in _calls(ctx, region):
        m = h.method(c)
        if m is not None and m[1] in names:
            yield c, f"{what}: .{m[1]}()"


def _qual_sites(ctx: Context, region: cst.CSTNode, names: set[str], what: str, bare: set[str] | None = None) -> Iterator[Site]:
    for c in _calls(ctx, region):
        if ctx.matches(c, names, bare if bare is not None else names):
            yield c, f"{what}: {h.dotted(c.func) or 'call'}"


def _dataloader(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    loaders = {id(c) for c in h.dataloader_calls(ctx)}
    for c in _calls(ctx, region):
        if id(c) in loaders:
            yield c, "DataLoader construction"
    for n in _walk_region(region):
        if isinstance(n, cst.For):
            names = [h.last_name(e) for e in _iter_sources(n.iter)]
            if any(x and "loader" in x.lower() for x in names):
                yield n, "loop drawing batches from a DataLoader"
        elif isinstance(n, cst.Call) and h.dotted(n.func) == "next":
            yield n, "next() on an iterator (batch fetch)"


def _iter_sources(it: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(it, cst.Call) and (h.dotted(it.func) or "").split(".")[-1] in ("enumerate", "tqdm", "zip", "iter", "islice"):
        return [x for a in h.positionals(it) for x in _iter_sources(a.value)]
    return [it]


def _sync(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    yield from _method_sites(ctx, region, {"item", "cpu", "numpy", "tolist", "nonzero", "synchronize", "masked_select", "unique"}, "host-device sync")
    yield from _qual_sites(ctx, region, {"torch.cuda.synchronize", "torch.nonzero", "torch.unique", "torch.masked_select"}, "host-device sync")
    for c in _calls(ctx, region):
        if h.is_method_call(c, "to") and c.args and h.string_value(c.args[0].value) == "cpu":
            yield c, "host-device sync: .to('cpu')"


def _h2d(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    for c in _calls(ctx, region):
        m = h.method(c)
        if m is None:
            continue
        if m[1] == "cuda" or m[1] == "pin_memory":
            yield c, f"host-to-device copy: .{m[1]}()"
        elif m[1] == "to" and c.args:
            first = c.args[0].value
            if h.is_device_expr(ctx, first) or (h.literal(first) is h.MISSING and not _dtype_like(first)):
                yield c, "host-to-device copy: .to(...)"
    yield from _qual_sites(ctx, region, {"torch.tensor", "torch.as_tensor", "torch.from_numpy"}, "host tensor creation")


def _dtype_like(expr: cst.CSTNode) -> bool:
    d = h.dotted(expr) or ""
    last = d.split(".")[-1].lower()
    return "dtype" in last or last in {"float16", "float32", "float64", "bfloat16", "half", "float", "double", "int64", "int32", "long", "bool", "uint8", "int8"}


def _copies(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    yield from _method_sites(ctx, region, {"clone", "contiguous", "copy_", "cpu", "cuda", "to", "float", "half", "double", "bfloat16"}, "tensor copy/conversion")
    yield from _qual_sites(ctx, region, {"torch.tensor", "torch.cat", "torch.stack"}, "tensor copy")


def _optimizer(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    for c in _calls(ctx, region):
        names = ctx.qualnames(c)
        if any(q.startswith("torch.optim.") and q.split(".")[-1][:1].isupper() and "lr_scheduler" not in q for q in names):
            yield c, "optimizer construction"
        elif h.is_method_call(c, "step", 0) and "opt" in (h.dotted(h.method(c)[0]) or "").lower():  # type: ignore[index]
            yield c, "optimizer step"


def _zero_grad(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    yield from _method_sites(ctx, region, {"zero_grad"}, "gradient reset")
    for c in _calls(ctx, region):
        if h.is_method_call(c, ("zero_", "fill_")) and ".grad" in (h.dotted(h.method(c)[0]) or ""):  # type: ignore[index]
            yield c, "gradient zero-fill"


def _convs(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    names = {f"torch.nn.{k}{d}d" for d in (1, 2, 3) for k in ("Conv", "ConvTranspose")}
    yield from _qual_sites(ctx, region, names, "convolution", names | {n.removeprefix("torch.") for n in names})


def _matmul(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    for n in _walk_region(region):
        if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.MatrixMultiply):
            yield n, "matmul (@)"
    yield from _qual_sites(ctx, region, MATMUL | {"torch.nn.Linear"}, "matmul", MATMUL | {"torch.nn.Linear", "nn.Linear", "F.linear"})
    yield from _qual_sites(ctx, region, {"torch.set_float32_matmul_precision"}, "matmul precision setting")
    for c in _calls(ctx, region):  # the forward pass: `model(x)`, `net(x)`
        if isinstance(c.func, cst.Name) and any(k in c.func.value.lower() for k in ("model", "net")):
            yield c, "forward pass (its matmuls run here)"


def _allocator(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    yield from _qual_sites(ctx, region, {"torch.cuda.empty_cache"}, "cache release")
    for c, what in _qual_sites(ctx, region, TORCH_FACTORIES, "allocation in a loop"):
        if ctx.in_loop(c):
            yield c, what


def _launch(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    for n in _walk_region(region):
        if isinstance(n, (cst.For, cst.While)):
            yield n, "loop launching kernels each iteration"
    yield from _qual_sites(ctx, region, {"torch.compile"}, "compilation")


def _comm(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    yield from _qual_sites(ctx, region, WRAPPERS, "data-parallel wrapper", WRAPPERS | {"DDP", "FSDP", "DistributedDataParallel"})
    yield from _qual_sites(ctx, region, COMM, "collective", COMM | {n.replace("torch.distributed", "dist") for n in COMM})
    yield from _method_sites(ctx, region, {"backward"}, "backward pass (gradient all-reduce)")


def _balance(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    yield from _comm(ctx, region)
    yield from _qual_sites(ctx, region, {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}, "data sharding", {"DistributedSampler"})


def _memory(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    # The trace says the region runs every step, so an append anywhere in a function is per step.
    per_step = isinstance(region, cst.FunctionDef)
    for c in _calls(ctx, region):
        if h.is_method_call(c, ("append", "extend")) and (per_step or ctx.in_loop(c)) and c.args:
            arg = c.args[0].value
            if not any(h.is_method_call(n, ("item", "tolist", "detach", "cpu")) for n in h.walk(arg)):
                yield c, "tensor kept alive across iterations (append without .item()/.detach())"
    for aug in _walk_region(region):
        if isinstance(aug, cst.AugAssign) and ctx.in_loop(aug) and isinstance(aug.value, cst.Name) and "loss" in aug.value.value.lower():
            yield aug, "loss accumulated with its autograd graph (no .detach())"


def _gemm(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    """Layer sizes that are not multiples of 8, wherever the module defines them (a literal in
    `nn.Linear(...)`, or the module-level constant it names), then the matmul sites."""
    yield from _misaligned_dims(ctx)
    yield from _matmul(ctx, region)


def _module_int_constants(ctx: Context) -> dict[str, cst.CSTNode]:
    """Module-level `NAME = <int>` and `A, B = <int>, <int>` bindings: name -> the literal."""
    out: dict[str, cst.CSTNode] = {}
    for stmt in ctx.module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if not isinstance(small, cst.Assign) or len(small.targets) != 1:
                continue
            target, value = small.targets[0].target, small.value
            if isinstance(target, cst.Name) and isinstance(value, cst.Integer):
                out[target.value] = value
            elif isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and len(target.elements) == len(value.elements):
                for t, v in zip(target.elements, value.elements):
                    if isinstance(t.value, cst.Name) and isinstance(v.value, cst.Integer):
                        out[t.value.value] = v.value
    return out


def _misaligned_dims(ctx: Context) -> Iterator[Site]:
    layers = {"torch.nn.Linear", "torch.nn.Embedding", "torch.nn.Bilinear"}
    consts = _module_int_constants(ctx)
    for c in ctx.nodes(cst.Call):
        if not ctx.matches(c, layers, layers | {"nn.Linear", "nn.Embedding", "Linear", "Embedding"}):
            continue
        for arg in c.args[:2]:
            node = arg.value
            literal = consts.get(node.value) if isinstance(node, cst.Name) else node
            if isinstance(literal, cst.Integer):
                try:
                    size = int(literal.evaluated_value)
                except (TypeError, ValueError):
                    continue
                if size > 0 and size % 8:
                    yield literal, f"layer size {size} is not a multiple of 8"


def _idle(ctx: Context, region: cst.CSTNode) -> Iterator[Site]:
    yield from _sync(ctx, region)
    yield from _dataloader(ctx, region)


LOCATORS: dict[str, Locator] = {
    "idle-gpu": _idle,
    "launch-bound": _launch,
    "sync-point": _sync,
    "extra-copy": _copies,
    "pageable-memcpy": _h2d,
    "dataloader-bound": _dataloader,
    "exposed-communication": _comm,
    "sharding-imbalance": _balance,
    "straggler": _balance,
    "allocator-churn": _allocator,
    "fp32-matmul": _matmul,
    "single-tensor-optimizer": _optimizer,
    "zero-grad-not-none": _zero_grad,
    "conv-bias-before-bn": _convs,
    "memory-growth": _memory,
    "misaligned-gemm": _gemm,
}


def find_function(ctx: Context, def_line: int, function: str | None = None) -> cst.CSTNode | None:
    """The FunctionDef whose ``def`` line or first decorator line is ``def_line`` (preferring
    one named ``function``); the Module for ``<module>``; if the line matches no function of
    that name (the source drifted), the only function with that name."""
    if function == "<module>":
        return ctx.module
    hits = []
    for fn in ctx.nodes(cst.FunctionDef):
        lines = {ctx.pos(fn.name).start.line, ctx.pos(fn).start.line}
        if fn.decorators:
            lines.add(ctx.pos(fn.decorators[0]).start.line)
        if def_line in lines:
            hits.append(fn)
    if function:
        named = [f for f in hits if f.name.value == function]
        return named[-1] if named else _unique(ctx, function)
    return hits[-1] if hits else None


def _unique(ctx: Context, function: str) -> cst.FunctionDef | None:
    same = [f for f in ctx.nodes(cst.FunctionDef) if f.name.value == function]
    return same[0] if len(same) == 1 else None


def locate_in(ctx: Context, region: cst.CSTNode, pattern: str, fixers: Iterable = ()) -> list[StaticMatch]:
    """Static findings of ``fixers`` inside ``region`` plus the pattern's candidate sites."""
    inside = {id(n) for n in _walk_region(region)}
    out: list[StaticMatch] = []
    seen: set[tuple[int, int]] = set()
    for m in collect_matches(list(fixers), ctx):
        if m.pattern != pattern:
            continue
        node = _node_at(ctx, region, m.line, m.column)
        if node is None or id(node) not in inside:
            continue
        out.append(m)
        seen.add((m.line, m.column))
    locator = LOCATORS.get(pattern)
    for node, what in (locator(ctx, region) if locator else ()):
        rng = ctx.pos(node)
        key = (rng.start.line, rng.start.column + 1)
        if key in seen:
            continue
        seen.add(key)
        stmt = ctx.line_statement(node)
        out.append(
            StaticMatch(
                path=ctx.path,
                line=rng.start.line,
                column=rng.start.column + 1,
                end_line=rng.end.line,
                end_column=rng.end.column + 1,
                statement_line=ctx.pos(stmt).start.line if stmt is not None else rng.start.line,
                pattern=pattern,
                message=f"candidate site ({what})",
                fixer="",
            )
        )
    out.sort(key=lambda m: (m.line, m.column))
    return out


def _node_at(ctx: Context, region: cst.CSTNode, line: int, column: int) -> cst.CSTNode | None:
    for n in _walk_region(region):
        try:
            rng = ctx.pos(n)
        except KeyError:
            continue
        if rng.start.line == line and rng.start.column + 1 == column:
            return n
    return None


def check_pattern(pattern: str) -> None:
    if pattern not in PATTERN_IDS:
        raise InputError(None, f"unknown pattern id: {pattern!r}")
