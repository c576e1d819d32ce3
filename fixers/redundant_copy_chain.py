"""redundant-copy-chain: method chains that copy a tensor twice (or convert it twice)."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import flow
from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

# no-argument methods whose second application returns its input unchanged
IDEMPOTENT = {"contiguous", "detach", "cpu", "cuda", "float", "half", "double", "bfloat16", "long", "int", "bool", "clone"}


WIDE = ("float64", "double")
NARROW = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16", "bfloat16": "bfloat16"}
NARROW_METHODS = {"float": "float32", "half": "float16", "bfloat16": "bfloat16"}


def _int(expr: cst.CSTNode) -> int | None:
    v = h.literal(expr)
    return v if type(v) is int else None


def _ints(call: cst.Call) -> list[int] | None:
    """The int arguments of ``.transpose(a, b)`` / ``.permute(a, b, c)`` / ``.permute((a, b, c))``."""
    if any(a.keyword is not None or a.star for a in call.args):
        return None
    args = [a.value for a in call.args]
    if len(args) == 1 and isinstance(args[0], (cst.Tuple, cst.List)):
        args = [e.value for e in args[0].elements]
    out = [_int(a) for a in args]
    return None if any(v is None for v in out) else out  # type: ignore[return-value]


TORCH_DTYPES = frozenset(
    {
        "bfloat16", "bool", "cdouble", "cfloat", "chalf", "complex128", "complex32", "complex64", "double", "float",
        "float16", "float32", "float64", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
        "half", "int", "int16", "int32", "int64", "int8", "long", "short", "uint16", "uint32", "uint64", "uint8",
    }
)
TORCH_DTYPE_NAMES = frozenset(f"torch.{n}" for n in TORCH_DTYPES)
AMBIGUOUS = -1


def _is_dtype(ctx: Context, expr: cst.CSTNode) -> bool:
    """``torch.float16`` (any alias of torch)."""
    return isinstance(expr, cst.Attribute) and ctx.matches(expr, TORCH_DTYPE_NAMES, TORCH_DTYPE_NAMES)


def _is_device(ctx: Context, expr: cst.CSTNode) -> bool:
    """A device spelled so that it cannot be a dtype or a tensor: ``"cuda:0"``, ``0``, ``torch.device(...)``."""
    if h.string_value(expr) is not None or type(h.literal(expr)) is int:
        return True
    return isinstance(expr, cst.Call) and ctx.matches(expr, {"torch.device"}, {"torch.device"})


def _to_copy_slot(ctx: Context, call: cst.Call) -> int | None:
    """Where ``copy`` stands in the ``Tensor.to(...)`` call: None when it is not passed, its
    positional index when it is passed by position, AMBIGUOUS when that cannot be told. The
    overloads are ``to(dtype, non_blocking, copy)``, ``to(tensor, non_blocking, copy)`` and
    ``to(device, dtype, non_blocking, copy)`` (``memory_format`` is keyword-only): up to two
    positional arguments never include ``copy``; four are the device form (``copy`` 4th); three
    are ``(device, dtype, non_blocking)`` when the second is a dtype or the first a device
    literal, ``(dtype, non_blocking, copy)`` when the first is a dtype, else ambiguous."""
    pos = h.positionals(call)
    if len(pos) <= 2:
        return None
    if len(pos) == 3:
        if _is_dtype(ctx, pos[1].value) or _is_device(ctx, pos[0].value):
            return None
        if _is_dtype(ctx, pos[0].value):
            return 2
        return AMBIGUOUS
    if len(pos) == 4:
        return 3
    return AMBIGUOUS


def _with_copy(ctx: Context, call: cst.Call) -> cst.Call | None:
    """``call`` (a ``.to(...)`` without ``copy=`` by keyword) made to always copy: ``copy=True``
    added, or the positional ``copy`` argument set to True; None when ambiguous."""
    slot = _to_copy_slot(ctx, call)
    if slot is None:
        return h.add_kwargs(call, [("copy", "True")])
    if slot == AMBIGUOUS:
        return None
    target = h.positionals(call)[slot]
    return call.with_changes(args=[a.with_changes(value=cst.Name("True")) if a is target else a for a in call.args])


DEFAULT_FLOAT = "default float"  # what a floating factory without dtype= makes: float32 or float64, both exact
#: dtypes whose every value float64 holds exactly: converting through float64 rounds once, as a
#: direct conversion does (int64/uint64 are not: a value beyond 2**53 rounds twice)
EXACT_IN_FLOAT64 = frozenset({"float64", "float32", "float16", "bfloat16", "int32", "int16", "int8", "uint8", "uint16",
                              "uint32", "bool", DEFAULT_FLOAT})
#: the dtype each no-argument conversion method gives, and the spellings of dtypes
METHOD_DTYPES = {"double": "float64", "float": "float32", "half": "float16", "bfloat16": "bfloat16", "int": "int32",
                 "short": "int16", "char": "int8", "byte": "uint8", "bool": "bool", "long": "int64"}
DTYPE_SPELLINGS = {"double": "float64", "float": "float32", "half": "float16", "int": "int32", "short": "int16", "long": "int64"}
#: torch factories that make a floating tensor (the default dtype) unless given dtype=
FLOAT_FACTORIES = frozenset({"randn", "rand", "zeros", "ones", "empty", "linspace", "logspace", "eye", "randn_like", "rand_like"})


def _dtype_made(ctx: Context, expr: cst.CSTNode) -> str | None:
    """The dtype a tensor expression visibly has: ``t.float()`` float32, ``t.int()`` int32,
    ``t.to(torch.float16)`` float16, a floating torch factory (``torch.randn(...)``,
    ``torch.zeros(...)``) its dtype= or DEFAULT_FLOAT; else None."""
    if not isinstance(expr, cst.Call):
        return None
    m = h.method(expr)
    if m is not None and m[1] in METHOD_DTYPES and not expr.args:
        return METHOD_DTYPES[m[1]]
    if m is not None and m[1] == "to":
        dtype = h.arg_at(expr, "dtype", 0)
        return _dtype_name(ctx, dtype.value) if len(expr.args) == 1 and dtype is not None else None
    name = h.last_name(expr.func)
    if name in FLOAT_FACTORIES and ctx.matches(expr, {f"torch.{name}"}, {f"torch.{name}"}) and not h.has_star(expr):
        dtype = h.kwarg(expr, "dtype")
        return DEFAULT_FLOAT if dtype is None else _dtype_name(ctx, dtype.value)
    return None


def _dtype_name(ctx: Context, expr: cst.CSTNode) -> str | None:
    """``float16`` for ``torch.float16`` / ``torch.half`` (any alias of torch), else None."""
    name = h.last_name(expr) if _is_dtype(ctx, expr) else None
    return DTYPE_SPELLINGS.get(name, name) if name is not None else None


def _pure(expr: cst.CSTNode) -> bool:
    """Names, attributes and literals: evaluating them twice is the same as once."""
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return h.dotted(expr) is not None
    return h.literal(expr) is not h.MISSING


_AMBIGUOUS_TO = (
    " (not rewritten: from its positional arguments it cannot be told which Tensor.to overload"
    " the call selects, so whether `copy` is already passed by position)"
)


class RedundantCopyChain(Fixer):
    pattern = "extra-copy"
    name = "redundant-copy-chain"
    summary = "x.clone().clone(), x.to(torch.float64).to(torch.float32), x.transpose(1, 2).contiguous().transpose(1, 2)...: keep one copy or none"
    explanation = """\
## What it does
Collapses method chains whose second step is provably redundant:

* the same no-argument method twice, `x.m().m()` for `contiguous`, `clone`, `detach`, `cpu`,
  `cuda`, `float`, `half`, `double`, `bfloat16`, `long`, `int`, `bool` -> `x.m()`;
* `x.clone().to(...)` -> `x.to(..., copy=True)` (one copy instead of two; still a new tensor);
  when `copy` is passed by position (`x.clone().to(d, torch.float16, False, False)`) that
  argument becomes `True`; when the positional arguments do not tell which `Tensor.to` overload
  is called (three, none a literal dtype or device), it is reported only;
* `x.clone().contiguous()` and `x.contiguous().clone()` ->
  `x.clone(memory_format=torch.contiguous_format)` (needs `import torch`);
* `x.to(a).to(a)` with the same simple arguments -> `x.to(a)`;
* `x.to(d).clone()` -> `x.to(d, copy=True)` (the same care for a positional `copy`);
* dtype round trips through float64, `t.to(torch.float64).to(torch.float32)` (also to float16
  or bfloat16, `.double().float()`, with or without a trailing `.clone()`), when `t` visibly
  has a dtype that float64 holds exactly: `x.half()`, `x.int()`, `x.to(torch.bfloat16)`, a
  floating factory (`torch.randn(...)`, `torch.zeros(...)` without an integer dtype). The round
  trip then rounds once, as one conversion does, and becomes `t.to(torch.float32, copy=True)`
  (one copy, still a new tensor); when `t` already has the final dtype (`x.float()` for
  float32) and the statement is `x = x.float()...` at the top of a function body with `x` only
  *read* afterwards (see below), it becomes `x = x.float()` (no copy at all). Where the dtype is not visible (a parameter, a name) it is
  reported, not rewritten: an int64 value beyond 2**53 rounds twice on the way
  (`2**60 + 2**36 + 1` becomes `2**60` through float64 but `2**60 + 2**37` directly), so one
  conversion could give another float32; only a trailing `.clone()` is dropped there (the
  narrowing `.to()` of a float64 tensor already made a fresh copy);
* layout round trips, `x.transpose(1, 2).contiguous().transpose(1, 2)` (also `.t()` and
  `.permute(p)` with the inverse permutation): the same values in another memory layout. The
  statement `x = x.<round trip>` is removed when `x` is only read afterwards, or when the
  statement before it just made `x` a fresh copy (`.clone()`, `.to(..., copy=True)`, a dtype
  round trip) that nothing else references; otherwise it is reported;
* `x = x.clone()` at the top of a function body when `x` is only read afterwards: removed.

"Only read" is decided statically inside the function: every later use of `x` is a metadata
read (`x.shape`, `x.device`), an operand of arithmetic, the receiver of an out-of-place method
(`x.mean(dim=1)`, `x.softmax(-1)`), an argument of a `torch.*`/`F.*` function known to return a
new tensor and not to modify it (not with `inplace` true or unknown, by keyword or by position:
`F.relu(x, True)`; not a dropout that may return its input, i.e. unless `training` is true and
`p` a literal other than 0; not `F.batch_norm`'s running statistics; not `torch.einsum`, which
may return a view), or a view of `x` used the same way; `x` is never returned, stored, passed
to any other call (a module could modify its input in place) or modified, and no other local
name aliases it. The function's locals die with it, so nobody can tell the missing copy.

## Why is this bad?
Every `clone()`/`contiguous()`/`.to()` that actually copies launches a copy kernel and
allocates a new tensor (`extra-copy` in the trace: `aten::copy_`/`aten::clone` with no
consumer other than the next copy). The second operation of these chains either copies the
fresh copy again or is a no-op that still costs a dispatcher round trip.

## Caveats
Removing a layout round trip changes the memory layout (strides) of the result, not its values;
reductions over it may round differently in the last bit.

## Example
```python
y = x.clone().to(device)
```
Use instead:
```python
y = x.to(device, copy=True)
```
"""

    VALID = [
        "y = x.clone().detach()\n",
        "y = x.contiguous().view(-1)\n",
        "y = x.to(device).to(dtype)\n",
        "y = x.clone(memory_format=fmt).clone()\n",
        "y = x.to(a, copy=True).to(a, copy=True)\n",
        "y = x.clone().clone()  # zoomer: ignore[extra-copy]\n",
        "y = f(x).to(g()).to(g())\n",
        "y = x.to(y.dtype)\n",
        "y = x.to(device=x.dtype)\n",
        # a tensor converted to its own dtype or device is returned as it is, without a copy (nothing to save),
        # and a tensor subclass may convert: torchao's NF4Tensor.to(its dtype) dequantizes (torchtune's
        # state-dict gathering relies on it)
        "if isinstance(param, NF4Tensor):\n    param = param.to(param.dtype)\nh = self.h.to(self.h.dtype) + w.to(device=w.device)\n",
        # the clone protects data that is modified afterwards
        "def f(x):\n    x = x.clone()\n    x.add_(1)\n    return x\n",
        "def f(model, x):\n    x = x.clone()\n    return model(x)\n",
        # not round trips: different dims, a narrowing first step, an integer target
        "y = x.transpose(0, 1).contiguous().transpose(1, 2)\n",
        "import torch\ny = x.to(torch.float16).to(torch.float32)\n",
        "import torch\ny = x.to(torch.float64).to(torch.int32)\n",
        # in-place functional calls, the flag passed by position: the clone protects the caller's x
        "import torch\nimport torch.nn.functional as F\n\n\ndef act(x):\n    x = x.clone()\n    F.relu(x, True)\n    return x.sum()\n\n\n"
        "def drop(x, p):\n    x = x.clone()\n    y = F.dropout(x, p, False)\n    y.mul_(2)\n    return y.sum() + x.sum()\n\n\n"
        "def lr(x):\n    x = x.clone()\n    F.leaky_relu(x, 0.1, True)\n    print(x)\n",
        "import torch.nn.functional as F\n\n\ndef f(x, flag):\n    x = x.clone()\n    return F.hardtanh(x, -1.0, 1.0, flag).sum()\n",
        "import torch.nn.functional as F\n\n\ndef f(x):\n    x = x.clone()\n    return F.threshold(x, 0.1, 0.0, True).sum()\n",
        "import torch.nn.functional as F\n\n\ndef f(x, kw):\n    x = x.clone()\n    return F.elu(x, **kw).sum()\n",
        # dropout returns its input itself unless training is true and p not 0 (alpha_dropout's
        # training defaults to False)
        "import torch.nn.functional as F\n\n\ndef f(x):\n    x = x.clone()\n    y = F.alpha_dropout(x)\n    y.add_(1)\n    return y\n",
        "import torch.nn.functional as F\n\n\ndef f(self, x):\n    x = x.clone()\n    y = F.dropout(x, self.p, self.training)\n    y.add_(1)\n    return y\n",
        "import torch.nn.functional as F\n\n\ndef f(x):\n    x = x.clone()\n    y = F.dropout2d(x, 0.0)\n    y.add_(1)\n    return y\n",
        # batch_norm updates its running statistics in place; einsum may return a view
        "import torch.nn.functional as F\n\n\ndef f(x, rm, rv):\n    rm = rm.clone()\n    return F.batch_norm(x, rm, rv, None, None, True).sum()\n",
        "import torch\n\n\ndef f(x):\n    x = x.clone()\n    y = torch.einsum(\"ij->ji\", x)\n    y.add_(1)\n    return y\n",
        # `copy` passed by position in an overload that cannot be told: not rewritten (report only is an INVALID example)
        "import torch as T\n\ndef f(x, d):\n    c = x.clone().to(d, copy=False)\n    g = x.to(d).clone(memory_format=T.channels_last)\n"
        "    h = x.to(d, copy=False).clone()\n    return c, g, h\n",
    ]
    INVALID = [
        Example("y = x.contiguous().contiguous()\n", "y = x.contiguous()\n", message_contains="contiguous"),
        Example("y = x.clone().clone()\n", "y = x.clone()\n", message_contains="clone"),
        Example("y = x.clone().to(device, non_blocking=True)\n", "y = x.to(device, non_blocking=True, copy=True)\n", message_contains="copy=True"),
        Example(
            "import torch\ny = x.contiguous().clone()\nz = (a + b).clone().contiguous()\n",
            "import torch\ny = x.clone(memory_format=torch.contiguous_format)\nz = (a + b).clone(memory_format=torch.contiguous_format)\n",
            message_contains="contiguous_format",
        ),
        Example("y = x.contiguous().clone()\n", None, message_contains="import torch"),
        Example("y = x.to(dev).to(dev)\n", "y = x.to(dev)\n", message_contains=".to("),
        Example("y = x.float().float().float()\n", "y = x.float()\n", message_contains="float"),
        Example(
            "import torch\n\n\nclass Pool(torch.nn.Module):\n"
            "    def forward(self, x):\n"
            "        x = x.to(torch.float64).to(torch.float32).clone()\n"
            "        x = x.transpose(1, 2).contiguous().transpose(1, 2)  # layout\n"
            "        pad = torch.zeros(x.shape[0], 8, device=x.device)\n"
            "        return self.net(torch.cat([x.mean(dim=1), pad], dim=1))\n",
            "import torch\n\n\nclass Pool(torch.nn.Module):\n"
            "    def forward(self, x):\n"
            "        x = x.to(torch.float64).to(torch.float32)\n"
            "        # layout\n"
            "        pad = torch.zeros(x.shape[0], 8, device=x.device)\n"
            "        return self.net(torch.cat([x.mean(dim=1), pad], dim=1))\n",
            message_contains="only read afterwards",
        ),
        Example(
            "import torch\n\ndef step(model, x):\n"
            "    x = x.to(torch.float64).to(torch.float32).clone()\n"
            "    x = x.transpose(1, 2).contiguous().transpose(1, 2)\n"
            "    return model(x)\n",
            "import torch\n\ndef step(model, x):\n"
            "    x = x.to(torch.float64).to(torch.float32)\n"
            "    return model(x)\n",
            message_contains="was just copied",
        ),
        # the dtype is not visible: an int64 value beyond 2**53 rounds twice through float64, so
        # one conversion could differ; only a clone of the fresh result goes
        Example("def total(x):\n    x = x.double().float()\n    return x.sum()\n", None, message_contains="int64"),
        Example("import torch\ny = x.to(torch.float64).to(torch.float32).clone()\n",
                "import torch\ny = x.to(torch.float64).to(torch.float32)\n", message_contains="int64"),
        # a dtype float64 holds exactly: the round trip rounds once, as one conversion does
        Example("import torch\nnoise = torch.randn(8, 8).double().half()\n", "import torch\nnoise = torch.randn(8, 8).to(torch.float16, copy=True)\n",
                message_contains="float16"),
        Example(
            "import torch\n\n\ndef pool(x):\n    x = x.float().to(torch.float64).to(torch.float32).clone()\n    return x.mean(dim=1)\n",
            "import torch\n\n\ndef pool(x):\n    x = x.float()\n    return x.mean(dim=1)\n",
            message_contains="already is float32",
        ),
        Example("import torch as T\ny = x.int().to(T.float64).to(T.float32).clone()\nz = w.half().double().float()\n",
                "import torch as T\ny = x.int().to(T.float32, copy=True)\nz = w.half().to(T.float32, copy=True)\n",
                message_contains="exact"),
        Example("y = x.to(device).clone()\n", "y = x.to(device, copy=True)\n", message_contains="copies once"),
        Example(
            "def mse(x, y):\n    x = x.clone()\n    return (x - y).pow(2).mean()\n",
            "def mse(x, y):\n    return (x - y).pow(2).mean()\n",
            message_contains="only read afterwards",
        ),
        Example("y = x.permute(0, 2, 1).contiguous().permute(0, 2, 1)\n", None, message_contains="another memory layout"),
        # out-of-place functional calls (inplace False, dropout certainly in training mode) only read x
        Example(
            "import torch.nn.functional as F\n\n\ndef f(x):\n    x = x.clone()\n"
            "    return F.relu(x, False).sum() + F.dropout(x, 0.1, True).sum() + F.batch_norm(x, rm, rv, training=True).sum()\n",
            "import torch.nn.functional as F\n\n\ndef f(x):\n"
            "    return F.relu(x, False).sum() + F.dropout(x, 0.1, True).sum() + F.batch_norm(x, rm, rv, training=True).sum()\n",
            message_contains="only read afterwards",
        ),
        # `copy` passed by position: Tensor.to(device, dtype, non_blocking, copy) takes four
        # positional arguments, to(dtype, non_blocking, copy) three; adding copy=True would raise TypeError
        Example(
            "import torch as T\n\ndef f(x, d):\n    e = x.clone().to(d, T.float16, False, False)\n"
            "    k = x.clone().to(d, T.float16, False)\n    m = x.clone().to(T.half, True, False)\n"
            "    n = x.to(d, T.float16, False, False).clone()\n    return e, k, m, n\n",
            "import torch as T\n\ndef f(x, d):\n    e = x.to(d, T.float16, False, True)\n"
            "    k = x.to(d, T.float16, False, copy=True)\n    m = x.to(T.half, True, True)\n"
            "    n = x.to(d, T.float16, False, True)\n    return e, k, m, n\n",
            message_contains="copy=True",
        ),
        Example(
            "import torch as T\n\ndef f(x, d):\n    a = x.clone().contiguous()\n    b = x.contiguous().clone()\n"
            "    c = x.clone().to(d, copy=False)\n    e = x.clone().to(d, T.float16, False, False)\n"
            "    g = x.to(d).clone(memory_format=T.channels_last)\n    h = x.to(d, copy=False).clone()\n"
            "    k = x.clone().to(d, T.float16, False)\n    return a, b, c, e, g, h, k\n",
            "import torch as T\n\ndef f(x, d):\n    a = x.clone(memory_format=T.contiguous_format)\n    b = x.clone(memory_format=T.contiguous_format)\n"
            "    c = x.clone().to(d, copy=False)\n    e = x.to(d, T.float16, False, True)\n"
            "    g = x.to(d).clone(memory_format=T.channels_last)\n    h = x.to(d, copy=False).clone()\n"
            "    k = x.to(d, T.float16, False, copy=True)\n    return a, b, c, e, g, h, k\n",
            message_contains="copies once",
        ),
        # three positional arguments, none a literal dtype or device: (dtype|tensor, non_blocking, copy)
        # or (device, dtype, non_blocking) cannot be told apart
        Example("y = x.clone().to(a, b, False)\nz = x.to(a, b, False).clone()\n", None, message_contains="cannot be told"),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        alias = ctx.torch_alias()
        yield from self._round_trips(ctx, alias)
        for call in ctx.nodes(cst.Call):
            outer = h.method(call)
            if outer is None or not isinstance(outer[0], cst.Call):
                continue
            inner_call = outer[0]
            inner = h.method(inner_call)
            if inner is None:
                continue
            receiver, first = inner
            second = outer[1]
            keep = lambda new: new.with_changes(lpar=call.lpar, rpar=call.rpar)  # noqa: E731
            if first == second and first in IDEMPOTENT and not call.args and not inner_call.args:
                message = f".{first}().{first}(): the second .{first}() is redundant"
                yield self.replace(call, message, {call: keep(inner_call)})
            elif first == "to" and second == "clone" and not call.args and inner_call.args and h.kwarg(inner_call, "copy") is None and not h.has_star(inner_call) and self._dtype_round_trip(ctx, inner_call, alias) is None:
                message = ".to(...).clone() can copy twice; .to(..., copy=True) copies once"
                new = _with_copy(ctx, inner_call)
                if new is None:
                    yield self.report(call, message + _AMBIGUOUS_TO)
                else:
                    yield self.replace(call, message, {call: keep(new)})
            elif first == "clone" and second == "to" and not inner_call.args and h.kwarg(call, "copy") is None and not h.has_star(call) and call.args:
                message = ".clone().to(...) copies twice; .to(..., copy=True) copies once"
                new = _with_copy(ctx, call.with_changes(func=call.func.with_changes(value=receiver)))  # type: ignore[union-attr]
                if new is None:
                    yield self.report(call, message + _AMBIGUOUS_TO)
                else:
                    yield self.replace(call, message, {call: keep(new)})
            elif {first, second} == {"clone", "contiguous"} and not call.args and not inner_call.args:
                message = f".{first}().{second}() can copy twice; use .clone(memory_format=torch.contiguous_format)"
                if alias is None:
                    yield self.report(call, message + " (needs `import torch`)")
                    continue
                new = cst.parse_expression(f"_.clone(memory_format={alias}.contiguous_format)")
                new = new.with_changes(func=new.func.with_changes(value=receiver), lpar=call.lpar, rpar=call.rpar)  # type: ignore[union-attr]
                yield self.replace(call, message, {call: new})
            elif (
                first == second == "to"
                and call.args
                and len(call.args) == len(inner_call.args)
                and all(a.star == "" and _pure(a.value) for a in call.args)
                and h.kwarg(call, "copy") is None
                and all(
                    (a.keyword.value if a.keyword else None) == (b.keyword.value if b.keyword else None) and a.value.deep_equals(b.value)
                    for a, b in zip(call.args, inner_call.args)
                )
            ):
                message = ".to(...).to(...) with the same arguments: the second .to() is redundant"
                yield self.replace(call, message, {call: keep(inner_call)})

    # -- round trips: dtype (through float64) and memory layout (transpose/contiguous/transpose) --

    def _round_trips(self, ctx: Context, alias: str | None) -> Iterable[Edit]:
        for call in ctx.nodes(cst.Call):
            m = h.method(call)
            if m is None:
                continue
            if m[1] == "clone" and not call.args and isinstance(m[0], cst.Call) and self._dtype_round_trip(ctx, m[0], alias):
                yield from self._fix_dtype_trip(ctx, call, m[0], alias, with_clone=True)
                continue
            trip = self._dtype_round_trip(ctx, call, alias)
            if trip is not None and not self._clone_follows(ctx, call):
                yield from self._fix_dtype_trip(ctx, call, call, alias, with_clone=False)
                continue
            receiver = self._layout_round_trip(call)
            if receiver is not None:
                yield from self._fix_layout_trip(ctx, call, receiver)
                continue
            if m[1] == "clone" and not call.args and isinstance(m[0], cst.Name):
                stmt = self._self_rebinding(ctx, call, m[0].value)
                if stmt is not None and flow.local_only_read(ctx, stmt, m[0].value):
                    message = f"`{m[0].value}.clone()` copies a tensor that is only read afterwards: the copy is not needed"
                    yield self.replace(call, message, h.remove_statement(ctx, stmt.body[0]))

    @staticmethod
    def _clone_follows(ctx: Context, call: cst.Call) -> bool:
        p = ctx.parent(call)
        gp = ctx.parent(p) if p is not None else None
        return isinstance(p, cst.Attribute) and p.attr.value == "clone" and isinstance(gp, cst.Call) and not gp.args

    @staticmethod
    def _dtype_round_trip(ctx: Context, call: cst.Call, alias: str | None) -> tuple[cst.BaseExpression, str] | None:
        """``E.to(torch.float64).to(torch.float32)`` (or ``.double().float()``, to float16/bfloat16
        as well): (E, the final dtype's short name)."""
        outer = h.method(call)
        if outer is None or not isinstance(outer[0], cst.Call):
            return None
        inner = h.method(outer[0])
        if inner is None:
            return None
        torch = alias or "torch"

        def dtype_of(c: cst.Call, name: str, table) -> str | None:
            if name == "to":
                if len(c.args) != 1 or c.args[0].keyword is not None and c.args[0].keyword.value != "dtype" or c.args[0].star:
                    return None
                d = h.dotted(c.args[0].value) or ""
                head, _, last = d.rpartition(".")
                return last if head == torch and last in table else None
            return None

        wide = None
        if inner[1] == "double" and not outer[0].args:
            wide = "float64"
        elif dtype_of(outer[0], inner[1], WIDE) is not None:
            wide = "float64"
        if wide is None:
            return None
        if outer[1] in NARROW_METHODS and not call.args:
            return inner[0], NARROW_METHODS[outer[1]]
        last = dtype_of(call, outer[1], NARROW)
        return (inner[0], NARROW[last]) if last is not None else None

    @staticmethod
    def _self_rebinding(ctx: Context, top: cst.CSTNode, name: str) -> cst.SimpleStatementLine | None:
        """The statement line ``name = <top>`` (one target, one statement on the line)."""
        assign = ctx.parent(top)
        if not (isinstance(assign, cst.Assign) and assign.value is top and len(assign.targets) == 1):
            return None
        target = assign.targets[0].target
        if not (isinstance(target, cst.Name) and target.value == name):
            return None
        line = ctx.parent(assign)
        return line if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None

    def _fix_dtype_trip(self, ctx: Context, top: cst.Call, trip: cst.Call, alias: str | None, *, with_clone: bool) -> Iterable[Edit]:
        found = self._dtype_round_trip(ctx, trip, alias)
        assert found is not None
        receiver, final = found
        torch = alias or "torch"
        keep = lambda new: new.with_changes(lpar=top.lpar, rpar=top.rpar)  # noqa: E731
        made = _dtype_made(ctx, receiver)
        if made not in EXACT_IN_FLOAT64:
            message = (f"converting to float64 and back to {final} makes two copies where `.to({torch}.{final}, copy=True)` "
                       f"makes one, with the same result unless the tensor is int64 (a value beyond 2**53 rounds twice on "
                       f"the way); not rewritten: its dtype is not visible here")
            if with_clone:
                yield self.replace(top, message + f"; the `.clone()` after it copies the fresh {final} tensor again: dropped",
                                   {top: keep(trip)})
            else:
                yield self.report(top, message)
            return
        copies = "three copies" if with_clone else "two copies"
        message = f"converting to float64 and back to {final} is exact and makes {copies}"
        outer = h.method(trip)
        assert outer is not None
        source = h.method(receiver)
        name = source[0].value if made == final and source is not None and isinstance(source[0], cst.Name) else None
        stmt = self._self_rebinding(ctx, top, name) if name else None
        if stmt is not None and flow.local_only_read(ctx, stmt, name):  # type: ignore[arg-type]
            yield self.replace(top, message + f"; `{ctx.code(receiver)}` already is {final} and `{name}` is only read "
                               "afterwards, so the round trip and its copies are not needed", {top: keep(receiver)})
            return
        if alias is None and outer[1] != "to":
            yield self.report(top, message + "; use .to(torch.%s, copy=True) (needs `import torch`)" % final)
            return
        if outer[1] == "to":
            base = trip.with_changes(func=trip.func.with_changes(value=receiver))  # type: ignore[union-attr]
        else:
            base = cst.parse_expression(f"_.to({torch}.{final})")
            base = base.with_changes(func=base.func.with_changes(value=receiver))  # type: ignore[union-attr]
        new = h.add_kwargs(base, [("copy", "True")])  # type: ignore[arg-type]
        yield self.replace(top, message + f"; `.to({torch}.{final}, copy=True)` makes one", {top: keep(new)})

    @staticmethod
    def _layout_round_trip(call: cst.Call) -> cst.BaseExpression | None:
        """``E.transpose(a, b).contiguous().transpose(a, b)`` / ``E.t().contiguous().t()`` /
        ``E.permute(p).contiguous().permute(q)`` with q the inverse of p: E."""
        outer = h.method(call)
        if outer is None or not isinstance(outer[0], cst.Call):
            return None
        mid = h.method(outer[0])
        if mid is None or mid[1] != "contiguous" or outer[0].args or not isinstance(mid[0], cst.Call):
            return None
        first = h.method(mid[0])
        if first is None or first[1] != outer[1]:
            return None
        kind = outer[1]
        if kind == "t":
            return first[0] if not call.args and not mid[0].args else None
        a, b = _ints(mid[0]), _ints(call)
        if a is None or b is None or len(a) != len(b):
            return None
        if kind == "transpose":
            return first[0] if len(a) == 2 and sorted(a) == sorted(b) else None
        if kind == "permute":
            n = len(a)
            norm = lambda v: [x % n if x < 0 else x for x in v]  # noqa: E731
            a, b = norm(a), norm(b)
            if sorted(a) != list(range(n)) or sorted(b) != list(range(n)):
                return None
            return first[0] if all(a[b[j]] == j for j in range(n)) else None
        return None

    def _fix_layout_trip(self, ctx: Context, top: cst.Call, receiver: cst.BaseExpression) -> Iterable[Edit]:
        text = ctx.code(top)
        text = text if len(text) <= 50 else text[:47] + "..."
        message = f"`{text}` copies the tensor only to give back the same values in another memory layout"
        name = receiver.value if isinstance(receiver, cst.Name) else None
        stmt = self._self_rebinding(ctx, top, name) if name else None
        if stmt is not None and flow.local_only_read(ctx, stmt, name):  # type: ignore[arg-type]
            yield self.replace(top, message + f"; `{name}` is only read afterwards: drop the statement", h.remove_statement(ctx, stmt.body[0]))
            return
        if stmt is not None and self._fresh_before(ctx, stmt, name):  # type: ignore[arg-type]
            yield self.replace(top, message + f"; `{name}` was just copied by the statement before: drop the statement", h.remove_statement(ctx, stmt.body[0]))
            return
        yield self.report(top, message + " (not rewritten: the result is not only read afterwards; drop it unless that layout is needed)")

    def _fresh_before(self, ctx: Context, stmt: cst.SimpleStatementLine, name: str) -> bool:
        """The statement right before ``stmt`` (same block, nothing in between) is
        ``name = <a guaranteed fresh copy>``: ``.clone()``, ``.to(..., copy=True)`` or a dtype round
        trip. That copy is referenced by ``name`` only, and ``stmt`` rebinds ``name``, so handing
        on the copy itself instead of a re-laid-out copy of it is unobservable (but for layout)."""
        where = ctx.block_of(stmt)
        if where is None or where[1] == 0:
            return False
        block, i = where
        prev = block.body[i - 1]  # type: ignore[attr-defined]
        if not (isinstance(prev, cst.SimpleStatementLine) and len(prev.body) == 1 and isinstance(prev.body[0], cst.Assign)):
            return False
        assign = prev.body[0]
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name) or assign.targets[0].target.value != name:
            return False
        value = assign.value
        m = h.method(value)
        if m is None:
            return False
        if m[1] == "clone" and not any(a.star for a in value.args):  # type: ignore[union-attr]
            return True
        copy = h.kwarg(value, "copy") if m[1] == "to" else None  # type: ignore[arg-type]
        if copy is not None and h.is_literal(copy.value, True):
            return True
        return self._dtype_round_trip(ctx, value, ctx.torch_alias()) is not None  # type: ignore[arg-type]
