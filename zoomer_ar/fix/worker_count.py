"""A DataLoader worker count that fits the machine the program runs on, computed when it runs.

The analyzer does not know the CPUs of the machine a fixed program will run on (the trace holds no
core count, and the program may move), so the dataloader-workers fixer does not write a number:
it puts one module-level constant after the file's leading imports (adding ``import os`` when the
file has none there) and passes it as ``num_workers``::

    DATALOADER_WORKERS = max(0, min(
        8,
        (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        // int(os.environ.get("LOCAL_WORLD_SIZE") or 1) - 1,
    ))

The CPUs this process may use (its affinity where the OS has one: a container's or ``taskset``'s
share, not the host's count) are shared by the node's training processes (torchrun's
``LOCAL_WORLD_SIZE``), one core left to each process for its own step, at most MAX_WORKERS. On a
single core that is 0: a worker would only take turns with training on that core (measured on the
dataloader_bound scenario pinned to one core: 50.8 ms/step with 0 workers, 55.1 with 1, 57.4 with
2), so the loader keeps loading in the training process and the arguments that need workers
(``persistent_workers``, ``prefetch_factor``) are written to follow the count. No comment is
added (fixers keep a file's comments as they are); the finding's message says what the count is.
"""

from __future__ import annotations

import libcst as cst

from .base import Context, Replacement

#: the constant the fixer defines and passes as num_workers
NAME = "DATALOADER_WORKERS"
#: the most workers the computed count gives (more seldom pays: each is a process with its own
#: copy of the dataset and prefetched batches)
MAX_WORKERS = 8
#: the count, as the program computes it
EXPRESSION = (
    f"max(0, min(\n    {MAX_WORKERS},\n"
    "    (len(os.sched_getaffinity(0)) if hasattr(os, \"sched_getaffinity\") else os.cpu_count() or 1)\n"
    "    // int(os.environ.get(\"LOCAL_WORLD_SIZE\") or 1) - 1,\n))"
)


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _is_import(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def _is_future(stmt: cst.CSTNode) -> bool:
    return _is_import(stmt) and all(isinstance(s, cst.ImportFrom) and isinstance(s.module, cst.Name)
                                    and s.module.value == "__future__" for s in stmt.body)


def _imports_os(stmt: cst.CSTNode) -> bool:
    """``import os`` (or ``import os.path``, which binds ``os`` too), not under another name."""
    return _is_import(stmt) and any(
        isinstance(s, cst.Import) and any(a.asname is None and (getattr(a.name, "value", None) == "os" or (
            isinstance(a.name, cst.Attribute) and isinstance(a.name.value, cst.Name) and a.name.value.value == "os"))
            for a in s.names)
        for s in stmt.body)


def _is_magic(stmt: cst.CSTNode) -> bool:
    """A notebook's masked IPython line (``%matplotlib inline``, ``!pip list``: a placeholder name
    while the fixers run, zoomer_ar.fix.notebooks), which a notebook's imports may follow."""
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, cst.Name) and stmt.body[0].value.value.startswith("__zoomer_magic_"))


def _leading_imports(module: cst.Module) -> tuple[cst.CSTNode | None, list[cst.CSTNode]]:
    """(the module docstring statement or None, the leading run of import statements after it,
    notebook magic lines among them skipped)."""
    body = list(module.body)
    doc = body[0] if body and _is_docstring(body[0]) else None
    imports = []
    for stmt in body[1 if doc is not None else 0:]:
        if _is_magic(stmt):
            continue
        if not _is_import(stmt):
            break
        imports.append(stmt)
    return doc, imports


def _definition(ctx: Context) -> cst.SimpleStatementLine | None:
    """The module-level ``DATALOADER_WORKERS = ...`` of the file, if any."""
    for stmt in ctx.module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if (isinstance(small, cst.Assign) and len(small.targets) == 1
                        and isinstance(small.targets[0].target, cst.Name) and small.targets[0].target.value == NAME):
                    return stmt
    return None


def _in_function(ctx: Context, node: cst.CSTNode) -> bool:
    return any(isinstance(a, (cst.FunctionDef, cst.Lambda)) for a in ctx.ancestors(node))


def runtime_count(ctx: Context, call: cst.Call, new_call: cst.Call) -> dict[cst.CSTNode, Replacement] | str:
    """The changes that replace ``call`` by ``new_call`` (which passes ``DATALOADER_WORKERS``) and
    define that constant where it is not defined yet, or why they cannot (a sentence for the
    report): the file uses the name otherwise, or defines it after the call runs."""
    defined = _definition(ctx)
    if defined is not None:
        if ctx.order(defined) < ctx.order(call) or _in_function(ctx, call):
            return {call: new_call}
        return f"the file defines {NAME} after this call, which would pass the computed worker count by that name"
    if any(n.value == NAME for n in ctx.nodes(cst.Name)):
        return f"the file already uses the name {NAME}, which the fix would define as the computed worker count"
    const = cst.parse_statement(f"{NAME} = {EXPRESSION}\n")
    const = const.with_changes(leading_lines=[cst.EmptyLine()])
    import_os = cst.parse_statement("import os\n")
    doc, imports = _leading_imports(ctx.module)
    changes: dict[cst.CSTNode, Replacement] = {call: new_call}
    if imports:
        end = imports[-1]
        after: list[cst.CSTNode] = [const]
        first = next((s for s in imports if not _is_future(s)), None)
        if not any(_imports_os(s) for s in imports):
            if first is None:  # only __future__ imports: os after them
                after = [import_os, const]
            else:  # os before the first import, which keeps the lines before it
                before = [import_os.with_changes(leading_lines=first.leading_lines), first.with_changes(leading_lines=[])]
                if first is end:
                    changes[end] = cst.FlattenSentinel([*before, *after])
                    return changes
                changes[first] = cst.FlattenSentinel(before)
        changes[end] = cst.FlattenSentinel([end, *after])
        return changes
    if doc is not None:
        changes[doc] = cst.FlattenSentinel([doc, import_os.with_changes(leading_lines=[cst.EmptyLine()]), const])
        return changes
    first_stmt = ctx.module.body[0]
    blanks = 2 if isinstance(first_stmt, (cst.FunctionDef, cst.ClassDef)) else 1
    rest = first_stmt
    if ctx.contains(first_stmt, call):  # the call is in that statement: its change goes inside it
        rest = first_stmt.deep_replace(call, new_call)
        del changes[call]
    rest = rest.with_changes(leading_lines=[*(cst.EmptyLine() for _ in range(blanks)), *first_stmt.leading_lines])
    changes[first_stmt] = cst.FlattenSentinel([import_os, const, rest])
    return changes
