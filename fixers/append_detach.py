"""append-detach: tensors appended to a list every step with their autograd graph attached."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import flow
from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

#: methods whose result keeps the receiver's autograd graph (grad_fn)
GRAPH_METHODS = (
    flow.FRESH_METHODS - {"argmax", "argmin", "eq", "ne", "lt", "le", "gt", "ge"}
) | (flow.VIEW_METHODS - {"detach"}) | {"cpu", "cuda", "clone", "max", "min", "topk", "sort"}
#: calls/methods that already cut the graph or leave tensors
DETACHING = {"detach", "item", "tolist", "numpy", "detach_", "data"}
MODEL_WORDS = ("model", "net", "encoder", "decoder", "backbone", "head", "module")
NO_GRAD = {"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad"}


def _is_model_call(expr: cst.CSTNode) -> bool:
    if not isinstance(expr, cst.Call):
        return False
    d = h.dotted(expr.func)
    if d is None:
        return False
    last = d.split(".")[-1].lower()
    return any(w in last for w in MODEL_WORDS) or (d.startswith("self.") and d.count(".") == 1)


class AppendDetach(Fixer):
    pattern = "memory-growth"
    name = "append-detach"
    summary = "a tensor with its autograd graph appended to a list every step: append .detach()"
    explanation = """\
## What it does
Flags `history.append(t)` executed every training step (in a loop, or in a function that calls
`.backward()`) when `t` is a tensor that still carries its autograd graph: a model output, a
loss, or a value computed from one (`logits.softmax(1).amax(1).mean()`), not under
`torch.no_grad()`. It rewrites the call to `history.append(t.detach())` when the list is
provably only collected: every use of it in the file, followed through plain function
arguments (`train_step(..., history)`), is an `.append(...)`, `.clear()`, `len(...)` or the
`history = []` that creates it. Lists that are read, returned, printed or handed to other code
(which might call `backward()` through the stored tensors) are reported, not changed.

## Why is this bad?
A tensor that requires grad keeps its `grad_fn`, and through it every tensor the graph saved
for the backward pass that has not been freed: a graph that was never back-propagated (a metric
computed from the outputs) keeps all its activations. Kept in a list, none of it is ever
released: allocated memory climbs every step (`memory-growth` in the trace: the step-end
`Total Allocated` rises monotonically) until the job runs out of memory.

## Caveats
`.detach()` shares the storage: values and in-place updates are unchanged; only `grad_fn` and
`requires_grad` of the stored tensors differ. A stored tensor that is itself large (the logits
of every step) still grows memory after the fix: store a reduction or `.item()` instead.

## Example
```python
def train_step(model, opt, x, y, history):
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    opt.step()
    history.append(logits.softmax(dim=1).amax(dim=1).mean())
```
Use instead:
```python
    history.append(logits.softmax(dim=1).amax(dim=1).mean().detach())
```
"""

    VALID = [
        # already detached / converted
        "def step(model, x, hist):\n    loss = model(x).sum()\n    loss.backward()\n    hist.append(loss.detach())\n",
        "def step(model, x, hist):\n    loss = model(x).sum()\n    loss.backward()\n    hist.append(loss.item())\n",
        # not a training step, not in a loop
        "def collect(model, x, hist):\n    out = model(x)\n    hist.append(out.mean())\n",
        # under no_grad: no graph
        "import torch\nhist = []\nfor x in loader:\n    with torch.no_grad():\n        loss = model(x).mean()\n    hist.append(loss)\n",
        # not recognisably a tensor
        "hist = []\nfor x in loader:\n    hist.append(len(x))\n",
        "def step(model, x, hist):\n    loss = model(x).sum()\n    loss.backward()\n    hist.append(loss)  # zoomer: ignore[memory-growth]\n",
    ]
    INVALID = [
        Example(
            "import torch.nn.functional as F\n"
            "\n"
            "def train_step(model, opt, x, y, history):\n"
            "    logits = model(x)\n"
            "    loss = F.cross_entropy(logits, y)\n"
            "    loss.backward()\n"
            "    opt.step()\n"
            "    history.append(logits.softmax(dim=1).amax(dim=1).mean())\n"
            "\n"
            "def main(model, opt, data):\n"
            "    history = []\n"
            "    for x, y in data:\n"
            "        train_step(model, opt, x, y, history)\n"
            "    print(f'{len(history)} steps')\n",
            "import torch.nn.functional as F\n"
            "\n"
            "def train_step(model, opt, x, y, history):\n"
            "    logits = model(x)\n"
            "    loss = F.cross_entropy(logits, y)\n"
            "    loss.backward()\n"
            "    opt.step()\n"
            "    history.append(logits.softmax(dim=1).amax(dim=1).mean().detach())\n"
            "\n"
            "def main(model, opt, data):\n"
            "    history = []\n"
            "    for x, y in data:\n"
            "        train_step(model, opt, x, y, history)\n"
            "    print(f'{len(history)} steps')\n",
            message_contains="autograd graph",
        ),
        Example(
            "losses = []\n"
            "for x, y in loader:\n"
            "    loss = criterion(model(x), y)\n"
            "    loss.backward()\n"
            "    losses.append(loss + 0)  # per step\n"
            "    if len(losses) > 100:\n"
            "        losses.clear()\n",
            "losses = []\n"
            "for x, y in loader:\n"
            "    loss = criterion(model(x), y)\n"
            "    loss.backward()\n"
            "    losses.append((loss + 0).detach())  # per step\n"
            "    if len(losses) > 100:\n"
            "        losses.clear()\n",
            message_contains=".detach()",
        ),
        Example(
            "class Trainer:\n"
            "    def __init__(self):\n"
            "        self.outputs = []\n"
            "\n"
            "    def step(self, x):\n"
            "        out = self.model(x)\n"
            "        out.sum().backward()\n"
            "        self.outputs.append(out.mean(dim=0))\n",
            "class Trainer:\n"
            "    def __init__(self):\n"
            "        self.outputs = []\n"
            "\n"
            "    def step(self, x):\n"
            "        out = self.model(x)\n"
            "        out.sum().backward()\n"
            "        self.outputs.append(out.mean(dim=0).detach())\n",
            message_contains="self.outputs",
        ),
        # the list is summed and could be back-propagated: report only
        Example(
            "losses = []\n"
            "for x, y in loader:\n"
            "    loss = criterion(model(x), y)\n"
            "    losses.append(loss)\n"
            "total = sum(losses)\n"
            "total.backward()\n",
            None,
            message_contains="not rewritten",
        ),
        # handed to code we cannot see
        Example(
            "def train_step(model, x, history):\n"
            "    loss = model(x).mean()\n"
            "    loss.backward()\n"
            "    history.append(loss)\n"
            "\n"
            "def main(model, data, history):\n"
            "    for x in data:\n"
            "        train_step(model, x, history)\n",
            None,
            message_contains="not rewritten",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        for call in ctx.nodes(cst.Call):
            m = h.method(call)
            if m is None or m[1] != "append" or len(call.args) != 1 or call.args[0].star or call.args[0].keyword is not None:
                continue
            expr_stmt = ctx.parent(call)
            if not isinstance(expr_stmt, cst.Expr):
                continue
            container, value = m[0], call.args[0].value
            if not (isinstance(container, cst.Name) or self._self_attr(container)):
                continue
            fn = flow.function_of(ctx, call)
            if not self._per_step(ctx, call, fn) or self._no_grad(ctx, call, fn):
                continue
            if self._detached(value) or not self._carries_graph(ctx, fn, value, call, 0):
                continue
            vtext = ctx.code(value)
            short = vtext if len(vtext) <= 40 else vtext[:37] + "..."
            message = (
                f"`{ctx.code(container)}.append({short})` keeps a tensor and its autograd graph alive every step, "
                "so allocated memory grows; append `.detach()`"
            )
            why = self._unsafe_container(ctx, container, fn)
            if why is not None:
                yield self.report(call, message + f" (not rewritten: {why})")
                continue
            new_value = self._detach(value)
            yield self.replace(call, message, {value: new_value})

    # -- the value ------------------------------------------------------------------------------

    @staticmethod
    def _detach(value: cst.BaseExpression) -> cst.BaseExpression:
        inner = value
        if isinstance(value, (cst.BinaryOperation, cst.UnaryOperation, cst.BooleanOperation, cst.Comparison, cst.IfExp, cst.Await, cst.Lambda)) and not value.lpar:
            inner = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return cst.Call(func=cst.Attribute(value=inner, attr=cst.Name("detach")))

    @staticmethod
    def _detached(value: cst.CSTNode) -> bool:
        for n in h.walk(value):
            m = h.method(n)
            if m is not None and m[1] in DETACHING:
                return True
            if isinstance(n, cst.Attribute) and n.attr.value == "data":
                return True
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in ("float", "int", "bool", "len", "str"):
                return True
        return False

    def _carries_graph(self, ctx: Context, fn: cst.FunctionDef | None, expr: cst.CSTNode, at: cst.CSTNode, depth: int) -> bool:
        if depth > 8:
            return False
        if isinstance(expr, cst.Name):
            return self._graph_name(ctx, fn, expr.value, at, depth)
        if isinstance(expr, cst.BinaryOperation):
            return self._carries_graph(ctx, fn, expr.left, at, depth + 1) or self._carries_graph(ctx, fn, expr.right, at, depth + 1)
        if isinstance(expr, cst.Attribute):
            if expr.attr.value in ("values", "loss", "logits"):
                return self._carries_graph(ctx, fn, expr.value, at, depth + 1) or (
                    isinstance(expr.value, cst.Name) and self._assigned_from_model(ctx, fn, expr.value.value, at)
                )
            return False
        if isinstance(expr, cst.Call):
            m = h.method(expr)
            if m is not None:
                return m[1] in GRAPH_METHODS and self._carries_graph(ctx, fn, m[0], at, depth + 1)
            if self._functional(ctx, expr):
                return any(self._carries_graph(ctx, fn, a.value, at, depth + 1) for a in h.positionals(expr))
            d = (h.dotted(expr.func) or "").split(".")[-1].lower()
            if "loss" in d or "criterion" in d:
                return True
        return False

    @staticmethod
    def _functional(ctx: Context, call: cst.Call) -> bool:
        d = h.dotted(call.func) or ""
        last = d.split(".")[-1]
        return bool(last) and ctx.matches(call, {f"torch.nn.functional.{last}", f"torch.{last}"}, {f"F.{last}", f"torch.nn.functional.{last}", f"torch.{last}"})

    def _assignment(self, ctx: Context, fn: cst.CSTNode | None, name: str, at: cst.CSTNode) -> cst.BaseExpression | None:
        scope = fn if fn is not None else ctx.module
        last = None
        for n in flow.names_in(ctx, scope, name):
            if ctx.order(n) >= ctx.order(at):
                break
            p = ctx.parent(n)
            if isinstance(p, cst.AssignTarget) and p.target is n:
                assign = ctx.parent(p)
                last = assign.value if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
            elif flow.is_store(ctx, n):
                last = None
        return last

    def _assigned_from_model(self, ctx: Context, fn: cst.CSTNode | None, name: str, at: cst.CSTNode) -> bool:
        rhs = self._assignment(ctx, fn, name, at)
        return rhs is not None and _is_model_call(rhs)

    def _graph_name(self, ctx: Context, fn: cst.FunctionDef | None, name: str, at: cst.CSTNode, depth: int) -> bool:
        scope = fn if fn is not None else ctx.module
        for c in flow.iter_calls(flow.body_of(scope)):
            if h.is_method_call(c, "backward") and isinstance(h.method(c)[0], cst.Name) and h.method(c)[0].value == name:  # type: ignore[index,union-attr]
                return True
        rhs = self._assignment(ctx, fn, name, at)
        if rhs is None or self._no_grad(ctx, rhs, None):
            return False
        if _is_model_call(rhs):
            return self._used_as_tensor(ctx, scope, name)
        return self._carries_graph(ctx, fn, rhs, at, depth + 1)

    @staticmethod
    def _used_as_tensor(ctx: Context, scope: cst.CSTNode, name: str) -> bool:
        """A model output is a tensor (not a dict-like ModelOutput) when the code uses it as one:
        a tensor method on it, or it is the first argument of a loss/criterion or F./torch. call."""
        for n in flow.names_in(ctx, scope, name):
            p = ctx.parent(n)
            if isinstance(p, cst.Attribute) and p.value is n and p.attr.value in (GRAPH_METHODS | {"backward", "argmax", "size", "shape"}):
                return True
            if isinstance(p, cst.Arg) and p.keyword is None:
                call = ctx.parent(p)
                if isinstance(call, cst.Call) and call.args and call.args[0] is p:
                    d = (h.dotted(call.func) or "").lower()
                    if d.startswith(("f.", "torch.", "nn.functional.")) or "loss" in d.split(".")[-1] or "criterion" in d:
                        return True
        return False

    # -- where it runs ----------------------------------------------------------------------------

    @staticmethod
    def _per_step(ctx: Context, call: cst.CSTNode, fn: cst.FunctionDef | None) -> bool:
        if ctx.in_loop(call):
            return True
        if fn is None:
            return False
        return any(h.is_method_call(c, "backward") for c in flow.iter_calls(fn.body))

    @staticmethod
    def _no_grad(ctx: Context, call: cst.CSTNode, fn: cst.FunctionDef | None) -> bool:
        for anc in ctx.ancestors(call):
            if isinstance(anc, cst.With):
                for item in anc.items:
                    if isinstance(item.item, cst.Call) and ctx.matches(item.item, NO_GRAD, NO_GRAD):
                        return True
        if fn is not None:
            for d in fn.decorators:
                target = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
                if ctx.matches(target, NO_GRAD, NO_GRAD):
                    return True
        return False

    # -- who else sees the list ---------------------------------------------------------------

    @staticmethod
    def _self_attr(expr: cst.CSTNode) -> bool:
        return isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self"

    def _unsafe_container(self, ctx: Context, container: cst.CSTNode, fn: cst.FunctionDef | None) -> str | None:
        if isinstance(container, cst.Attribute):
            return self._unsafe_attr(ctx, container.attr.value)
        name = container.value  # type: ignore[attr-defined]
        scope: cst.CSTNode = fn if fn is not None else ctx.module
        if fn is not None and not flow.is_param(fn, name) and not any(flow.is_store(ctx, n) for n in flow.names_in(ctx, fn, name)):
            scope = ctx.module  # a global list
            for other in ctx.nodes(cst.FunctionDef):
                if flow.names_in(ctx, other, name) and not flow.is_param(other, name):
                    why = self._unsafe_uses(ctx, other, name, set(), allow_global=True)
                    if why:
                        return why
        return self._unsafe_uses(ctx, scope, name, set())

    def _unsafe_uses(self, ctx: Context, scope: cst.CSTNode, name: str, seen: set, allow_global: bool = False) -> str | None:
        key = (id(scope), name)
        if key in seen:
            return None
        seen.add(key)
        if len(seen) > 24:
            return "too many functions to follow"
        if flow.used_in_nested_scopes(ctx, scope, name) or flow.declared_nonlocal(scope, name) and not allow_global:
            return f"`{name}` is used in a nested function"
        for n in flow.names_in(ctx, scope, name):
            p = ctx.parent(n)
            if flow.is_store(ctx, n):
                if isinstance(p, cst.AssignTarget) and self._empty_list(ctx.parent(p)):
                    continue
                return f"`{name}` is bound to something else"
            if isinstance(p, cst.Attribute) and p.value is n:
                gp = ctx.parent(p)
                if isinstance(gp, cst.Call) and gp.func is p and p.attr.value in ("append", "clear"):
                    continue
                return f"`{name}.{p.attr.value}` reads the list"
            if isinstance(p, cst.Arg) and p.value is n and not p.star:
                call = ctx.parent(p)
                if not isinstance(call, cst.Call):
                    return f"`{name}` is used"
                if isinstance(call.func, cst.Name) and call.func.value == "len" and (not ctx.is_bound(call.func) or ctx.qualnames(call.func) == {"builtins.len"}):
                    continue
                callee = flow.called_function(ctx, call)
                if callee is None:
                    return f"`{name}` is passed to {h.dotted(call.func) or 'a call'}"
                param = flow.arg_param(ctx, call, callee, n)
                if param is None:
                    return f"`{name}` is passed to {callee.name.value} in a way that cannot be followed"
                why = self._unsafe_uses(ctx, callee, param, seen)
                if why:
                    return why
                continue
            return f"`{name}` is used as `{ctx.code(p)[:40]}`"
        if isinstance(scope, cst.FunctionDef) and flow.is_param(scope, name):
            calls = flow.call_sites(ctx, scope)
            if calls is None:
                return f"{scope.name.value}() is used other than by direct calls in this file"
            if not calls:
                return f"{scope.name.value}() is not called in this file"
            for call in calls:
                arg = flow.bound_argument(call, scope, name)
                if not isinstance(arg, cst.Name):
                    return f"{scope.name.value}() gets `{name}` from an expression"
                caller = ctx.enclosing_scope(call)
                caller_scope = caller if isinstance(caller, cst.FunctionDef) else ctx.module
                why = self._unsafe_uses(ctx, caller_scope, arg.value, seen)
                if why:
                    return why
        return None

    @staticmethod
    def _empty_list(assign: cst.CSTNode | None) -> bool:
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return False
        v = assign.value
        if isinstance(v, cst.List) and not v.elements:
            return True
        return isinstance(v, cst.Call) and h.dotted(v.func) == "list" and not v.args

    def _unsafe_attr(self, ctx: Context, attr: str) -> str | None:
        for a in ctx.nodes(cst.Attribute):
            if a.attr.value != attr:
                continue
            p = ctx.parent(a)
            if isinstance(p, cst.AssignTarget) and p.target is a and self._empty_list(ctx.parent(p)):
                continue
            if isinstance(p, cst.Attribute) and p.value is a:
                gp = ctx.parent(p)
                if isinstance(gp, cst.Call) and gp.func is p and p.attr.value in ("append", "clear"):
                    continue
            if isinstance(p, cst.Arg) and p.value is a:
                call = ctx.parent(p)
                if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == "len":
                    continue
            return f"`.{attr}` is read (`{ctx.code(p)[:40]}`)"
        return None
