"""libcst helpers shared by the fixers (pure functions on nodes, plus a few Context-aware ones)."""

from __future__ import annotations

import ast
import re
from typing import Any, Iterable, Iterator, Mapping, Sequence

import libcst as cst

from .base import Context, Replacement, iter_children

MISSING: Any = object()

# --------------------------------------------------------------------------------------------
# Names and literals
# --------------------------------------------------------------------------------------------


def dotted(expr: cst.CSTNode | None) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(expr, cst.Attribute):
        parts.append(expr.attr.value)
        expr = expr.value
    if isinstance(expr, cst.Name):
        parts.append(expr.value)
        return ".".join(reversed(parts))
    return None


def root_name(expr: cst.CSTNode | None) -> str | None:
    """The Name at the root of ``a.b[0].c(...)``-like expressions (through attributes,
    subscripts and calls), else None."""
    while True:
        if isinstance(expr, cst.Name):
            return expr.value
        if isinstance(expr, (cst.Attribute, cst.Subscript)):
            expr = expr.value
        elif isinstance(expr, cst.Call):
            expr = expr.func
        else:
            return None


def last_name(expr: cst.CSTNode | None) -> str | None:
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        return expr.attr.value
    return None


def literal(expr: cst.CSTNode | None) -> Any:
    """The Python value of a simple literal (numbers, strings, True/False/None, -1), else MISSING."""
    if isinstance(expr, cst.Name) and expr.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[expr.value]
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)) or (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, (cst.Minus, cst.Plus))
        and isinstance(expr.expression, (cst.Integer, cst.Float))
    ):
        try:
            return ast.literal_eval(cst.Module([]).code_for_node(expr).strip())
        except Exception:
            return MISSING
    return MISSING


def string_value(expr: cst.CSTNode | None) -> str | None:
    value = literal(expr)
    return value if isinstance(value, str) else None


def is_literal(expr: cst.CSTNode | None, value: Any) -> bool:
    v = literal(expr)
    return v is not MISSING and type(v) is type(value) and v == value


# --------------------------------------------------------------------------------------------
# Calls
# --------------------------------------------------------------------------------------------


def kwarg(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def positionals(call: cst.Call) -> list[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def arg_at(call: cst.Call, name: str, index: int | None) -> cst.Arg | None:
    """The argument bound to parameter ``name``: by keyword, else at positional ``index`` (None:
    keyword-only)."""
    arg = kwarg(call, name)
    if arg is not None or index is None:
        return arg
    pos = positionals(call)
    return pos[index] if index < len(pos) else None


def has_star(call: cst.Call) -> bool:
    return any(a.star for a in call.args)


def method(call: cst.CSTNode) -> tuple[cst.BaseExpression, str] | None:
    """(receiver, name) of ``receiver.name(...)``."""
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
        return call.func.value, call.func.attr.value
    return None


def is_method_call(node: cst.CSTNode, name: str | Iterable[str], nargs: int | None = None) -> bool:
    m = method(node)
    if m is None:
        return False
    names = {name} if isinstance(name, str) else set(name)
    if m[1] not in names:
        return False
    return nargs is None or len(node.args) == nargs  # type: ignore[union-attr]


def _plain_ws(ws: cst.BaseParenthesizableWhitespace) -> cst.BaseParenthesizableWhitespace:
    """The same line break/indentation, without comments or blank lines."""
    if isinstance(ws, cst.ParenthesizedWhitespace):
        return cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(), empty_lines=[], indent=ws.indent, last_line=ws.last_line
        )
    return ws


def _separator(call: cst.Call) -> cst.Comma:
    """A comma like the ones between the call's arguments (comments stripped)."""
    args = list(call.args)
    if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
        c = args[-2].comma
        return cst.Comma(whitespace_before=c.whitespace_before, whitespace_after=_plain_ws(c.whitespace_after))
    if args and isinstance(args[-1].comma, cst.Comma) and isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        return cst.Comma(whitespace_after=_plain_ws(call.whitespace_before_args))
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def make_arg(name: str, value: str | cst.BaseExpression) -> cst.Arg:
    expr = cst.parse_expression(value) if isinstance(value, str) else value
    return cst.Arg(
        value=expr,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )


def add_kwargs(call: cst.Call, pairs: Sequence[tuple[str, str | cst.BaseExpression]]) -> cst.Call:
    """Append keyword arguments, following the call's layout (one per line stays one per line, a
    trailing comma stays trailing, a comment after the last argument stays with it)."""
    if not pairs:
        return call
    args = list(call.args)
    sep = _separator(call)
    new = [make_arg(k, v) for k, v in pairs]
    if not args:
        return call.with_changes(args=[a.with_changes(comma=sep) for a in new[:-1]] + [new[-1]])
    last = args[-1]
    trailing = last.comma
    closing = trailing.whitespace_after if isinstance(trailing, cst.Comma) else last.whitespace_after_arg
    if isinstance(closing, cst.ParenthesizedWhitespace):
        # the call closes on its own line: the last argument keeps its comment, the new ones go
        # on their own lines, and the closing paren keeps its indentation
        if isinstance(sep.whitespace_after, cst.ParenthesizedWhitespace):
            layout = sep.whitespace_after
        else:
            layout = _plain_ws(closing).with_changes(last_line=cst.SimpleWhitespace(closing.last_line.value + "    "))
            sep = cst.Comma(whitespace_after=layout)
        last_comma = cst.Comma(
            whitespace_before=trailing.whitespace_before if isinstance(trailing, cst.Comma) else cst.SimpleWhitespace(""),
            whitespace_after=cst.ParenthesizedWhitespace(
                first_line=closing.first_line,
                empty_lines=closing.empty_lines,
                indent=layout.indent,
                last_line=layout.last_line,
            ),
        )
        plain_close = _plain_ws(closing)
        if isinstance(trailing, cst.Comma):
            args[-1] = last.with_changes(comma=last_comma)
            final = new[-1].with_changes(comma=trailing.with_changes(whitespace_after=plain_close))
        else:
            args[-1] = last.with_changes(comma=last_comma, whitespace_after_arg=cst.SimpleWhitespace(""))
            final = new[-1].with_changes(whitespace_after_arg=plain_close)
    else:
        args[-1] = last.with_changes(comma=sep)
        final = new[-1].with_changes(comma=trailing)
    return call.with_changes(args=[*args, *(a.with_changes(comma=sep) for a in new[:-1]), final])


def set_kwarg(call: cst.Call, name: str, value: str | cst.BaseExpression) -> cst.Call:
    """Replace the value of an existing keyword argument (or add it)."""
    expr = cst.parse_expression(value) if isinstance(value, str) else value
    if kwarg(call, name) is None:
        return add_kwargs(call, [(name, expr)])
    args = [a.with_changes(value=expr) if a.keyword is not None and a.keyword.value == name else a for a in call.args]
    return call.with_changes(args=args)


# --------------------------------------------------------------------------------------------
# Device expressions
# --------------------------------------------------------------------------------------------

_DEVICE_NAMES = {"dev", "cuda", "gpu", "gpu_id", "device_id", "local_rank", "rank", "device_ids"}


def is_device_expr(ctx: Context | None, expr: cst.CSTNode) -> bool:
    """Statically recognisably an accelerator device: ``"cuda"``/``"cuda:0"``, ``device``,
    ``args.device``, ``x.device``, ``torch.device("cuda", ...)``, ``local_rank``, an int. CPU
    spellings (``"cpu"``, ``cpu_device``) and anything unknown (e.g. a dtype) are not."""
    s = string_value(expr)
    if s is not None:
        return s.strip().lower().startswith("cuda")
    if isinstance(expr, cst.Integer):
        return True
    name = last_name(expr)
    if name is not None:
        low = name.lower()
        if "cpu" in low or "host" in low or "dtype" in low:
            return False
        return "device" in low or low in _DEVICE_NAMES
    if isinstance(expr, cst.Call):
        d = dotted(expr.func)
        if d is not None and d.split(".")[-1] == "device" and (ctx is None or ctx.matches(expr, {"torch.device"}, {"torch.device"})):
            first = expr.args[0].value if expr.args else None
            s = string_value(first)
            return s is not None and s.strip().lower().startswith("cuda") or (s is None and first is not None and is_device_expr(ctx, first))
    return False


# --------------------------------------------------------------------------------------------
# Walking
# --------------------------------------------------------------------------------------------


def walk(node: cst.CSTNode, *, into_scopes: bool = True) -> Iterator[cst.CSTNode]:
    """Pre-order traversal of ``node``'s subtree (optionally not entering def/class/lambda)."""
    stack = [node]
    scopes = _SCOPE_TYPES
    while stack:
        cur = stack.pop()
        yield cur
        if not into_scopes and cur is not node:
            t = type(cur)
            scope = scopes.get(t)
            if scope is None:
                scope = scopes[t] = issubclass(t, (cst.FunctionDef, cst.ClassDef, cst.Lambda))
            if scope:
                continue
        children = iter_children(cur)
        children.reverse()
        stack.extend(children)


_SCOPE_TYPES: dict[type, bool] = {}  # node type -> whether it opens a scope (def, class, lambda)


def target_names(target: cst.CSTNode) -> list[str]:
    """Names bound by an assignment/for target (through tuples, lists and starred)."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        out: list[str] = []
        for el in target.elements:
            out.extend(target_names(el.value))
        return out
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []


# --------------------------------------------------------------------------------------------
# Statements
# --------------------------------------------------------------------------------------------


def simple_stmt(code: str) -> cst.SimpleStatementLine:
    """A statement line parsed from code (e.g. ``"model = torch.compile(model)\n"``)."""
    stmt = cst.parse_statement(code)
    if not isinstance(stmt, cst.SimpleStatementLine):
        raise ValueError(f"not a simple statement: {code!r}")
    return stmt


def remove_statement(ctx: Context, small: cst.BaseSmallStatement, *, drop_empty_if: bool = False) -> dict[cst.CSTNode, Replacement]:
    """Changes that delete one small statement, keeping comments: in ``a; b`` only the statement
    goes; a whole line goes and hands its comments (leading lines, trailing comment) to the next
    statement; the only statement of a block becomes ``pass`` (with its comments).

    ``drop_empty_if``: when the statement is the only one of an ``if`` (no ``elif``/``else``)
    whose test has no side effects (:func:`side_effect_free`), the whole ``if`` goes instead of
    becoming ``if test: pass``, also through nested such ``if`` statements; its comments go to
    the next statement.

    A clause left holding nothing goes rather than becoming ``pass``, where that changes nothing
    (:func:`_emptied_clause`): an ``else:`` (of ``if``, ``for``, ``while``, ``try``), a ``finally:``
    of a ``try`` with handlers, and with ``drop_empty_if`` a last ``elif`` whose test has no side
    effects."""
    line = ctx.parent(small)
    if not isinstance(line, (cst.SimpleStatementSuite, cst.SimpleStatementLine)):
        return {}
    if len(line.body) > 1:
        if line.body[-1] is small:  # `a; b` -> `a`, not `a; `
            prev = line.body[-2]
            return {small: cst.RemovalSentinel.REMOVE, prev: prev.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)}
        return {small: cst.RemovalSentinel.REMOVE}
    emptied = _emptied_if(ctx, line) if drop_empty_if else None
    clause = _emptied_clause(ctx, emptied or line, drop_elif=drop_empty_if)
    if clause is not None:
        return _drop_clause(ctx, clause)
    if emptied is not None:
        return _drop_from_block(ctx, emptied, _comments_in(ctx, emptied))
    if isinstance(line, cst.SimpleStatementSuite):
        return {small: cst.Pass()}
    where = ctx.block_of(line)
    if where is None:
        return {}
    block, index = where
    body = list(block.body)
    if len(body) == 1:
        return {line: line.with_changes(body=[cst.Pass()])}
    trailing = line.trailing_whitespace.comment
    carried = list(line.leading_lines)
    if trailing is not None:
        carried.append(cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace(""), comment=trailing))
    if index + 1 < len(body):
        nxt = body[index + 1]
        if not carried:
            return {line: cst.RemovalSentinel.REMOVE}
        return {line: cst.RemovalSentinel.REMOVE, nxt: nxt.with_changes(leading_lines=[*carried, *nxt.leading_lines])}
    if any(e.comment is not None for e in carried):
        return {line: line.with_changes(body=[cst.Pass()], trailing_whitespace=line.trailing_whitespace)}
    return {line: cst.RemovalSentinel.REMOVE}


def side_effect_free(expr: cst.CSTNode) -> bool:
    """Evaluating ``expr`` does nothing but give a value: a name or attribute read, a literal, or
    comparisons, arithmetic, ``not``/``and``/``or`` of those (``i % 100 == 0``, ``self.training``).
    Calls, subscripts, ``:=``, ``in`` (which advances an iterator), f-strings, lambdas and
    comprehensions are not."""
    if isinstance(expr, cst.Name):
        return True
    if isinstance(expr, cst.Attribute):
        return side_effect_free(expr.value)
    if literal(expr) is not MISSING:
        return True
    if isinstance(expr, cst.Comparison):  # not `in`: `x in it` advances an iterator
        return side_effect_free(expr.left) and all(
            not isinstance(c.operator, (cst.In, cst.NotIn)) and side_effect_free(c.comparator) for c in expr.comparisons)
    if isinstance(expr, (cst.BooleanOperation, cst.BinaryOperation)):
        return side_effect_free(expr.left) and side_effect_free(expr.right)
    if isinstance(expr, cst.UnaryOperation):
        return side_effect_free(expr.expression)
    return False


def _emptied_if(ctx: Context, stmt: cst.CSTNode) -> cst.If | None:
    """The outermost ``if`` that holds nothing but ``stmt`` (through nested such ``if``
    statements), has no ``elif``/``else``, is no ``elif`` itself and tests something without side
    effects (no comment inside the test either); None when there is none."""
    found = None
    node = stmt
    while True:
        holder = ctx.parent(node)
        if isinstance(holder, cst.IndentedBlock):
            if len(holder.body) != 1:
                break
            holder = ctx.parent(holder)
        if not (isinstance(holder, cst.If) and holder.orelse is None and not isinstance(ctx.parent(holder), cst.If)):
            break
        if not side_effect_free(holder.test) or any(isinstance(n, cst.Comment) for n in walk(holder.test)):
            break
        found = node = holder
    return found


def _emptied_clause(ctx: Context, stmt: cst.CSTNode, *, drop_elif: bool) -> cst.CSTNode | None:
    """The clause (``else:``, ``finally:``, ``elif``) whose body is ``stmt`` alone and which can go
    without changing what runs once ``stmt`` is deleted: an ``else:`` of ``if``/``for``/``while``/
    ``try``; a ``finally:`` of a ``try`` that keeps a handler (``try:`` needs one or the other); with
    ``drop_elif``, an ``elif`` with no ``elif``/``else`` after it (dropping one with a later
    branch would send its cases there) whose test has no side effects. None where a comment
    anywhere in the clause would be lost, or no such clause holds ``stmt``."""
    holder = ctx.parent(stmt)
    if isinstance(holder, cst.IndentedBlock):
        if len(holder.body) != 1:
            return None
        holder = ctx.parent(holder)
    elif not isinstance(stmt, cst.SimpleStatementSuite):
        return None
    if isinstance(holder, cst.Finally):
        owner = ctx.parent(holder)
        if not (isinstance(owner, (cst.Try, cst.TryStar)) and owner.handlers):
            return None
    elif isinstance(holder, cst.If):
        owner = ctx.parent(holder)
        if not (drop_elif and isinstance(owner, cst.If) and owner.orelse is holder and holder.orelse is None
                and side_effect_free(holder.test)):
            return None
    elif not isinstance(holder, cst.Else):
        return None
    if any(isinstance(n, cst.Comment) for n in walk(holder)):
        return None
    return holder


def _drop_clause(ctx: Context, clause: cst.CSTNode) -> dict[cst.CSTNode, Replacement]:
    """Changes that delete ``clause`` (from :func:`_emptied_clause`): the statement that owns it is
    rewritten without it (through an ``if``/``elif`` chain, from its first ``if``)."""
    owner = ctx.parent(clause)
    new: cst.CSTNode = owner.with_changes(finalbody=None) if isinstance(clause, cst.Finally) else owner.with_changes(orelse=None)
    while isinstance(owner, cst.If) and isinstance(ctx.parent(owner), cst.If) and ctx.parent(owner).orelse is owner:
        owner, new = ctx.parent(owner), ctx.parent(owner).with_changes(orelse=new)
    return {owner: new}


def _comments_in(ctx: Context, stmt: cst.CSTNode) -> list[cst.EmptyLine]:
    """``stmt``'s leading lines, then every other comment inside it (in source order) as a line
    of its own."""
    inner = sorted((n for n in walk(stmt) if isinstance(n, cst.Comment)), key=lambda c: (ctx.pos(c).start.line, ctx.pos(c).start.column))
    own = {id(e.comment) for e in getattr(stmt, "leading_lines", ()) if e.comment is not None}
    lines = list(getattr(stmt, "leading_lines", ()))
    lines += [cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace(""), comment=c) for c in inner if id(c) not in own]
    return lines


def _drop_from_block(ctx: Context, stmt: cst.CSTNode, carried: list[cst.EmptyLine]) -> dict[cst.CSTNode, Replacement]:
    """Changes that delete the statement ``stmt`` of a block, handing ``carried`` (its comment
    lines) to the next statement; the only statement of a block becomes ``pass`` (with them)."""
    where = ctx.block_of(stmt)
    if where is None:
        return {}
    block, index = where
    body = list(block.body)
    has_comments = any(e.comment is not None for e in carried)
    if len(body) == 1 or (index + 1 == len(body) and has_comments):
        return {stmt: cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried)}
    if index + 1 < len(body):
        nxt = body[index + 1]
        if not carried:
            return {stmt: cst.RemovalSentinel.REMOVE}
        return {stmt: cst.RemovalSentinel.REMOVE, nxt: nxt.with_changes(leading_lines=[*carried, *nxt.leading_lines])}
    return {stmt: cst.RemovalSentinel.REMOVE}


def _root_name_node(expr: cst.CSTNode) -> cst.Name | None:
    while isinstance(expr, cst.Attribute):
        expr = expr.value
    return expr if isinstance(expr, cst.Name) else None


def _import_binding(ctx: Context, name: str) -> tuple[cst.ImportFrom, cst.ImportAlias] | None:
    """The ``from M import X [as name]`` that binds ``name``, when it is the file's only import
    of that name (not ``as name`` with the same name: an explicit re-export)."""
    found: list[tuple[cst.ImportFrom, cst.ImportAlias]] = []
    for node in ctx.nodes(cst.Import, cst.ImportFrom):
        if isinstance(node, cst.ImportFrom) and isinstance(node.names, cst.ImportStar):
            continue
        for alias in node.names:  # type: ignore[union-attr]
            bound = alias.asname.name if alias.asname is not None else alias.name
            full = dotted(bound) or ""
            if (full if alias.asname is not None or isinstance(node, cst.ImportFrom) else full.split(".")[0]) == name:
                found.append((node, alias))  # type: ignore[arg-type]
    if len(found) != 1 or not isinstance(found[0][0], cst.ImportFrom):
        return None
    imp, alias = found[0]
    if alias.asname is not None and dotted(alias.asname.name) == dotted(alias.name):
        return None
    return imp, alias


def _without_alias(ctx: Context, imp: cst.ImportFrom, alias: cst.ImportAlias) -> dict[cst.CSTNode, Replacement]:
    """Changes that take ``alias`` out of ``imp`` (the whole statement when it is the only name)."""
    names = list(imp.names)  # type: ignore[arg-type]
    if len(names) == 1:
        return remove_statement(ctx, imp)
    i = next(k for k, a in enumerate(names) if a is alias)
    rest = names[:i] + names[i + 1:]
    if i == len(names) - 1:  # the last name: the one before it takes its comma (none without parentheses)
        comma = alias.comma if imp.rpar is not None else cst.MaybeSentinel.DEFAULT
        rest[-1] = rest[-1].with_changes(comma=comma)
    return {imp: imp.with_changes(names=rest)}


def _separate(ctx: Context, changes: Sequence[Mapping[cst.CSTNode, Replacement]]) -> bool:
    """No two change sets touch the same node or nodes inside one another."""
    nodes = [n for c in changes for n in c]
    return all(not ctx.contains(a, b) and not ctx.contains(b, a) for i, a in enumerate(nodes) for b in nodes[i + 1:])


def _docstring(ctx: Context, string: cst.CSTNode) -> bool:
    """``string`` is a module's, class's or function's docstring (prose, not a name's use)."""
    expr = ctx.parent(string)
    line = ctx.parent(expr) if isinstance(expr, cst.Expr) else None
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return False
    where = ctx.block_of(line)
    if where is None or where[1] != 0:
        return False
    holder = where[0] if isinstance(where[0], cst.Module) else ctx.parent(where[0])
    return isinstance(holder, (cst.Module, cst.FunctionDef, cst.ClassDef))


def drop_imports_left_unused(ctx: Context, removed: Sequence[tuple[cst.Call, Mapping[cst.CSTNode, Replacement]]]
                             ) -> dict[cst.Call, tuple[dict[cst.CSTNode, Replacement], str]]:
    """Imports that deleting the statements of ``removed`` (calls, each with the changes that
    delete it) would leave unused: ``from torch.cuda import empty_cache`` (or ``from torch import
    cuda``) when every other use of the name is one of those calls. Not when anything else in
    the file names it (code, ``__all__``, a string annotation, any string but a docstring), when
    it is bound more than once, imported ``as`` itself (an explicit re-export), in a package's
    ``__init__.py`` (other modules import from it), in a notebook (its IPython magics and cells
    left out of the analysis may use it; cells run in any order) or carries a comment. Returns,
    for the last such call of each name, the changes that delete all its calls and the import
    together, and the import's text: one edit, so that the import never goes while a call using
    it stays."""
    if ctx.path.replace("\\", "/").rsplit("/", 1)[-1] == "__init__.py" or ctx.notebook():
        return {}  # a package's names are imported by others; a notebook's cells (magics, cells left out) by each other
    by_name: dict[str, list[tuple[cst.Call, Mapping[cst.CSTNode, Replacement]]]] = {}
    for call, changes in removed:
        root = _root_name_node(call.func)
        if root is not None and changes:
            by_name.setdefault(root.value, []).append((call, changes))
    out: dict[cst.Call, tuple[dict[cst.CSTNode, Replacement], str]] = {}
    for name, calls in by_name.items():
        binding = _import_binding(ctx, name)
        if binding is None:
            continue
        imp, alias = binding
        if any(isinstance(n, cst.Comment) for n in walk(alias)):
            continue
        roots = {id(_root_name_node(call.func)) for call, _ in calls}
        own = {id(n) for n in walk(alias)}
        uses = [n for n in ctx.nodes(cst.Name) if n.value == name and id(n) not in own
                and not (isinstance(ctx.parent(n), cst.Attribute) and ctx.parent(n).attr is n)]  # type: ignore[union-attr]
        if any(id(n) not in roots for n in uses):
            continue
        word = re.compile(rf"(?<![\w]){re.escape(name)}(?![\w])")
        strings = [*ctx.nodes(cst.SimpleString), *ctx.nodes(cst.FormattedStringText)]
        if any(word.search(s.value) and not _docstring(ctx, s) for s in strings):
            continue
        import_changes = _without_alias(ctx, imp, alias)
        sets = [c for _, c in calls] + [import_changes]
        if not import_changes or not _separate(ctx, sets):
            continue
        combined: dict[cst.CSTNode, Replacement] = {}
        for c in sets:
            combined.update(c)
        last = max((call for call, _ in calls), key=ctx.order)
        out[last] = (combined, ctx.code(imp).strip())
    return out


def insert_after(stmt: cst.CSTNode, new: Sequence[cst.CSTNode]) -> dict[cst.CSTNode, Replacement]:
    return {stmt: cst.FlattenSentinel([stmt, *new])}


# --------------------------------------------------------------------------------------------
# DataLoader (shared by dataloader-bound and pageable-memcpy)
# --------------------------------------------------------------------------------------------

DATALOADER_NAMES = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
DATALOADER_BARE = {"DataLoader", "data.DataLoader", "torch.utils.data.DataLoader"}


def dataloader_calls(ctx: Context) -> list[cst.Call]:
    return [c for c in ctx.nodes(cst.Call) if ctx.matches(c, DATALOADER_NAMES, DATALOADER_BARE)]


def dataloader_is_serial(call: cst.Call) -> bool:
    """num_workers missing or literally 0 (statically visible)."""
    arg = kwarg(call, "num_workers")
    return arg is None or is_literal(arg.value, 0)


def dataloader_fixable(call: cst.Call) -> bool:
    """The dataloader fixer can rewrite this call: no */** arguments, num_workers not positional."""
    return not has_star(call) and len(positionals(call)) <= 5
