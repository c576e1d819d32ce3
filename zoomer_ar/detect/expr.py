"""A small, safe expression language for rule conditions and impact formulas.

Python expression syntax restricted to: numbers, strings, True/False/None, feature names, and/or/not,
comparisons, + - * /, conditional expressions, and calls to min/max/abs/coalesce/clip.
`None` (a feature not measurable in this trace) propagates through arithmetic and makes every
comparison false, so a rule never fires on a figure the trace does not have.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from typing import Any

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_CMPOPS = {
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Eq: operator.eq, ast.NotEq: operator.ne,
}


def _coalesce(*args: Any) -> Any:
    return next((a for a in args if a is not None), None)


def _clip(x: Any, lo: Any, hi: Any) -> Any:
    return None if x is None else max(lo, min(hi, x))


def _min(*args: Any) -> Any:
    vals = [a for a in args if a is not None]
    return min(vals) if vals else None


def _max(*args: Any) -> Any:
    vals = [a for a in args if a is not None]
    return max(vals) if vals else None


FUNCTIONS = {"min": _min, "max": _max, "abs": lambda x: None if x is None else abs(x), "coalesce": _coalesce, "clip": _clip}


class ExprError(ValueError):
    pass


class Expr:
    """A parsed, validated expression. `names` lists the variables it reads."""

    def __init__(self, source: str):
        self.source = str(source).strip()
        try:
            tree = ast.parse(self.source, mode="eval")
        except SyntaxError as exc:
            raise ExprError(f"invalid expression {self.source!r}: {exc.msg}") from None
        self.names: set[str] = set()
        self._check(tree.body)
        self._tree = tree.body

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self._check(v)
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            self._check(node.left)
            self._check(node.right)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            self._check(node.operand)
        elif isinstance(node, ast.Compare) and all(type(op) in _CMPOPS for op in node.ops):
            self._check(node.left)
            for c in node.comparators:
                self._check(c)
        elif isinstance(node, ast.IfExp):
            self._check(node.test)
            self._check(node.body)
            self._check(node.orelse)
        elif isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (int, float, str, bool))):
            pass
        elif isinstance(node, ast.Name):
            if node.id not in FUNCTIONS:
                self.names.add(node.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS and not node.keywords:
            for a in node.args:
                self._check(a)
        else:
            raise ExprError(f"unsupported syntax in {self.source!r}: {ast.dump(node)[:60]}")

    def __call__(self, env: Mapping[str, Any]) -> Any:
        return _eval(self._tree, env)

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ExprError(f"unknown name {node.id!r}")
        return env[node.id]
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for v in node.values:
                result = _eval(v, env)
                if not result:
                    return False
            return bool(result)
        for v in node.values:
            if _eval(v, env):
                return True
        return False
    if isinstance(node, ast.UnaryOp):
        val = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not val
        return None if val is None else -val
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env), _eval(node.right, env)
        if a is None or b is None:
            return None
        if isinstance(node.op, ast.Div) and b == 0:
            return None
        return _BINOPS[type(node.op)](a, b)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            if (left is None or right is None) and type(op) not in (ast.Eq, ast.NotEq):
                return False
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, ast.Call):
        return FUNCTIONS[node.func.id](*[_eval(a, env) for a in node.args])  # type: ignore[union-attr]
    raise ExprError(f"cannot evaluate {ast.dump(node)[:60]}")
