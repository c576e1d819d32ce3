"""ddp-bucket-view (opt-in): DistributedDataParallel copying gradients into its buckets."""

from __future__ import annotations

import math
from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer, FixerError

DDP_NAMES = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
DDP_BARE = {"DDP", "DistributedDataParallel", "nn.parallel.DistributedDataParallel", "torch.nn.parallel.DistributedDataParallel"}


class DdpBucketView(Fixer):
    pattern = "extra-copy"
    name = "ddp-bucket-view"
    opt_in = True
    summary = "DistributedDataParallel without gradient_as_bucket_view: let gradients alias the all-reduce buckets"
    explanation = """\
## What it does
Adds `gradient_as_bucket_view=True` (and `bucket_cap_mb=<N>` when the option is given, e.g.
sized from the trace's all-reduce evidence) to `DistributedDataParallel(...)` / `DDP(...)`
calls that do not set it. An explicit `gradient_as_bucket_view=False` is reported, not changed;
so is a call passing ten or more arguments by position (`gradient_as_bucket_view` may be one of them).
**Opt-in**: reported by default, rewritten only when selected explicitly
(`--select ddp-bucket-view` or `--select extra-copy`).

## Why is this bad?
By default DDP copies every gradient into its flat communication buckets before each
all-reduce and back afterwards: extra device copies on the critical path and a second copy of
all gradients in memory. In a GPU trace the copies into the buckets are `Memcpy DtoD` events during
backward: the time `extra-copy` measures, which is why the fixer is filed under it. With bucket views
the gradients *are* the buckets. This saves those copies and the memory; it does not by itself make
the all-reduce overlap the backward pass any more. For overlap (`exposed-communication` in the
trace: NCCL kernels not hidden behind compute), smaller buckets start communicating earlier:
`bucket_cap_mb` below the default 25 (the option sets a value you choose; a larger one delays the
first all-reduce).

## Caveats
Gradients become views into the buckets: code that calls `p.grad.detach_()` or replaces
`p.grad` tensors in place of the views is affected (`zero_grad(set_to_none=True)` is fine).
That is why the fix is opt-in.

## Example
```python
model = DDP(model, device_ids=[local_rank])
```
Use instead:
```python
model = DDP(model, device_ids=[local_rank], gradient_as_bucket_view=True)
```
"""
    OPTIONS = {"bucket_cap_mb": (None, "also set bucket_cap_mb (MB) when the call does not")}

    def __init__(self, **options):
        super().__init__(**options)
        cap = self.options["bucket_cap_mb"]  # no default to take a type from: written into the call as given
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap) or cap <= 0):
            raise FixerError(f"fixer {self.name}: option bucket_cap_mb: expected a number of MB above 0, got {cap!r}")

    VALID = [
        "from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(model, gradient_as_bucket_view=True)\n",
        "model = DDP(model, device_ids=[rank])  # zoomer: ignore[extra-copy]\n",
        "from mylib import DDP\nmodel = DDP(model)\n",
    ]
    INVALID = [
        Example(
            "from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(model, device_ids=[local_rank])\n",
            "from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(model, device_ids=[local_rank], gradient_as_bucket_view=True)\n",
            message_contains="gradient_as_bucket_view",
        ),
        Example(
            "import torch\nmodel = torch.nn.parallel.DistributedDataParallel(\n    model,\n    device_ids=[rank],\n)\n",
            "import torch\nmodel = torch.nn.parallel.DistributedDataParallel(\n    model,\n    device_ids=[rank],\n    gradient_as_bucket_view=True,\n    bucket_cap_mb=100,\n)\n",
            message_contains="copies",
            options={"bucket_cap_mb": 100},
        ),
        Example(
            "model = DDP(model, gradient_as_bucket_view=False)\n",
            None,
            message_contains="gradient_as_bucket_view=False",
        ),
        # every parameter by position, gradient_as_bucket_view among them: the keyword would name it twice
        Example(
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "model = DDP(model, [0], 0, 0, True, True, None, 25, False, False, True)\n",
            None,
            message_contains="by position",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        cap = self.options["bucket_cap_mb"]
        for call in ctx.nodes(cst.Call):
            if not ctx.matches(call, DDP_NAMES, DDP_BARE):
                continue
            view = h.kwarg(call, "gradient_as_bucket_view")
            if view is not None:
                if h.is_literal(view.value, False):
                    yield self.report(call, "DDP with gradient_as_bucket_view=False copies every gradient into the all-reduce buckets and back")
                continue
            message = "DDP copies every gradient into its all-reduce buckets and back; set gradient_as_bucket_view=True"
            if h.has_star(call):
                yield self.report(call, message + " (the call takes **kwargs: set it there)")
                continue
            if len(h.positionals(call)) >= 10:  # its 10th argument, the 11th since DDP took init_sync
                yield self.report(call, message + " (the call passes 10 or more arguments by position and "
                                  "gradient_as_bucket_view may be one of them: set it by keyword)")
                continue  # adding the keyword could name it twice: a TypeError when DDP is built
            add = [("gradient_as_bucket_view", "True")]
            if cap is not None and h.kwarg(call, "bucket_cap_mb") is None and len(h.positionals(call)) < 6:
                add.append(("bucket_cap_mb", repr(cap)))
            yield self.replace(call, message, {call: h.add_kwargs(call, add)})
