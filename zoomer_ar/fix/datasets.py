"""What a file says about the datasets its DataLoaders read: iterable-style or map-style.

Shared by the fixers that change a DataLoader (fixers/dataloader_workers.py adds workers and pinned
memory) and those that rely on that change (fixers/non_blocking_h2d.py adds non_blocking=True only
where the loader's memory is, or will be, pinned): both ask `loader_verdict`, so they agree on
which loaders get rewritten.
"""

from __future__ import annotations

import re
from typing import Iterable

import libcst as cst

from . import helpers as h
from .base import Context
from .loader_workers import workers_refusal

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


class Datasets:
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


def loader_verdict(ctx: Context, call: cst.Call) -> tuple[str, str | None]:
    """(kind, why) of a DataLoader call's dataset: kind ITERABLE, MAP or UNKNOWN; for UNKNOWN, why it
    is not taken for map-style (None: it is, as a dataset this file says nothing against)."""
    if map_style_by_call(call):
        return MAP, None
    datasets = datasets_of(ctx)
    dataset = h.arg_at(call, "dataset", 0)
    expr = dataset.value if dataset is not None else None
    kind = datasets.kind(expr, ctx.enclosing_scope(call))
    if kind != UNKNOWN:
        return kind, None
    why = "this file uses iterable-style datasets" if datasets.around() else None
    if why is None and _streamy_name(expr) is not None:
        why = "its name reads like a stream"
    return kind, why


def workers_rewritable(ctx: Context, call: cst.Call) -> bool:
    """The dataloader-workers fixer rewrites this call (workers and pin_memory=True): a serial loader,
    no */** arguments, num_workers not positional, over a dataset taken for map-style, and nothing
    that loader_workers.workers_refusal reports (a test module, an unpicklable collate_fn, training
    run at import)."""
    if not (h.dataloader_is_serial(call) and h.dataloader_fixable(call)):
        return False
    kind, why = loader_verdict(ctx, call)
    return (kind == MAP or (kind == UNKNOWN and why is None)) and workers_refusal(ctx, call) is None


def datasets_of(ctx: Context) -> "Datasets":
    """The file's dataset facts, built once per Context (class hierarchies are resolved once)."""
    d = ctx.__dict__.get("_zoomer_datasets")
    if d is None:
        d = ctx.__dict__["_zoomer_datasets"] = Datasets(ctx)
    return d
