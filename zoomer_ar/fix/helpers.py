"""libcst helpers shared by the fixers (pure functions on nodes, plus a few Context-aware ones)."""

from __future__ import annotations

import ast
from typing import Any, Iterable, Iterator, Sequence

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


def remove_statement(ctx: Context, small: cst.BaseSmallStatement) -> dict[cst.CSTNode, Replacement]:
    """Changes that delete one small statement, keeping comments: in ``a; b`` only the statement
    goes; a whole line goes and hands its comments (leading lines, trailing comment) to the next
    statement; the only statement of a block becomes ``pass`` (with its comments)."""
    line = ctx.parent(small)
    if not isinstance(line, (cst.SimpleStatementSuite, cst.SimpleStatementLine)):
        return {}
    if len(line.body) > 1:
        if line.body[-1] is small:  # `a; b` -> `a`, not `a; `
            prev = line.body[-2]
            return {small: cst.RemovalSentinel.REMOVE, prev: prev.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)}
        return {small: cst.RemovalSentinel.REMOVE}
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
