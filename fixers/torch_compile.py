"""torch-compile (opt-in): an eager nn.Module that could be compiled."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

MODULE_BASES = {"torch.nn.Module", "torch.nn.modules.module.Module"}
MODULE_BASES_BARE = {"nn.Module", "torch.nn.Module", "Module"}
CHAIN_METHODS = {"to", "cuda", "train", "half", "float", "bfloat16", "to_empty"}
MODEL_FACTORIES_PREFIX = ("torchvision.models.", "timm.create_model", "transformers.AutoModel")


def _module_classes(ctx: Context) -> set[str]:
    """Names of classes defined in this file that derive (transitively) from nn.Module."""
    classes = {c.name.value: c for c in ctx.nodes(cst.ClassDef)}
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, cls in classes.items():
            if name in found:
                continue
            for base in cls.bases:
                if base.keyword is not None:
                    continue
                if ctx.matches(base.value, MODULE_BASES, MODULE_BASES_BARE) or h.dotted(base.value) in found:
                    found.add(name)
                    changed = True
                    break
    return found


def _constructor(value: cst.BaseExpression) -> cst.Call | None:
    """``Net(...)`` in ``Net(...)``, ``Net(...).to(dev)``, ``Net().cuda().train()``."""
    while isinstance(value, cst.Call):
        m = h.method(value)
        if m is not None and m[1] in CHAIN_METHODS and isinstance(m[0], cst.Call):
            value = m[0]
            continue
        return value
    return None


class TorchCompile(Fixer):
    pattern = "launch-bound"
    name = "torch-compile"
    opt_in = True
    summary = "model built from an nn.Module and run eagerly: compile it with torch.compile"
    explanation = """\
## What it does
After `model = Net(...)` (optionally `.to(device)`/`.cuda()`), where `Net` is an `nn.Module`
subclass defined in the same file or a `torchvision.models` / `timm.create_model` factory, adds
`model = torch.compile(model)`. Files that already call `torch.compile` are left alone.
**Opt-in**: reported by default, rewritten only when selected explicitly
(`--select torch-compile` or `--select launch-bound`).

## Why is this bad?
In eager mode every operator is a separate kernel launch from Python. Models made of many
small operators spend more time launching than computing: the GPU waits for the CPU
(`launch-bound` in the trace: short kernels separated by gaps, the CPU thread busy in
`cudaLaunchKernel`). `torch.compile` fuses operators into fewer, larger kernels (and can use
CUDA graphs with `mode="reduce-overhead"`).

## Caveats
Compilation takes time on the first steps and on shape changes; the compiled module's
`state_dict()` keys gain an `_orig_mod.` prefix (save `model._orig_mod` or strip the prefix
when checkpointing); some code (graph breaks, dynamic control flow) compiles poorly. That is
why the fix is opt-in. With DDP, compile the DDP-wrapped model.

## Example
```python
model = Net().to(device)
```
Use instead:
```python
model = Net().to(device)
model = torch.compile(model)
```
"""

    VALID = [
        "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    pass\nmodel = Net()\nmodel = torch.compile(model)\n",
        "import torch\nmodel = Net()\n",  # Net is not known to be a module
        "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    pass\nmodel = Net()  # zoomer: ignore[launch-bound]\n",
        "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    pass\nnet = Net()\nopt = torch.compile(net, mode='max-autotune')\n",
    ]
    INVALID = [
        Example(
            "import torch\nimport torch.nn as nn\n\n\nclass Net(nn.Module):\n    pass\n\n\nmodel = Net().to(device)\nopt = make_opt(model)\n",
            "import torch\nimport torch.nn as nn\n\n\nclass Net(nn.Module):\n    pass\n\n\nmodel = Net().to(device)\nmodel = torch.compile(model)\nopt = make_opt(model)\n",
            message_contains="torch.compile",
        ),
        Example(
            "import torch\nimport torchvision\n\ndef main():\n    net = torchvision.models.resnet50(weights=None).cuda()  # backbone\n    train(net)\n",
            "import torch\nimport torchvision\n\ndef main():\n    net = torchvision.models.resnet50(weights=None).cuda()  # backbone\n    net = torch.compile(net)\n    train(net)\n",
            message_contains="eager",
        ),
        Example(
            "from torch import nn\nclass Net(nn.Module):\n    pass\nmodel = Net()\n",
            None,
            message_contains="import torch",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        for call in ctx.nodes(cst.Call):
            if ctx.matches(call, {"torch.compile"}, {"torch.compile"}) or (
                isinstance(call.func, cst.Attribute) and call.func.attr.value == "compile" and h.dotted(call.func.value) in ("torch", ctx.torch_alias())
            ):
                return  # the file already compiles something: leave it to the author
        modules = _module_classes(ctx)
        alias = ctx.torch_alias()
        for assign in ctx.nodes(cst.Assign):
            if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
                continue
            ctor = _constructor(assign.value)
            if ctor is None:
                continue
            names = ctx.qualnames(ctor.func)
            if not any(q in modules or q.startswith(MODEL_FACTORIES_PREFIX) for q in names):
                continue
            target = assign.targets[0].target.value
            message = f"{target} runs eagerly: every operator is a separate kernel launch; torch.compile({target}) fuses them"
            line = ctx.parent(assign)
            if alias is None:
                yield self.report(assign.value, message + " (add `import torch` first)")
                continue
            if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
                yield self.report(assign.value, message)
                continue
            new = h.simple_stmt(f"{target} = {alias}.compile({target})\n")
            yield self.replace(assign.value, message, h.insert_after(line, [new]))
