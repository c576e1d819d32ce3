"""factory-on-device: tensors created on the CPU and then copied to the GPU."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

FACTORIES = (
    "zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "linspace", "logspace",
    "eye", "tensor", "as_tensor", "zeros_like", "ones_like", "empty_like", "full_like",
)
RANDOM = {"rand", "randn", "randint"}
#: factories whose values the CPU and CUDA kernels compute differently (the CPU accumulates in
#: double, CUDA in float; pytorch/pytorch#40904, #82230: logspace(1, 2, 2, dtype=int32) gives 99 on
#: CUDA, 100 on the CPU)
COMPUTED = {"linspace", "logspace"}


def _arange_exact(call: cst.Call) -> bool:
    """``torch.arange(end)`` / ``arange(start, end[, step])`` with ``start`` and ``step`` integer
    literals (or left out): every value is ``start + i * step`` exactly, on either device. A float
    start or step is summed in double on the CPU and in float on CUDA."""
    if h.has_star(call):
        return False
    pos = h.positionals(call)
    start = h.kwarg(call, "start") or (pos[0] if len(pos) >= 2 else None)
    step = h.kwarg(call, "step") or (pos[2] if len(pos) >= 3 else None)
    return all(a is None or type(h.literal(a.value)) is int for a in (start, step))
BLOCKING_KWARGS = {"device", "out", "requires_grad", "pin_memory", "generator"}


class FactoryOnDevice(Fixer):
    pattern = "extra-copy"
    name = "factory-on-device"
    summary = "torch.zeros/ones/empty/full/rand/arange/tensor(...).to(device) or .cuda(): create the tensor on the device"
    explanation = """\
## What it does
Rewrites a tensor factory whose result is immediately moved to an accelerator,
`torch.zeros(n).to(device)` / `.to("cuda")` / `.cuda()`, into a factory call with
`device=...`: `torch.zeros(n, device=device)`. Factories: `zeros`, `ones`, `empty`, `full`,
`rand`, `randn`, `randint`, `arange`, `linspace`, `logspace`, `eye`, `tensor`, `as_tensor` and
the `*_like` variants. Only device arguments that are statically recognisable (`"cuda"`,
`device`, `args.device`, `x.device`, `torch.device("cuda")`, `local_rank`) are rewritten, so
`.to(torch.float16)` is never touched.

## Why is this bad?
The tensor is allocated and filled on the CPU, then copied host-to-device through pageable
memory (`extra-copy` / `pageable-memcpy` in the trace: `Memcpy HtoD (Pageable -> Device)`
followed by a stall). Created on the device it costs one small fill kernel and no copy.

Random factories (`rand`, `randn`, `randint`) are reported, not rewritten, unless the option
`random` is set (`--option factory-on-device.random=true`).

## Caveats
Created on the device, `rand`/`randn`/`randint` draw from the device's generator instead of the
CPU one: same distribution, different values for a given seed, and every later CPU draw
(shuffling, initialisation) shifts too. That changes a seeded run's results, so those factories
are only rewritten with `random=true`. `linspace` and `logspace` are reported, not rewritten,
and so is `arange` with a start or step that is not an integer literal: the CPU kernels compute
`start + i * step` in double, the CUDA ones in float, so values can differ in the last bit, and
by one once cast to an integer dtype (`torch.logspace(1, 2, 2, dtype=torch.int32)` gives 100 on
the CPU, 99 on CUDA: pytorch/pytorch#82230). Factories that already have `device=`, `out=`,
`requires_grad=` (the result would become a leaf), `pin_memory=` or `generator=` are left alone.

## Example
```python
mask = torch.ones(batch, seq).to(device)
```
Use instead:
```python
mask = torch.ones(batch, seq, device=device)
```
"""
    OPTIONS = {
        "random": (
            False,
            "also rewrite rand/randn/randint (off: reported only; on: the draws move to the device generator, so a seeded run's values change)",
        )
    }

    VALID = [
        "import torch\nx = torch.zeros(4, device=device)\n",
        "import torch\nx = torch.zeros(4).to(torch.float16)\n",
        "import torch\nx = torch.zeros(4).to(dtype)\n",
        "import torch\nx = torch.zeros(4).to('cpu')\n",
        "import torch\nx = torch.zeros(4, requires_grad=True).cuda()\n",
        "import torch\nx = torch.zeros(4).to(device)  # zoomer: ignore[extra-copy]\n",
        "import torch\nx = torch.zeros(4).to(other)\n",
    ]
    INVALID = [
        Example(
            "import torch\nmask = torch.ones(batch, seq).to(device)\n",
            "import torch\nmask = torch.ones(batch, seq, device=device)\n",
            message_contains="torch.ones",
        ),
        Example(
            "import torch\nidx = torch.arange(0, n, dtype=torch.long).cuda()\n",
            'import torch\nidx = torch.arange(0, n, dtype=torch.long, device="cuda")\n',
            message_contains="copied",
        ),
        Example(
            "import torch\nt = torch.tensor([1.0, 2.0]).to(x.device)\nz = torch.zeros(\n    3,\n    4,\n).to(device='cuda:0')\n",
            "import torch\nt = torch.tensor([1.0, 2.0], device=x.device)\nz = torch.zeros(\n    3,\n    4,\n    device='cuda:0',\n)\n",
            message_contains="device=",
        ),
        # by default a random factory is reported only: its draws would leave the CPU generator
        Example(
            "import torch\nnoise = torch.randn(8).to(device)\n",
            None,
            message_contains="randn",
        ),
        Example(
            "import torch\nnoise = torch.randn(8).to(device)\n",
            "import torch\nnoise = torch.randn(8, device=device)\n",
            message_contains="randn",
            options={"random": True},
        ),
        Example("import torch\nx = torch.zeros(*shape, **kw).to(device)\n", None, message_contains="**"),
        # values the CPU and CUDA kernels compute differently: linspace, logspace, arange with a float step
        Example(
            "import torch\nt = torch.linspace(0.0004, 0, 204).to(device)\np = torch.logspace(1, 2, 2, dtype=torch.int32).cuda()\n"
            "f = torch.arange(0.0, 1.0, 0.1).to(device)\ns = torch.arange(0, 1, step).cuda()\n",
            None,
            message_contains="compute the values differently",
        ),
        Example(
            "import torch\npos = torch.arange(seq_len).to(device)\nodd = torch.arange(1, n, 2).cuda()\n",
            'import torch\npos = torch.arange(seq_len, device=device)\nodd = torch.arange(1, n, 2, device="cuda")\n',
            message_contains="arange",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        for call in ctx.nodes(cst.Call):
            m = h.method(call)
            if m is None or m[1] not in ("to", "cuda") or not isinstance(m[0], cst.Call):
                continue
            inner = m[0]
            factory = next((f for f in FACTORIES if ctx.matches(inner, {f"torch.{f}"}, {f"torch.{f}"})), None)
            if factory is None:
                continue
            device = self._device(ctx, call, m[1])
            if device is None:
                continue
            message = f"torch.{factory}(...) is created on the CPU and copied to the device; create it there with device={device}"
            if h.has_star(inner) and any(a.star == "**" for a in inner.args):
                yield self.report(call, message + " (the factory takes **kwargs)")
                continue
            if any(h.kwarg(inner, k) is not None for k in BLOCKING_KWARGS):
                continue
            if factory in RANDOM and not self.options["random"]:
                yield self.report(
                    call,
                    message + " (report only: the draws would move from the CPU generator to the device one and change"
                    " a seeded run's values; set the option random=true to rewrite)",
                )
                continue
            if factory in COMPUTED or (factory == "arange" and not _arange_exact(inner)):
                yield self.report(
                    call,
                    message + f" (report only: the CPU and CUDA kernels of {factory} compute the values differently, in"
                    " double and in float, so some would change in the last bit or, cast to an integer dtype, by one)",
                )
                continue
            new = h.add_kwargs(inner, [("device", device)])
            yield self.replace(call, message, {call: new.with_changes(lpar=call.lpar, rpar=call.rpar)})

    @staticmethod
    def _device(ctx: Context, call: cst.Call, kind: str) -> str | None:
        """The device expression (source) of ``.to(dev)`` / ``.to(device=dev)`` / ``.cuda()``."""
        if kind == "cuda":
            return '"cuda"' if not call.args else None
        if len(call.args) != 1 or call.args[0].star:
            return None
        arg = call.args[0]
        if arg.keyword is not None and arg.keyword.value != "device":
            return None
        if not h.is_device_expr(ctx, arg.value):
            return None
        return ctx.code(arg.value)
