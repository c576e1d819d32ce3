"""dataloader-workers: a DataLoader that loads batches in the training process."""

from __future__ import annotations

from typing import Iterable

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer


class DataLoaderWorkers(Fixer):
    pattern = "dataloader-bound"
    name = "dataloader-workers"
    summary = "DataLoader without worker processes: add num_workers, pin_memory, persistent_workers, prefetch_factor"
    explanation = """\
## What it does
Flags `DataLoader(...)` calls that leave `num_workers` unset or set it to `0`, and adds
`num_workers=<N>` (default 4), `pin_memory=True`, `persistent_workers=True` and
`prefetch_factor=2`. Arguments already given are kept; an explicit non-zero `num_workers`
(literal or variable) is left alone.

## Why is this bad?
With `num_workers=0` every batch is loaded, decoded and collated in the training process,
between steps: the GPU waits for the input pipeline (the trace shows `dataloader-bound`: long
`enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__` spans and GPU idle gaps). Worker
processes prefetch batches while the GPU computes; pinned (page-locked) batches can be copied
to the GPU asynchronously; persistent workers avoid re-forking the workers every epoch.

## Caveats
Workers are separate processes: the dataset must be picklable and, on platforms that `spawn`
(macOS, Windows), the script needs an `if __name__ == "__main__":` guard. The number of workers
is a starting point: size it from the trace (option `num_workers`) and the CPU count.
Calls with `*args`/`**kwargs` or with `num_workers` passed positionally are reported, not changed.

## Example
```python
loader = DataLoader(dataset, batch_size=64, shuffle=True)
```
Use instead:
```python
loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2)
```
"""
    OPTIONS = {
        "num_workers": (4, "worker processes to add (e.g. from trace evidence); at least 1"),
        "prefetch_factor": (2, "batches prefetched per worker"),
    }

    VALID = [
        "loader = DataLoader(ds, batch_size=32, num_workers=8)\n",
        "loader = DataLoader(ds, num_workers=args.workers, pin_memory=True)\n",
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, num_workers=2, pin_memory=False)\n",
        # a project's own DataLoader class is not torch's
        "class DataLoader:\n    pass\n\nloader = DataLoader(ds)\n",
        # suppressed
        "loader = DataLoader(ds)  # zoomer: ignore[dataloader-bound]\n",
        "loader = DataLoader(ds)  # zoomer: ignore\n",
        "from mylib import DataLoader\nloader = DataLoader(ds)\n",
    ]
    INVALID = [
        Example(
            "loader = DataLoader(ds, batch_size=32, shuffle=True)\n",
            "loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2)\n",
            message_contains="num_workers",
        ),
        Example(
            "import torch\nloader = torch.utils.data.DataLoader(ds, num_workers=0)\n",
            "import torch\nloader = torch.utils.data.DataLoader(ds, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2)\n",
            message_contains="num_workers=0",
        ),
        Example(
            "from torch.utils.data import DataLoader as DL\n"
            "loader = DL(\n"
            "    ds,\n"
            "    batch_size=32,  # per GPU\n"
            "    pin_memory=False,\n"
            ")\n",
            "from torch.utils.data import DataLoader as DL\n"
            "loader = DL(\n"
            "    ds,\n"
            "    batch_size=32,  # per GPU\n"
            "    pin_memory=False,\n"
            "    num_workers=8,\n"
            "    persistent_workers=True,\n"
            "    prefetch_factor=2,\n"
            ")\n",
            message_contains="DataLoader",
            options={"num_workers": 8},
        ),
        Example(
            "loader = DataLoader(ds, 64, True, None, None, 0)\n",
            None,
            message_contains="positionally",
        ),
        Example("loader = DataLoader(ds, **loader_kwargs)\n", None, message_contains="**"),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        workers = max(1, int(self.options["num_workers"]))
        prefetch = max(1, int(self.options["prefetch_factor"]))
        for call in h.dataloader_calls(ctx):
            if not h.dataloader_is_serial(call):
                continue
            if h.has_star(call):
                yield self.report(call, "DataLoader may load batches in the main process (num_workers unset); it takes **kwargs, so set num_workers/pin_memory there")
                continue
            if len(h.positionals(call)) > 5:
                yield self.report(call, "DataLoader gets num_workers positionally; pass num_workers>0 and pin_memory=True by keyword")
                continue
            arg = h.kwarg(call, "num_workers")
            what = "num_workers=0" if arg is not None else "no num_workers"
            message = f"DataLoader with {what} loads every batch in the training process; use worker processes (num_workers={workers}) and pinned memory"
            new = call
            if arg is not None:
                new = h.set_kwarg(new, "num_workers", str(workers))
            add = [] if arg is not None else [("num_workers", str(workers))]
            if h.kwarg(call, "pin_memory") is None:
                add.append(("pin_memory", "True"))
            if h.kwarg(call, "persistent_workers") is None:
                add.append(("persistent_workers", "True"))
            if h.kwarg(call, "prefetch_factor") is None:
                add.append(("prefetch_factor", str(prefetch)))
            new = h.add_kwargs(new, add)
            yield self.replace(call, message, {call: new})
