"""optimizer-foreach: torch.optim optimizers stepping one tensor at a time."""

from __future__ import annotations

import re
from typing import Iterable

import libcst as cst

from zoomer_ar.fix import flow
from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

FOREACH_CAPABLE = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop")
FUSED_CAPABLE = ("Adam", "AdamW", "SGD")


def _names(cls: str) -> set[str]:
    return {f"torch.optim.{cls}", f"torch.optim.{cls.lower()}.{cls}"}


# --------------------------------------------------------------------------------------------
# CPU-only evidence: foreach=True buys nothing on the CPU (its foreach kernels loop per tensor),
# so optimizers that visibly step CPU tensors are left alone
# --------------------------------------------------------------------------------------------

#: torch factories that allocate on the CPU unless given device= (or a default device is set)
CPU_FACTORIES = ("zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange", "linspace",
                 "logspace", "eye", "tensor", "from_numpy")
_FACTORY_NAMES = {f"torch.{f}" for f in CPU_FACTORIES}
_PARAMETER = {"torch.nn.Parameter", "torch.nn.parameter.Parameter"}
_PARAMETER_BARE = {"nn.Parameter", "torch.nn.Parameter", "Parameter"}
#: tensor methods whose result stays on the receiver's device
_SAME_DEVICE = {"requires_grad_", "float", "double", "half", "bfloat16", "clone", "detach", "contiguous"}
#: decorators that run a test on the CPU only (accelerate's test_utils.require_cpu)
_CPU_MARKERS = {"require_cpu", "requires_cpu", "cpu_only", "only_cpu"}
#: words naming an accelerator, or a library that places models on one
_ACCEL_WORDS = frozenset({
    "cuda", "gpu", "gpus", "cudnn", "nccl", "xla", "tpu", "tpus", "mps", "xpu", "npu", "hpu", "mlu", "musa", "rocm",
    "accelerator", "accelerators", "accelerate", "deepspeed", "fsdp", "ddp", "distributed", "lightning", "fabric",
    "transformers", "composer", "fairscale", "colossalai", "apex",
})
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_MAX_DEPTH = 8


def _binding_scope(ctx: Context, name: cst.Name) -> cst.CSTNode | None:
    """The scope ``name`` resolves to from where it is read (its function, else the enclosing
    ones, else the module): the innermost that assigns it; None for a parameter, ``global`` or
    ``nonlocal``, or a name assigned nowhere."""
    scope = ctx.enclosing_scope(name)
    while True:
        if isinstance(scope, cst.FunctionDef) and flow.is_param(scope, name.value):
            return None
        if not isinstance(scope, cst.ClassDef) or scope is ctx.enclosing_scope(name):
            if any(flow.is_store(ctx, n) for n in flow.names_in(ctx, scope, name.value)):
                return None if flow.declared_nonlocal(scope, name.value) else scope
        if scope is ctx.module:
            return None
        scope = ctx.enclosing_scope(scope)


def _bound_values(ctx: Context, name: cst.Name) -> list[cst.BaseExpression] | None:
    """The values ``name`` is assigned in the scope it resolves to, when every binding there is
    a plain ``name = value``; None otherwise (a parameter, a loop target, unpacking...)."""
    scope = _binding_scope(ctx, name)
    if scope is None:
        return None
    values = []
    for n in flow.names_in(ctx, scope, name.value):
        if not flow.is_store(ctx, n):
            continue
        target = ctx.parent(n)
        assign = ctx.parent(target) if isinstance(target, cst.AssignTarget) else None
        if not isinstance(assign, cst.Assign):
            return None
        values.append(assign.value)
    return values


def _reads(ctx: Context, name: cst.Name) -> list[cst.Name] | None:
    """The reads of ``name`` in the scope it resolves to; None when a nested def, class-level code or a
    lambda uses it too (it may do anything with it)."""
    scope = _binding_scope(ctx, name)
    if scope is None or flow.used_in_nested_scopes(ctx, scope, name.value):
        return None
    return [n for n in flow.names_in(ctx, scope, name.value) if not flow.is_store(ctx, n)]


def _mutated(ctx: Context, name: cst.Name) -> bool:
    """The list or dict ``name`` may be changed in place: ``name.append(...)`` (any attribute),
    ``name[k] = ...``, ``name += ...``, or a use we cannot follow."""
    reads = _reads(ctx, name)
    if reads is None:
        return True
    for n in reads:
        p = ctx.parent(n)
        if isinstance(p, cst.Attribute) and p.value is n:
            return True  # a method call or an attribute store: cannot tell, assume it changes
        if isinstance(p, cst.Subscript) and p.value is n and isinstance(ctx.parent(p), (cst.AssignTarget, cst.AugAssign, cst.Del)):
            return True
        if isinstance(p, cst.AugAssign) and p.target is n:
            return True
    return False


def _cpu_tensor(ctx: Context, expr: cst.CSTNode, depth: int = 0) -> bool:
    """A tensor made on the CPU in this file: a torch factory without ``device=``
    (``torch.zeros([1], requires_grad=True)``, ``torch.tensor(0.0)``), ``nn.Parameter`` of one,
    one with a same-device method (``.requires_grad_()``, ``.float()``), or a name only ever
    assigned one."""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(expr, cst.Call):
        m = h.method(expr)
        if m is not None and m[1] in _SAME_DEVICE and not any(a.keyword is not None for a in expr.args):
            return _cpu_tensor(ctx, m[0], depth + 1)
        if ctx.matches(expr, _PARAMETER, _PARAMETER_BARE):
            data = h.arg_at(expr, "data", 0)
            return data is not None and not data.star and _cpu_tensor(ctx, data.value, depth + 1)
        return (ctx.matches(expr, _FACTORY_NAMES, _FACTORY_NAMES) and h.kwarg(expr, "device") is None
                and not any(a.star == "**" for a in expr.args))
    if isinstance(expr, cst.Name):
        values = _bound_values(ctx, expr)
        return bool(values) and not _escapes(ctx, expr) and all(_cpu_tensor(ctx, v, depth + 1) for v in values)
    return False


def _escapes(ctx: Context, name: cst.Name) -> bool:
    """The tensor ``name`` may be moved in place by other code: its ``.data`` (any attribute but
    ``.grad``/``.requires_grad``) is assigned, it is handed to a call other than an optimizer's
    (``net.register_parameter("w", w)``, ``nn.ParameterList([w])``, then ``net.cuda()``), stored
    in an attribute or an item (``self.w = w``), or used by a nested function."""
    reads = _reads(ctx, name)
    if reads is None:
        return True
    for n in reads:
        p = ctx.parent(n)
        if (isinstance(p, cst.Attribute) and p.value is n and isinstance(ctx.parent(p), cst.AssignTarget)
                and p.attr.value not in ("grad", "requires_grad")):
            return True  # `w.data = w.data.cuda()` moves it; setting its .grad does not
        holder = p
        while isinstance(holder, (cst.Element, cst.List, cst.Tuple, cst.DictElement, cst.Dict)):
            holder = ctx.parent(holder)
        if isinstance(holder, cst.Arg):
            call = ctx.parent(holder)
            if not (isinstance(call, cst.Call) and (h.dotted(call.func) or "").split(".")[-1] in FOREACH_CAPABLE):
                return True
        if isinstance(holder, cst.Assign) and any(not isinstance(t.target, cst.Name) for t in holder.targets):
            return True
    return False


def _params_on_cpu(ctx: Context, expr: cst.CSTNode, depth: int = 0) -> bool:
    """The optimizer's ``params`` are all CPU tensors made in this file: a list/tuple of them, of
    param groups (``{"params": [t1], "lr": 0.1}``) holding them, or a name assigned such a list
    and never changed afterwards."""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(expr, (cst.List, cst.Tuple)):
        return bool(expr.elements) and all(
            isinstance(e, cst.Element) and _params_on_cpu(ctx, e.value, depth + 1) for e in expr.elements)
    if isinstance(expr, cst.Dict):
        params = None
        for el in expr.elements:
            if not isinstance(el, cst.DictElement) or h.string_value(el.key) is None:
                return False
            if h.string_value(el.key) == "params":
                params = el.value
        return params is not None and _params_on_cpu(ctx, params, depth + 1)
    if isinstance(expr, cst.Name):
        values = _bound_values(ctx, expr)
        if not values:
            return False
        if all(isinstance(v, (cst.List, cst.Tuple, cst.Dict)) for v in values):
            return not _mutated(ctx, expr) and all(_params_on_cpu(ctx, v, depth + 1) for v in values)
    return _cpu_tensor(ctx, expr, depth)


def _default_device_changed(ctx: Context) -> bool:
    """The file may make factories allocate elsewhere: ``torch.set_default_device(...)``,
    ``torch.set_default_tensor_type(...)`` or ``with torch.device(...):``."""
    if any(h.last_name(c.func) in ("set_default_device", "set_default_tensor_type") for c in ctx.nodes(cst.Call)):
        return True
    return any(isinstance(w.item, cst.Call) and h.last_name(w.item.func) == "device" for w in ctx.nodes(cst.WithItem))


def _cpu_marked(ctx: Context, call: cst.Call) -> bool:
    """A def (or class) around the call is decorated to run on the CPU only (``@require_cpu``)."""
    for anc in ctx.ancestors(call):
        if isinstance(anc, (cst.FunctionDef, cst.ClassDef)):
            for d in anc.decorators:
                expr = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
                if h.last_name(expr) in _CPU_MARKERS:
                    return True
    return False


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def _cpu_device(ctx: Context, expr: cst.CSTNode, depth: int = 0) -> bool:
    """``"cpu"``, ``torch.device("cpu")`` or a name only ever assigned one of those. (Not
    ``x.device``: ``args.device`` reads the same.)"""
    s = h.string_value(expr)
    if s is not None:
        return s.strip().lower().split(":")[0] == "cpu"
    if isinstance(expr, cst.Call) and h.last_name(expr.func) == "device" and ctx.matches(expr, {"torch.device"}, {"torch.device"}):
        first = h.arg_at(expr, "type", 0)
        return first is not None and len(expr.args) == 1 and _cpu_device(ctx, first.value, depth + 1)
    if isinstance(expr, cst.Name) and depth <= _MAX_DEPTH:
        values = _bound_values(ctx, expr)
        return bool(values) and all(_cpu_device(ctx, v, depth + 1) for v in values)
    return False


def _dtype_like(ctx: Context, expr: cst.CSTNode) -> bool:
    name = h.last_name(expr) or ""
    return "dtype" in name.lower() or name in {"float16", "float32", "float64", "bfloat16", "half", "float", "double",
                                               "int8", "int16", "int32", "int64", "long", "uint8", "bool"}


_AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}
_CPU_AUTOCAST = {"torch.cpu.amp.autocast", "torch.cpu.amp.autocast_mode.autocast"}


def _module_pins_cpu(ctx: Context) -> bool:
    """The file places everything on the CPU: it names no accelerator, nor a library that places
    models on one (in names, attributes or strings), every device it names is the CPU
    (``torch.device("cpu")``, ``device="cpu"``, ``.to("cpu")``, ``torch.autocast("cpu")``,
    ``torch.cpu.amp.autocast()``, a name assigned only those), and it names the CPU so at least
    once."""
    for node in ctx.nodes(cst.Name):
        if _words(node.value) & _ACCEL_WORDS:
            return False
    for node in [*ctx.nodes(cst.SimpleString), *ctx.nodes(cst.FormattedStringText)]:
        if _words(node.value) & _ACCEL_WORDS:
            return False
    if _default_device_changed(ctx):
        return False
    pinned = False
    for call in ctx.nodes(cst.Call):
        places: list[cst.CSTNode] = []
        if ctx.matches(call, _AUTOCAST, _AUTOCAST):  # torch.autocast(device_type="cpu", ...) runs the step on the CPU
            device_type = h.arg_at(call, "device_type", 0)
            if device_type is None or device_type.star:
                return False
            places.append(device_type.value)
        elif ctx.matches(call, _CPU_AUTOCAST, _CPU_AUTOCAST):
            pinned = True
        if h.last_name(call.func) == "device" and ctx.matches(call, {"torch.device"}, {"torch.device"}):
            places.append(call)
        device = h.kwarg(call, "device")
        if device is not None:
            places.append(device.value)
        m = h.method(call)
        if m is not None and m[1] == "to":
            first = h.positionals(call)[:1]
            if first and not _dtype_like(ctx, first[0].value):
                places.append(first[0].value)
        if h.has_star(call) and m is not None and m[1] == "to":
            return False
        for place in places:
            if not _cpu_device(ctx, place):
                return False
            pinned = True
    return pinned


def _runs_on_cpu(ctx: Context, call: cst.Call) -> bool:
    """Whether the optimizer visibly steps CPU tensors: its parameters are made on the CPU in this
    file, it is built under ``@require_cpu``, or the whole file pins the CPU."""
    params = h.arg_at(call, "params", 0)
    if params is not None and not params.star and not _default_device_changed(ctx) and _params_on_cpu(ctx, params.value):
        return True
    if _cpu_marked(ctx, call):
        return True
    pins = ctx.__dict__.get("_zoomer_pins_cpu")
    if pins is None:
        pins = ctx.__dict__["_zoomer_pins_cpu"] = _module_pins_cpu(ctx)
    return pins


#: the optimizers that refuse foreach=True with a Tensor lr unless capturable=True
#: (torch/optim/adam.py: "lr as a Tensor is not supported for capturable=False and foreach=True")
TENSOR_LR_NEEDS_CAPTURABLE = ("Adam", "AdamW")
#: why an optimizer that leaves foreach (and fused) unset is reported, not changed: torch/optim/optimizer.py's
#: _default_to_fused_or_foreach picks foreach already unless one of these holds
DEFAULT_FOREACH = (
    "PyTorch 2.0 and newer already use foreach when every parameter is a plain tensor on a CUDA (ROCm) or XPU "
    "device, so foreach=True would change nothing there; if the trace shows single-tensor steps, look for "
    "parameters on another device (CPU, MPS), tensor-subclass parameters, differentiable=True, a Tensor lr "
    "(Adam, AdamW) or a PyTorch before 2.0, or pass fused=True (Adam, AdamW, SGD; option fused)"
)


def _tensor_lr(ctx: Context, call: cst.Call) -> bool:
    """The optimizer's ``lr`` is visibly a tensor (``lr=torch.tensor(1e-3)``, or a name only ever
    assigned a ``torch.*`` factory call) and ``capturable`` is not ``True``."""
    if h.is_literal(getattr(h.kwarg(call, "capturable"), "value", None), True):
        return False
    lr = h.arg_at(call, "lr", 1)
    if lr is None or lr.star:
        return False
    values: list[cst.BaseExpression] | None = [lr.value]
    if isinstance(lr.value, cst.Name):
        values = _bound_values(ctx, lr.value)
    return bool(values) and all(isinstance(v, cst.Call) and any(q.startswith("torch.") for q in ctx.qualnames(v))
                                for v in values)


class OptimizerForeach(Fixer):
    pattern = "single-tensor-optimizer"
    name = "optimizer-foreach"
    summary = "torch.optim optimizer with foreach=False: use the multi-tensor (foreach) implementation"
    explanation = """\
## What it does
Flags `torch.optim.Adam/AdamW/SGD/RMSprop/Adagrad/Adadelta/Adamax/NAdam/RAdam/ASGD/Rprop(...)`
constructed with `foreach=False` and sets `foreach=True`. With the option `fused=True`, Adam,
AdamW and SGD get `fused=True` instead, also where `foreach` is unset. An optimizer already
created with `fused=True` or `foreach=True` is left alone.

An optimizer that leaves `foreach` (and `fused`) unset is reported, not changed: since PyTorch
2.0 the optimizer picks foreach itself when every parameter is a plain tensor (or `nn.Parameter`,
DTensor) on a CUDA (ROCm's too) or XPU device and `differentiable` is off
(`_default_to_fused_or_foreach` in torch/optim/optimizer.py), so `foreach=True` would change
nothing there. Where a trace shows single-tensor steps anyway, the default fell back: parameters
on another device (the CPU, MPS), tensor-subclass parameters, `differentiable=True`, a Tensor `lr`
for Adam/AdamW without `capturable=True`, or a PyTorch before 2.0. The report names them; the
option `fused=True` is a change the default never makes.

Adam and AdamW built with `foreach=False` and an `lr` that is visibly a tensor
(`lr=torch.tensor(1e-3)`, or a name only assigned a `torch.*` call) are reported, not changed,
unless `capturable=True`: PyTorch refuses `foreach=True` with a Tensor `lr` there (a `ValueError`
when the optimizer is built).

So is an optimizer that visibly steps CPU tensors (CPU tests, CPU examples): on the CPU the
foreach ops fall back to a loop over the tensors, so the change buys nothing:

* its parameters are tensors made on the CPU in this file: a list, tuple or param groups
  (`{"params": [t], "lr": 0.1}`) of torch factories without `device=`
  (`torch.zeros([1], requires_grad=True)`, `torch.tensor(0.0)`, `nn.Parameter(torch.randn(4))`),
  directly or through names only assigned those, never handed to other calls (which might
  register them in a module that is then moved), stored elsewhere, `.data`-assigned or used by
  nested functions, in a file that sets no default device (`torch.set_default_device`,
  `with torch.device(...)`);
* it is created under a CPU-only decorator (`@require_cpu`, as in accelerate's tests); or
* the file pins the CPU: every device it names is the CPU (`torch.device("cpu")`,
  `device="cpu"`, `.to("cpu")`, CPU autocast: `torch.autocast(device_type="cpu")`,
  `torch.cpu.amp.autocast()`; a name assigned only those), it names the CPU so at least
  once, and it names no accelerator (`cuda`, `gpu`, `mps`, `xla`, `xpu`, ...) nor a library
  that places models on one (`accelerate`, `lightning`, `deepspeed`, `transformers`, ...)
  anywhere in its names or strings.

On the CPU the change is not even neutral: NAdam's and RAdam's foreach steps round differently
from their single-tensor ones (parameters differ in the last bit after a few steps).
A file that never names a device is not taken for CPU-only: the model may be moved elsewhere
(a Lightning `Trainer`, `accelerator.prepare`, a helper of another module).

## Why is this bad?
The single-tensor ("for-loop") implementation launches several small kernels per parameter
per step: for a model with hundreds of parameter tensors, `optimizer.step()` becomes a long
train of tiny kernels (`single-tensor-optimizer` in the trace: many `aten::add_`/`aten::mul_`
launches inside `Optimizer.step`). The foreach implementation updates all parameters with a few
multi-tensor kernels; the fused one with one kernel.

## Caveats
`foreach=True` groups the parameters by device and dtype and uses a little more peak memory (a
temporary per parameter group). `fused=True` needs floating-point CUDA (or, in recent releases,
CPU) parameters. Optimizers with `differentiable=True` (the foreach and fused steps refuse it) or
`**kwargs` are reported, not changed.

## Example
```python
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
```
Use instead:
```python
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
```
"""
    OPTIONS = {"fused": (False, "use fused=True for Adam, AdamW and SGD instead of foreach=True")}

    VALID = [
        "import torch\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)\n",
        "import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)\n",
        "import torch\nopt = torch.optim.LBFGS(model.parameters())\n",
        "from mylib.optim import Adam\nopt = Adam(model.parameters())\n",
        "import torch\nopt = torch.optim.Adam(model.parameters())  # zoomer: ignore[single-tensor-optimizer]\n",
        # CPU-only: parameters made on the CPU in this file (ignite's scheduler and logger tests)
        "import torch\n\n\ndef test_linear_scheduler():\n    tensor = torch.zeros([1], requires_grad=True)\n"
        "    optimizer = torch.optim.SGD([tensor], lr=0.0)\n    tensor.grad = torch.ones(1)\n    optimizer.step()\n",
        "import torch\n\n\ndef test_logger():\n    optimizer = torch.optim.SGD([torch.tensor(0.0)], lr=0.01)\n    log(optimizer)\n",
        "import torch\nfrom torch.nn import Parameter\n\nt1 = torch.zeros([1], requires_grad=True)\n"
        "t2 = Parameter(torch.randn(10, 5))\ngroups = [{\"params\": t1, \"lr\": 0.1}, {\"params\": [t2], \"lr\": 0.2}]\n"
        "optimizer = torch.optim.SGD(groups)\n",
        # a test that runs on the CPU only (accelerate's tests/test_optimizer.py)
        "import torch\nfrom accelerate.test_utils import require_cpu\n\n\n@require_cpu\ndef test_pickle_optimizer():\n"
        "    model = create_model()\n    optimizer = torch.optim.SGD(model.parameters(), 0.1)\n",
        # CPU training under CPU autocast (torch.autocast's own docstring example)
        "import torch\nfrom torch import optim\n\nmodel = Net()\noptimizer = optim.SGD(model.parameters(), lr=0.1)\n"
        "for input, target in data:\n    optimizer.zero_grad()\n"
        "    with torch.autocast(device_type=\"cpu\", dtype=torch.bfloat16):\n        loss = loss_fn(model(input), target)\n"
        "    loss.backward()\n    optimizer.step()\n",
        "import torch\n\n\n@torch.cpu.amp.autocast()\ndef step(model, x):\n    return model(x).sum()\n\n\n"
        "opt = torch.optim.NAdam(model.parameters())\n",
        # a file that pins the CPU and names no accelerator
        "import torch\nfrom torch import nn\n\ndevice = torch.device(\"cpu\")\nmodel = nn.Linear(8, 2).to(device)\n"
        "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n",
    ]
    INVALID = [
        # autocast on the GPU, or a CPU autocast in a file that also names the GPU, is no CPU evidence
        Example(
            "import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)\nwith torch.autocast(\"cuda\"):\n"
            "    step()\nwith torch.autocast(device_type=\"cpu\"):\n    model.cuda()\n",
            "import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)\nwith torch.autocast(\"cuda\"):\n"
            "    step()\nwith torch.autocast(device_type=\"cpu\"):\n    model.cuda()\n",
            message_contains="SGD",
        ),
        Example(
            "import torch\nopt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)\n",
            "import torch\nopt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)\n",
            message_contains="foreach=False",
        ),
        # foreach left unset: PyTorch 2.0+ picks foreach already where it can, foreach=True would be a no-op
        Example(
            "from torch import optim\nopt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)\n",
            None,
            message_contains="leaves foreach unset",
        ),
        Example(
            "import torch\nopt = torch.optim.RMSprop(model.parameters(), lr=1e-2, foreach=None)\n",
            None,
            message_contains="would change nothing",
        ),
        Example(
            "from torch.optim import RMSprop\nopt = RMSprop(\n    model.parameters(),\n    lr=1e-2,\n    foreach=False,\n)\n",
            "from torch.optim import RMSprop\nopt = RMSprop(\n    model.parameters(),\n    lr=1e-2,\n    foreach=True,\n)\n",
            message_contains="RMSprop",
        ),
        # fused=True is never the default: asked for, it changes the implementation
        Example(
            "import torch\nopt = torch.optim.Adam(model.parameters(), lr=1e-3)\n",
            "import torch\nopt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)\n",
            message_contains="Adam",
            options={"fused": True},
        ),
        Example(
            "from torch.optim import AdamW\nopt = AdamW(\n    model.parameters(),\n    lr=1e-2,\n)\n",
            "from torch.optim import AdamW\nopt = AdamW(\n    model.parameters(),\n    lr=1e-2,\n    fused=True,\n)\n",
            message_contains="fused=True",
            options={"fused": True},
        ),
        Example(
            "import torch\nopt = torch.optim.Adam(params, differentiable=flag, foreach=False)\n",
            None,
            message_contains="differentiable",
        ),
        Example("import torch\nopt = torch.optim.Adam(params, foreach=False, **cfg)\n", None, message_contains="**"),
        # Adam/AdamW refuse foreach=True with a Tensor lr unless capturable=True (a ValueError when built)
        Example(
            "import torch\nlr = torch.tensor(1e-3)\nopt = torch.optim.AdamW(model.parameters(), lr, foreach=False)\n",
            None,
            message_contains="Tensor lr",
        ),
        # not CPU-only: a tensor made on the GPU; one registered in a module (which may be moved);
        # a CPU fallback next to CUDA; a device handed in by the caller
        Example(
            "import torch\nw = torch.zeros(3, device=\"cuda\", requires_grad=True)\nopt = torch.optim.Adam([w], lr=0.1, foreach=False)\n",
            "import torch\nw = torch.zeros(3, device=\"cuda\", requires_grad=True)\nopt = torch.optim.Adam([w], lr=0.1, foreach=True)\n",
            message_contains="Adam",
        ),
        Example(
            "import torch\nw = torch.nn.Parameter(torch.zeros(3))\nnet.register_parameter(\"w\", w)\n"
            "opt = torch.optim.SGD([w], lr=0.1, foreach=False)\n",
            "import torch\nw = torch.nn.Parameter(torch.zeros(3))\nnet.register_parameter(\"w\", w)\n"
            "opt = torch.optim.SGD([w], lr=0.1, foreach=True)\n",
            message_contains="SGD",
        ),
        Example(
            "import torch\ndevice = \"cuda\" if torch.cuda.is_available() else \"cpu\"\nmodel = Net().to(device)\n"
            "opt = torch.optim.Adam(model.parameters(), foreach=False)\n",
            "import torch\ndevice = \"cuda\" if torch.cuda.is_available() else \"cpu\"\nmodel = Net().to(device)\n"
            "opt = torch.optim.Adam(model.parameters(), foreach=True)\n",
            message_contains="Adam",
        ),
        Example(
            "import torch\n\n\ndef fit(model, device):\n    model.to(device)\n    probe = torch.zeros(1).to(\"cpu\")\n"
            "    return torch.optim.AdamW(model.parameters(), foreach=False)\n",
            "import torch\n\n\ndef fit(model, device):\n    model.to(device)\n    probe = torch.zeros(1).to(\"cpu\")\n"
            "    return torch.optim.AdamW(model.parameters(), foreach=True)\n",
            message_contains="AdamW",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        for call in ctx.nodes(cst.Call):
            cls = next((c for c in FOREACH_CAPABLE if ctx.matches(call, _names(c), {f"optim.{c}", f"torch.optim.{c}"})), None)
            if cls is None:
                continue
            foreach = h.kwarg(call, "foreach")
            fused = h.kwarg(call, "fused")
            if fused is not None and not (h.is_literal(fused.value, False) or h.is_literal(fused.value, None)):
                continue  # fused=True (or a variable): the user chose
            if foreach is not None and not (h.is_literal(foreach.value, False) or h.is_literal(foreach.value, None)):
                continue
            if _runs_on_cpu(ctx, call):
                continue  # foreach=True changes nothing worth having on the CPU
            turned_off = foreach is not None and h.is_literal(foreach.value, False)
            to_fused = self.options["fused"] and cls in FUSED_CAPABLE
            if not turned_off and not to_fused:
                # PyTorch (2.0 and newer) already picks foreach when foreach and fused are left unset,
                # so writing foreach=True changes nothing where that default holds
                yield self.report(call, f"torch.optim.{cls} leaves foreach unset: {DEFAULT_FOREACH}")
                continue
            what = "foreach=False" if turned_off else "no foreach"
            message = f"torch.optim.{cls} with {what} may step each parameter with single-tensor kernels; use foreach=True"
            if h.has_star(call):
                yield self.report(call, message + " (the call takes **kwargs: set it there)")
                continue
            diff = h.kwarg(call, "differentiable")
            if diff is not None and not h.is_literal(diff.value, False):
                yield self.report(call, message + " (not with differentiable=True: check before changing)")
                continue
            if to_fused:
                new = h.set_kwarg(call, "fused", "True")
                message = f"torch.optim.{cls} with {what}: use the fused implementation (fused=True)"
            elif cls in TENSOR_LR_NEEDS_CAPTURABLE and _tensor_lr(ctx, call):
                yield self.report(call, message + " (not with a Tensor lr: foreach=True then needs capturable=True)")
                continue
            else:
                new = h.set_kwarg(call, "foreach", "True")
            yield self.replace(call, message, {call: new})
