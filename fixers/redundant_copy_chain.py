"""redundant-copy-chain: method chains that copy a tensor twice (or convert it twice)."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

# no-argument methods whose second application returns its input unchanged
IDEMPOTENT = {"contiguous", "detach", "cpu", "cuda", "float", "half", "double", "bfloat16", "long", "int", "bool", "clone"}


def _pure(expr: cst.CSTNode) -> bool:
    """Names, attributes and literals: evaluating them twice is the same as once."""
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return h.dotted(expr) is not None
    return h.literal(expr) is not h.MISSING


class RedundantCopyChain(Fixer):
    pattern = "extra-copy"
    name = "redundant-copy-chain"
    summary = "x.clone().clone(), x.contiguous().contiguous(), x.clone().to(...), x.to(d).to(d), x.to(x.dtype): keep one copy or none"
    explanation = """\
## What it does
Collapses method chains whose second step is provably redundant:

* the same no-argument method twice, `x.m().m()` for `contiguous`, `clone`, `detach`, `cpu`,
  `cuda`, `float`, `half`, `double`, `bfloat16`, `long`, `int`, `bool` -> `x.m()`;
* `x.clone().to(...)` -> `x.to(..., copy=True)` (one copy instead of two; still a new tensor);
* `x.clone().contiguous()` and `x.contiguous().clone()` ->
  `x.clone(memory_format=torch.contiguous_format)` (needs `import torch`);
* `x.to(a).to(a)` with the same simple arguments -> `x.to(a)`;
* `x.to(x.dtype)` / `x.to(x.device)` (x a plain name or attribute) -> `x`: converting a tensor to
  its own dtype or device returns it unchanged.

## Why is this bad?
Every `clone()`/`contiguous()`/`.to()` that actually copies launches a copy kernel and
allocates a new tensor (`extra-copy` in the trace: `aten::copy_`/`aten::clone` with no
consumer other than the next copy). The second operation of these chains either copies the
fresh copy again or is a no-op that still costs a dispatcher round trip.

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
        Example("h = self.h.to(self.h.dtype) + (w.to(device=w.device))\n", "h = self.h + (w)\n", message_contains="no-op"),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        alias = ctx.torch_alias()
        for call in ctx.nodes(cst.Call):
            outer = h.method(call)
            if outer is not None and outer[1] == "to" and self._self_to(call, outer[0]):
                message = f".to({ctx.code(call.args[0].value)}) converts {ctx.code(outer[0])} to what it already is: a no-op"
                yield self.replace(call, message, {call: outer[0].with_changes(lpar=call.lpar, rpar=call.rpar)})
                continue
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
            elif first == "clone" and second == "to" and not inner_call.args and h.kwarg(call, "copy") is None and not h.has_star(call) and call.args:
                message = ".clone().to(...) copies twice; .to(..., copy=True) copies once"
                yield self.replace(call, message, {call: keep(h.add_kwargs(call.with_changes(func=call.func.with_changes(value=receiver)), [("copy", "True")]))})  # type: ignore[union-attr]
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

    @staticmethod
    def _self_to(call: cst.Call, receiver: cst.BaseExpression) -> bool:
        """``x.to(x.dtype)`` / ``x.to(x.device)`` (also by keyword) for a plain name/attribute x."""
        owner = h.dotted(receiver)
        if owner is None or len(call.args) != 1 or call.args[0].star:
            return False
        arg = call.args[0]
        if arg.keyword is not None and arg.keyword.value not in ("dtype", "device"):
            return False
        target = h.dotted(arg.value)
        if target not in (f"{owner}.dtype", f"{owner}.device"):
            return False
        return arg.keyword is None or target.endswith("." + arg.keyword.value)
