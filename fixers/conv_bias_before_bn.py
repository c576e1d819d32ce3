"""conv-bias-before-bn: a convolution (or transposed convolution) bias that the following BatchNorm cancels."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import flow
from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

# ConvNd and ConvTransposeNd both add one bias per output channel, which a BatchNorm over those
# channels cancels, and both take `bias` as their eighth positional argument (right after groups).
CONV_KINDS = ("Conv", "ConvTranspose")
CONV = {f"torch.nn.{m}{k}{d}d": d for d in (1, 2, 3) for m in ("", "modules.conv.") for k in CONV_KINDS}
CONV_BARE = {f"{p}{k}{d}d": d for d in (1, 2, 3) for p in ("nn.", "torch.nn.") for k in CONV_KINDS}
BN = {f"torch.nn.{m}BatchNorm{d}d": d for d in (1, 2, 3) for m in ("", "modules.batchnorm.")}
BN |= {"torch.nn.SyncBatchNorm": 0, "torch.nn.modules.batchnorm.SyncBatchNorm": 0}
BN_BARE = {f"{p}BatchNorm{d}d": d for d in (1, 2, 3) for p in ("nn.", "torch.nn.")} | {"nn.SyncBatchNorm": 0, "torch.nn.SyncBatchNorm": 0}
SEQUENTIAL = {"torch.nn.Sequential", "torch.nn.modules.container.Sequential"}


def _kind(ctx: Context, node: cst.CSTNode | None, full: dict[str, int], bare: dict[str, int]) -> int | None:
    if not isinstance(node, cst.Call):
        return None
    target = node.func
    if ctx.is_bound(target):
        for q in ctx.qualnames(target):
            if q in full:
                return full[q]
        return None
    return bare.get(h.dotted(target) or "")


def _compatible(conv: int | None, bn: int | None) -> bool:
    return conv is not None and bn is not None and (bn == 0 or bn == conv)


def _strict_load(ctx: Context) -> int | None:
    """Line of a ``.load_state_dict(...)`` call that does not pass ``strict=False``, if any: a model's
    (strict by default: a checkpoint saved with the bias has keys the model no longer has) or an
    optimizer's (its parameter groups would count one parameter fewer). Either raises on a
    checkpoint saved before the fix."""
    for call in ctx.nodes(cst.Call):
        if not h.is_method_call(call, "load_state_dict"):
            continue
        strict = h.arg_at(call, "strict", 1)
        if strict is None or not h.is_literal(strict.value, False):
            return ctx.pos(call).start.line
    return None


def _self_attr(node: cst.CSTNode | None) -> str | None:
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return node.attr.value
    return None


class ConvBiasBeforeBn(Fixer):
    pattern = "conv-bias-before-bn"
    name = "conv-bias-before-bn"
    summary = "nn.ConvNd / nn.ConvTransposeNd with a bias followed by BatchNorm: the bias is cancelled, use bias=False"
    explanation = """\
## What it does
Sets `bias=False` on `nn.Conv1d/2d/3d(...)` or `nn.ConvTranspose1d/2d/3d(...)` (bias left at
its default `True` or `True` explicitly) whose output goes straight into a `BatchNorm` of the
same dimension (or `SyncBatchNorm`):

* adjacent arguments of one `nn.Sequential(...)`, or
* `self.convX = nn.Conv2d(...)` and `self.bnX = nn.BatchNorm2d(...)` assigned in `__init__`
  when every call of `self.convX` in the class feeds `self.bnX` directly: `self.bnX(self.convX(x))`
  or `x = self.convX(x)` immediately followed by `x = self.bnX(x)`, the name read by nothing but
  the BatchNorm before it is bound again.

A conv output that also goes elsewhere (a residual `y = self.convX(x)`, `z = self.bnX(y)`,
`return z + y`) still sees the bias there: that finding is reported, not fixed.

If the file reads a `.bias` attribute without an `is not None` guard (e.g. an init loop doing
`nn.init.zeros_(m.bias)`), the finding is reported, not fixed. So is one in a file that loads a
state dict (`model.load_state_dict(...)` without `strict=False`, `optimizer.load_state_dict(...)`:
resuming, pretrained weights): a checkpoint saved before the fix holds the bias, and loading it
would raise (unexpected `.bias` keys; a parameter group of another size).

## Why is this bad?
BatchNorm subtracts the per-channel mean, so a per-channel bias added just before it has no
effect on the output: it costs an extra elementwise kernel (or epilogue) in the forward pass,
its gradient in the backward pass and a parameter in the optimizer.

## Caveats
Checkpoints saved with the bias have a `convX.bias` key that a strict `load_state_dict` will
reject, and an optimizer state with one parameter more per conv; a file that loads them is
reported (see above), but one that only saves them cannot tell the program that will load them:
load with `strict=False` or drop the key there.

## Example
```python
block = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())
```
Use instead:
```python
block = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
```
"""

    VALID = [
        "import torch.nn as nn\nblock = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8))\n",
        "import torch.nn as nn\nblock = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.BatchNorm2d(8))\n",
        "import torch.nn as nn\nblock = nn.Sequential(nn.Conv1d(3, 8, 3), nn.BatchNorm2d(8))\n",
        "import torch.nn as nn\n"
        "class B(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.conv = nn.Conv2d(3, 8, 3)\n"
        "        self.bn = nn.BatchNorm2d(8)\n"
        "    def forward(self, x):\n"
        "        return self.bn(self.conv(x)) + self.conv(x)\n",
        "import torch.nn as nn\nblock = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))  # zoomer: ignore\n",
        "import torch.nn as nn\nup = nn.Sequential(nn.ConvTranspose2d(8, 4, 4, 2, 1, bias=False), nn.BatchNorm2d(4))\n",
        "import torch.nn as nn\nup = nn.Sequential(nn.ConvTranspose2d(8, 4, 4, 2, 1), nn.BatchNorm1d(4))\n",
    ]
    INVALID = [
        Example(
            "import torch.nn as nn\nblock = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())\n",
            "import torch.nn as nn\nblock = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU())\n",
            message_contains="BatchNorm2d",
        ),
        Example(
            "from torch import nn\n"
            "\n"
            "class Block(nn.Module):\n"
            "    def __init__(self, c):\n"
            "        super().__init__()\n"
            "        self.conv1 = nn.Conv2d(c, c, 3, bias=True)\n"
            "        self.bn1 = nn.BatchNorm2d(c)\n"
            "        self.conv2 = nn.Conv2d(c, c, 1)\n"
            "        self.bn2 = nn.SyncBatchNorm(c)\n"
            "        nn.init.kaiming_normal_(self.conv1.weight)\n"
            "\n"
            "    def forward(self, x):\n"
            "        y = self.bn1(self.conv1(x))\n"
            "        y = self.conv2(y)\n"
            "        y = self.bn2(y)\n"
            "        return y\n",
            "from torch import nn\n"
            "\n"
            "class Block(nn.Module):\n"
            "    def __init__(self, c):\n"
            "        super().__init__()\n"
            "        self.conv1 = nn.Conv2d(c, c, 3, bias=False)\n"
            "        self.bn1 = nn.BatchNorm2d(c)\n"
            "        self.conv2 = nn.Conv2d(c, c, 1, bias=False)\n"
            "        self.bn2 = nn.SyncBatchNorm(c)\n"
            "        nn.init.kaiming_normal_(self.conv1.weight)\n"
            "\n"
            "    def forward(self, x):\n"
            "        y = self.bn1(self.conv1(x))\n"
            "        y = self.conv2(y)\n"
            "        y = self.bn2(y)\n"
            "        return y\n",
            message_contains="cancel",
        ),
        Example(
            "import torch.nn as nn\n"
            "block = nn.Sequential(nn.Conv3d(1, 4, 3), nn.BatchNorm3d(4))\n"
            "for m in block.modules():\n"
            "    if isinstance(m, nn.Conv3d):\n"
            "        nn.init.zeros_(m.bias)\n",
            None,
            message_contains=".bias",
        ),
        Example(
            "import torch.nn as nn\nblock = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 0, 1, 1, True), nn.BatchNorm2d(8))\n",
            None,
            message_contains="positional",
        ),
        # a DCGAN generator block: the transposed convolution's bias is cancelled just the same
        Example(
            "import torch.nn as nn\n"
            "net = nn.Sequential(\n"
            "    nn.ConvTranspose2d(512, 256, 4, 2, 1, bias=True),\n"
            "    nn.BatchNorm2d(256),\n"
            "    nn.ReLU(True),\n"
            ")\n",
            "import torch.nn as nn\n"
            "net = nn.Sequential(\n"
            "    nn.ConvTranspose2d(512, 256, 4, 2, 1, bias=False),\n"
            "    nn.BatchNorm2d(256),\n"
            "    nn.ReLU(True),\n"
            ")\n",
            message_contains="ConvTranspose2d bias is cancelled",
        ),
        Example(
            "from torch import nn\n"
            "\n"
            "class Up(nn.Module):\n"
            "    def __init__(self, c):\n"
            "        super().__init__()\n"
            "        self.up = nn.ConvTranspose3d(c, c, 2, stride=2)\n"
            "        self.bn = nn.BatchNorm3d(c)\n"
            "\n"
            "    def forward(self, x):\n"
            "        return self.bn(self.up(x))\n",
            "from torch import nn\n"
            "\n"
            "class Up(nn.Module):\n"
            "    def __init__(self, c):\n"
            "        super().__init__()\n"
            "        self.up = nn.ConvTranspose3d(c, c, 2, stride=2, bias=False)\n"
            "        self.bn = nn.BatchNorm3d(c)\n"
            "\n"
            "    def forward(self, x):\n"
            "        return self.bn(self.up(x))\n",
            message_contains="ConvTranspose3d",
        ),
        # resuming a generator saved with the bias: reported, not rewritten
        Example(
            "import torch\nfrom torch import nn\n\n\ndef main(path):\n"
            "    g = nn.Sequential(nn.ConvTranspose2d(8, 4, 4, 2, 1), nn.BatchNorm2d(4))\n"
            "    g.load_state_dict(torch.load(path))\n    return g\n",
            None,
            message_contains="line 7 loads a state dict",
        ),
        # the conv output also feeds a residual add, where its bias is not cancelled
        Example(
            "import torch.nn as nn\n"
            "class Res(nn.Module):\n"
            "    def __init__(self, c):\n"
            "        super().__init__()\n"
            "        self.conv2 = nn.Conv2d(c, c, 3, padding=1)\n"
            "        self.bn2 = nn.BatchNorm2d(c)\n"
            "    def forward(self, x):\n"
            "        skip = self.conv2(x)\n"
            "        z = self.bn2(skip)\n"
            "        return z + skip\n",
            None,
            message_contains="also read on line 10",
        ),
        # resuming from a checkpoint saved with the bias: the strict load would raise after the fix
        Example(
            "import torch\nfrom torch import nn\n\n\ndef main(path):\n"
            "    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n"
            "    model.load_state_dict(torch.load(path))\n    return model\n",
            None,
            message_contains="line 7 loads a state dict",
        ),
        # a lenient load of the model alone: fixed
        Example(
            "import torch\nfrom torch import nn\n\nmodel = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n"
            "model.load_state_dict(torch.load(path), strict=False)\n",
            "import torch\nfrom torch import nn\n\nmodel = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8))\n"
            "model.load_state_dict(torch.load(path), strict=False)\n",
            message_contains="use bias=False",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        candidates: list[tuple[cst.Call, str, str | None, str | None]] = []
        for call in ctx.nodes(cst.Call):
            if not ctx.matches(call, SEQUENTIAL, {"nn.Sequential", "torch.nn.Sequential"}) or h.has_star(call):
                continue
            args = h.positionals(call)
            for a, b in zip(args, args[1:]):
                cd = _kind(ctx, a.value, CONV, CONV_BARE)
                bd = _kind(ctx, b.value, BN, BN_BARE)
                if _compatible(cd, bd):
                    candidates.append((a.value, ctx.code(b.value.func), None, None))  # type: ignore[union-attr]
        for cls in ctx.nodes(cst.ClassDef):
            candidates.extend(self._class_candidates(ctx, cls))
        if not candidates:
            return
        unsafe = self._unguarded_bias(ctx, {a for _, _, a, _ in candidates if a})
        load = _strict_load(ctx)
        for conv, bn, _attr, shared in candidates:
            bias = h.kwarg(conv, "bias")
            pos = h.positionals(conv)
            if bias is not None and h.is_literal(bias.value, False) or len(pos) >= 8 and h.is_literal(pos[7].value, False):
                continue
            kind = h.dotted(conv.func) or "Conv"
            message = f"{kind.split('.')[-1]} bias is cancelled by the {bn.split('.')[-1]} that follows (it subtracts the mean); use bias=False"
            if shared is not None:
                yield self.report(conv, message + f" (but its output is also read on {shared}, where the bias still counts: not rewritten)")
            elif h.has_star(conv) or len(pos) >= 8:
                yield self.report(conv, message + " (bias is passed positionally or through *args)")
            elif bias is not None and not h.is_literal(bias.value, True):
                yield self.report(conv, message + " (bias is not a literal)")
            elif unsafe is not None:
                yield self.report(conv, message + f" (line {unsafe} reads .bias without an `is not None` check)")
            elif load is not None:
                yield self.report(conv, message + f" (not rewritten: line {load} loads a state dict, and a checkpoint "
                                  "saved with the bias would no longer load: unexpected `.bias` keys for a model, a "
                                  "parameter group of another size for an optimizer; load with strict=False or drop "
                                  "the keys first)")
            else:
                new = h.set_kwarg(conv, "bias", "False")
                yield self.replace(conv, message, {conv: new})

    def _class_candidates(self, ctx: Context, cls: cst.ClassDef) -> list[tuple[cst.Call, str, str | None, str | None]]:
        init = next(
            (s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None
        ) if isinstance(cls.body, cst.IndentedBlock) else None
        if init is None:
            return []
        convs: dict[str, tuple[cst.Call, int]] = {}
        bns: dict[str, int] = {}
        assigned: dict[str, int] = {}
        targets: set[int] = set()
        for node in h.walk(init):
            if isinstance(node, cst.Assign) and len(node.targets) == 1:
                attr = _self_attr(node.targets[0].target)
                if attr is None:
                    continue
                assigned[attr] = assigned.get(attr, 0) + 1
                targets.add(id(node.targets[0].target))
                cd = _kind(ctx, node.value, CONV, CONV_BARE)
                bd = _kind(ctx, node.value, BN, BN_BARE)
                if cd is not None:
                    convs[attr] = (node.value, cd)  # type: ignore[assignment]
                if bd is not None:
                    bns[attr] = bd
        convs = {k: v for k, v in convs.items() if assigned[k] == 1}
        if not convs or not bns:
            return []
        feeds: dict[str, set[str]] = {k: set() for k in convs}
        shared: dict[str, str] = {}
        bad: set[str] = set()
        for node in h.walk(cls):
            attr = _self_attr(node)
            if attr not in convs or id(node) in targets:
                continue
            parent = ctx.parent(node)
            if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "weight":
                continue
            if not (isinstance(parent, cst.Call) and parent.func is node):
                bad.add(attr)
                continue
            bn, other = self._feeding_bn(ctx, parent, bns)
            if bn is None:
                bad.add(attr)
            else:
                feeds[attr].add(bn)
                if other is not None:
                    shared.setdefault(attr, other)
        out = []
        for attr, (call, cd) in convs.items():
            if attr in bad or not feeds[attr]:
                continue
            if all(_compatible(cd, bns[b]) for b in feeds[attr]):
                out.append((call, f"self.{sorted(feeds[attr])[0]}", attr, shared.get(attr)))
        return out

    @staticmethod
    def _feeding_bn(ctx: Context, call: cst.Call, bns: dict[str, int]) -> tuple[str | None, str | None]:
        """The BN attribute that consumes the output of ``call`` directly, if any, and where else
        that output is read (``"line N"``; None: nowhere, the BN is its only reader)."""
        arg = ctx.parent(call)
        outer = ctx.parent(arg) if isinstance(arg, cst.Arg) else None
        if isinstance(outer, cst.Call) and len(outer.args) == 1 and not arg.star and arg.keyword is None:  # type: ignore[union-attr]
            bn = _self_attr(outer.func)
            return (bn, None) if bn in bns else (None, None)
        assign = ctx.parent(call)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)):
            return None, None
        var = assign.targets[0].target.value
        line = ctx.parent(assign)
        where = ctx.block_of(line) if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
        if where is None:
            return None, None
        block, i = where
        if i + 1 >= len(block.body):
            return None, None
        nxt = block.body[i + 1]
        if not (isinstance(nxt, cst.SimpleStatementLine) and len(nxt.body) == 1 and isinstance(nxt.body[0], (cst.Assign, cst.Return, cst.Expr))):
            return None, None
        value = nxt.body[0].value
        if isinstance(value, cst.Call) and len(value.args) == 1 and isinstance(value.args[0].value, cst.Name) and value.args[0].value.value == var:
            bn = _self_attr(value.func)
            if bn not in bns:
                return None, None
            return bn, ConvBiasBeforeBn._other_reader(ctx, var, assign, value.args[0].value)
        return None, None

    @staticmethod
    def _other_reader(ctx: Context, var: str, assign: cst.Assign, bn_arg: cst.Name) -> str | None:
        """Whether the value ``assign`` binds to ``var`` is read by anything but ``bn_arg`` (the
        statement right after): None when the BN is provably its only reader (the BN statement
        or a later straight-line statement binds ``var`` again, or the function ends), else
        where the other read is (``"line N"``) or, when unsure, ``"another line"``."""
        unsure = "another line"
        fn = ctx.enclosing_scope(assign)
        if not isinstance(fn, cst.FunctionDef) or flow.used_in_nested_scopes(ctx, fn, var) or flow.declared_nonlocal(fn, var):
            return unsure
        line = ctx.parent(assign)
        block, i = ctx.block_of(line)  # type: ignore[misc]
        bn_small = block.body[i + 1].body[0]  # type: ignore[union-attr]
        if isinstance(bn_small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == var for t in bn_small.targets):
            return None  # `y = self.bn(y)`: the conv output is dead
        in_finally = any(isinstance(a, cst.Try) and a.finalbody is not None for a in ctx.ancestors(line) if ctx.contains(fn, a) and a is not fn)
        if isinstance(bn_small, cst.Return) and not in_finally:
            return None
        named = flow.names_in(ctx, fn, var)
        for stmt in block.body[i + 2:]:
            mentions = [n for n in named if ctx.contains(stmt, n)]
            if not mentions:
                continue
            small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and len(mentions) == 1
                and mentions[0] is small.targets[0].target
            ):
                return None  # bound again before any read
            return f"line {ctx.pos(mentions[0]).start.line}"
        if block is fn.body and not in_finally:
            return None  # the function ends: locals die
        # the block ends inside a loop, branch, with or try: any other mention of the name counts
        for n in named:
            if n is bn_arg or n is assign.targets[0].target:
                continue
            if flow.is_store(ctx, n) and not isinstance(ctx.parent(n), cst.AugAssign):
                continue  # another binding (or `del`) reads nothing
            return f"line {ctx.pos(n).start.line}"
        return None

    @staticmethod
    def _unguarded_bias(ctx: Context, conv_attrs: set[str]) -> int | None:
        """Line of a `.bias` read that could hit a conv whose bias becomes None, if any."""
        for attr in ctx.nodes(cst.Attribute):
            if attr.attr.value != "bias":
                continue
            owner = _self_attr(attr.value)
            if owner is not None and owner not in conv_attrs:
                continue
            parent = ctx.parent(attr)
            if isinstance(parent, cst.Comparison) and all(isinstance(c.operator, (cst.Is, cst.IsNot)) for c in parent.comparisons):
                continue
            code = ctx.code(attr)
            guarded = False
            for anc in ctx.ancestors(attr):
                if isinstance(anc, (cst.If, cst.IfExp)) and f"{code} is not None" in ctx.code(anc.test).replace("  ", " "):
                    guarded = True
                    break
                if isinstance(anc, cst.BooleanOperation) and f"{code} is not None" in ctx.code(anc.left):
                    guarded = True
                    break
            if not guarded:
                return ctx.pos(attr).start.line
        return None
