"""zero-grad-set-to-none: gradients zeroed with memset kernels instead of being dropped."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer


def _grad_zero(stmt: cst.CSTNode, var: str) -> bool:
    """``var.grad.zero_()`` / ``var.grad.data.zero_()`` as a statement."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return False
    call = stmt.body[0].value
    if not h.is_method_call(call, "zero_", 0):
        return False
    return h.dotted(call.func.value) in (f"{var}.grad", f"{var}.grad.data")  # type: ignore[union-attr]


def _grad_not_none_guard(stmt: cst.CSTNode, var: str) -> cst.CSTNode | None:
    """``if var.grad is not None: <one statement>`` -> that statement."""
    if not isinstance(stmt, cst.If) or stmt.orelse is not None:
        return None
    test = stmt.test
    if not (
        isinstance(test, cst.Comparison)
        and h.dotted(test.left) == f"{var}.grad"
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.IsNot)
        and h.is_literal(test.comparisons[0].comparator, None)
    ):
        return None
    body = stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else None
    if body is None or len(body) != 1:
        return None
    return body[0]


def _module_like(ctx: Context, expr: cst.BaseExpression) -> bool:
    """Conservatively an nn.Module: ``self`` (inside a class), or a name like model/net."""
    d = h.dotted(expr)
    if d is None:
        return False
    last = d.split(".")[-1].lower()
    return d == "self" or "model" in last or last.endswith("net") or last in ("module", "backbone", "encoder", "decoder")


class ZeroGradSetToNone(Fixer):
    pattern = "zero-grad-not-none"
    name = "zero-grad-set-to-none"
    summary = "zero_grad(set_to_none=False) or a p.grad.zero_() loop: drop gradients instead of zero-filling them"
    explanation = """\
## What it does
Rewrites `.zero_grad(set_to_none=False)` to `.zero_grad(set_to_none=True)` and replaces a loop
that zero-fills every gradient (`for p in model.parameters(): p.grad.zero_()`, also
`p.grad.data.zero_()` and the `if p.grad is not None:` guarded form) by
`model.zero_grad(set_to_none=True)` when the loop is exactly that (one statement, no `else`)
and the receiver is recognisably a module (`model`, `net`, `self`, ...). Other loops are
reported.

## Why is this bad?
Zero-filling launches a memset kernel per gradient every step (`zero-grad-not-none` in the
trace: a train of `aten::zero_`/`Memset` before the forward pass) and keeps the gradient
memory alive between steps. With `set_to_none=True` the gradients are dropped: no kernels, and
the next backward pass writes (rather than accumulates into) fresh gradients.

## Caveats
Afterwards `p.grad` is `None` until the next backward instead of a zero tensor: code that reads
gradients between `zero_grad()` and `backward()` must handle `None`. Since PyTorch 2.0
`set_to_none=True` is the default of `zero_grad()`.

## Example
```python
optimizer.zero_grad(set_to_none=False)
```
Use instead:
```python
optimizer.zero_grad(set_to_none=True)
```
"""

    VALID = [
        "optimizer.zero_grad()\n",
        "optimizer.zero_grad(set_to_none=True)\n",
        "for p in model.parameters():\n    p.grad = None\n",
        "opt.zero_grad(set_to_none=False)  # zoomer: ignore[zero-grad-not-none]\n",
        "for p in model.parameters():\n    p.requires_grad_(False)\n",
    ]
    INVALID = [
        Example(
            "optimizer.zero_grad(set_to_none=False)\n",
            "optimizer.zero_grad(set_to_none=True)\n",
            message_contains="set_to_none=False",
        ),
        Example(
            "model.zero_grad(False)\n",
            "model.zero_grad(set_to_none=True)\n",
            message_contains="zero_grad",
        ),
        Example(
            "for step in range(10):\n"
            "    # clear old gradients\n"
            "    for p in model.parameters():\n"
            "        p.grad.data.zero_()\n"
            "    loss = model(x).sum()\n",
            "for step in range(10):\n"
            "    # clear old gradients\n"
            "    model.zero_grad(set_to_none=True)\n"
            "    loss = model(x).sum()\n",
            message_contains="p.grad",
        ),
        Example(
            "for p in self.net.parameters():  # all of them\n    if p.grad is not None:\n        p.grad.zero_()  # reset\n",
            "# all of them\n# reset\nself.net.zero_grad(set_to_none=True)\n",
            message_contains="zero-fills",
        ),
        Example(
            "for p in params:\n    p.grad.zero_()\n",
            None,
            message_contains="zero-fills",
        ),
        Example(
            "for p in model.parameters():\n    p.grad.zero_()\n    p.grad.requires_grad_(False)\n",
            None,
            message_contains="zero-fills",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        for call in ctx.nodes(cst.Call):
            if not h.is_method_call(call, "zero_grad"):
                continue
            arg = h.kwarg(call, "set_to_none")
            pos = h.positionals(call)
            if arg is None and len(pos) == 1:
                arg = pos[0]
            if arg is None or not h.is_literal(arg.value, False):
                continue
            if h.has_star(call) or len(call.args) != 1:
                yield self.report(call, "zero_grad(set_to_none=False) zero-fills every gradient each step; use set_to_none=True")
                continue
            new = call.with_changes(args=[h.make_arg("set_to_none", "True").with_changes(comma=arg.comma)])
            yield self.replace(call, "zero_grad(set_to_none=False) zero-fills every gradient each step; use set_to_none=True", {call: new})

        for loop in ctx.nodes(cst.For):
            if not isinstance(loop.target, cst.Name) or not isinstance(loop.body, cst.IndentedBlock):
                continue
            var = loop.target.value
            body = list(loop.body.body)
            stmts = body
            if len(body) == 1 and _grad_not_none_guard(body[0], var) is not None:
                stmts = [_grad_not_none_guard(body[0], var)]
            if not any(_grad_zero(s, var) for s in stmts):
                if not any(_grad_zero(s, var) for s in h.walk(loop.body) if isinstance(s, cst.SimpleStatementLine)):
                    continue
            message = f"the loop zero-fills each {var}.grad with a kernel per parameter; use zero_grad(set_to_none=True)"
            it = loop.iter
            owner = h.method(it)
            simple = (
                len(stmts) == 1
                and _grad_zero(stmts[0], var)
                and loop.orelse is None
                and loop.asynchronous is None
                and owner is not None
                and owner[1] == "parameters"
                and not it.args  # type: ignore[union-attr]
                and _module_like(ctx, owner[0])
            )
            if not simple:
                yield self.report(loop, message)
                continue
            # comments inside the loop (header, body) move above the new statement
            inner = [
                c for c in h.walk(loop) if isinstance(c, cst.Comment) and not any(c is e.comment for e in loop.leading_lines)
            ]
            inner.sort(key=lambda c: (ctx.pos(c).start.line, ctx.pos(c).start.column))
            kept = [cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace(""), comment=c) for c in inner]
            new = h.simple_stmt(f"{ctx.code(owner[0])}.zero_grad(set_to_none=True)\n").with_changes(
                leading_lines=[*loop.leading_lines, *kept]
            )
            yield self.replace(loop, message, {loop: new})
