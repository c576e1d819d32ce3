"""dataloader-workers: a DataLoader that loads batches in the training process."""

from __future__ import annotations

import re
from typing import Iterable

import libcst as cst

from zoomer_ar.fix import helpers as h
from zoomer_ar.fix.base import Context, Edit, Example, Fixer

# -- iterable-style datasets -------------------------------------------------------------------
# Every DataLoader worker iterates its own copy of an IterableDataset: unless the dataset's
# __iter__ splits the stream by torch.utils.data.get_worker_info(), N workers yield every sample
# N times. Adding workers is only safe for map-style datasets (indexed by the sampler).

ITERABLE, MAP, UNKNOWN = "iterable", "map", "unknown"

_DATA = ("torch.utils.data", "torch.utils.data.dataset")
#: base classes / constructors of iterable-style datasets
ITERABLE_NAMES = {
    *(f"{m}.{n}" for m in _DATA for n in ("IterableDataset", "ChainDataset")),
    "torch.utils.data.IterDataPipe", "torch.utils.data.datapipes.datapipe.IterDataPipe",
    "torchdata.datapipes.iter.IterDataPipe", "datasets.IterableDataset", "datasets.iterable_dataset.IterableDataset",
}
ITERABLE_BARE = {"IterableDataset", "ChainDataset", "IterDataPipe", "data.IterableDataset", "torch.utils.data.IterableDataset"}
#: modules whose datasets are all iterable-style
ITERABLE_PREFIXES = ("torchdata.datapipes.iter.", "webdataset.", "torchtext.datasets.")
#: base classes / constructors of map-style datasets (not IterableDataset instances)
MAP_NAMES = {
    *(f"{m}.{n}" for m in _DATA for n in ("Dataset", "TensorDataset", "Subset", "ConcatDataset", "StackDataset")),
    "torch.utils.data.MapDataPipe", "builtins.object", "typing.Generic",
}
MAP_BARE = {"Dataset", "TensorDataset", "Subset", "ConcatDataset", "StackDataset", "data.Dataset", "data.TensorDataset", "object", "Generic"}
MAP_PREFIXES = ("torchvision.datasets.",)
#: names whose presence in the file means iterable-style datasets are around
ITERABLE_MARKERS = {"IterableDataset", "ChainDataset", "IterDataPipe", "IterableWrapper", "WebDataset", "to_iterable_dataset", "get_worker_info"}
#: a dataset spelled like a stream (`stream_ds`, `IterDataset(...)`) is not assumed map-style
_STREAMY = re.compile(r"(?:^|[^A-Za-z])[Ii]ter|Iter|[Ss]tream")


def _streamy_name(expr: cst.CSTNode | None) -> str | None:
    """``train_iter``, ``StreamingCorpus(...)``, ``self.stream``: the name, when it reads like a stream."""
    name = h.dotted(expr.func if isinstance(expr, cst.Call) else expr)
    return name if name is not None and _STREAMY.search(name) else None


def _names_of(ctx: Context, node: cst.CSTNode) -> set[str]:
    d = h.dotted(node)
    if d is None:
        return set()
    return ctx.qualnames(node) if ctx.is_bound(node) else {d}


def _known(ctx: Context, node: cst.CSTNode) -> str:
    """ITERABLE / MAP for a known dataset class or constructor, else UNKNOWN."""
    if isinstance(node, cst.Subscript):  # Generic[T], Dataset[Tensor]
        node = node.value
    if ctx.matches(node, ITERABLE_NAMES, ITERABLE_BARE) or any(n.startswith(ITERABLE_PREFIXES) for n in _names_of(ctx, node)):
        return ITERABLE
    if ctx.matches(node, MAP_NAMES, MAP_BARE) or any(n.startswith(MAP_PREFIXES) for n in _names_of(ctx, node)):
        return MAP
    return UNKNOWN


def _combine(kinds: Iterable[str]) -> str:
    kinds = set(kinds)
    if ITERABLE in kinds:
        return ITERABLE
    return MAP if kinds == {MAP} else UNKNOWN


def _defines(cls: cst.ClassDef, method: str) -> bool:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    return any(isinstance(s, cst.FunctionDef) and s.name.value == method for s in body)


class _Datasets:
    """What one file says about its datasets (memoised: class hierarchies are resolved once)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.classes: dict[str, list[cst.ClassDef]] = {}
        for c in ctx.nodes(cst.ClassDef):
            self.classes.setdefault(c.name.value, []).append(c)
        self._kinds: dict[cst.ClassDef, str] = {}
        self._around: bool | None = None
        self._index: dict[tuple[cst.CSTNode, bool], dict[str, list[cst.CSTNode | None]]] = {}

    def class_kind(self, cls: cst.ClassDef, depth: int = 0) -> str:
        """A class of this file: ITERABLE when a base is (through this file's classes) an
        IterableDataset, MAP when every base is a known map-style one (or none: a plain class),
        ITERABLE as well when its bases are unknown and it defines ``__iter__`` but no
        ``__getitem__`` (an imported IterableDataset subclass, most likely), else UNKNOWN."""
        kind = self._kinds.get(cls)
        if kind is not None:
            return kind
        if depth > 64:  # a hierarchy that deep is not resolved (and not memoised: a shallower path may)
            return UNKNOWN
        self._kinds[cls] = UNKNOWN  # a cycle (class A(A)) stays unknown
        kinds = [UNKNOWN if b.star else self.expr_class_kind(b.value, depth + 1) for b in cls.bases if b.keyword is None]
        kind = _combine(kinds) if kinds else MAP
        if kind == UNKNOWN and _defines(cls, "__iter__") and not _defines(cls, "__getitem__"):
            kind = ITERABLE
        self._kinds[cls] = kind
        return kind

    def expr_class_kind(self, node: cst.CSTNode, depth: int = 0) -> str:
        """The kind of the class (or dataset factory) ``node`` names."""
        known = _known(self.ctx, node)
        if known != UNKNOWN:
            return known
        if isinstance(node, cst.Name):
            classes = self.classes.get(node.value, [])
            if classes and not self.ctx.qualnames(node) - {node.value}:  # not also imported
                return _combine(self.class_kind(c, depth) for c in classes)
        return UNKNOWN

    def _assigned(self, text: str, scope: cst.CSTNode) -> list[cst.CSTNode | None] | None:
        attributes = "." in text
        root = self.ctx.module if attributes else scope
        index = self._index.get((root, attributes))
        if index is None:
            index = self._index[(root, attributes)] = _assignments(self.ctx, root, attributes=attributes)
        return index.get(text)

    def _values(self, expr: cst.CSTNode, scope: cst.CSTNode) -> list[cst.CSTNode | None]:
        """The values the name/attribute ``expr`` is assigned in ``scope`` (else at module level);
        [None] when unknown."""
        text = h.dotted(expr)
        if text is None:
            return [None]
        values = self._assigned(text, scope)
        if values is None and scope is not self.ctx.module:
            values = self._assigned(text, self.ctx.module)
        return values or [None]

    def kind(self, expr: cst.CSTNode | None, scope: cst.CSTNode, depth: int = 0) -> str:
        """Whether the dataset expression ``expr`` is statically an iterable-style dataset, a
        map-style one, or unknown: a constructor call of a class of this file or a known one
        (``TensorDataset``, ``torchvision.datasets.*``; ``IterableDataset`` subclasses, datapipes,
        ``load_dataset(..., streaming=True)``, ``.to_iterable_dataset()``), or a name/attribute
        assigned such a value in the same function (or at module level)."""
        if expr is None or depth > 8:
            return UNKNOWN
        if isinstance(expr, cst.Call):
            if any(a.keyword is not None and a.keyword.value == "streaming" and not h.is_literal(a.value, False) for a in expr.args):
                return ITERABLE
            m = h.method(expr)
            if m is not None and m[1] == "to_iterable_dataset":
                return ITERABLE
            return self.expr_class_kind(expr.func)
        if isinstance(expr, (cst.Name, cst.Attribute)):
            return _combine(self.kind(v, scope, depth + 1) for v in self._values(expr, scope))
        return UNKNOWN

    def around(self) -> bool:
        """The file mentions iterable-style datasets (IterableDataset, datapipes, streaming=True,
        get_worker_info, ...) or defines a class that looks like one."""
        if self._around is None:
            self._around = (
                any(n.value in ITERABLE_MARKERS for n in self.ctx.nodes(cst.Name))
                or any(
                    a.keyword is not None and a.keyword.value == "streaming" and not h.is_literal(a.value, False)
                    for a in self.ctx.nodes(cst.Arg)
                )
                or any(self.class_kind(c) == ITERABLE for c in self.ctx.nodes(cst.ClassDef))
            )
        return self._around

    def dataset_classes(self, expr: cst.CSTNode | None, scope: cst.CSTNode, depth: int = 0) -> list[cst.ClassDef]:
        """This file's classes the dataset expression (or the values its name is assigned)
        constructs, with their bases of this file."""
        if expr is None or depth > 8:
            return []
        if not isinstance(expr, cst.Call):
            return [c for v in self._values(expr, scope) for c in self.dataset_classes(v, scope, depth + 1)]
        out: list[cst.ClassDef] = []
        todo = [expr.func]
        while todo and len(out) < 64:
            node = todo.pop()
            if isinstance(node, cst.Subscript):
                node = node.value
            if isinstance(node, cst.Name):
                for c in self.classes.get(node.value, []):
                    if not any(c is o for o in out):
                        out.append(c)
                        todo.extend(b.value for b in c.bases if b.keyword is None)
        return out

    def uses_worker_info(self, expr: cst.CSTNode | None, scope: cst.CSTNode) -> bool:
        """The dataset's class (of this file, or one of its bases) calls get_worker_info()."""
        return any(
            isinstance(n, cst.Name) and n.value == "get_worker_info" for c in self.dataset_classes(expr, scope) for n in h.walk(c)
        )


def _assignments(ctx: Context, root: cst.CSTNode, *, attributes: bool) -> dict[str, list[cst.CSTNode | None]]:
    """Dotted target text -> the values assigned to it: plain names bound in ``root`` (a function,
    class, lambda or the module; not in nested scopes), or, with ``attributes``, the attribute
    targets anywhere under ``root`` (``self.ds = ...`` in ``__init__``). A None value marks a
    binding whose value is unknown (a parameter, a loop target, ``with ... as``, ``+=``)."""
    out: dict[str, list[cst.CSTNode | None]] = {}

    def add(text: str, value: cst.CSTNode | None) -> None:
        if ("." in text) == attributes:
            out.setdefault(text, []).append(value)

    body = root.body if isinstance(root, (cst.FunctionDef, cst.ClassDef)) else root
    if isinstance(root, cst.FunctionDef):
        ps = root.params
        for p in [*ps.posonly_params, *ps.params, *ps.kwonly_params]:
            add(p.name.value, None)
    for n in h.walk(body, into_scopes=attributes):
        if isinstance(n, cst.Assign):
            for t in n.targets:
                text = h.dotted(t.target)
                if text is not None:
                    add(text, n.value)
                else:
                    for other in _target_texts(t.target):
                        add(other, None)
        elif isinstance(n, (cst.AnnAssign, cst.NamedExpr)) and h.dotted(n.target) is not None:
            add(h.dotted(n.target), n.value)  # type: ignore[arg-type]
        elif isinstance(n, (cst.AugAssign, cst.For, cst.CompFor)):
            for other in _target_texts(n.target):
                add(other, None)
        elif isinstance(n, cst.AsName):
            for other in _target_texts(n.name):
                add(other, None)
    return out


def _target_texts(target: cst.CSTNode) -> set[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return {t for el in target.elements for t in _target_texts(el.value)}
    if isinstance(target, cst.StarredElement):
        return _target_texts(target.value)
    d = h.dotted(target)
    return {d} if d is not None else set()


def map_style_by_call(call: cst.Call) -> bool:
    """The DataLoader call itself rules out an IterableDataset (DataLoader raises ValueError for
    one given ``shuffle=True``, a ``sampler`` or a ``batch_sampler``)."""
    shuffle = h.arg_at(call, "shuffle", 2)
    if shuffle is not None and h.is_literal(shuffle.value, True):
        return True
    for name, index in (("sampler", 3), ("batch_sampler", 4)):
        arg = h.arg_at(call, name, index)
        if arg is not None and not h.is_literal(arg.value, None):
            return True
    return False


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
A dataset whose kind is not visible in the file is assumed map-style unless the file or its
name hints otherwise: check the datasets other modules define.

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
        # an explicit num_workers is the user's, even over an IterableDataset
        "from torch.utils.data import DataLoader, IterableDataset\n\n\nclass S(IterableDataset):\n"
        "    def __iter__(self):\n        return iter(range(8))\n\n\nloader = DataLoader(S(), num_workers=2)\n",
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
        ),
        # shuffle=True rules out an IterableDataset (DataLoader raises ValueError for one)
        Example(
            "from torch.utils.data import DataLoader, IterableDataset\nloader = DataLoader(ds, batch_size=8, shuffle=True)\n",
            "from torch.utils.data import DataLoader, IterableDataset\nloader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2)\n",
            message_contains="no num_workers",
        ),
    ]

    def check(self, ctx: Context) -> Iterable[Edit]:
        workers = max(1, int(self.options["num_workers"]))
        prefetch = max(1, int(self.options["prefetch_factor"]))
        datasets: _Datasets | None = None  # built on first use
        for call in h.dataloader_calls(ctx):
            if not h.dataloader_is_serial(call):
                continue
            if h.has_star(call):
                yield self.report(call, "DataLoader may load batches in the main process (num_workers unset); it takes **kwargs, so set num_workers/pin_memory there")
                continue
            if len(h.positionals(call)) > 5:
                yield self.report(call, "DataLoader gets num_workers positionally; pass num_workers>0 and pin_memory=True by keyword")
                continue
            dataset = h.arg_at(call, "dataset", 0)
            expr = dataset.value if dataset is not None else None
            scope = ctx.enclosing_scope(call)
            if map_style_by_call(call):
                kind = MAP
            else:
                datasets = datasets or _Datasets(ctx)
                kind = datasets.kind(expr, scope)
            shown = ctx.code(expr) if expr is not None else "the dataset"
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            if kind == ITERABLE:
                shards = (
                    "; its class calls get_worker_info(): if __iter__ splits the stream by worker, set num_workers by hand"
                    if datasets is not None and datasets.uses_worker_info(expr, scope)
                    else "; split the stream in __iter__ with torch.utils.data.get_worker_info() before adding workers"
                )
                yield self.report(call, f"DataLoader over an iterable-style dataset (`{shown}`, an IterableDataset) loads in the training process, but worker processes would each replay the whole stream (every sample num_workers times){shards}")
                continue
            if kind == UNKNOWN:
                why = "this file uses iterable-style datasets" if datasets is not None and datasets.around() else None
                if why is None and _streamy_name(expr) is not None:
                    why = "its name reads like a stream"
                if why is not None:
                    yield self.report(call, f"DataLoader with num_workers unset or 0 loads every batch in the training process; not rewritten: `{shown}` may be an IterableDataset ({why}), and with workers each would replay the whole stream unless __iter__ splits it by worker; add num_workers by hand if it is map-style")
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
