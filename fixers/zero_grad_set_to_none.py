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


def _not_modules_zero_grad(ctx: Context, loop: cst.CSTNode, owner: cst.BaseExpression) -> str | None:
    """Why ``self.zero_grad(set_to_none=True)`` in place of a loop over ``self.parameters()`` would not
    be nn.Module's zero_grad, else None: the loop is the body of the class's own ``zero_grad`` (the
    call would run that method again, with an argument it may not take), the class defines its own
    ``zero_grad``, or the class has no base (no nn.Module: no zero_grad at all)."""
    if h.dotted(owner) != "self":
        return None
    function = next((a for a in ctx.ancestors(loop) if isinstance(a, cst.FunctionDef)), None)
    cls = next((a for a in ctx.ancestors(loop) if isinstance(a, cst.ClassDef)), None)
    if cls is None:
        return None
    if function is not None and function.name.value == "zero_grad":
        return (" (not changed: the loop is the body of the class's own zero_grad, which "
                "`self.zero_grad(set_to_none=True)` would call again)")
    if any(isinstance(s, cst.FunctionDef) and s.name.value == "zero_grad" for s in cls.body.body):
        return (f" (not changed: {cls.name.value} defines its own zero_grad, which `self.zero_grad(set_to_none=True)` "
                "would call instead of nn.Module's)")
    if all(h.dotted(b.value) in (None, "object") for b in cls.bases):
        return f" (not changed: {cls.name.value} derives from no nn.Module, so `self` may have no zero_grad)"
    return None


def _simple_owner(ctx: Context, loop: cst.CSTNode) -> cst.BaseExpression | None:
    """The module of ``for p in <module>.parameters(): p.grad.zero_()`` (also the
    ``.grad.data`` and ``if p.grad is not None:`` forms) when the loop is exactly that, else None."""
    if not isinstance(loop, cst.For) or not isinstance(loop.target, cst.Name) or not isinstance(loop.body, cst.IndentedBlock):
        return None
    var = loop.target.value
    stmts = list(loop.body.body)
    if len(stmts) == 1 and _grad_not_none_guard(stmts[0], var) is not None:
        stmts = [_grad_not_none_guard(stmts[0], var)]
    owner = h.method(loop.iter)
    if (
        len(stmts) == 1
        and _grad_zero(stmts[0], var)
        and loop.orelse is None
        and loop.asynchronous is None
        and owner is not None
        and owner[1] == "parameters"
        and not loop.iter.args  # type: ignore[union-attr]
        and _module_like(ctx, owner[0])
    ):
        return owner[0]
    return None


def _is_backward(node: cst.CSTNode) -> bool:
    """``loss.backward()``, ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``,
    ``torch.autograd.backward(...)``, ``backward(...)``."""
    return isinstance(node, cst.Call) and h.last_name(node.func) == "backward"


def _is_grad_read(ctx: Context, node: cst.CSTNode) -> bool:
    """``x.grad`` used as a value (not ``x.grad = ...``, not ``del x.grad``, not
    ``torch.autograd.grad(...)``)."""
    if not (isinstance(node, cst.Attribute) and node.attr.value == "grad"):
        return False
    parent = ctx.parent(node)
    if isinstance(parent, cst.AssignTarget) and parent.target is node:
        return False
    if isinstance(parent, cst.Call) and parent.func is node:
        return False
    if isinstance(parent, cst.Del) and parent.target is node:
        return False
    return True


def _is_optimizer_step(node: cst.CSTNode) -> bool:
    """``opt.step()`` / ``self.optimizer.step()`` / ``scaler.step(optimizer)``: an update that
    uses the gradients (a zero gradient still moves the weights through momentum or weight
    decay; a None one is skipped)."""
    m = h.method(node)
    if m is None or m[1] != "step":
        return False
    names = [h.last_name(m[0])] + [h.last_name(a.value) for a in node.args]  # type: ignore[attr-defined]
    return any(n is not None and "opt" in n.lower() for n in names)


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
reported. Two or more such loops over the same module in a row become one call. A loop over
`self.parameters()` is reported, not changed, where `self.zero_grad` would not be nn.Module's:
in the class's own `zero_grad` method (the call would run it again), in a class that defines
its own `zero_grad`, or in a class with no base class.

Nothing is rewritten when the gradients are used after the zeroing, before the next backward
pass (a `.backward(` call) in the same function or loop body (or anywhere after it when no
backward follows): a read of `.grad` (`sum(p.grad.sum() for p in model.parameters())`, `if
p.grad is not None`), an optimizer step (`opt.step()`, `scaler.step(opt)`) or a call of a function
of the same file that does either (by its name, `log_grads(model)`, or as a method of `self`/`cls`,
`self.clip()`; `self.model.train()` is the model's method, not the class's own `train`). In a loop, the statements at the top of its body count too
(they run after the zeroing on the next iteration) unless a backward follows the zeroing in the
loop. Those sites are reported only: with `set_to_none=True` the gradients would be `None` there
(an `AttributeError`, or an optimizer step that skips the parameters instead of applying
momentum and weight decay).

## Why is this bad?
Zero-filling launches a memset kernel per gradient every step (`zero-grad-not-none` in the
trace: a train of `aten::zero_`/`Memset` before the forward pass) and keeps the gradient
memory alive between steps. With `set_to_none=True` the gradients are dropped: no kernels, and
the next backward pass writes (rather than accumulates into) fresh gradients.

## Caveats
Afterwards `p.grad` is `None` until the next backward instead of a zero tensor. Reads the
fixer can see in the same scope keep the site report-only; reads it cannot see (another module,
a function called through an object other than `self`) must handle `None`. Since PyTorch 2.0
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
        "for p in model.parameters():\n    p.grad = None\ntotal = sum(p.grad is None for p in model.parameters())\n",
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
        # the zeroed gradients are read next: with set_to_none=True they would be None (crash)
        Example(
            "for p in model.parameters():\n"
            "    p.grad.zero_()\n"
            "total = sum(p.grad.sum() for p in model.parameters())\n",
            None,
            message_contains="would be None",
        ),
        Example(
            "optimizer.zero_grad(set_to_none=False)\nfor p in model.parameters():\n    p.grad.add_(noise)\n",
            None,
            message_contains="would be None",
        ),
        # no backward in the loop: the read at the top of the body sees the zeroed gradients
        Example(
            "for step in range(3):\n"
            "    print(model.fc.weight.grad.norm())\n"
            "    for p in model.parameters():\n"
            "        p.grad.zero_()\n"
            "    loss = model(x).sum()\n",
            None,
            message_contains="would be None",
        ),
        # an optimizer step before the next backward would skip None gradients
        Example(
            "for p in model.parameters():\n    p.grad.zero_()\noptimizer.step()\n",
            None,
            message_contains="optimizer.step()",
        ),
        # a function of the file that reads gradients, called before the next backward
        Example(
            "def log_grads(model):\n"
            "    print(sum(p.grad.norm() for p in model.parameters()))\n"
            "\n"
            "for p in model.parameters():\n"
            "    p.grad.zero_()\n"
            "log_grads(model)\n",
            None,
            message_contains="log_grads(model)",
        ),
        # a method of the class that reads gradients, called on self before the next backward
        Example(
            "class Trainer:\n"
            "    def clip(self):\n"
            "        self.optimizer.step()\n"
            "\n"
            "    def run(self):\n"
            "        for it in range(10):\n"
            "            self.optimizer.zero_grad(set_to_none=False)\n"
            "            self.clip()\n",
            None,
            message_contains="self.clip()",
        ),
        # `self.model.train()` calls the model's train(), not the class's own train() that steps
        # the optimizer: estimate_loss (nanoGPT) reads no gradient
        Example(
            "import torch\n"
            "\n"
            "\n"
            "class Trainer:\n"
            "    @torch.no_grad()\n"
            "    def estimate_loss(self):\n"
            "        self.model.eval()\n"
            "        out = sum(self.model(x).item() for x in self.val)\n"
            "        self.model.train()\n"
            "        return out\n"
            "\n"
            "    def train(self):\n"
            "        for it in range(1000):\n"
            "            if it % 100 == 0:\n"
            "                print(self.estimate_loss())\n"
            "            loss = self.model(next(self.data))\n"
            "            loss.backward()\n"
            "            self.optimizer.step()\n"
            "            self.optimizer.zero_grad(set_to_none=False)\n",
            "import torch\n"
            "\n"
            "\n"
            "class Trainer:\n"
            "    @torch.no_grad()\n"
            "    def estimate_loss(self):\n"
            "        self.model.eval()\n"
            "        out = sum(self.model(x).item() for x in self.val)\n"
            "        self.model.train()\n"
            "        return out\n"
            "\n"
            "    def train(self):\n"
            "        for it in range(1000):\n"
            "            if it % 100 == 0:\n"
            "                print(self.estimate_loss())\n"
            "            loss = self.model(next(self.data))\n"
            "            loss.backward()\n"
            "            self.optimizer.step()\n"
            "            self.optimizer.zero_grad(set_to_none=True)\n",
            message_contains="zero-fills",
        ),
        # a backward pass comes first: the reads after it see fresh gradients
        Example(
            "for p in model.parameters():\n"
            "    p.grad.zero_()\n"
            "loss.backward()\n"
            "norm = sum(p.grad.norm() for p in model.parameters())\n",
            "model.zero_grad(set_to_none=True)\n"
            "loss.backward()\n"
            "norm = sum(p.grad.norm() for p in model.parameters())\n",
            message_contains="zero-fills",
        ),
        # the loop is a module's own zero_grad: `self.zero_grad(set_to_none=True)` would call it again
        Example(
            "import torch\n\n\nclass Meta(torch.nn.Module):\n    def zero_grad(self):\n"
            "        for p in self.parameters():\n            if p.grad is not None:\n                p.grad.data.zero_()\n",
            None,
            message_contains="the class's own zero_grad",
        ),
        Example(
            "from torch import nn\n\n\nclass Net(nn.Module):\n    def zero_grad(self, set_to_none=True):\n        pass\n\n"
            "    def reset(self):\n        for p in self.parameters():\n            p.grad.zero_()\n",
            None,
            message_contains="Net defines its own zero_grad",
        ),
        # a plain class with a parameters() method of its own has no zero_grad
        Example(
            "class Learner:\n    def parameters(self):\n        return self.model.parameters()\n\n"
            "    def clear(self):\n        for p in self.parameters():\n            p.grad.zero_()\n",
            None,
            message_contains="Learner derives from no nn.Module",
        ),
        # self of an nn.Module subclass: its zero_grad is nn.Module's
        Example(
            "from torch import nn\n\n\nclass Net(nn.Module):\n    def clear(self):\n        for p in self.parameters():\n"
            "            p.grad.zero_()\n",
            "from torch import nn\n\n\nclass Net(nn.Module):\n    def clear(self):\n        self.zero_grad(set_to_none=True)\n",
            message_contains="zero-fills",
        ),
        # two loops in a row over the same module: one zero_grad call, not two
        Example(
            "for p in model.parameters():\n"
            "    p.grad.zero_()\n"
            "for p in model.parameters():  # again\n"
            "    p.grad.zero_()\n"
            "loss.backward()\n",
            "# again\n"
            "model.zero_grad(set_to_none=True)\n"
            "loss.backward()\n",
            message_contains="zero-fills",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        reads = _GradReads(self, ctx)
        for call in ctx.nodes(cst.Call):
            if not h.is_method_call(call, "zero_grad"):
                continue
            arg = h.kwarg(call, "set_to_none")
            pos = h.positionals(call)
            if arg is None and len(pos) == 1:
                arg = pos[0]
            if arg is None or not h.is_literal(arg.value, False):
                continue
            message = "zero_grad(set_to_none=False) zero-fills every gradient each step; use set_to_none=True"
            if h.has_star(call) or len(call.args) != 1:
                yield self.report(call, message)
                continue
            read = reads.read_after(call)
            if read is not None:
                yield self.report(call, message + read)
                continue
            new = call.with_changes(args=[h.make_arg("set_to_none", "True").with_changes(comma=arg.comma)])
            yield self.replace(call, message, {call: new})

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
            owner = _simple_owner(ctx, loop)
            if owner is None:
                yield self.report(loop, message)
                continue
            not_module = _not_modules_zero_grad(ctx, loop, owner)
            if not_module is not None:
                yield self.report(loop, message + not_module)
                continue
            dups = reads.repeats(loop)
            read = reads.read_after(dups[-1] if dups else loop)
            if read is not None:
                yield self.report(loop, message + read)
                continue
            if reads.repeated(loop):
                yield self.report(loop, message + " (it repeats the loop just above, which the fix replaces by one zero_grad call)")
                continue
            # comments inside the loop (header, body) and in the repeats it absorbs move above the
            # new statement
            inner = [
                c for c in h.walk(loop) if isinstance(c, cst.Comment) and not any(c is e.comment for e in loop.leading_lines)
            ]
            for dup in dups:
                inner.extend(c for c in h.walk(dup) if isinstance(c, cst.Comment))
            inner.sort(key=lambda c: (ctx.pos(c).start.line, ctx.pos(c).start.column))
            kept = [cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace(""), comment=c) for c in inner]
            new = h.simple_stmt(f"{ctx.code(owner)}.zero_grad(set_to_none=True)\n").with_changes(
                leading_lines=[*loop.leading_lines, *kept]
            )
            changes: dict = {loop: new}
            for dup in dups:
                changes[dup] = cst.RemovalSentinel.REMOVE
            yield self.replace(loop, message, changes)


class _GradReads:
    """Where gradients are read after a zeroing site, before the next backward pass.

    Events are looked for in the scope (function, class body or module) of the site, in source
    order: reads of ``x.grad`` (stores like ``p.grad = None`` excepted), optimizer steps, calls of
    this file's functions that do either, and ``.backward(`` calls. A read after the site, before
    a backward that follows it, means the zeroed gradients are used: with ``set_to_none=True`` they
    would be ``None``. Inside a loop, the reads at the top of the loop body run after the site too
    (next iteration) unless a backward follows the site in that loop. Zeroing loops the fixer
    rewrites (unsuppressed, simple) are not reads: they become ``zero_grad`` calls too."""

    def __init__(self, fixer: Fixer, ctx: Context):
        self.fixer = fixer
        self.ctx = ctx
        self._events: dict[cst.CSTNode, list[tuple[int, str, cst.CSTNode]]] = {}
        self._simple: dict[cst.CSTNode, cst.BaseExpression | None] = {}
        self._readers: set[str] | None = None

    # -- simple, rewritable zeroing loops ------------------------------------------------------

    def owner(self, loop: cst.CSTNode) -> cst.BaseExpression | None:
        if loop not in self._simple:
            owner = _simple_owner(self.ctx, loop)
            if owner is not None and self.ctx.is_suppressed(loop, self.fixer.pattern, self.fixer.name):
                owner = None
            self._simple[loop] = owner
        return self._simple[loop]

    def _same_owner(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        oa, ob = self.owner(a), self.owner(b)
        return oa is not None and ob is not None and oa.deep_equals(ob)

    def repeats(self, loop: cst.For) -> list[cst.For]:
        """The zeroing loops over the same module right after ``loop`` in its block."""
        where = self.ctx.block_of(loop)
        if where is None or self.owner(loop) is None:
            return []
        block, i = where
        out: list[cst.For] = []
        for stmt in block.body[i + 1 :]:  # type: ignore[attr-defined]
            if not self._same_owner(loop, stmt):
                break
            out.append(stmt)
        return out

    def repeated(self, loop: cst.For) -> bool:
        """``loop`` repeats the zeroing loop right before it (that one's fix absorbs it)."""
        where = self.ctx.block_of(loop)
        if where is None or where[1] == 0:
            return False
        return self._same_owner(where[0].body[where[1] - 1], loop)  # type: ignore[attr-defined]

    def _in_simple_loop(self, node: cst.CSTNode) -> bool:
        return any(isinstance(a, cst.For) and self.owner(a) is not None for a in self.ctx.ancestors(node))

    # -- events ----------------------------------------------------------------------------------

    def _reads(self, node: cst.CSTNode) -> bool:
        ctx = self.ctx
        return (_is_grad_read(ctx, node) or _is_optimizer_step(node)) and not self._in_simple_loop(node)

    def _reader_functions(self) -> set[str]:
        """Names of this file's functions that read gradients (directly or through each other)."""
        if self._readers is None:
            defs = self.ctx.nodes(cst.FunctionDef)
            readers = {fn.name.value for fn in defs if any(self._reads(n) for n in h.walk(fn.body))}
            while True:
                more = {
                    fn.name.value
                    for fn in defs
                    if fn.name.value not in readers
                    and any(isinstance(n, cst.Call) and self._calls_reader(n, readers) for n in h.walk(fn.body))
                }
                if not more:
                    break
                readers |= more
            self._readers = readers
        return self._readers

    @staticmethod
    def _calls_reader(call: cst.Call, readers: set[str]) -> bool:
        name = h.last_name(call.func)
        if name is None or name not in readers:
            return False
        # `reader()` or `self.reader()` / `cls.reader()`, not `self.model.train()`: a method of
        # another object that only shares a name with one of this file's functions
        func = call.func
        return isinstance(func, cst.Name) or (
            isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in ("self", "cls")
        )

    def events(self, scope: cst.CSTNode) -> list[tuple[int, str, cst.CSTNode]]:
        if scope not in self._events:
            out = []
            for n in h.walk(scope, into_scopes=False):
                if _is_backward(n):
                    out.append((self.ctx.order(n), "backward", n))
                elif self._reads(n) or (isinstance(n, cst.Call) and self._calls_reader(n, self._reader_functions())):
                    out.append((self.ctx.order(n), "read", n))
            out.sort(key=lambda e: e[0])
            self._events[scope] = out
        return self._events[scope]

    def read_after(self, site: cst.CSTNode) -> str | None:
        """Why the gradients are read after ``site`` (a message suffix), else None."""
        ctx = self.ctx
        events = [e for e in self.events(ctx.enclosing_scope(site)) if not ctx.contains(site, e[2])]
        at = ctx.order(site)
        for _, kind, node in (e for e in events if e[0] > at):
            if kind == "backward":
                break
            return self._why(node)
        for loop in ctx.loops_around(site):
            inside = [e for e in events if ctx.contains(loop, e[2])]
            if any(kind == "backward" and order > at for order, kind, _ in inside):
                continue
            for order, kind, node in inside:
                if order > at or kind == "backward":
                    break
                return self._why(node)  # read at the top of the loop, next iteration
        return None

    def _why(self, node: cst.CSTNode) -> str:
        text = self.ctx.code(node)
        text = text if len(text) <= 40 else text[:37] + "..."
        line = self.ctx.pos(node).start.line
        return f" (report only: `{text}` at line {line} uses the gradients before the next backward; they would be None)"
