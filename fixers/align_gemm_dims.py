"""align-gemm-dims: layer and batch sizes that leave GEMM dimensions off a multiple of 8."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

LINEAR = {"torch.nn.Linear", "torch.nn.modules.linear.Linear"}
LINEAR_BARE = {"nn.Linear", "torch.nn.Linear"}
#: factories whose positional arguments (or first-argument tuple/list) are all sizes
SIZE_FACTORIES = {f"torch.{n}" for n in ("randn", "rand", "zeros", "ones", "empty")}
#: factories whose ``size`` is one argument: (position of size, keyword)
SIZE_ARG = {"torch.randint": (2, "size"), "torch.full": (0, "size")}

IN, OUT, SIZE = "in_features", "out_features", "size"
#: calls that bring data from outside the program (callee's last name; also read_*/load_*)
DATA_SOURCES = {"DataLoader", "load", "loadtxt", "genfromtxt", "fromfile", "memmap", "open", "ImageFolder",
                "DatasetFolder", "TensorDataset", "Dataset", "IterableDataset"}
#: sizes below this are left alone (a 10-wide or 3-class layer cannot be padded usefully)
MIN_SIZE = 32


@dataclass
class _Constant:
    name: str
    value: int
    node: cst.Integer
    roles: set[str] = field(default_factory=set)
    uses: list[str] = field(default_factory=list)
    calls: list[cst.Call] = field(default_factory=list)
    bad: str | None = None
    batch: bool = False


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


class AlignGemmDims(Fixer):
    pattern = "misaligned-gemm"
    name = "align-gemm-dims"
    summary = "module-level layer/batch sizes feeding GEMMs rounded up to a multiple of 8, where the program owns them"
    OPTIONS = {
        "multiple": (8, "round sizes up to a multiple of this (8: tensor cores in fp16/bf16; 64 is better still)"),
        "max_growth": (0.10, "largest relative growth of a size the fixer makes (a bigger one is reported)"),
    }
    explanation = """\
## What it does
Rounds up, to a multiple of 8 (option `multiple`), a module-level integer constant
(`HIDDEN = 999`, or one element of `IN_FEATURES, HIDDEN, BATCH = 1001, 999, 63`) that sets
GEMM dimensions, when the program owns every dimension it sets. Every use of the name must be
the whole argument in one of these places:

* `nn.Linear(in_features, out_features)`: a size used as `out_features` must also be some
  layer's `in_features` (a hidden width, internal to the model); a size used only as
  `in_features` must also size a tensor the program makes (its input is synthetic);
* a size argument of `torch.randn/rand/zeros/ones/empty(...)`, the `size` of
  `torch.randint(low, high, size)` or of `torch.full(size, value)`: the program makes that data.

A name used anywhere else (arithmetic, `range`, a `DataLoader`, a function argument, a label
range such as `randint`'s `high`), bound a second time, or whose rounding grows it by more than
`max_growth` (10%) is reported, not changed; so are input widths and batches when the file also
reads data (a `DataLoader`, a `Dataset`, `torch.load`, `np.loadtxt`, `open`, `pd.read_*`, ...),
since that data may have to match them; so is an output width (`out_features` of the last
layer: the number of classes or the vocabulary) and a literal size written inside `nn.Linear(...)`.
So is every layer width (not a batch) of a file that loads a state dict (`load_state_dict(...)`:
resuming, pretrained weights): a checkpoint saved with the old width would no longer load.

## Why is this bad?
GEMM kernels work on tiles: tensor cores load operands in 16-byte vectors (8 fp16/bf16 or 4
fp32 elements) and cuBLAS picks its fastest kernels only when M, N and K are multiples of 8
(64 is better); CPU kernels block by 8/16 too. Sizes like 1001, 999 or a batch of 63 leave
partial tiles in every forward and backward GEMM (the batch is the K of each weight-gradient
GEMM), and the kernels fall back to slower paths or pad internally. In the trace the
`aten::mm`/`aten::addmm` `Input Dims` show the odd sizes.

## Caveats
This is a change to the model, which is the fix the finding asks for: a wider hidden layer
has more parameters (999 -> 1000 adds 0.1%) and a different initialisation scale, so results
are not bit-identical and checkpoints of the old shape no longer load. A rounded input width
adds feature columns to the data the program generates; a rounded batch changes the batch
size the program trains with. Sizes that come from real data or labels are never changed.

## Example
```python
IN_FEATURES, HIDDEN, BATCH = 1001, 999, 63
model = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))
x = torch.randn(BATCH, IN_FEATURES)
```
Use instead:
```python
IN_FEATURES, HIDDEN, BATCH = 1008, 1000, 64
model = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))
x = torch.randn(BATCH, IN_FEATURES)
```
"""

    VALID = [
        # aligned already
        "import torch\nfrom torch import nn\nHIDDEN = 1024\nm = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, 10))\n",
        # small sizes (under 32) are left alone: padding them would grow them a lot
        "import torch\nfrom torch import nn\nH, CLASSES = 10, 3\nm = nn.Sequential(nn.Linear(H, H), nn.Linear(H, CLASSES))\nx = torch.randn(4, H)\n",
        # not a GEMM dimension
        "EPOCHS = 999\nfor epoch in range(EPOCHS):\n    pass\n",
        # suppressed
        "from torch import nn\nHIDDEN = 999  # zoomer: ignore[misaligned-gemm]\nm = nn.Sequential(nn.Linear(64, HIDDEN), nn.Linear(HIDDEN, 64))\n",
    ]
    INVALID = [
        Example(
            "import torch\n"
            "from torch import nn\n"
            "\n"
            "IN_FEATURES, HIDDEN, BATCH = 1001, 999, 63  # sizes\n"
            "CLASSES = 64\n"
            "\n"
            "\n"
            "def build():\n"
            "    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))\n"
            "\n"
            "\n"
            "x = torch.randn(BATCH, IN_FEATURES)\n"
            "y = torch.randint(0, CLASSES, (BATCH,))\n",
            "import torch\n"
            "from torch import nn\n"
            "\n"
            "IN_FEATURES, HIDDEN, BATCH = 1008, 1000, 64  # sizes\n"
            "CLASSES = 64\n"
            "\n"
            "\n"
            "def build():\n"
            "    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))\n"
            "\n"
            "\n"
            "x = torch.randn(BATCH, IN_FEATURES)\n"
            "y = torch.randint(0, CLASSES, (BATCH,))\n",
            message_contains="multiple of 8",
        ),
        Example(
            "import torch.nn as nn\n"
            "HIDDEN = 3001\n"
            "class MLP(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.up = nn.Linear(in_features=512, out_features=HIDDEN)\n"
            "        self.down = nn.Linear(in_features=HIDDEN, out_features=512)\n",
            "import torch.nn as nn\n"
            "HIDDEN = 3008\n"
            "class MLP(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.up = nn.Linear(in_features=512, out_features=HIDDEN)\n"
            "        self.down = nn.Linear(in_features=HIDDEN, out_features=512)\n",
            message_contains="3008",
        ),
        # an output width (number of classes): the label space is not ours to pad
        Example(
            "from torch import nn\nHIDDEN, CLASSES = 512, 1001\nm = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, CLASSES))\n",
            None,
            message_contains="output width",
        ),
        # the input width comes from data the program does not make
        Example(
            "import numpy as np\nfrom torch import nn\nIN = 1001\ndata = np.loadtxt('x.csv')\nm = nn.Linear(IN, 512)\n",
            None,
            message_contains="input width",
        ),
        # the batch is used by a DataLoader too: reported, not changed
        Example(
            "import torch\n"
            "from torch import nn\n"
            "from torch.utils.data import DataLoader\n"
            "BATCH = 63\n"
            "m = nn.Linear(BATCH, 512)\n"
            "x = torch.randn(8, BATCH)\n"
            "loader = DataLoader(range(10), batch_size=BATCH)\n",
            None,
            message_contains="DataLoader",
        ),
        # a hidden width in a file that resumes from a checkpoint: the saved weights have the old shape
        Example(
            "import torch\nfrom torch import nn\n\nHIDDEN = 999\n"
            "model = nn.Sequential(nn.Linear(64, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))\n"
            "model.load_state_dict(torch.load(\"ckpt.pt\"), strict=False)\n",
            None,
            message_contains="line 6): a checkpoint saved with 999 would no longer load",
        ),
        # the program also reads data: its input width may be the data's
        Example(
            "import torch\n"
            "from torch import nn\n"
            "IN, HIDDEN = 1001, 999\n"
            "model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, 64))\n"
            "warmup = torch.randn(8, IN)\n"
            "real = torch.load('features.pt')\n",
            "import torch\n"
            "from torch import nn\n"
            "IN, HIDDEN = 1001, 1000\n"
            "model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, 64))\n"
            "warmup = torch.randn(8, IN)\n"
            "real = torch.load('features.pt')\n",
            message_contains="reads data",
        ),
        # rounding would grow the size by more than 10%
        Example(
            "import torch\nfrom torch import nn\nH = 33\nm = nn.Sequential(nn.Linear(H, H), nn.Linear(H, 64))\nx = torch.randn(4, H)\n",
            None,
            message_contains="grow",
        ),
        # a literal odd size inside nn.Linear: reported
        Example(
            "from torch import nn\nm = nn.Linear(1001, 512)\n",
            None,
            message_contains="1001",
        ),
        # a hidden width also used in arithmetic: reported
        Example(
            "from torch import nn\n"
            "HIDDEN = 999\n"
            "m = nn.Sequential(nn.Linear(64, HIDDEN), nn.Linear(HIDDEN, 64))\n"
            "params = 64 * HIDDEN * 2\n",
            None,
            message_contains="HIDDEN",
        ),
    ]

    # -- analysis ------------------------------------------------------------------------------------

    def check(self, ctx: Context) -> Iterable[Edit]:
        multiple = max(1, int(self.options["multiple"]))
        consts = self._constants(ctx)
        linear_calls = [c for c in ctx.nodes(cst.Call) if ctx.matches(c, LINEAR, LINEAR_BARE)]
        for call in linear_calls:
            for arg, role in self._linear_args(call):
                v = h.literal(arg.value)
                if isinstance(v, int) and not isinstance(v, bool) and v >= MIN_SIZE and v % multiple:
                    yield self.report(
                        arg.value,
                        f"nn.Linear {role} {v} is not a multiple of {multiple}: its GEMMs run on partial tiles; "
                        f"use {_round_up(v, multiple)} if the size is the model's to choose",
                    )
        if not consts:
            return
        self._classify(ctx, consts)
        data_source_node = self._data_source(ctx)
        data_source = f"{self._callee(data_source_node)}(...)" if data_source_node is not None else None
        loads = next((c for c in ctx.nodes(cst.Call) if h.is_method_call(c, "load_state_dict")), None)
        for c in consts.values():
            if not (c.roles & {IN, OUT} or c.batch) or c.value % multiple == 0 or c.value < MIN_SIZE:
                continue  # not a GEMM dimension, or aligned
            new = _round_up(c.value, multiple)
            where = ", ".join(sorted(set(c.uses)))
            head = f"{c.name} = {c.value} sets GEMM dimensions ({where}) that are not a multiple of {multiple}"
            reason = c.bad
            if reason is None and OUT in c.roles and IN not in c.roles:
                reason = "it is an output width (classes or vocabulary), whose size the labels set"
            if reason is None and IN in c.roles and OUT not in c.roles and SIZE not in c.roles:
                reason = "it is an input width the program does not generate (the data's width)"
            if reason is None and (c.batch or OUT not in c.roles) and data_source is not None:
                reason = (f"the program also reads data ({data_source}, line {ctx.pos(data_source_node).start.line}), "
                          "whose width or batch it may have to match")
            if reason is None and c.roles & {IN, OUT} and loads is not None:
                reason = (f"the program loads a state dict (line {ctx.pos(loads).start.line}): a checkpoint saved with "
                          f"{c.value} would no longer load (size mismatch for the weights it shapes)")
            if reason is None and (new - c.value) > float(self.options["max_growth"]) * c.value:
                reason = f"rounding to {new} would grow it by {100.0 * (new - c.value) / c.value:.0f}%"
            if reason is not None:
                yield self.report(c.node, f"{head}; not changed: {reason}")
            else:
                yield self.replace(c.node, f"{head}: round up to {new}", {c.node: cst.Integer(str(new))})

    @staticmethod
    def _data_source(ctx: Context) -> cst.Call | None:
        """The first call that brings data from outside the program (a loader, a file, a dataset):
        input widths and batches are then the data's, not the program's."""
        for call in ctx.nodes(cst.Call):
            name = (h.dotted(call.func) or "").split(".")[-1]
            if name in DATA_SOURCES or name.startswith(("read_", "load_")):
                return call
        return None

    @staticmethod
    def _linear_args(call: cst.Call) -> list[tuple[cst.Arg, str]]:
        out = []
        pos = h.positionals(call)
        for i, role in ((0, IN), (1, OUT)):
            if len(pos) > i:
                out.append((pos[i], role))
            kw = h.kwarg(call, role)
            if kw is not None:
                out.append((kw, role))
        return out

    @staticmethod
    def _constants(ctx: Context) -> dict[str, _Constant]:
        """Module-level ``NAME = int`` and ``A, B = int, int`` bindings, each bound once."""
        found: dict[str, _Constant] = {}
        for stmt in ctx.module.body:
            if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
                continue
            assign = stmt.body[0]
            if len(assign.targets) != 1:
                continue
            target, value = assign.targets[0].target, assign.value
            pairs: list[tuple[cst.BaseExpression, cst.BaseExpression]] = []
            if isinstance(target, cst.Name):
                pairs = [(target, value)]
            elif isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and len(target.elements) == len(value.elements):
                if any(isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements)):
                    continue
                pairs = [(t.value, v.value) for t, v in zip(target.elements, value.elements)]
            for t, v in pairs:
                if isinstance(t, cst.Name) and isinstance(v, cst.Integer):
                    found[t.value] = _Constant(t.value, int(v.evaluated_value), v)
        if not found:
            return {}
        # every other binding of the name (anywhere in the file) disqualifies it
        counts: dict[str, int] = {}
        for node in ctx.nodes(cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.Param, cst.FunctionDef,
                              cst.ClassDef, cst.ImportAlias, cst.NamedExpr, cst.Global, cst.WithItem, cst.CompFor):
            for name in _bound_names(node):
                counts[name] = counts.get(name, 0) + 1
        return {k: c for k, c in found.items() if counts.get(k, 0) <= 1}

    def _classify(self, ctx: Context, consts: dict[str, _Constant]) -> None:
        for name in ctx.nodes(cst.Name):
            c = consts.get(name.value)
            if c is None or self._is_binding(ctx, name):
                continue
            role, label, call = self._use(ctx, name)
            if role is None:
                if c.bad is None:
                    c.bad = f"{c.name} is also used {label}"
                continue
            c.roles.add(role)
            c.uses.append(label)
            if role == SIZE and call is not None:
                c.calls.append(call)
        # a size used only for generated tensors is a GEMM dimension (the batch: M of the forward
        # GEMM, K of the weight-gradient one) when it sizes a tensor together with an input width
        inputs = {id(call) for c in consts.values() if IN in c.roles for call in c.calls}
        for c in consts.values():
            c.batch = c.roles == {SIZE} and any(id(call) in inputs for call in c.calls)
            if c.batch:
                c.uses.append("the batch of an input")

    @staticmethod
    def _is_binding(ctx: Context, name: cst.Name) -> bool:
        parent = ctx.parent(name)
        if isinstance(parent, cst.AssignTarget):
            return True
        if isinstance(parent, cst.Element):
            tup = ctx.parent(parent)
            return isinstance(tup, cst.Tuple) and isinstance(ctx.parent(tup), cst.AssignTarget)
        return False

    def _use(self, ctx: Context, name: cst.Name) -> tuple[str | None, str, cst.Call | None]:
        """(role, description, call) of one read of a constant; role None for any other use."""
        parent = ctx.parent(name)
        holder: cst.CSTNode | None = None
        if isinstance(parent, cst.Element):  # an element of a size tuple/list
            seq = ctx.parent(parent)
            arg = ctx.parent(seq) if isinstance(seq, (cst.Tuple, cst.List)) else None
            if isinstance(arg, cst.Arg) and arg.value is seq:
                call = ctx.parent(arg)
                if isinstance(call, cst.Call) and self._size_arg(ctx, call, arg, in_sequence=True):
                    return SIZE, f"{self._callee(call)} size", call
                holder = call
        elif isinstance(parent, cst.Arg) and parent.value is name and not parent.star:
            call = ctx.parent(parent)
            if isinstance(call, cst.Call):
                if ctx.matches(call, LINEAR, LINEAR_BARE):
                    for arg, role in self._linear_args(call):
                        if arg is parent:
                            return role, f"nn.Linear {role}", call
                if self._size_arg(ctx, call, parent, in_sequence=False):
                    return SIZE, f"{self._callee(call)} size", call
                holder = call
        if isinstance(holder, cst.Call):
            return None, f"as an argument of {self._callee(holder)}(...) (line {ctx.pos(name).start.line})", None
        return None, f"in `{ctx.code(ctx.statement(name) or parent).strip().splitlines()[0][:60]}` (line {ctx.pos(name).start.line})", None

    @staticmethod
    def _callee(call: cst.Call) -> str:
        return (h.dotted(call.func) or "a call").split(".")[-1]

    @staticmethod
    def _size_arg(ctx: Context, call: cst.Call, arg: cst.Arg, *, in_sequence: bool) -> bool:
        if ctx.matches(call, SIZE_FACTORIES, SIZE_FACTORIES):
            pos = h.positionals(call)
            if arg.keyword is not None:
                return in_sequence and arg.keyword.value == "size"
            if in_sequence:
                return bool(pos) and pos[0] is arg
            return arg in pos
        for qual, (index, keyword) in SIZE_ARG.items():
            if ctx.matches(call, {qual}, {qual}):
                if not in_sequence:
                    return False
                if arg.keyword is not None:
                    return arg.keyword.value == keyword
                pos = h.positionals(call)
                return len(pos) > index and pos[index] is arg
        return False


def _bound_names(node: cst.CSTNode) -> list[str]:
    if isinstance(node, cst.AssignTarget):
        return h.target_names(node.target)
    if isinstance(node, (cst.AugAssign, cst.AnnAssign)):
        return h.target_names(node.target)
    if isinstance(node, (cst.For, cst.CompFor)):
        return h.target_names(node.target)
    if isinstance(node, cst.WithItem):
        return h.target_names(node.asname.name) if node.asname is not None else []
    if isinstance(node, cst.NamedExpr):
        return h.target_names(node.target)
    if isinstance(node, (cst.Param, cst.FunctionDef, cst.ClassDef)):
        return [node.name.value]
    if isinstance(node, cst.ImportAlias):
        if node.asname is not None:
            return h.target_names(node.asname.name)
        return [(h.dotted(node.name) or "").split(".")[0]]
    if isinstance(node, cst.Global):
        return [n.name.value for n in node.names]
    return []
