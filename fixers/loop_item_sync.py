"""loop-item-sync: host reads of device tensors (.item(), .cpu(), float(loss), print) in a loop."""

from __future__ import annotations

import re
from typing import Iterable

import libcst as cst

from zoomer_ar.fix import flow
from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer, iter_children

SYNC_METHODS = {"item", "cpu", "numpy", "tolist"}
LOG_CALL = re.compile(r"^(print|(\w+\.)*(logger|logging|log|LOGGER|_logger|logs?)\.(info|debug|warning|warn|error|log)|wandb\.log|(\w+\.)*(add_scalar|add_scalars|set_postfix|set_description|log_metrics))$")


def _is_loss_name(expr: cst.CSTNode | None) -> bool:
    name = h.last_name(expr)
    return name is not None and "loss" in name.lower()


def _tensorish(expr: cst.CSTNode) -> bool:
    """Statically a tensor for sure enough to call .detach() on it: a loss name/attribute, a
    loss/criterion call or a torch/F call, or arithmetic with one of those."""
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return _is_loss_name(expr)
    if isinstance(expr, cst.Call):
        d = h.dotted(expr.func) or ""
        last = d.split(".")[-1].lower()
        return "loss" in last or "criterion" in last or d.startswith(("F.", "torch.", "nn.functional."))
    if isinstance(expr, cst.BinaryOperation):
        return _tensorish(expr.left) or _tensorish(expr.right)
    return False


def _literal_key(sub: cst.Subscript) -> str | None:
    """KEY of ``d["KEY"]`` (one plain string index), else None."""
    if len(sub.slice) != 1 or not isinstance(sub.slice[0].slice, cst.Index):
        return None
    return h.string_value(sub.slice[0].slice.value)


def _dict_with_number(expr: cst.CSTNode, key: str) -> bool:
    """A dict literal with plain string keys (no ``**``) holding a number literal at ``key``."""
    if not isinstance(expr, cst.Dict):
        return False
    found = False
    for el in expr.elements:
        if not isinstance(el, cst.DictElement) or h.string_value(el.key) is None:
            return False
        if h.string_value(el.key) == key:
            found = type(h.literal(el.value)) in (int, float)
    return found


def _is_modulo_guard(test: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo) for n in h.walk(test))


#: methods of nn.Module iterating over its own parts: a loop over them is not a step loop
MODULE_PARTS = {"parameters", "named_parameters", "buffers", "named_buffers", "modules", "named_modules", "children", "named_children"}


def _over_parameters(loop: cst.For | cst.While) -> bool:
    """``for p in model.parameters()`` (and the other MODULE_PARTS, also through ``zip`` or
    ``enumerate``), ``for group in opt.param_groups``, ``for p in group["params"]``."""
    if not isinstance(loop, cst.For):
        return False
    for n in h.walk(loop.iter):
        if h.is_method_call(n, MODULE_PARTS):
            return True
        if isinstance(n, cst.Attribute) and n.attr.value == "param_groups":
            return True
        if isinstance(n, cst.Subscript) and _literal_key(n) == "params":
            return True
    return False


LOW_PRECISION = {"bfloat16", "float16", "half"}


def _low_precision(ctx: Context) -> bool:
    """The file puts tensors in half precision (`torch.bfloat16`/`float16`/`half` named anywhere,
    `.half()`, `.bfloat16()`): its losses may be half-precision tensors."""
    alias = ctx.torch_alias() or "torch"
    for attr in ctx.nodes(cst.Attribute):
        if attr.attr.value in LOW_PRECISION and h.dotted(attr.value) in (alias, "torch"):
            return True
    return any(h.is_method_call(c, m) and not c.args for c in ctx.nodes(cst.Call) for m in ("half", "bfloat16"))


def _detached(ctx: Context, item: cst.Call) -> cst.BaseExpression:
    """``t.item()`` as ``t.detach()``; ``t.detach().float()`` where the file uses half precision: a
    bfloat16 sum of thousands of steps would lose the digits `.item()`'s Python floats keep
    (``.float()`` of a float32 tensor returns it as it is)."""
    detached = item.with_changes(func=item.func.with_changes(attr=cst.Name("detach")))  # type: ignore[union-attr]
    if not _low_precision(ctx):
        return detached
    return cst.Call(func=cst.Attribute(value=detached.with_changes(lpar=[], rpar=[]), attr=cst.Name("float")),
                    lpar=item.lpar, rpar=item.rpar)


class LoopItemSync(Fixer):
    pattern = "sync-point"
    name = "loop-item-sync"
    summary = "loss.item() / .cpu() / .numpy() / float(loss) / print(loss) every iteration: accumulate on device, log every N steps"
    explanation = """\
## What it does
Flags host reads of device tensors inside `for`/`while` loop bodies: `.item()`, `.cpu()`,
`.numpy()`, `.tolist()`, `.to("cpu")`, and `float(...)`/`int(...)`/`print(...)` of a loss
variable. Only the innermost loop counts (a read once per epoch, after the step loop, is fine;
a loop over `model.parameters()`, `.named_parameters()`, `.modules()`, an optimizer's
`param_groups` or a group's `["params"]`, as in a manual update, is part of the step and does not
count) and reads under an `if step % N == 0:`-style guard are not flagged. Two forms are
rewritten, conservatively:

* `total += loss.item()` (also `total += loss.item() * n`) becomes `total += loss.detach()`
  when `total` is initialised to a number literal in the block holding the loop, is not used
  elsewhere in the loop, and is only read after it; those reads become `float(total)`.
* `stats["loss"] += loss.item()` (a dict entry with a literal key) becomes
  `stats["loss"] += loss.detach()` when the dict is created in this file as a dict literal with a
  number at that key, either before the loop in the same function or in the functions that call
  the function holding the loop (`train_step(..., stats)` from `main`, followed through plain
  arguments of module-level functions), and the entry is only read after those loops; the reads
  become `float(stats["loss"])`. Any other use of the dict (passed elsewhere, iterated,
  printed whole, read inside the loop) leaves the finding report-only.
* a `print(...)`/`logger.info(...)`/`writer.add_scalar(...)`/`wandb.log(...)` statement directly
  in a loop with an index (`for i, b in enumerate(...)`, `for step in range(...)`) is wrapped in
  `if i % 100 == 0:` (option `log_every`). Logs and metric trackers (`add_scalar`,
  `wandb.log`, `log_metrics`, `set_postfix`) count as logging: a sampled curve is the usual
  practice. Reported instead, not wrapped: a loop whose trip count is a literal `range(...)` (or
  `enumerate` of one) of at most `log_every` steps (only its first line would remain), a loop
  whose variable or iterable reads like epochs (`for epoch in range(...)`, `range(num_epochs)`:
  per-epoch logs are the ones to keep), and statements that write data rather than log:
  `print(..., file=f)` to anything but `sys.stdout`/`sys.stderr`. Other data writes
  (`f.write(...)`, `csv_writer.writerow(...)`, `json.dump(...)`, `losses.append(loss.item())`) are
  never wrapped; their `.item()` is reported.

Everything else is reported, not changed.

## Why is this bad?
Reading a tensor's value on the host waits for every kernel queued before it: the CPU stops
launching work, the GPU drains and idles until the next kernels arrive (`sync-point` in the
trace: `aten::item`/`aten::_local_scalar_dense` followed by `cudaStreamSynchronize` or
`Memcpy DtoH` every step). Summing on the device and reading once after the loop, or every N
steps, keeps the CPU ahead of the GPU.

## Caveats
The accumulated value is summed in the loss's dtype on the device (usually float32) instead of
in Python floats (float64); in a file that uses half precision (`torch.bfloat16`, `torch.float16`,
`.half()`, `.bfloat16()`) the loss is converted first, `total += loss.detach().float()`, so
that the sum is float32, not bfloat16. Logging every N steps logs less often; that is the point.

## Example
```python
running = 0.0
for x, y in loader:
    loss = step(x, y)
    running += loss.item()
print(running / len(loader))
```
Use instead:
```python
running = 0.0
for x, y in loader:
    loss = step(x, y)
    running += loss.detach()
print(float(running) / len(loader))
```
"""
    OPTIONS = {"log_every": (100, "log every N steps when guarding per-step logging")}

    VALID = [
        "total = loss.item()\n",
        "for i, (x, y) in enumerate(loader):\n    loss = step(x, y)\n    if i % 50 == 0:\n        print(loss.item())\n",
        "for x in loader:\n    loss = step(x)\n    print(loss.item())  # zoomer: ignore[sync-point]\n",
        "for x in loader:\n    def log():\n        return loss.item()\n",
        "for x in loader:\n    d = results.items()\n",
        "for batch in loader:\n    out = model(batch)\n",
        # once per epoch, after the step loop
        "for epoch in range(epochs):\n    for x in loader:\n        loss = step(x)\n    print(loss.item())\n",
        # a parameter loop beside it does not make the step loop an inner loop
        "for epoch in range(epochs):\n    for p in model.parameters():\n        p.requires_grad_(epoch > 0)\n"
        "    for x in loader:\n        loss = step(x)\n    print(loss.item())\n",
    ]
    INVALID = [
        Example(
            "running = 0.0\n"
            "for x, y in loader:\n"
            "    loss = step(x, y)\n"
            "    running += loss.item()\n"
            "print(running / len(loader))\n",
            "running = 0.0\n"
            "for x, y in loader:\n"
            "    loss = step(x, y)\n"
            "    running += loss.detach()\n"
            "print(float(running) / len(loader))\n",
            message_contains="accumulate on the device",
        ),
        Example(
            "def train(model, loader, epochs):\n"
            "    for epoch in range(epochs):\n"
            "        total_loss = 0\n"
            "        for batch in loader:\n"
            "            total_loss += criterion(model(batch), batch).item() * len(batch)  # sum\n"
            "        log.info(f'epoch {epoch}: {total_loss:.4f}')\n",
            "def train(model, loader, epochs):\n"
            "    for epoch in range(epochs):\n"
            "        total_loss = 0\n"
            "        for batch in loader:\n"
            "            total_loss += criterion(model(batch), batch).detach() * len(batch)  # sum\n"
            "        log.info(f'epoch {epoch}: {float(total_loss):.4f}')\n",
            message_contains=".item()",
        ),
        Example(
            "for i, (x, y) in enumerate(loader):\n"
            "    loss = step(x, y)\n"
            "    # progress\n"
            "    print(f'step {i} loss {loss.item():.3f}')  # noisy\n",
            "for i, (x, y) in enumerate(loader):\n"
            "    loss = step(x, y)\n"
            "    # progress\n"
            "    if i % 100 == 0:\n"
            "        print(f'step {i} loss {loss.item():.3f}')  # noisy\n",
            message_contains="every step",
        ),
        Example(
            "for step in range(num_steps):\n    loss = train_step()\n    writer.add_scalar('loss', loss, step)\n    logger.info('loss %s', float(loss))\n",
            "for step in range(num_steps):\n    loss = train_step()\n    writer.add_scalar('loss', loss, step)\n    if step % 10 == 0:\n        logger.info('loss %s', float(loss))\n",
            message_contains="float(loss)",
            options={"log_every": 10},
        ),
        Example(
            "def evaluate(model, loader):\n"
            "    total = 0.0\n"
            "    for batch in loader:\n"
            "        outputs = model(**batch)\n"
            "        total += outputs.loss.item()\n"
            "    return total / len(loader)\n",
            "def evaluate(model, loader):\n"
            "    total = 0.0\n"
            "    for batch in loader:\n"
            "        outputs = model(**batch)\n"
            "        total += outputs.loss.detach()\n"
            "    return float(total) / len(loader)\n",
            message_contains="accumulate",
        ),
        Example(
            "def train_step(model, opt, batch, stats):\n"
            "    for mb in batch.chunk(4):\n"
            "        loss = model(mb).mean()\n"
            "        loss.backward()\n"
            "        stats[\"loss\"] += loss.item()\n"
            "    opt.step()\n"
            "\n"
            "def main(model, opt, data):\n"
            "    stats = {\"loss\": 0.0, \"steps\": 0}\n"
            "    for batch in data:\n"
            "        train_step(model, opt, batch, stats)\n"
            "        stats[\"steps\"] += 1\n"
            "    print(f\"mean loss {stats['loss'] / stats['steps']:.4f}\")\n",
            "def train_step(model, opt, batch, stats):\n"
            "    for mb in batch.chunk(4):\n"
            "        loss = model(mb).mean()\n"
            "        loss.backward()\n"
            "        stats[\"loss\"] += loss.detach()\n"
            "    opt.step()\n"
            "\n"
            "def main(model, opt, data):\n"
            "    stats = {\"loss\": 0.0, \"steps\": 0}\n"
            "    for batch in data:\n"
            "        train_step(model, opt, batch, stats)\n"
            "        stats[\"steps\"] += 1\n"
            "    print(f\"mean loss {float(stats['loss']) / stats['steps']:.4f}\")\n",
            message_contains="accumulate on the device",
        ),
        Example(
            "metrics = {'loss': 0}\nfor x in loader:\n    metrics['loss'] += loss_fn(x).item()\nreport(metrics['loss'])\n",
            "metrics = {'loss': 0}\nfor x in loader:\n    metrics['loss'] += loss_fn(x).detach()\nreport(float(metrics['loss']))\n",
            message_contains=".item()",
        ),
        # the dict is handed to code we cannot see (json.dump would get a tensor): report only
        Example(
            "import json\nstats = {'loss': 0.0}\nfor x in loader:\n    stats['loss'] += loss_fn(x).item()\njson.dump(stats, fh)\n",
            None,
            message_contains=".item()",
        ),
        # the accumulator escapes into a closure: report only
        Example(
            "def run(loader):\n    total = 0\n    for b in loader:\n        total += loss_fn(b).item()\n    return lambda: total\n",
            None,
            message_contains=".item()",
        ),
        # not recognisably a tensor (could be a NumPy scalar): report only
        Example("hits = 0\nfor b in loader:\n    hits += acc.item()\nprint(hits)\n", None, message_contains="acc.item()"),
        # read inside the loop: cannot accumulate on device safely
        Example(
            "total = 0.0\nfor x in loader:\n    total += loss_fn(x).item()\n    if total > 10:\n        break\n",
            None,
            message_contains=".item()",
        ),
        Example("preds = []\nwhile running:\n    preds.append(model(x).argmax(1).cpu().numpy())\n", None, message_contains=".cpu()"),
        Example("for x in loader:\n    print(loss.item())\n", None, message_contains="no step index"),
        # a manual SGD update loops over the parameters inside the step loop: still every step
        Example(
            "def train(loader, model, lr):\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        loss = model(x, y)\n"
            "        loss.backward()\n"
            "        print(step, loss.item())\n"
            "        for p in model.parameters():\n"
            "            p.data.add_(p.grad, alpha=-lr)\n",
            "def train(loader, model, lr):\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        loss = model(x, y)\n"
            "        loss.backward()\n"
            "        if step % 100 == 0:\n"
            "            print(step, loss.item())\n"
            "        for p in model.parameters():\n"
            "            p.data.add_(p.grad, alpha=-lr)\n",
            message_contains="logged every step",
        ),
        Example(
            "for x in loader:\n"
            "    loss = step(x)\n"
            "    for group in opt.param_groups:\n"
            "        for p in group['params']:\n"
            "            p.grad.clamp_(-1, 1)\n"
            "    history.append(loss.item())\n",
            None,
            message_contains="loss.item()",
        ),
        # a literal trip count below log_every: the guard would keep epoch 0 only
        Example(
            "for i in range(10):\n    loss = train_one_epoch(model)\n    logger.info('%d loss %.3f', i, loss.item())\n",
            None,
            message_contains="runs 10 times",
        ),
        # per-epoch logs are kept, whatever the trip count
        Example(
            "for epoch in range(num_epochs):\n    loss = train_one_epoch(model)\n    logger.info('epoch %d loss %.3f', epoch, loss.item())\n",
            None,
            message_contains="once per epoch",
        ),
        # a record written to a file is data, not a log
        Example(
            "for step in range(1000):\n    loss = train_step()\n    print(loss.item(), file=open('losses.txt', 'a'))\n",
            None,
            message_contains="writes a record",
        ),
        Example(
            "for step in range(1000):\n    loss = train_step()\n    losses.append(loss.item())\n",
            None,
            message_contains=".item()",
        ),
        Example(
            "for step in range(1000):\n    loss = train_step()\n    fh.write(f'{loss.item()}\\n')\n",
            None,
            message_contains=".item()",
        ),
        # a bfloat16 model: the sum is kept in float32
        Example(
            "import torch\nmodel = model.to(dtype=torch.bfloat16)\nrunning = 0.0\nfor x in loader:\n"
            "    loss = model(x).sum()\n    running += loss.item()\nprint(running)\n",
            "import torch\nmodel = model.to(dtype=torch.bfloat16)\nrunning = 0.0\nfor x in loader:\n"
            "    loss = model(x).sum()\n    running += loss.detach().float()\nprint(float(running))\n",
            message_contains="accumulate on the device",
        ),
        # accumulator read before the loop in the same block (stale across epochs): report only
        Example(
            "for epoch in range(3):\n    print(total)\n    total = 0.0\n    for x in loader:\n        total += loss.item()\n",
            None,
            message_contains=".item()",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        for node in ctx.nodes(cst.Call):
            site = self._site(ctx, node)
            if site is None:
                continue
            loops = ctx.loops_around(node)
            if not loops or self._guarded(ctx, node, loops[0]) or self._has_inner_loop(loops[0]):
                continue  # not in a loop, logged every N steps, or once per outer (epoch) iteration
            text = ctx.code(node)
            text = text if len(text) <= 40 else text[:37] + "..."
            base = f"`{text}` inside the loop waits for the GPU and copies to the host every iteration"
            if site == "item":
                changes = self._accumulate(ctx, node, loops[0])
                if changes:
                    yield self.replace(node, base + "; accumulate on the device with .detach() and read it once after the loop", changes)
                    continue
            guard = self._guard_logging(ctx, node, loops[0])
            if isinstance(guard, str):
                yield self.report(node, base + guard)
                continue
            if guard is not None:
                changes, stmt = guard
                yield self.replace(node, base + f"; it is logged every step: log every {self.options['log_every']} steps", changes)
                continue
            if guard is None and self._log_stmt(ctx, node) is not None and self._index(loops[0]) is None:
                yield self.report(node, base + " (logged every step; no step index to log every N steps)")
                continue
            yield self.report(node, base)

    # -- sites -----------------------------------------------------------------------------------

    def _site(self, ctx: Context, call: cst.Call) -> str | None:
        m = h.method(call)
        if m is not None:
            receiver, name = m
            if name == "item" and not call.args:
                return "item"
            if name in ("cpu", "numpy", "tolist"):
                if name != "cpu" and any(h.is_method_call(n, ("cpu", "item")) for n in h.walk(receiver)):
                    return None  # reported at the .cpu()
                return name
            if name == "to" and len(call.args) == 1 and h.string_value(call.args[0].value) == "cpu":
                return "cpu"
            return None
        if isinstance(call.func, cst.Name) and call.func.value in ("float", "int", "print") and ctx.qualnames(call.func) == {f"builtins.{call.func.value}"}:
            if any(_is_loss_name(a.value) for a in call.args if not a.star):
                return call.func.value
        return None

    @staticmethod
    def _has_inner_loop(loop: cst.CSTNode) -> bool:
        """Whether ``loop``'s body holds a loop of its own (a read beside it then runs once per
        outer, epoch, iteration), not counting loops over a model's parameters, buffers or modules
        or an optimizer's parameter groups: a manual update ``for p in model.parameters(): ...``
        is part of the step, not a step loop."""
        body = getattr(loop, "body", None)
        stack: list[cst.CSTNode] = [body] if body is not None else []
        while stack:
            cur = stack.pop()
            if isinstance(cur, (cst.For, cst.While)):
                if not _over_parameters(cur):
                    return True
                continue  # nor anything nested in it
            if isinstance(cur, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                continue
            stack.extend(iter_children(cur))
        return False

    @staticmethod
    def _guarded(ctx: Context, node: cst.CSTNode, loop: cst.CSTNode) -> bool:
        child = node
        for anc in ctx.ancestors(node):
            if anc is loop:
                return False
            if isinstance(anc, cst.If) and child is not anc.test and _is_modulo_guard(anc.test):
                return True
            if isinstance(anc, cst.IfExp) and child is not anc.test and _is_modulo_guard(anc.test):
                return True
            child = anc
        return False

    # -- accumulate on the device ------------------------------------------------------------------

    def _accumulate(self, ctx: Context, item: cst.Call, loop: cst.For | cst.While) -> dict | None:
        value = item
        parent = ctx.parent(item)
        if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, (cst.Multiply, cst.Divide)):
            other = parent.right if parent.left is item else parent.left
            if any(h.is_method_call(n, SYNC_METHODS) for n in h.walk(other)):
                return None
            value, parent = parent, ctx.parent(parent)
        if not (isinstance(parent, cst.AugAssign) and parent.value is value and isinstance(parent.operator, cst.AddAssign)):
            return None
        aug = parent
        if not _tensorish(item.func.value):  # type: ignore[union-attr]
            return None
        if isinstance(aug.target, cst.Subscript):
            return self._accumulate_in_dict(ctx, item, aug, loop)
        if not isinstance(aug.target, cst.Name):
            return None
        total = aug.target.value
        where = ctx.block_of(loop)
        if where is None:
            return None
        block, k = where
        scope = ctx.enclosing_scope(loop)
        init = False
        reads: list[cst.Name] = []
        for name in h.walk(scope):
            if not isinstance(name, cst.Name) or name.value != total or name is aug.target:
                continue
            if ctx.enclosing_scope(name) is not scope:
                return None
            stmt_index = self._index_in(ctx, block, name)
            if stmt_index is None:
                return None
            if stmt_index < k:
                stmt = block.body[stmt_index]
                if not (
                    isinstance(stmt, cst.SimpleStatementLine)
                    and len(stmt.body) == 1
                    and isinstance(stmt.body[0], cst.Assign)
                    and len(stmt.body[0].targets) == 1
                    and stmt.body[0].targets[0].target is name
                    and type(h.literal(stmt.body[0].value)) in (int, float)
                ):
                    return None
                init = True
            elif stmt_index == k:
                return None  # used elsewhere in the loop
            else:
                p = ctx.parent(name)
                if isinstance(p, (cst.AssignTarget, cst.AugAssign, cst.For, cst.CompFor, cst.Del, cst.NameItem, cst.AsName, cst.Param)):
                    return None
                if isinstance(p, cst.FormattedStringExpression) and p.equal is not None:
                    return None
                if isinstance(p, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)) and self._is_store(ctx, name):
                    return None
                reads.append(name)
        if not init:
            return None
        changes: dict = {item: _detached(ctx, item)}
        for r in reads:
            p = ctx.parent(r)
            arg_of = ctx.parent(p) if isinstance(p, cst.Arg) else None
            if isinstance(arg_of, cst.Call) and h.dotted(arg_of.func) == "float" and len(arg_of.args) == 1:
                continue
            changes[r] = cst.Call(func=cst.Name("float"), args=[cst.Arg(r.with_changes(lpar=[], rpar=[]))], lpar=r.lpar, rpar=r.rpar)
        return changes

    # -- accumulate into a dict entry: stats["loss"] += loss.item() ------------------------------

    def _accumulate_in_dict(self, ctx: Context, item: cst.Call, aug: cst.AugAssign, loop: cst.For | cst.While) -> dict | None:
        """``d[KEY] += t.item()`` where ``d`` is a dict created in this file with a number at
        ``KEY`` (``stats = {"loss": 0.0}``), either in the function running the loop or in the
        functions calling it (``train_step(..., stats)`` from ``main``), and ``d[KEY]`` is only
        read after those loops: accumulate ``t.detach()`` and read ``float(d[KEY])``."""
        target = aug.target
        key = _literal_key(target)  # type: ignore[arg-type]
        if key is None or not isinstance(target.value, cst.Name):  # type: ignore[union-attr]
            return None
        name = target.value.value  # type: ignore[union-attr]
        scope = ctx.enclosing_scope(loop)
        reads: list[cst.Subscript] = []
        if isinstance(scope, cst.FunctionDef) and flow.is_param(scope, name):
            if not self._dict_uses_ok(ctx, scope, name, key, aug, None, None, reads):
                return None
            calls = flow.call_sites(ctx, scope)
            if not calls:
                return None
            for call in calls:
                arg = flow.bound_argument(call, scope, name)
                caller = ctx.enclosing_scope(call)
                if not isinstance(arg, cst.Name) or isinstance(caller, (cst.ClassDef, cst.Lambda)):
                    return None
                if isinstance(caller, cst.FunctionDef) and flow.is_param(caller, arg.value):
                    return None
                if not self._dict_uses_ok(ctx, caller, arg.value, key, None, scope, call, reads):
                    return None
        elif not isinstance(scope, (cst.ClassDef, cst.Lambda)):
            if not self._dict_uses_ok(ctx, scope, name, key, aug, None, loop, reads):
                return None
        else:
            return None
        changes: dict = {item: _detached(ctx, item)}
        for r in reads:
            p = ctx.parent(r)
            arg_of = ctx.parent(p) if isinstance(p, cst.Arg) else None
            if isinstance(arg_of, cst.Call) and h.dotted(arg_of.func) == "float" and len(arg_of.args) == 1:
                continue
            changes[r] = cst.Call(func=cst.Name("float"), args=[cst.Arg(r.with_changes(lpar=[], rpar=[]))], lpar=r.lpar, rpar=r.rpar)
        return changes

    def _dict_uses_ok(
        self,
        ctx: Context,
        scope: cst.CSTNode,
        name: str,
        key: str,
        site: cst.AugAssign | None,
        callee: cst.FunctionDef | None,
        loop: cst.CSTNode | None,
        reads: list,
    ) -> bool:
        """Every use of the dict ``name`` in ``scope`` is safe: its creation as a dict literal with
        a number at ``key`` (once, in the caller), other literal keys (any use), the accumulation
        ``site``, resets ``name[key] = <number>``, passing it to ``callee`` (the function holding
        the loop) and reads of ``name[key]`` outside the loops that accumulate (collected in
        ``reads``: they get ``float(...)``)."""
        if flow.used_in_nested_scopes(ctx, scope, name) or flow.declared_nonlocal(scope, name):
            return False
        created = 0
        for n in flow.names_in(ctx, scope, name):
            p = ctx.parent(n)
            if flow.is_store(ctx, n):
                assign = ctx.parent(p) if isinstance(p, cst.AssignTarget) else None
                if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and _dict_with_number(assign.value, key)):
                    return False
                created += 1
                continue
            if isinstance(p, cst.Subscript) and p.value is n:
                k = _literal_key(p)
                if k is None:
                    return False
                if k != key:
                    continue
                if site is not None and p is site.target:
                    continue
                holder = ctx.parent(p)
                if isinstance(holder, cst.AssignTarget):
                    assign = ctx.parent(holder)
                    if isinstance(assign, cst.Assign) and type(h.literal(assign.value)) in (int, float):
                        continue
                    return False
                if isinstance(holder, (cst.AugAssign, cst.Del)) or flow.is_store(ctx, n):
                    return False
                if isinstance(holder, cst.FormattedStringExpression) and holder.equal is not None:
                    return False
                if callee is None and loop is None:
                    return False  # a read inside the function that accumulates (it runs every step)
                if loop is not None and ctx.contains(loop, p):
                    return False  # read inside the accumulating loop
                if callee is not None and any(self._calls(ctx, outer, callee) for outer in ctx.loops_around(p)):
                    return False  # read inside the loop that calls the accumulating function
                reads.append(p)
                continue
            if callee is not None and isinstance(p, cst.Arg) and p.value is n and not p.star:
                call = ctx.parent(p)
                if isinstance(call, cst.Call) and flow.called_function(ctx, call) is callee and flow.arg_param(ctx, call, callee, n) is not None:
                    continue
            return False
        if callee is not None:
            return created == 1
        if site is not None and loop is not None:
            return created >= 1 and self._created_before(ctx, scope, name, loop)
        return True

    @staticmethod
    def _calls(ctx: Context, node: cst.CSTNode, fn: cst.FunctionDef) -> bool:
        return any(flow.called_function(ctx, c) is fn for c in flow.iter_calls(node))

    @staticmethod
    def _created_before(ctx: Context, scope: cst.CSTNode, name: str, loop: cst.CSTNode) -> bool:
        for n in flow.names_in(ctx, scope, name):
            if flow.is_store(ctx, n):
                return ctx.order(n) < ctx.order(loop) and not ctx.contains(loop, n)
        return False

    @staticmethod
    def _index_in(ctx: Context, block: cst.CSTNode, node: cst.CSTNode) -> int | None:
        """Index of the statement of ``block`` that contains ``node``, else None."""
        for anc in (node, *ctx.ancestors(node)):
            parent = ctx.parent(anc)
            if parent is block:
                for i, s in enumerate(block.body):  # type: ignore[attr-defined]
                    if s is anc:
                        return i
                return None
        return None

    @staticmethod
    def _is_store(ctx: Context, node: cst.CSTNode) -> bool:
        for anc in ctx.ancestors(node):
            if isinstance(anc, (cst.AssignTarget, cst.For, cst.CompFor, cst.With, cst.WithItem)):
                return True
            if isinstance(anc, cst.BaseSmallStatement):
                return False
        return False

    # -- log every N steps ---------------------------------------------------------------------

    @staticmethod
    def _log_stmt(ctx: Context, node: cst.CSTNode) -> cst.SimpleStatementLine | None:
        """The `print(...)`/logging statement holding ``node``, if that is all the statement is."""
        stmt = ctx.statement(node)
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
            return None
        call = stmt.body[0].value
        if not isinstance(call, cst.Call) or not LOG_CALL.match(h.dotted(call.func) or ""):
            return None
        if isinstance(call.func, cst.Name) and ctx.qualnames(call.func) != {"builtins.print"}:
            return None
        return stmt

    @staticmethod
    def _index(loop: cst.CSTNode) -> str | None:
        if not isinstance(loop, cst.For):
            return None
        target, it = loop.target, loop.iter
        name = None
        if isinstance(it, cst.Call) and h.dotted(it.func) == "enumerate" and isinstance(target, (cst.Tuple, cst.List)) and target.elements:
            first = target.elements[0].value
            name = first.value if isinstance(first, cst.Name) else None
        elif isinstance(it, cst.Call) and h.dotted(it.func) == "range" and isinstance(target, cst.Name):
            name = target.value
        return None if name in (None, "_") else name

    @staticmethod
    def _trip_count(loop: cst.For) -> int | None:
        """How many times ``for ... in range(<literals>)`` (also through ``enumerate(...)``, or
        ``enumerate`` of a list/tuple literal) runs, else None."""
        it = loop.iter
        if isinstance(it, cst.Call) and h.dotted(it.func) == "enumerate" and it.args and not it.args[0].star and it.args[0].keyword is None:
            it = it.args[0].value
            if isinstance(it, (cst.List, cst.Tuple)) and not any(isinstance(e, cst.StarredElement) for e in it.elements):
                return len(it.elements)
        if not (isinstance(it, cst.Call) and h.dotted(it.func) == "range") or h.has_star(it) or any(a.keyword for a in it.args):
            return None
        values = [h.literal(a.value) for a in it.args]
        if not 1 <= len(values) <= 3 or any(type(v) is not int for v in values):
            return None
        try:
            return len(range(*values))
        except ValueError:  # range(0, 10, 0)
            return None

    @staticmethod
    def _writes_data(call: cst.Call) -> bool:
        """``print(..., file=f)`` to anything but ``sys.stdout``/``sys.stderr``: a record, not a log."""
        if not (isinstance(call.func, cst.Name) and call.func.value == "print"):
            return False
        out = h.kwarg(call, "file")
        if out is None:
            return h.has_star(call) and any(a.star == "**" for a in call.args)  # file= may hide in **kwargs
        target = h.dotted(out.value) or ""
        return target not in ("sys.stdout", "sys.stderr", "None") and not h.is_literal(out.value, None)

    def _guard_logging(self, ctx: Context, node: cst.CSTNode, loop: cst.For | cst.While) -> tuple[dict, cst.CSTNode] | str | None:
        """The changes that log every N steps, a reason (message suffix) not to, or None."""
        stmt = self._log_stmt(ctx, node)
        if stmt is None or ctx.parent(stmt) is not getattr(loop, "body", None):
            return None
        index = self._index(loop)
        if index is None:
            return None
        for n in h.walk(loop.body, into_scopes=False):  # the index must not be rebound in the body
            if isinstance(n, (cst.AssignTarget, cst.AugAssign)) and index in h.target_names(getattr(n, "target", n)):
                return None
        every = max(1, int(self.options["log_every"]))
        call = stmt.body[0].value  # type: ignore[attr-defined]
        if self._writes_data(call):
            return " (it writes a record to a file, not a log line: every step is kept; not changed)"
        if not isinstance(loop, cst.For):  # _index only names for-loop indices
            return None
        if "epoch" in (ctx.code(loop.target) + " " + ctx.code(loop.iter)).lower():
            return " (it runs once per epoch: logging every N epochs would drop epoch logs; not changed)"
        trips = self._trip_count(loop)
        if trips is not None and trips <= every:
            return f" (the loop runs {trips} times: logging every {every} steps would keep only the first line; not changed)"
        guarded = cst.If(
            test=cst.parse_expression(f"{index} % {every} == 0"),
            body=cst.IndentedBlock(body=[stmt.with_changes(leading_lines=[])]),
            leading_lines=stmt.leading_lines,
        )
        return {stmt: guarded}, stmt
