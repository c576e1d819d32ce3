"""When a DataLoader may not be given worker processes although its dataset allows them.

Shared by fixers/dataloader_workers.py (which reports such a loader instead of rewriting it) and,
through datasets.workers_rewritable, fixers/non_blocking_h2d.py (which counts on the rewrite's
pin_memory=True only where it happens). Workers started by spawn (macOS, Windows; forkserver,
Linux's default from Python 3.14, likewise) import the main module again and receive the loader's
callables pickled, so:

* a test module is left alone: workers would change what the test exercises;
* a dataset the program changes while the loader iterates it (``ds.set_epoch(e)`` in the batch
  loop): each worker holds its own copy, made when it started, that does not see the change;
* a `collate_fn`/`worker_init_fn` that pickle cannot find by name (a lambda, a function defined in
  a function, a partial of one) would fail in the workers;
* a script that runs its training as it is imported (a loop over a loader, or a call of one of its
  own looping functions, outside every function and an `if __name__ == "__main__":` block) would
  run it again in every worker, whose loader then tries to start workers of its own while the
  worker is still starting: RuntimeError ("An attempt has been made to start a new process before
  the current process has finished its bootstrapping phase").
"""

from __future__ import annotations

import libcst as cst

from . import helpers as h
from .base import SCOPE_BOUNDARIES, Context, _is_main_guard

SPAWN = "worker processes started by spawn (macOS, Windows; Linux's default from Python 3.14)"


def workers_refusal(ctx: Context, call: cst.Call) -> str | None:
    """Why the DataLoader ``call`` is reported rather than given workers (the tail of the finding's
    message, from "not changed: "), else None."""
    if ctx.test_module():
        return ("not changed: a test module (worker processes would change what the "
                "test exercises, and start for every small loader of the run)")
    local = _unpicklable_callable(ctx, call)
    if local is not None:
        return f"not changed: {local}, which {SPAWN} cannot pickle: define it at module level first"
    change = dataset_change(ctx, call)
    if change is not None and change[1]:
        return (f"not changed: line {ctx.pos(change[0]).start.line} changes the dataset while the loader iterates "
                f"it (`{_short(ctx, change[0])}`), and worker processes each hold a copy of the dataset that "
                "would not see the change")
    program = program_at_import(ctx)
    if program is not None:
        return (f"not changed: the file runs its training as it is imported ({program}, outside an "
                f"`if __name__ == \"__main__\":` block); {SPAWN} import it again and would start workers "
                "of their own while starting (RuntimeError): move that code under such a block first")
    return None


# -- callables the workers receive pickled ------------------------------------------------------

def _unpicklable_callable(ctx: Context, call: cst.Call) -> str | None:
    """Why the loader's `collate_fn` / `worker_init_fn` cannot be pickled, else None: a lambda, a
    name bound to a lambda or to a function defined inside a function (seen from the call's
    function), or functools.partial of one. Workers get these callables pickled under spawn."""
    for key in ("collate_fn", "worker_init_fn"):
        arg = h.kwarg(call, key)
        if arg is None:
            continue
        value = arg.value
        while isinstance(value, cst.Call) and h.last_name(value.func) == "partial" and value.args:
            value = value.args[0].value
        if isinstance(value, cst.Lambda):
            return f"its {key} is a lambda"
        if isinstance(value, cst.Name) and _local_callable(ctx, call, value.value):
            return f"its {key} `{value.value}` is a function defined inside a function (or a lambda)"
    return None


def _local_callable(ctx: Context, call: cst.Call, name: str) -> bool:
    """`name` is bound to a lambda (anywhere: pickle finds no lambda by name) or, in a function
    around `call`, by a nested `def name`."""
    def function_of(node: cst.CSTNode) -> cst.CSTNode | None:
        return next((a for a in ctx.ancestors(node) if isinstance(a, cst.FunctionDef)), None)

    around = {id(a) for a in ctx.ancestors(call) if isinstance(a, cst.FunctionDef)}
    for node in ctx.nodes(cst.FunctionDef):
        if node.name.value == name and id(function_of(node)) in around:
            return True
    for node in ctx.nodes(cst.Assign):
        if isinstance(node.value, cst.Lambda) and any(isinstance(t.target, cst.Name) and t.target.value == name
                                                      for t in node.targets):
            scope = function_of(node)
            if scope is None or id(scope) in around:
                return True
    return False


# -- training run as the module is imported ---------------------------------------------------

def program_at_import(ctx: Context) -> str | None:
    """What runs the file's training as it is imported (``"`for ... in enumerate(train_loader)` at
    line 115"``, ``"`main()` at line 40"``), else None: outside every function, class and
    `__main__` block, a loop over a name bound to a DataLoader there, or a call of a function of
    the file (a method of one of its classes, on an instance made there) that makes a DataLoader,
    loops over one made there, or loops and is given one. A helper that only builds something
    (``vocab = load_vocab(path)``) runs no training. A notebook is no module that workers import."""
    cached = ctx.__dict__.get("_zoomer_program_at_import", False)
    if cached is not False:
        return cached
    found = None if ctx.notebook() else _find_program(ctx)
    ctx.__dict__["_zoomer_program_at_import"] = found
    return found


def _at_import(ctx: Context, node: cst.CSTNode) -> bool:
    """``node`` runs as the module is imported: outside every function, class and lambda, and not
    in the body of an ``if __name__ == "__main__":`` (its ``else`` runs on import)."""
    child = node
    for a in ctx.ancestors(node):
        if isinstance(a, SCOPE_BOUNDARIES):
            return False
        if isinstance(a, cst.If) and child is a.body and _is_main_guard(a.test):
            return False
        child = a
    return True


def _find_program(ctx: Context) -> str | None:
    functions = {s.name.value: s for s in ctx.module.body if isinstance(s, cst.FunctionDef)}
    classes = {s.name.value: s for s in ctx.module.body if isinstance(s, cst.ClassDef)}
    loader_calls = {id(c) for c in h.dataloader_calls(ctx)}
    loaders: set[str] = set()  # names bound to a DataLoader at import
    instances: dict[str, cst.ClassDef] = {}  # names bound to an instance of a class of the file at import
    for assign in ctx.nodes(cst.Assign):
        if not _at_import(ctx, assign):
            continue
        names = [t.target.value for t in assign.targets if isinstance(t.target, cst.Name)]
        value = assign.value
        if isinstance(value, cst.Call) and id(value) in loader_calls:
            loaders.update(names)
        elif isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in classes:
            instances.update((n, classes[value.func.value]) for n in names)
    for node in ctx.nodes(cst.For, cst.CompFor, cst.Call):
        if not _at_import(ctx, node):
            continue
        if isinstance(node, (cst.For, cst.CompFor)):
            if any(isinstance(n, cst.Name) and n.value in loaders for n in h.walk(node.iter)):
                return f"`for ... in {_short(ctx, node.iter)}` at line {ctx.pos(node).start.line}"
            continue
        fn = _callee(node, functions, classes, instances)
        if fn is None:
            continue
        given = any(isinstance(n, cst.Name) and n.value in loaders for a in node.args for n in h.walk(a.value))
        found = _Finds(functions, loader_calls, loaders)
        if found.reaches_loader(fn, _class_of(ctx, fn)) or (given and found.loops(fn, _class_of(ctx, fn))):
            return f"`{_short(ctx, node)}` at line {ctx.pos(node).start.line}"
    return None


def _callee(call: cst.Call, functions: dict[str, cst.FunctionDef], classes: dict[str, cst.ClassDef],
            instances: dict[str, cst.ClassDef]) -> cst.FunctionDef | None:
    """The function of the file that ``call`` runs: ``name(...)`` of a top-level function,
    ``obj.method(...)`` with ``obj`` an instance of one of its classes, or ``Class(...).method(...)``."""
    if isinstance(call.func, cst.Name):
        return functions.get(call.func.value)
    if not isinstance(call.func, cst.Attribute):
        return None
    receiver = call.func.value
    cls = None
    if isinstance(receiver, cst.Name):
        cls = instances.get(receiver.value)
    elif isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Name):
        cls = classes.get(receiver.func.value)
    return _method(cls, call.func.attr.value) if cls is not None else None


def _method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    return next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)


def _class_of(ctx: Context, fn: cst.FunctionDef) -> cst.ClassDef | None:
    parent = ctx.parent(ctx.parent(fn))  # FunctionDef -> IndentedBlock -> ClassDef
    return parent if isinstance(parent, cst.ClassDef) else None


class _Finds:
    """What a function of the file runs, itself or through the file's functions it calls by name
    and its class's methods it calls on ``self``."""

    def __init__(self, functions: dict[str, cst.FunctionDef], loader_calls: set[int], loaders: set[str]):
        self.functions = functions
        self.loader_calls = loader_calls
        self.loaders = loaders

    def loops(self, fn: cst.FunctionDef, cls: cst.ClassDef | None) -> bool:
        """A ``for``/``while`` loop (over a loader it was given, say)."""
        return self._search(fn, cls, lambda n: isinstance(n, (cst.For, cst.While)), set())

    def reaches_loader(self, fn: cst.FunctionDef, cls: cst.ClassDef | None) -> bool:
        """A DataLoader it makes, or a loop over a loader the module made."""
        def hit(n: cst.CSTNode) -> bool:
            if isinstance(n, cst.Call):
                return id(n) in self.loader_calls
            return isinstance(n, cst.For) and any(isinstance(m, cst.Name) and m.value in self.loaders
                                                  for m in h.walk(n.iter))
        return self._search(fn, cls, hit, set())

    def _search(self, fn: cst.FunctionDef, cls: cst.ClassDef | None, hit, seen: set[int]) -> bool:
        if id(fn) in seen:
            return False
        seen.add(id(fn))
        for n in h.walk(fn.body, into_scopes=False):
            if hit(n):
                return True
            if not isinstance(n, cst.Call):
                continue
            if isinstance(n.func, cst.Name) and n.func.value in self.functions:
                if self._search(self.functions[n.func.value], None, hit, seen):
                    return True
            elif cls is not None and isinstance(n.func, cst.Attribute) and h.dotted(n.func.value) == "self":
                method = _method(cls, n.func.attr.value)
                if method is not None and self._search(method, cls, hit, seen):
                    return True
        return False


def _short(ctx: Context, node: cst.CSTNode) -> str:
    text = " ".join(ctx.code(node).split())
    return text if len(text) <= 40 else text[:37] + "..."


# -- a dataset the program changes after the loader is made ----------------------------------

#: method names that read like a change of the dataset's state (curriculum, resampling, mosaic off)
CHANGING = ("set_", "update", "reset", "shuffle", "resample", "reshuffle", "enable", "disable", "close",
            "reload", "refresh", "rebuild", "advance", "next_epoch", "new_epoch", "step")


def dataset_change(ctx: Context, call: cst.Call) -> tuple[cst.CSTNode, bool] | None:
    """Where the program changes the dataset of the DataLoader ``call`` after making it, if it does:
    ``(node, while_iterating)``. A change is an attribute store (``ds.level = 2``,
    ``loader.dataset.mosaic = False``) or a call of a method whose name reads like one
    (``ds.set_epoch(epoch)``, ``loader.dataset.close_mosaic()``) on the dataset the call is given
    by name or on the loader's ``.dataset``, in the call's function (or the class, for ``self.``
    names). Workers hold a copy of the dataset made when they start: persistent ones (started once)
    never see a change, and none sees one made while the loader is being iterated
    (``while_iterating``: inside a ``for`` over the loader)."""
    cache = ctx.__dict__.setdefault("_zoomer_dataset_changes", {})
    if id(call) not in cache:
        cache[id(call)] = _dataset_change(ctx, call)
    return cache[id(call)]


def _dataset_change(ctx: Context, call: cst.Call) -> tuple[cst.CSTNode, bool] | None:
    dataset = h.arg_at(call, "dataset", 0)
    names = set()
    if dataset is not None and h.dotted(dataset.value) is not None:
        names.add(h.dotted(dataset.value))
    loader = _bound_to(ctx, call)
    if loader is not None:
        names.add(f"{loader}.dataset")
    if not names:
        return None
    first = None
    for node in h.walk(_region(ctx, call, names)):
        owner = None
        if isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Attribute):
            owner = h.dotted(node.target.value)
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value.lower().startswith(CHANGING):
            owner = h.dotted(node.func.value)
        if owner not in names:
            continue
        if loader is not None and _iterating(ctx, node, loader):
            return node, True
        if first is None or ctx.pos(node).start.line < ctx.pos(first).start.line:
            first = node
    return (first, False) if first is not None else None


def _bound_to(ctx: Context, call: cst.Call) -> str | None:
    """The dotted name the loader is assigned to (``loader``, ``self.train_loader``), if any."""
    parent = ctx.parent(call)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        return h.dotted(parent.targets[0].target)
    return None


def _region(ctx: Context, call: cst.Call, names: set[str]) -> cst.CSTNode:
    """Where changes of ``names`` are looked for: the class around the call for ``self.`` names,
    else the call's function (or the module)."""
    if any(n.startswith("self.") for n in names):
        cls = next((a for a in ctx.ancestors(call) if isinstance(a, cst.ClassDef)), None)
        if cls is not None:
            return cls
    return ctx.enclosing_scope(call)


def _iterating(ctx: Context, node: cst.CSTNode, loader: str) -> bool:
    """``node`` runs inside a ``for`` over the loader (``for x in loader``, ``enumerate(loader)``)."""
    for loop in ctx.loops_around(node):
        if isinstance(loop, cst.For) and any(h.dotted(n) == loader for n in h.walk(loop.iter)
                                             if isinstance(n, (cst.Name, cst.Attribute))):
            return True
    return False
