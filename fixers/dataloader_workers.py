"""dataloader-workers: a DataLoader that loads batches in the training process."""

from __future__ import annotations

from typing import Any, Iterable

import libcst as cst

from zoomer_ar.fix import flow
from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer, FixerError
from zoomer_ar.fix.datasets import ITERABLE, UNKNOWN, datasets_of, loader_verdict
from zoomer_ar.fix.loader_workers import dataset_change, workers_refusal
from zoomer_ar.fix.worker_count import EXPRESSION, MAX_WORKERS, NAME, runtime_count

#: the batches each worker prefetches when prefetch_factor is not given (torch >= 2.0, and 2 before)
TORCH_PREFETCH = 2


def _chosen_workers(ctx: Context, call: cst.Call) -> bool:
    """The call sets ``num_workers`` to something other than a literal 0 where the keyword check
    does not look: positionally (the sixth argument, ``DataLoader(ds, 64, True, None, None, 4)``)
    or in a ``**`` dict built in this file (``**{"num_workers": 4}``, ``**dict(num_workers=4)``,
    ``**kw`` with ``kw = dict(..., num_workers=4)`` in its scope, or ``kw["num_workers"] = 4``
    there outside any if/loop/try).
    A count the user chose is theirs, like ``num_workers=4`` by keyword."""
    def chosen(value: cst.BaseExpression) -> bool:
        return not h.is_literal(value, 0)

    if not h.has_star(call):
        pos = h.positionals(call)
        return len(pos) > 5 and chosen(pos[5].value)
    for arg in call.args:
        if arg.star != "**":
            continue
        value = _workers_in_dict(arg.value)
        if value is not None:
            return chosen(value)
        if isinstance(arg.value, cst.Name):
            scope = ctx.enclosing_scope(call)
            values = []
            for n in flow.names_in(ctx, scope, arg.value.value):
                p = ctx.parent(n)
                if isinstance(p, cst.AssignTarget):
                    assign = ctx.parent(p)
                    values.append(_workers_in_dict(assign.value) if isinstance(assign, cst.Assign) else None)
                elif (isinstance(p, cst.Subscript) and p.value is n and isinstance(ctx.parent(p), cst.AssignTarget)
                      and len(p.slice) == 1 and isinstance(p.slice[0].slice, cst.Index)
                      and h.string_value(p.slice[0].slice.value) == "num_workers"):
                    assign = ctx.parent(ctx.parent(p))
                    line = ctx.parent(assign)
                    if isinstance(assign, cst.Assign) and ctx.parent(line) is flow.body_of(scope):
                        return chosen(assign.value)  # set unconditionally, not under an if/loop/try
                elif flow.is_store(ctx, n):
                    values.append(None)  # a parameter, a loop target, unpacking: not visible
            if values and all(v is not None for v in values):
                return all(chosen(v) for v in values)
    return False


def _workers_in_dict(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """The value at ``"num_workers"`` of a dict literal or of ``dict(num_workers=...)``."""
    if isinstance(expr, cst.Dict):
        for el in expr.elements:
            if isinstance(el, cst.DictElement) and h.string_value(el.key) == "num_workers":
                return el.value
    if isinstance(expr, cst.Call) and h.dotted(expr.func) == "dict":
        arg = h.kwarg(expr, "num_workers")
        return arg.value if arg is not None else None
    return None


#: what the fix inserts after a file's leading imports (the examples' text)
_COUNT = f"\n{NAME} = {EXPRESSION}\n"


class DataLoaderWorkers(Fixer):
    pattern = "dataloader-bound"
    name = "dataloader-workers"
    summary = "DataLoader without worker processes: add num_workers (sized to the CPUs when the program runs), pin_memory, persistent_workers"
    explanation = """\
## What it does
Flags `DataLoader(...)` calls that leave `num_workers` unset or set it to `0`, and gives them
worker processes sized to the machine the program runs on, which the trace does not tell: it
adds, once per file after the leading imports (with `import os` where they lack it),

```python
DATALOADER_WORKERS = max(0, min(
    8,
    (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    // int(os.environ.get("LOCAL_WORLD_SIZE") or 1) - 1,
))
```

(the CPUs the process may use, shared by the node's training processes, one core left to each,
at most 8) and passes `num_workers=DATALOADER_WORKERS, pin_memory=True,
persistent_workers=DATALOADER_WORKERS > 0`. On a single core the count is 0: a worker would only
take turns with training there (the dataloader_bound scenario pinned to one core: 50.8 ms/step
with 0 workers, 55.1 with 1, 57.4 with 2), so it keeps loading in the training process, and
`persistent_workers` (which torch refuses without workers) is then False. On 2 cores it is 1
(50.2 -> 30.9 ms/step on an otherwise idle 2-core machine; 2 and 4 workers gave 32.5 and 31.9).
`prefetch_factor` is left to torch's default (2 per worker) unless the option sets another, which
is then written `N if DATALOADER_WORKERS else None`. The option `num_workers` writes that number
instead (with `persistent_workers=True, prefetch_factor=2`). A file that already uses the name
`DATALOADER_WORKERS` for something else, or defines it after the loader, is reported, not changed.

Arguments already given are kept; an explicit `num_workers` other than a
literal `0` (a number or a variable; by keyword, positionally as the sixth argument, or in a
`**` dict built in the file: `**{"num_workers": 4}`, `**dict(num_workers=4)`, `**kw` with
`kw = dict(..., num_workers=4)`, or `kw["num_workers"] = 4` not under an `if`, loop or `try`)
is the user's choice and is left alone.

Only map-style datasets get workers. A DataLoader over an iterable-style dataset (an
`IterableDataset` subclass of this file, through its bases, a datapipe, `ChainDataset`,
`load_dataset(..., streaming=True)`, `.to_iterable_dataset()`, or a name assigned one) is
reported, not changed: every worker iterates its own copy of the dataset, so unless `__iter__`
splits the stream with `torch.utils.data.get_worker_info()`, N workers yield every sample N
times. A dataset whose kind is not visible (a parameter, an imported class) is changed only when
nothing suggests an iterable-style one: not when the file uses such datasets (`IterableDataset`,
`get_worker_info`, datapipes, `streaming=True`, a class with `__iter__` but no `__getitem__`)
or when its name reads like a stream (`train_iter`, `StreamingCorpus`). `shuffle=True`, a
`sampler` or a `batch_sampler` prove a map-style dataset (DataLoader refuses them for an
IterableDataset), and so do `TensorDataset`, `Subset`, `ConcatDataset`, `torchvision.datasets.*`
and this file's `Dataset` subclasses.

It reports only, too, in a test module (`test_*.py`, `*_test.py`, `conftest.py`: workers would
change what the test exercises, and start for every small loader of the run) and when the
loader's `collate_fn` or `worker_init_fn` is a lambda or a function defined inside a function
(also through `functools.partial`): workers started by spawn (macOS, Windows; Linux's default from
Python 3.14) receive them pickled, and pickle cannot find those by name. So is every loader of a
script that runs its training as it is imported: a loop over a loader made at its top level, or a
call of one of its functions (or of a method of one of its classes) that makes a loader, loops
over one made at the top level, or loops and is given one, outside every function and an
`if __name__ == "__main__":` block (a helper that only builds something, `vocab = load_vocab(path)`,
runs no training). Those workers import the script again, run
the training themselves and try to start workers of their own while starting (RuntimeError: "An
attempt has been made to start a new process before the current process has finished its
bootstrapping phase"); put that code under such a block first. And so is a loader whose dataset
the program changes while iterating it (an attribute set, or a `set_*`/`update*`/`reset*`/
`shuffle*`/`close*`-style method called, on the dataset or on `loader.dataset`, inside the `for`
over the loader): each worker holds its own copy, which never sees the change. A dataset changed
between epochs (`ds.set_epoch(epoch)` before the `for` over the loader) gets workers but not
`persistent_workers=True`: workers started once would keep the first epoch's copy.

## Why is this bad?
With `num_workers=0` every batch is loaded, decoded and collated in the training process,
between steps: the GPU waits for the input pipeline (the trace shows `dataloader-bound`: long
`enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__` spans and GPU idle gaps). Worker
processes prefetch batches while the GPU computes; pinned (page-locked) batches can be copied
to the GPU asynchronously; persistent workers avoid re-forking the workers every epoch.

## Caveats
Workers are separate processes: the dataset must be picklable, and workers started by spawn
(macOS, Windows; Linux's default from Python 3.14) import the script again: a script that trains
as it is imported is reported, not changed (see above). The computed count
assumes the CPUs are the job's: on a machine other jobs keep busy, workers take turns with them
and with training, and the loader can end up slower than loading in the training process. Size it
from the trace and the free cores there (option `num_workers`). The constant lies outside the
changed lines of a pull request, so `zoomer-ar review` shows this fix as a diff, not a one-click
suggestion, unless the file defines `DATALOADER_WORKERS` already.
Calls with `*args`/`**kwargs` or with `num_workers` passed positionally are reported, not changed.
A dataset whose kind is not visible in the file is assumed map-style unless the file or its
name hints otherwise: check the datasets other modules define.

## Example
```python
loader = DataLoader(dataset, batch_size=64, shuffle=True)
```
Use instead:
```python
import os

DATALOADER_WORKERS = max(0, min(
    8,
    (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    // int(os.environ.get("LOCAL_WORLD_SIZE") or 1) - 1,
))
loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=DATALOADER_WORKERS, pin_memory=True,
                    persistent_workers=DATALOADER_WORKERS > 0)
```
"""
    OPTIONS = {
        "num_workers": (None, "worker processes to add, written as that number (e.g. from trace evidence; at least 1); "
                              "unset: DATALOADER_WORKERS, computed when the program runs from the CPUs it may use"),
        "prefetch_factor": (2, "batches prefetched per worker"),
    }

    VALID = [
        "loader = DataLoader(ds, batch_size=32, num_workers=8)\n",
        # the fix's own output: a count computed when the program runs is a chosen one
        "import os\nDATALOADER_WORKERS = max(0, min(8, (os.cpu_count() or 1) - 1))\n"
        "loader = DataLoader(ds, num_workers=DATALOADER_WORKERS, pin_memory=True, persistent_workers=DATALOADER_WORKERS > 0)\n",
        "loader = DataLoader(ds, num_workers=args.workers, pin_memory=True)\n",
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, num_workers=2, pin_memory=False)\n",
        # a project's own DataLoader class is not torch's
        "class DataLoader:\n    pass\n\nloader = DataLoader(ds)\n",
        # suppressed
        "loader = DataLoader(ds)  # zoomer: ignore[dataloader-bound]\n",
        "loader = DataLoader(ds)  # zoomer: ignore\n",
        "from mylib import DataLoader\nloader = DataLoader(ds)\n",
        # a worker count chosen positionally or in a ** dict of the file is the user's too
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, 64, True, None, None, 4)\n",
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, 64, True, None, None, cfg.workers, collate)\n",
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, **{\"batch_size\": 8, \"num_workers\": 4})\n",
        "from torch.utils.data import DataLoader\n\n\ndef build(ds, batch_size):\n"
        "    loader_kwargs = dict(batch_size=batch_size, num_workers=4, pin_memory=True)\n"
        "    return DataLoader(ds, shuffle=True, **loader_kwargs)\n",
        "from torch.utils.data import DataLoader\n\n\ndef build(ds, kw):\n    kw[\"num_workers\"] = 4\n"
        "    return DataLoader(ds, **kw)\n",
        # an explicit num_workers is the user's, even over an IterableDataset
        "from torch.utils.data import DataLoader, IterableDataset\n\n\nclass S(IterableDataset):\n"
        "    def __iter__(self):\n        return iter(range(8))\n\n\nloader = DataLoader(S(), num_workers=2)\n",
    ]
    INVALID = [
        Example(
            "loader = DataLoader(ds, batch_size=32, shuffle=True)\n",
            "loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2)\n",
            message_contains="num_workers",
            options={"num_workers": 4},
        ),
        Example(
            "import torch\nloader = torch.utils.data.DataLoader(ds, num_workers=0)\n",
            "import torch\nloader = torch.utils.data.DataLoader(ds, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2)\n",
            message_contains="num_workers=0",
            options={"num_workers": 4},
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
        # a ** dict of the file that sets num_workers=0: still a loader without workers
        Example("loader = DataLoader(ds, **{\"batch_size\": 8, \"num_workers\": 0})\n", None, message_contains="**"),
        # num_workers rescaled only when the caller passed one (ignite's auto_dataloader): may be unset
        Example(
            "from torch.utils.data import DataLoader\n\n\ndef auto_dataloader(ds, **kwargs):\n"
            "    if \"num_workers\" in kwargs:\n        kwargs[\"num_workers\"] = kwargs[\"num_workers\"] // 2\n"
            "    return DataLoader(ds, **kwargs)\n",
            None,
            message_contains="**",
        ),
        # iterable-style datasets: every worker would replay the whole stream (4 workers: 4x the data)
        Example(
            "import torch\nfrom torch.utils.data import DataLoader, IterableDataset\n\n\n"
            "class Stream(IterableDataset):\n    def __iter__(self):\n        return iter(range(8))\n\n\n"
            "def count():\n    loader = DataLoader(Stream(), batch_size=None)\n    return sum(1 for _ in loader)\n\n\n"
            "if __name__ == \"__main__\":\n    print(count())\n",
            None,
            message_contains="replay the whole stream",
        ),
        Example(
            "import torch.utils.data as tud\n\n\nclass Base(tud.IterableDataset):\n    pass\n\n\n"
            "class Shards(Base):\n    def __iter__(self):\n        info = tud.get_worker_info()\n        yield from range(8)\n\n\n"
            "ds = Shards()\nloader = tud.DataLoader(ds, num_workers=0)\n",
            None,
            message_contains="its class calls get_worker_info()",
        ),
        Example(
            "from datasets import load_dataset\nfrom torch.utils.data import DataLoader\n"
            "loader = DataLoader(load_dataset(\"c4\", split=\"train\", streaming=True), batch_size=8)\n",
            None,
            message_contains="iterable-style",
        ),
        # the dataset's kind is not visible, and this file uses iterable-style datasets
        Example(
            "from torch.utils.data import DataLoader, IterableDataset\n\n\nclass Stream(IterableDataset):\n"
            "    def __iter__(self):\n        yield 1\n\n\ndef make(ds):\n    return DataLoader(ds, batch_size=8)\n",
            None,
            message_contains="may be an IterableDataset",
        ),
        Example("from mydata import StreamingCorpus\nloader = DataLoader(StreamingCorpus(), batch_size=8)\n", None, message_contains="reads like a stream"),
        # map-style datasets of the same file get workers, iterable-style ones around or not
        Example(
            "from torch.utils.data import DataLoader, Dataset, IterableDataset\n\n\nclass Items(Dataset):\n"
            "    def __len__(self):\n        return 8\n\n    def __getitem__(self, i):\n        return i\n\n\n"
            "class Stream(IterableDataset):\n    def __iter__(self):\n        yield 1\n\n\n"
            "items = Items()\nloader = DataLoader(items, batch_size=2)\n",
            "from torch.utils.data import DataLoader, Dataset, IterableDataset\n\n\nclass Items(Dataset):\n"
            "    def __len__(self):\n        return 8\n\n    def __getitem__(self, i):\n        return i\n\n\n"
            "class Stream(IterableDataset):\n    def __iter__(self):\n        yield 1\n\n\n"
            "items = Items()\nloader = DataLoader(items, batch_size=2, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2)\n",
            message_contains="no num_workers",
            options={"num_workers": 4},
        ),
        # callables that workers started by spawn cannot pickle: a lambda, a function defined in a function
        Example(
            "from torch.utils.data import DataLoader\n\n\ndef make(ds):\n    def pad(batch):\n        return batch\n\n"
            "    return DataLoader(ds, batch_size=8, shuffle=True, collate_fn=pad)\n",
            None,
            message_contains="cannot pickle",
        ),
        Example(
            "import functools\nfrom torch.utils.data import DataLoader\nloader = DataLoader(ds, shuffle=True, "
            "worker_init_fn=functools.partial(lambda i, s: None, s=1))\n",
            None,
            message_contains="worker_init_fn is a lambda",
        ),
        # a test module: workers would change what the test exercises
        Example("from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_size=8, shuffle=True)\n", None,
                message_contains="a test module", path="tests/test_data_loader.py"),
        # a module-level collate function pickles by name: fixed
        Example(
            "from torch.utils.data import DataLoader\n\n\ndef pad(batch):\n    return batch\n\n\n"
            "loader = DataLoader(ds, shuffle=True, collate_fn=pad)\n",
            "from torch.utils.data import DataLoader\n\n\ndef pad(batch):\n    return batch\n\n\n"
            "loader = DataLoader(ds, shuffle=True, collate_fn=pad, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2)\n",
            message_contains="no num_workers",
            options={"num_workers": 4},
        ),
        # a script that trains as it is imported (no __main__ block): workers started by spawn import
        # it again and start workers of their own while starting (RuntimeError)
        Example(
            "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
            "loader = DataLoader(TensorDataset(torch.zeros(8, 4)), batch_size=2, shuffle=True)\n"
            "for epoch in range(3):\n    for i, (x,) in enumerate(loader):\n        print(x.sum())\n",
            None,
            message_contains="runs its training as it is imported (`for ... in enumerate(loader)` at line 6",
        ),
        Example(
            "from torch.utils.data import DataLoader\n\n\nclass Trainer:\n    def fit(self, ds):\n"
            "        self.epoch(DataLoader(ds, batch_size=8, shuffle=True))\n\n    def epoch(self, loader):\n"
            "        for batch in loader:\n            print(batch)\n\n\nTrainer().fit(ds)\n",
            None,
            message_contains="(`Trainer().fit(ds)` at line 13",
        ),
        # a helper run at import that builds something (no loader): the workers rerun only that
        Example(
            "from torch.utils.data import DataLoader\n\n\ndef load_vocab(path):\n    return [w for w in open(path)]\n\n\n"
            "def count(path):\n    n = 0\n    for _ in open(path):\n        n += 1\n    return n\n\n\n"
            "VOCAB, N = load_vocab(\"vocab.txt\"), count(\"vocab.txt\")\n\n\ndef main(ds):\n"
            "    for batch in DataLoader(ds, batch_size=8, shuffle=True):\n        print(batch)\n\n\n"
            "if __name__ == \"__main__\":\n    main(None)\n",
            "from torch.utils.data import DataLoader\n\n\ndef load_vocab(path):\n    return [w for w in open(path)]\n\n\n"
            "def count(path):\n    n = 0\n    for _ in open(path):\n        n += 1\n    return n\n\n\n"
            "VOCAB, N = load_vocab(\"vocab.txt\"), count(\"vocab.txt\")\n\n\ndef main(ds):\n"
            "    for batch in DataLoader(ds, batch_size=8, shuffle=True, num_workers=4, pin_memory=True, "
            "persistent_workers=True, prefetch_factor=2):\n        print(batch)\n\n\n"
            "if __name__ == \"__main__\":\n    main(None)\n",
            message_contains="no num_workers",
            options={"num_workers": 4},
        ),
        # the same program under a __main__ block (the workers import the file without running it): fixed
        Example(
            "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=8, shuffle=True)\n\n\n"
            "def main():\n    for batch in loader:\n        print(batch)\n\n\nif __name__ == \"__main__\":\n    main()\n",
            "import os\nfrom torch.utils.data import DataLoader\n" + _COUNT + "\nloader = DataLoader(ds, batch_size=8, "
            "shuffle=True, num_workers=DATALOADER_WORKERS, pin_memory=True, persistent_workers=DATALOADER_WORKERS > 0)\n\n\n"
            "def main():\n    for batch in loader:\n        print(batch)\n\n\nif __name__ == \"__main__\":\n    main()\n",
            message_contains="num_workers=DATALOADER_WORKERS: computed when the program runs",
        ),
        # the count computed at run time: `import os` goes before the first import (after __future__ ones),
        # the constant after the leading imports, once for every loader of the file
        Example(
            "\"\"\"Train.\"\"\"\nfrom __future__ import annotations\n\nimport torch\nfrom torch.utils.data import DataLoader\n\n\n"
            "def loaders(train, val):\n    return (DataLoader(train, batch_size=8, shuffle=True),\n"
            "            DataLoader(val, batch_size=8, num_workers=0, prefetch_factor=None))\n",
            "\"\"\"Train.\"\"\"\nfrom __future__ import annotations\n\nimport os\nimport torch\nfrom torch.utils.data import DataLoader\n"
            + _COUNT + "\n\ndef loaders(train, val):\n    return (DataLoader(train, batch_size=8, shuffle=True, "
            "num_workers=DATALOADER_WORKERS, pin_memory=True, persistent_workers=DATALOADER_WORKERS > 0),\n"
            "            DataLoader(val, batch_size=8, num_workers=DATALOADER_WORKERS, prefetch_factor=None, pin_memory=True, "
            "persistent_workers=DATALOADER_WORKERS > 0))\n",
            message_contains="none on a single core",
        ),
        # `import os` there already; the file defines the constant already (a second loader added later)
        Example(
            "import os\nfrom torch.utils.data import DataLoader\n" + _COUNT + "\ntrain = DataLoader(a, num_workers=DATALOADER_WORKERS)\n"
            "val = DataLoader(b, batch_size=8, shuffle=True)\n",
            "import os\nfrom torch.utils.data import DataLoader\n" + _COUNT + "\ntrain = DataLoader(a, num_workers=DATALOADER_WORKERS)\n"
            "val = DataLoader(b, batch_size=8, shuffle=True, num_workers=DATALOADER_WORKERS, pin_memory=True, "
            "persistent_workers=DATALOADER_WORKERS > 0)\n",
            message_contains="no num_workers",
        ),
        # no imports at all: `import os` and the constant go first
        Example(
            "loader = DataLoader(ds, shuffle=True)\n",
            "import os\n" + _COUNT + "\nloader = DataLoader(ds, shuffle=True, num_workers=DATALOADER_WORKERS, pin_memory=True, "
            "persistent_workers=DATALOADER_WORKERS > 0)\n",
            message_contains="no num_workers",
        ),
        # a prefetch_factor other than torch's default follows the count (torch refuses one without workers)
        Example(
            "import os\nloader = DataLoader(ds, shuffle=True)\n",
            "import os\n" + _COUNT + "loader = DataLoader(ds, shuffle=True, num_workers=DATALOADER_WORKERS, pin_memory=True, "
            "persistent_workers=DATALOADER_WORKERS > 0, prefetch_factor=4 if DATALOADER_WORKERS else None)\n",
            message_contains="no num_workers",
            options={"prefetch_factor": 4},
        ),
        # the name taken by something else, or defined after the loader it would size: reported
        Example("from torch.utils.data import DataLoader\n\n\ndef make(ds, DATALOADER_WORKERS=2):\n"
                "    return DataLoader(ds, shuffle=True)\n", None, message_contains="already uses the name DATALOADER_WORKERS"),
        Example("loader = DataLoader(ds, shuffle=True)\nDATALOADER_WORKERS = 2\n", None,
                message_contains="defines DATALOADER_WORKERS after this call"),
        # a dataset changed between epochs (a curriculum): workers started once (persistent) would keep
        # the first epoch's copy; workers started every epoch see each change
        Example(
            "from torch.utils.data import DataLoader\n\n\ndef train(ds, epochs):\n"
            "    loader = DataLoader(ds, batch_size=8, shuffle=True)\n    for epoch in range(epochs):\n"
            "        ds.set_epoch(epoch)\n        for batch in loader:\n            step(batch)\n",
            "from torch.utils.data import DataLoader\n\n\ndef train(ds, epochs):\n"
            "    loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=4, pin_memory=True, prefetch_factor=2)\n"
            "    for epoch in range(epochs):\n        ds.set_epoch(epoch)\n        for batch in loader:\n            step(batch)\n",
            message_contains="persistent_workers left out: line 7 changes the dataset",
            options={"num_workers": 4},
        ),
        # changed while the loader iterates it: no worker would see it
        Example(
            "from torch.utils.data import DataLoader\n\n\nclass Trainer:\n    def __init__(self, ds):\n"
            "        self.loader = DataLoader(ds, batch_size=8, shuffle=True)\n\n    def fit(self):\n"
            "        for i, batch in enumerate(self.loader):\n            if i == 100:\n"
            "                self.loader.dataset.mosaic = False\n",
            None,
            message_contains="line 11 changes the dataset while the loader iterates it",
        ),
        # shuffle=True rules out an IterableDataset (DataLoader raises ValueError for one)
        Example(
            "from torch.utils.data import DataLoader, IterableDataset\nloader = DataLoader(ds, batch_size=8, shuffle=True)\n",
            "from torch.utils.data import DataLoader, IterableDataset\nloader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2)\n",
            message_contains="no num_workers",
            options={"num_workers": 4},
        ),

    ]

    def __init__(self, **options: Any):
        super().__init__(**options)
        chosen = self.options["num_workers"]
        if chosen is not None:  # the default is None (computed at run time), so the base class left it as given
            try:
                if isinstance(chosen, bool) or (isinstance(chosen, float) and not chosen.is_integer()):
                    raise ValueError(chosen)
                count = int(chosen)
            except (TypeError, ValueError, OverflowError):
                raise FixerError(f"fixer {self.name}: option num_workers: expected int, got {chosen!r}") from None
            if count < 1:
                raise FixerError(f"fixer {self.name}: option num_workers: expected 1 or more, got {chosen!r}")
            self.options["num_workers"] = count

    def check(self, ctx: Context) -> Iterable[Edit]:
        chosen = self.options["num_workers"]  # None: computed by the program when it runs
        prefetch = max(1, int(self.options["prefetch_factor"]))
        for call in h.dataloader_calls(ctx):
            if not h.dataloader_is_serial(call) or _chosen_workers(ctx, call):
                continue  # num_workers chosen: by keyword, positionally or in a ** dict of this file
            if h.has_star(call):
                yield self.report(call, "DataLoader may load batches in the main process (num_workers unset); it takes **kwargs, so set num_workers/pin_memory there")
                continue
            if len(h.positionals(call)) > 5:
                yield self.report(call, "DataLoader gets num_workers positionally; pass num_workers>0 and pin_memory=True by keyword")
                continue
            dataset = h.arg_at(call, "dataset", 0)
            expr = dataset.value if dataset is not None else None
            kind, why = loader_verdict(ctx, call)
            shown = ctx.code(expr) if expr is not None else "the dataset"
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            if kind == ITERABLE:
                shards = (
                    "; its class calls get_worker_info(): if __iter__ splits the stream by worker, set num_workers by hand"
                    if datasets_of(ctx).uses_worker_info(expr, ctx.enclosing_scope(call))
                    else "; split the stream in __iter__ with torch.utils.data.get_worker_info() before adding workers"
                )
                yield self.report(call, f"DataLoader over an iterable-style dataset (`{shown}`, an IterableDataset) loads in the training process, but worker processes would each replay the whole stream (every sample num_workers times){shards}")
                continue
            if kind == UNKNOWN and why is not None:
                yield self.report(call, f"DataLoader with num_workers unset or 0 loads every batch in the training process; not rewritten: `{shown}` may be an IterableDataset ({why}), and with workers each would replay the whole stream unless __iter__ splits it by worker; add num_workers by hand if it is map-style")
                continue
            arg = h.kwarg(call, "num_workers")
            what = "num_workers=0" if arg is not None else "no num_workers"
            if chosen is None:
                count = NAME
                message = (f"DataLoader with {what} loads every batch in the training process; use worker processes "
                           f"(num_workers={NAME}: computed when the program runs, the CPUs it may use less one for "
                           f"training, at most {MAX_WORKERS}, none on a single core) and pinned memory")
            else:
                count = str(chosen)
                message = f"DataLoader with {what} loads every batch in the training process; use worker processes (num_workers={chosen}) and pinned memory"
            refusal = workers_refusal(ctx, call)
            if refusal is not None:
                yield self.report(call, f"{message}; {refusal}")
                continue
            new = call
            if arg is not None:
                new = h.set_kwarg(new, "num_workers", count)
            add = [] if arg is not None else [("num_workers", count)]
            if h.kwarg(call, "pin_memory") is None:
                add.append(("pin_memory", "True"))
            change = dataset_change(ctx, call)
            if h.kwarg(call, "persistent_workers") is None and change is None:
                # torch refuses persistent_workers=True (and any prefetch_factor) without workers
                add.append(("persistent_workers", "True" if chosen is not None else f"{NAME} > 0"))
            elif h.kwarg(call, "persistent_workers") is None:
                message += (f"; persistent_workers left out: line {ctx.pos(change[0]).start.line} changes the dataset "
                            "between epochs, which workers started once would never see")
            if h.kwarg(call, "prefetch_factor") is None and chosen is not None:
                add.append(("prefetch_factor", str(prefetch)))
            elif h.kwarg(call, "prefetch_factor") is None and prefetch != TORCH_PREFETCH:
                add.append(("prefetch_factor", f"{prefetch} if {NAME} else None"))
            new = h.add_kwargs(new, add)
            if chosen is not None:
                yield self.replace(call, message, {call: new})
                continue
            changes = runtime_count(ctx, call, new)
            if isinstance(changes, str):
                yield self.report(call, f"{message}; not rewritten: {changes}")
                continue
            yield self.replace(call, message, changes)
