"""optimizer-foreach: torch.optim optimizers stepping one tensor at a time."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

FOREACH_CAPABLE = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop")
FUSED_CAPABLE = ("Adam", "AdamW", "SGD")


def _names(cls: str) -> set[str]:
    return {f"torch.optim.{cls}", f"torch.optim.{cls.lower()}.{cls}"}


class OptimizerForeach(Fixer):
    pattern = "single-tensor-optimizer"
    name = "optimizer-foreach"
    summary = "torch.optim optimizer with foreach=False or unset: use the multi-tensor (foreach) implementation"
    explanation = """\
## What it does
Flags `torch.optim.Adam/AdamW/SGD/RMSprop/Adagrad/Adadelta/Adamax/NAdam/RAdam/ASGD/Rprop(...)`
constructed with `foreach=False` or without `foreach`, and sets `foreach=True`. With the option
`fused=True`, Adam, AdamW and SGD get `fused=True` instead. An optimizer already created with
`fused=True` or `foreach=True` is left alone.

## Why is this bad?
The single-tensor ("for-loop") implementation launches several small kernels per parameter
per step: for a model with hundreds of parameter tensors, `optimizer.step()` becomes a long
train of tiny kernels (`single-tensor-optimizer` in the trace: many `aten::add_`/`aten::mul_`
launches inside `Optimizer.step`). The foreach implementation updates all parameters with a few
multi-tensor kernels; the fused one with one kernel.

## Caveats
`foreach` needs the parameters on one device type; it uses a little more peak memory (a
temporary per parameter group). `fused=True` needs floating-point CUDA (or, in recent releases,
CPU) parameters. Optimizers with `differentiable=True` or `**kwargs` are reported, not changed.

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
    ]
    INVALID = [
        Example(
            "import torch\nopt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)\n",
            "import torch\nopt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)\n",
            message_contains="foreach=False",
        ),
        Example(
            "from torch import optim\nopt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)\n",
            "from torch import optim\nopt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)\n",
            message_contains="single-tensor",
        ),
        Example(
            "from torch.optim import RMSprop\nopt = RMSprop(\n    model.parameters(),\n    lr=1e-2,\n)\n",
            "from torch.optim import RMSprop\nopt = RMSprop(\n    model.parameters(),\n    lr=1e-2,\n    foreach=True,\n)\n",
            message_contains="RMSprop",
        ),
        Example(
            "import torch\nopt = torch.optim.Adam(model.parameters(), lr=1e-3)\n",
            "import torch\nopt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)\n",
            message_contains="Adam",
            options={"fused": True},
        ),
        Example(
            "import torch\nopt = torch.optim.Adam(params, differentiable=flag)\n",
            None,
            message_contains="differentiable",
        ),
        Example("import torch\nopt = torch.optim.Adam(params, **cfg)\n", None, message_contains="**"),
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
            what = "foreach=False" if foreach is not None and h.is_literal(foreach.value, False) else "no foreach"
            message = f"torch.optim.{cls} with {what} may step each parameter with single-tensor kernels; use foreach=True"
            if h.has_star(call):
                yield self.report(call, message + " (the call takes **kwargs: set it there)")
                continue
            diff = h.kwarg(call, "differentiable")
            if diff is not None and not h.is_literal(diff.value, False):
                yield self.report(call, message + " (not with differentiable=True: check before changing)")
                continue
            if self.options["fused"] and cls in FUSED_CAPABLE:
                new = h.set_kwarg(call, "fused", "True")
                message = f"torch.optim.{cls} with {what}: use the fused implementation (fused=True)"
            else:
                new = h.set_kwarg(call, "foreach", "True")
            yield self.replace(call, message, {call: new})
