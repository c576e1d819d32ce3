"""Fixer base class, the per-source analysis context and the edit machinery.

A fixer looks at one parsed source (a :class:`Context`) and yields :class:`Edit` objects: the node
it flags, a message and, when it knows a behaviour-preserving rewrite, a mapping from original
nodes to their replacements. The machinery here turns edits into :class:`StaticMatch` findings
(``detect``) or applies them (``fix``): non-overlapping edits are applied together, the result is
re-parsed (libcst and :mod:`ast`) and an edit whose result does not parse is refused; rounds repeat
until nothing is left to fix, so ``fix(fix(x)) == fix(x)``.

Inline suppression: ``# zoomer: ignore`` or ``# zoomer: ignore[ID, ...]`` (ID: a pattern id or a
fixer name) on the flagged line or on the first/last line of the enclosing statement;
``# zoomer: ignore-file[ID, ...]`` anywhere in the file.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import math
import re
import threading
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping, Sequence

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper
from pydantic import BaseModel, Field

from ..errors import InputError, ZoomerError
from .lines import split_lines
from .nesting import nesting_problem, parse_in_big_stack
from .positions import positions as node_positions

MAX_ROUNDS = 12

Replacement = cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel


class FixerError(ZoomerError):
    """A fixer file under fixers/ is invalid, or a fixer was given bad options."""

    exit_code = 1


class SourceParseError(InputError):
    """A source file does not parse (libcst ParserSyntaxError); exit code 2 when fatal."""

    def __init__(self, path: str | None, line: int, column: int, reason: str):
        self.line = line
        self.column = column
        super().__init__(f"{path}:{line}:{column}" if path else f"{line}:{column}", f"cannot parse: {reason}")


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


class TextEdit(BaseModel):
    """One replaced span of the original source (1-based lines and columns, end exclusive)."""

    line: int
    column: int
    end_line: int
    end_column: int
    text: str


class StaticMatch(BaseModel):
    """A statically visible occurrence of an anti-pattern.

    ``line``/``column`` (1-based) to ``end_line``/``end_column`` (exclusive) is the flagged
    expression or statement; ``statement_line`` the first line of the statement holding it.
    ``fixable`` says whether the selected fixer will rewrite it in this run; ``replacement`` is
    the new text of the flagged span (or of the statement) and ``edits`` every span the fix
    changes (a fix may touch more than one place, e.g. a read after a loop).
    """

    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    statement_line: int
    pattern: str
    message: str
    fixer: str
    fixable: bool = False
    opt_in: bool = False
    replacement: str | None = None
    edits: list[TextEdit] = Field(default_factory=list)

    def format(self) -> str:
        tag = "fixable" if self.fixable else ("opt-in" if self.opt_in and self.edits else "report only")
        return f"{self.path}:{self.line}:{self.column}: {self.pattern} {self.message} [{self.fixer}, {tag}]"


@dataclass(frozen=True)
class Example:
    """A rule example: ``before`` must be flagged (message containing ``message_contains``) and
    fixed to exactly ``after``; ``after=None`` means report only (the fix leaves it unchanged).
    ``path``: the file the source is read as (a fixer may judge a test module or a file's name)."""

    before: str
    after: str | None = None
    message_contains: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    path: str = "example.py"


@dataclass(eq=False)
class Edit:
    """What a fixer yields: the flagged node, a message and (optionally) node replacements."""

    node: cst.CSTNode
    message: str
    changes: dict[cst.CSTNode, Replacement] | None = None


# --------------------------------------------------------------------------------------------
# Parsing and the analysis context
# --------------------------------------------------------------------------------------------

_SUPPRESS_RE = re.compile(r"#\s*zoomer\s*:\s*ignore(?P<file>-file)?(?:\[(?P<ids>[^\]]*)\])?", re.IGNORECASE)
ALL = "*"


def parse_source(source: str, path: str | None = "<string>") -> cst.Module:
    """Parse with libcst; a syntax error becomes a one-line :class:`SourceParseError` (position
    and message from Python's own parser when it agrees the source is invalid). Text nested too
    deeply is refused before parsing: the native parser would overflow its stack and kill the
    process (see :mod:`.nesting`)."""
    too_deep = nesting_problem(source)
    if too_deep is not None:
        line, column, why = too_deep
        raise SourceParseError(path, line, column, f"nesting too deep ({why})")
    try:
        return parse_in_big_stack(lambda: cst.parse_module(source))
    except cst.ParserSyntaxError as exc:
        line, col, reason = _syntax_error(source, exc)
        raise SourceParseError(path, line, col, reason) from None
    except RecursionError:
        raise SourceParseError(path, 1, 1, "too deeply nested") from None
    except Exception as exc:  # libcst may raise other errors for exotic input
        raise SourceParseError(path, 1, 1, f"{type(exc).__name__}: {exc}".splitlines()[0]) from None


class _Parsed:
    """A parsed source with its traversal and (lazily) positions; immutable once built, so
    Contexts over the same text share it (detect then fix parse once)."""

    def __init__(self, module: cst.Module):
        self.module = module
        self.wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        self.collector = _Collector(module)
        self._positions: Mapping[cst.CSTNode, CodeRange] | None = None
        self.ast_ok: bool | None = None

    def positions(self) -> Mapping[cst.CSTNode, CodeRange]:
        if self._positions is None:
            self._positions = node_positions(self.module)  # libcst's PositionProvider, faster (positions.py)
        return self._positions


_CACHE: "OrderedDict[str, _Parsed]" = OrderedDict()
_CACHE_SIZE = 64
_CACHE_MAX_CHARS = 1_000_000
_CACHE_LOCK = threading.Lock()


def _parsed(source: str, path: str | None) -> _Parsed:
    with _CACHE_LOCK:
        hit = _CACHE.get(source)
        if hit is not None:
            _CACHE.move_to_end(source)
            return hit
    parsed = _Parsed(parse_source(source, path))
    if len(source) <= _CACHE_MAX_CHARS:
        with _CACHE_LOCK:
            _CACHE[source] = parsed
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    return parsed


def _syntax_error(source: str, exc: cst.ParserSyntaxError) -> tuple[int, int, str]:
    try:
        ast.parse(source)
    except SyntaxError as err:
        return err.lineno or 1, err.offset or 1, (err.msg or "invalid syntax").splitlines()[0]
    except (ValueError, RecursionError, MemoryError) as err:
        return 1, 1, str(err).splitlines()[0] if str(err) else type(err).__name__
    message = str(exc.message).strip().splitlines()[0] if str(exc.message).strip() else "syntax error"
    m = re.match(r"parser error: error at (\d+):(\d+): (.*)", message)
    if m:
        line, col, message = int(m.group(1)), int(m.group(2)) + 1, m.group(3)
    else:
        line, col = exc.editor_line, exc.editor_column
    if len(message) > 100:
        message = message[:97] + "..."
    return line, col, f"{message} (unsupported by libcst)"


BUILTINS = frozenset(dir(builtins))


def _dotted(expr: cst.CSTNode | None) -> str | None:
    parts: list[str] = []
    while isinstance(expr, cst.Attribute):
        parts.append(expr.attr.value)
        expr = expr.value
    if isinstance(expr, cst.Name):
        parts.append(expr.value)
        return ".".join(reversed(parts))
    return None


def _stored_names(target: cst.CSTNode) -> Iterator[str]:
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for el in target.elements:
            yield from _stored_names(el.value)
    elif isinstance(target, (cst.StarredElement, cst.Element)):
        yield from _stored_names(target.value)


_FIELDS: dict[type, tuple[str, ...]] = {}
#: type -> whether it is a CSTNode: CSTNode's metaclass is ABCMeta, whose isinstance goes through
#: Python code; a traversal asks it millions of times for a few dozen types
_IS_NODE: dict[type, bool] = {}


def is_node(value: object) -> bool:
    """isinstance(value, cst.CSTNode), answered once per type."""
    t = type(value)
    known = _IS_NODE.get(t)
    if known is None:
        known = _IS_NODE[t] = isinstance(value, cst.CSTNode)
    return known


def iter_children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Direct children of a node, read from its dataclass fields (much cheaper than libcst's
    ``.children``, which rebuilds the node). Field order, close to source order."""
    names = _FIELDS.get(type(node))
    if names is None:
        names = _FIELDS[type(node)] = tuple(f.name for f in dataclasses.fields(node))
    out: list[cst.CSTNode] = []
    for name in names:
        value = getattr(node, name)
        if is_node(value):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(item for item in value if is_node(item))
    return out


class _Collector:
    """One traversal: order, nodes by type, parents, and the names the file binds (imports ->
    full dotted names; other bindings: assignments, defs, classes, parameters...)."""

    def __init__(self, module: cst.Module) -> None:
        self.order: dict[cst.CSTNode, int] = {}
        self.by_type: dict[type, list[cst.CSTNode]] = defaultdict(list)
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self.imports: dict[str, set[str]] = defaultdict(set)
        self.locals: set[str] = set()
        stack: list[cst.CSTNode] = [module]
        order, by_type, parents = self.order, self.by_type, self.parents
        binds = _BINDING_TYPES
        while stack:
            node = stack.pop()
            order[node] = len(order)
            t = type(node)
            by_type[t].append(node)
            if t in binds or (t not in _PLAIN_TYPES and self._binding_type(t)):
                self._bindings(node)
            children = iter_children(node)
            for child in children:
                parents[child] = node
            children.reverse()
            stack.extend(children)

    @staticmethod
    def _binding_type(t: type) -> bool:
        """Whether nodes of type t can bind a name (_bindings): decided once per type."""
        if issubclass(t, _BINDING_BASES):
            _BINDING_TYPES.add(t)
            return True
        _PLAIN_TYPES.add(t)
        return False

    def _bindings(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = _dotted(alias.name) or ""
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self.imports[alias.asname.name.value].add(full)
                else:
                    root = full.split(".")[0]
                    self.imports[root].add(root)
        elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
            module = "." * len(node.relative) + (_dotted(node.module) or "")
            for alias in node.names:
                name = _dotted(alias.name) or ""
                bound = alias.asname.name.value if alias.asname is not None and isinstance(alias.asname.name, cst.Name) else name
                self.imports[bound].add(f"{module}.{name}" if module and not module.endswith(".") else f"{module}{name}")
        elif isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr)):
            self.locals.update(_stored_names(node.target))
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Param)):
            self.locals.add(node.name.value)
        elif isinstance(node, (cst.WithItem, cst.ExceptHandler, cst.ExceptStarHandler)):
            asname = node.asname if isinstance(node, cst.WithItem) else node.name
            if asname is not None:
                self.locals.update(_stored_names(asname.name))


_BINDING_BASES = (cst.Import, cst.ImportFrom, cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor,
                  cst.NamedExpr, cst.FunctionDef, cst.ClassDef, cst.Param, cst.WithItem, cst.ExceptHandler,
                  cst.ExceptStarHandler)
_BINDING_TYPES: set[type] = set()  # node types _Collector._bindings looks at (subclasses of _BINDING_BASES)
_PLAIN_TYPES: set[type] = set()  # and those it does not

SCOPE_BOUNDARIES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
LINE_STATEMENTS = (cst.SimpleStatementLine, cst.SimpleStatementSuite, cst.BaseCompoundStatement)
def _is_main_guard(test: cst.BaseExpression) -> bool:
    """``__name__ == "__main__"`` (either side)."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Equal)):
        return False
    sides = [test.left, test.comparisons[0].comparator]
    names = [s for s in sides if isinstance(s, cst.Name) and s.value == "__name__"]
    strings = [s for s in sides if isinstance(s, cst.SimpleString) and s.evaluated_value == "__main__"]
    return len(names) == 1 and len(strings) == 1


CELL_MARKER = "# zoomer-ar cell "  # notebooks.py: the comment line before each cell of a joined notebook
TIMED_MARK = "timed"  # ... ending in this word for a cell that a %%time/%%timeit/%%prun magic times


class Context:
    """One parsed source with the metadata fixers need (positions, parents, qualified names)."""

    def __init__(
        self,
        source: str,
        path: str = "<string>",
        *,
        fixing: Iterable[str] = (),
        options: Mapping[str, Mapping[str, Any]] | None = None,
        module: cst.Module | None = None,
    ):
        self.source = source
        self.path = path
        self.fixing = frozenset(fixing)
        self.options = options or {}
        parsed = _parsed(source, path) if module is None else _Parsed(module)
        self._parsed = parsed
        self.wrapper = parsed.wrapper
        self.module = parsed.module
        collector = parsed.collector
        self._order = collector.order
        self._by_type = collector.by_type
        self._parents = collector.parents
        self._imports = collector.imports
        self._locals = collector.locals
        self._line_suppress: dict[int, set[str]] | None = None
        self._file_suppress: set[str] = set()
        self._resolved: dict[cst.CSTNode, tuple[bool, frozenset[str] | str | None]] = {}  # matches()

    @property
    def _pos(self) -> Mapping[cst.CSTNode, CodeRange]:
        """Positions, computed on first use (a code-generation pass: the costliest metadata)."""
        return self._parsed.positions()

    def _suppressions(self) -> dict[int, set[str]]:
        if self._line_suppress is None:
            self._line_suppress = defaultdict(set)
            if "zoomer" in self.source.lower():
                for comment in self._by_type.get(cst.Comment, ()):
                    for m in _SUPPRESS_RE.finditer(comment.value):
                        ids = {i.strip().lower() for i in (m.group("ids") or "").split(",") if i.strip()} or {ALL}
                        if m.group("file"):
                            self._file_suppress |= ids
                        else:
                            self._line_suppress[self._pos[comment].start.line] |= ids
        return self._line_suppress

    # -- traversal -------------------------------------------------------------------------

    def nodes(self, *types: type) -> list[Any]:
        """All nodes of the given types, in document order."""
        if len(types) == 1:
            return list(self._by_type.get(types[0], ()))
        out: list[cst.CSTNode] = []
        for t in types:
            out.extend(self._by_type.get(t, ()))
        out.sort(key=self._order.__getitem__)
        return out

    def order(self, node: cst.CSTNode) -> int:
        return self._order[node]

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        cur = self._parents.get(node)
        while cur is not None:
            yield cur
            cur = self._parents.get(cur)

    def pos(self, node: cst.CSTNode) -> CodeRange:
        return self._pos[node]

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def contains(self, outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
        return inner is outer or any(a is outer for a in self.ancestors(inner))

    # -- statements and loops ------------------------------------------------------------------

    def small_statement(self, node: cst.CSTNode) -> cst.BaseSmallStatement | None:
        for n in (node, *self.ancestors(node)):
            if isinstance(n, cst.BaseSmallStatement):
                return n
            if isinstance(n, (*LINE_STATEMENTS, cst.IndentedBlock, cst.Module)):
                return None
        return None

    def line_statement(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The nearest SimpleStatementLine / SimpleStatementSuite / compound statement."""
        for n in (node, *self.ancestors(node)):
            if isinstance(n, LINE_STATEMENTS):
                return n
        return None

    def statement(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The nearest statement that is an element of a block (SimpleStatementLine or compound)."""
        for n in (node, *self.ancestors(node)):
            if isinstance(n, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return n
        return None

    def block_of(self, stmt: cst.CSTNode) -> tuple[cst.CSTNode, int] | None:
        """(block, index) where block is the Module or IndentedBlock whose body holds ``stmt``."""
        parent = self.parent(stmt)
        if isinstance(parent, (cst.Module, cst.IndentedBlock)):
            for i, s in enumerate(parent.body):
                if s is stmt:
                    return parent, i
        return None

    def enclosing_scope(self, node: cst.CSTNode) -> cst.CSTNode:
        """The innermost FunctionDef / ClassDef / Lambda around ``node``, else the Module."""
        for a in self.ancestors(node):
            if isinstance(a, SCOPE_BOUNDARIES):
                return a
        return self.module

    def loops_around(self, node: cst.CSTNode) -> list[cst.For | cst.While]:
        """Statement loops whose body (or while-test) runs ``node`` each iteration, innermost
        first; stops at a function, class or lambda boundary."""
        out: list[cst.For | cst.While] = []
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, SCOPE_BOUNDARIES):
                break
            if isinstance(anc, cst.For) and child is anc.body:
                out.append(anc)
            elif isinstance(anc, cst.While) and (child is anc.body or child is anc.test):
                out.append(anc)
            child = anc
        return out

    def in_loop(self, node: cst.CSTNode) -> bool:
        return bool(self.loops_around(node))

    # -- names -----------------------------------------------------------------------------------

    def qualnames(self, node: cst.CSTNode) -> set[str]:
        """Full dotted names of a Name/Attribute (or a Call's callee) through the file's imports
        (``nn.Conv2d`` -> ``torch.nn.Conv2d``); names bound otherwise (assignments, defs,
        classes, parameters) stay as written; builtins get ``builtins.``; names that nothing
        binds give their dotted source text (``torch.optim.Adam`` in a snippet)."""
        if isinstance(node, cst.Call):
            node = node.func
        d = _dotted(node)
        if d is None:
            return set()
        root, _, rest = d.partition(".")
        names: set[str] = set()
        for full in self._imports.get(root, ()):
            names.add(f"{full}.{rest}" if rest else full)
        if root in self._locals:
            names.add(d)
        if not names and root in BUILTINS:
            names.add(f"builtins.{d}")
        return names or {d}

    def is_bound(self, node: cst.CSTNode) -> bool:
        """Whether the root of a Name/Attribute (or a Call's callee) is bound in the file by an
        import, an assignment, a def/class or a parameter, or is a builtin."""
        if isinstance(node, cst.Call):
            node = node.func
        d = _dotted(node)
        if d is None:
            return False
        root = d.split(".")[0]
        return root in self._imports or root in self._locals or root in BUILTINS

    def matches(self, node: cst.CSTNode, full: Iterable[str], bare: Iterable[str] = ()) -> bool:
        """Whether ``node`` (a callee or a Call) refers to one of ``full`` (fully qualified names);
        ``bare`` lists spellings accepted only when nothing binds them (snippets, star imports)."""
        target = node.func if type(node) is cst.Call else node
        resolved = self._resolved.get(target)
        if resolved is None:  # what is_bound and qualnames say of it, once per node
            bound = self.is_bound(target)
            resolved = self._resolved[target] = (bound, frozenset(self.qualnames(target)) if bound else _dotted(target))
        bound, names = resolved
        if bound:
            return not names.isdisjoint(full)  # type: ignore[union-attr]
        if names is None:
            return False
        full = full if isinstance(full, (set, frozenset)) else set(full)
        return names in full or names in (bare if isinstance(bare, (set, frozenset)) else set(bare))

    def torch_alias(self) -> str | None:
        """The name a top-level ``import torch [as X]`` binds, if any."""
        for stmt in self.module.body:
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        if self.code(alias.name) == "torch":
                            if alias.asname is None:
                                return "torch"
                            asname = alias.asname.name
                            if isinstance(asname, cst.Name):
                                return asname.value
        return None

    # -- suppression -----------------------------------------------------------------------------

    def suppression_lines(self, node: cst.CSTNode) -> set[int]:
        lines = {self._pos[node].start.line}
        stmt = self.line_statement(node)
        if stmt is not None:
            rng = self._pos[stmt]
            lines.add(rng.start.line)
            if isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                lines.add(rng.end.line)
        return lines

    def is_suppressed(self, node: cst.CSTNode, *ids: str) -> bool:
        lines = self._suppressions()
        if not lines and not self._file_suppress:
            return False
        wanted = {ALL, *(i.lower() for i in ids)}
        if self._file_suppress & wanted:
            return True
        return any(lines.get(line, set()) & wanted for line in self.suppression_lines(node))

    # -- spans -----------------------------------------------------------------------------------

    def span(self, node: cst.CSTNode) -> tuple[tuple[int, int], tuple[int, int]]:
        """((line, col), (line, col)) of a node; statements include their leading comment lines."""
        rng = self._pos[node]
        start = (rng.start.line, rng.start.column)
        leading = getattr(node, "leading_lines", None)
        if leading and isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            start = (rng.start.line - len(leading), 0)
        return start, (rng.end.line, rng.end.column)

    def ast_ok(self) -> bool:
        if self._parsed.ast_ok is None:
            try:
                ast.parse(self.source)
                self._parsed.ast_ok = True
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                self._parsed.ast_ok = False
        return self._parsed.ast_ok

    def indent_at(self, node: cst.CSTNode) -> str:
        """The exact whitespace before ``node`` on its first line."""
        rng = self._pos[node]
        line = self.lines()[rng.start.line - 1] if rng.start.line - 1 < len(self.lines()) else ""
        return line[: rng.start.column]

    def notebook(self) -> bool:
        """Whether the module is a notebook's cells joined (notebooks.py marks each cell)."""
        return self.path.endswith(".ipynb") or any(line.startswith(CELL_MARKER) for line in self.lines()[:1])

    def test_module(self) -> bool:
        """Whether the file is a test module by its name (test_*.py, *_test.py, conftest.py): pytest
        imports it into one process with every other test."""
        name = self.path.replace("\\", "/").rsplit("/", 1)[-1]
        return name == "conftest.py" or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")))

    def script_like(self, *nodes: cst.CSTNode) -> bool:
        """Whether the file is run as a program rather than imported as a library: a notebook, an
        `if __name__ == "__main__":` block, or one of `nodes` outside every function and class (code
        that runs as the file runs). A process-wide setting belongs in such a file: put in a module
        that others import, it would hold for every program that imports it."""
        if self.notebook():
            return True
        for stmt in self.module.body:
            if isinstance(stmt, cst.If) and _is_main_guard(stmt.test):
                return True
        scopes = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
        return any(not any(isinstance(a, scopes) for a in self.ancestors(n)) for n in nodes)

    def timed(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` lies in a notebook cell that a `%%time`/`%%timeit`/`%%prun` magic times
        as a whole (the notebook layer puts a marker comment before each cell; a timed cell's
        marker ends in `timed`): code whose running time is being measured."""
        lines = self.lines()
        for i in range(min(self._pos[node].start.line, len(lines)) - 1, -1, -1):
            line = lines[i].strip()
            if line.startswith(CELL_MARKER):
                return line.endswith(" " + TIMED_MARK)
        return False

    def lines(self) -> list[str]:
        if not hasattr(self, "_lines"):
            self._lines = split_lines(self.source)  # Python's lines, as libcst's positions count them
        return self._lines

    def text_edit(
        self, node: cst.CSTNode, new: Replacement, changes: Mapping[cst.CSTNode, Replacement] | None = None
    ) -> tuple[tuple[int, int], tuple[int, int], str]:
        """The replaced span ((line, col) to (line, col), 1-based lines, 0-based columns, end
        exclusive) and its new text, as the module's code generation writes it (``changes``: the
        whole fix ``new`` belongs to, for a small statement whose later neighbours it deletes)."""
        rng = self._pos[node]
        semicolon_end = self._semicolon_end(node) if isinstance(new, (cst.RemovalSentinel, cst.BaseSmallStatement)) else None
        if semicolon_end is not None:  # `a; b`: the statement with its `; `
            text = ""
            if isinstance(new, cst.BaseSmallStatement):
                body = list(getattr(self.parent(node), "body", ()))
                later = body[body.index(node) + 1:] if node in body else []
                last = all(isinstance((changes or {}).get(s), cst.RemovalSentinel) for s in later)
                from libcst._nodes.internal import CodegenState

                state = CodegenState(default_indent=self.module.default_indent, default_newline=self.module.default_newline)
                new._codegen(state, default_semicolon=not last)
                text = "".join(state.tokens)
            return (rng.start.line, rng.start.column), semicolon_end, text
        if not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            # written at the indentation of the statement holding it, as the module writes it:
            # the continuation lines of a call spanning lines inside a block keep the block's indent
            if isinstance(new, cst.RemovalSentinel):
                text = ""
            else:
                text = self._codegen(self.statement(node) or node, list(new.nodes) if isinstance(new, cst.FlattenSentinel) else [new])
            return (rng.start.line, rng.start.column), (rng.end.line, rng.end.column), text
        leading = list(node.leading_lines)
        end = (rng.end.line + 1, 0)
        if isinstance(new, cst.RemovalSentinel):
            return (rng.start.line - len(leading), 0), end, ""
        nodes: list[cst.CSTNode] = list(new.nodes) if isinstance(new, cst.FlattenSentinel) else [new]
        first = nodes[0]
        new_leading = list(getattr(first, "leading_lines", ()))
        added = len(new_leading) - len(leading)
        if added >= 0 and all(a.deep_equals(b) for a, b in zip(new_leading[added:], leading)):
            if added and len(nodes) == 1 and first.with_changes(leading_lines=leading).deep_equals(node):
                # only comment lines put before the statement (a deleted line's comments): insert
                # them, leaving the statement's own lines alone
                at = (rng.start.line - len(leading), 0)
                return at, at, self._codegen(node, new_leading[:added])
            if not added:
                nodes[0] = first.with_changes(leading_lines=[])
                return (rng.start.line, 0), end, self._codegen(node, nodes)
        return (rng.start.line - len(leading), 0), end, self._codegen(node, nodes)

    def _semicolon_end(self, node: cst.CSTNode) -> tuple[int, int] | None:
        """Where the ``;`` after a small statement of ``a; b`` ends, with the space after it (the
        code generation writes a small statement with its semicolon): None without one."""
        semicolon = getattr(node, "semicolon", None) if isinstance(node, cst.BaseSmallStatement) else None
        if not isinstance(semicolon, cst.Semicolon) or semicolon not in self._pos:
            return None
        end = self._pos[semicolon].end
        line, column = end.line, end.column
        for part in split_lines(semicolon.whitespace_after.value):
            if part.endswith(("\n", "\r")):
                line, column = line + 1, 0
            else:
                column += len(part)
        return line, column

    def _codegen(self, node: cst.CSTNode, nodes: Sequence[cst.CSTNode]) -> str:
        """``nodes`` written as the module writes them at ``node``'s indentation."""
        from libcst._nodes.internal import CodegenState

        state = CodegenState(default_indent=self.module.default_indent, default_newline=self.module.default_newline)
        indent = self.indent_at(node)
        if indent:
            state.increase_indent(indent)
        for n in nodes:
            n._codegen(state)
        return "".join(state.tokens)


# --------------------------------------------------------------------------------------------
# The Fixer base class
# --------------------------------------------------------------------------------------------

class Fixer:
    """Base class of a fixer (one per file under ``fixers/``).

    Subclasses set the class attributes and implement :meth:`check`, yielding :class:`Edit`
    objects built with :meth:`report` (flag only) or :meth:`replace` (flag and rewrite).
    """

    #: anti-pattern id, one of zoomer_ar.models.PATTERN_IDS
    pattern: ClassVar[str] = ""
    #: fixer name (kebab-case, unique)
    name: ClassVar[str] = ""
    #: one line
    summary: ClassVar[str] = ""
    #: markdown: what it does / why it is slow / the fix (ruff style)
    explanation: ClassVar[str] = ""
    #: opt-in fixers report by default and rewrite only when selected explicitly
    opt_in: ClassVar[bool] = False
    #: option name -> (default, help)
    OPTIONS: ClassVar[dict[str, tuple[Any, str]]] = {}
    VALID: ClassVar[list[str]] = []
    INVALID: ClassVar[list[Example]] = []
    #: set by the registry: the file the fixer was loaded from
    source_file: ClassVar[str] = ""

    def __init__(self, **options: Any):
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise FixerError(f"fixer {self.name}: unknown option(s): {', '.join(unknown)}")
        self.options: dict[str, Any] = {k: default for k, (default, _help) in self.OPTIONS.items()}
        for key, value in options.items():
            default = self.OPTIONS[key][0]
            self.options[key] = _coerce(self.name, key, value, default)

    # -- to implement ------------------------------------------------------------------------------

    def check(self, ctx: Context) -> Iterable[Edit]:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- helpers for subclasses ----------------------------------------------------------------------

    @staticmethod
    def report(node: cst.CSTNode, message: str) -> Edit:
        return Edit(node, message, None)

    @staticmethod
    def replace(node: cst.CSTNode, message: str, changes: Mapping[cst.CSTNode, Replacement]) -> Edit:
        return Edit(node, message, dict(changes))

    # -- public ---------------------------------------------------------------------------------------

    def detect(self, source: str, path: str = "<string>", *, fixing: Iterable[str] | None = None) -> list[StaticMatch]:
        """Findings in ``source`` (raises SourceParseError if it does not parse)."""
        ctx = Context(source, path, fixing=self._fixing(fixing))
        return collect_matches([self], ctx)

    def fix(self, source: str, path: str = "<string>", *, fixing: Iterable[str] | None = None) -> str:
        """``source`` with every fixable, unsuppressed finding rewritten."""
        return apply_fixer(self, source, path, fixing=self._fixing(fixing))

    def _fixing(self, fixing: Iterable[str] | None) -> frozenset[str]:
        return frozenset(fixing) if fixing is not None else frozenset({self.name})

    def __repr__(self) -> str:
        return f"<fixer {self.name} ({self.pattern})>"


def _coerce(fixer: str, key: str, value: Any, default: Any) -> Any:
    if default is None or value is None:
        return value
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                low = value.strip().lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if isinstance(default, int):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            number = int(value)
            if default >= 1 and number < 1:  # a count or a size: 0 or less was clamped, the fixer silently idle
                raise FixerError(f"fixer {fixer}: option {key}: expected 1 or more, got {value!r}")
            return number
        if isinstance(default, float):
            if isinstance(value, bool):
                raise ValueError(value)
            number = float(value)
            if not math.isfinite(number) or (default >= 0 and number < 0):
                raise FixerError(f"fixer {fixer}: option {key}: expected a number of 0 or more, got {value!r}")
            return number
        return type(default)(value)
    except (TypeError, ValueError, OverflowError):
        raise FixerError(f"fixer {fixer}: option {key}: expected {type(default).__name__}, got {value!r}") from None


# --------------------------------------------------------------------------------------------
# Detection and application
# --------------------------------------------------------------------------------------------


def _join_insertions(edits: list[TextEdit]) -> list[TextEdit]:
    """Sorted edits with each insertion joined to the edit that ends where it is inserted: a
    deleted line whose comments move to the next statement is one edit writing the comments in
    its place, not a deletion plus an insertion before the next line."""
    out: list[TextEdit] = []
    for e in edits:
        prev = out[-1] if out else None
        inserted = (e.line, e.column) == (e.end_line, e.end_column)
        if prev is not None and inserted and (prev.end_line, prev.end_column) == (e.line, e.column):
            out[-1] = prev.model_copy(update={"text": prev.text + e.text})
        else:
            out.append(e)
    return out


def _to_match(ctx: Context, fixer: Fixer, edit: Edit) -> StaticMatch:
    rng = ctx.pos(edit.node)
    stmt = ctx.line_statement(edit.node)
    stmt_line = ctx.pos(stmt).start.line if stmt is not None else rng.start.line
    edits: list[TextEdit] = []
    replacement = None
    for node, new in (edit.changes or {}).items():
        (sl, sc), (el, ec), text = ctx.text_edit(node, new, edit.changes)
        edits.append(TextEdit(line=sl, column=sc + 1, end_line=el, end_column=ec + 1, text=text))
        if node is edit.node or replacement is None:
            replacement = text
    edits = _join_insertions(sorted(edits, key=lambda e: (e.line, e.column, e.end_line, e.end_column)))
    fixable = bool(edits) and fixer.name in ctx.fixing
    message = edit.message
    if edits and not fixable and fixer.opt_in:
        message += f" (opt-in fix: select {fixer.name} explicitly)"
    return StaticMatch(
        path=ctx.path,
        line=rng.start.line,
        column=rng.start.column + 1,
        end_line=rng.end.line,
        end_column=rng.end.column + 1,
        statement_line=stmt_line,
        pattern=fixer.pattern,
        message=message,
        fixer=fixer.name,
        fixable=fixable,
        opt_in=fixer.opt_in,
        replacement=replacement,
        edits=edits,
    )


def collect_matches(fixers: Iterable[Fixer], ctx: Context) -> list[StaticMatch]:
    out: list[StaticMatch] = []
    seen: set[tuple[int, int, str]] = set()
    for fixer in fixers:
        for edit in fixer.check(ctx):
            if ctx.is_suppressed(edit.node, fixer.pattern, fixer.name):
                continue
            match = _to_match(ctx, fixer, edit)
            key = (match.line, match.column, fixer.name)
            if key in seen:
                continue
            seen.add(key)
            out.append(match)
    out.sort(key=lambda m: (m.line, m.column, m.pattern, m.fixer))
    return out


def _overlaps(a: tuple[tuple[int, int], tuple[int, int]], b: tuple[tuple[int, int], tuple[int, int]]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class _Apply(cst.CSTTransformer):
    def __init__(self, changes: Mapping[cst.CSTNode, Replacement]):
        super().__init__()
        self.changes = changes

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        new = self.changes.get(original_node)
        return updated_node if new is None else new


def _valid(ctx: Context, code: str) -> bool:
    try:
        _parsed(code, None)  # cached: the next round's Context reuses it
    except Exception:
        return False
    if ctx.ast_ok():
        try:
            ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
    return True


def _apply(ctx: Context, edits: list[Edit]) -> str | None:
    changes: dict[cst.CSTNode, Replacement] = {}
    for e in edits:
        changes.update(e.changes or {})
    try:
        code = ctx.module.visit(_Apply(changes)).code
    except Exception:
        return None
    return code if _valid(ctx, code) else None


def apply_edits(ctx: Context, edits: list[Edit]) -> tuple[str | None, bool]:
    """Apply non-overlapping edits; refuse any whose result does not parse. Returns the new
    code (None: nothing applied) and whether every edit was applied (nothing deferred)."""
    chosen: list[Edit] = []
    taken: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for e in sorted(edits, key=lambda e: min(ctx.order(n) for n in e.changes or {e.node: None})):
        spans = [ctx.span(n) for n in (e.changes or {})]
        if any(_overlaps(s, t) for s in spans for t in taken):
            continue
        chosen.append(e)
        taken.extend(spans)
    if not chosen:
        return None, False
    code = _apply(ctx, chosen)
    if code is not None:
        return code, len(chosen) == len(edits)
    accepted: list[Edit] = []
    for e in chosen:  # refuse the edits that break parsing, keep the others
        if _apply(ctx, [*accepted, e]) is not None:
            accepted.append(e)
    return (_apply(ctx, accepted) if accepted else None), False


def apply_fixer(fixer: Fixer, source: str, path: str = "<string>", *, fixing: Iterable[str] = (),
                keep: Callable[[Context], Callable[[Edit], bool]] | None = None) -> str:
    """Rewrite ``source`` with one fixer until nothing fixable is left (bounded rounds; a round
    that applied every edit is the last: fixers never create new sites for themselves). ``keep``:
    given each round's context, which of its edits to apply (default: all)."""
    fixing = frozenset(fixing) | {fixer.name}
    current = source
    for _ in range(MAX_ROUNDS):
        ctx = Context(current, path, fixing=fixing)
        wanted = keep(ctx) if keep is not None else None
        edits = [e for e in fixer.check(ctx) if e.changes and not ctx.is_suppressed(e.node, fixer.pattern, fixer.name)
                 and (wanted is None or wanted(e))]
        if not edits:
            break
        new, complete = apply_edits(ctx, edits)
        if new is None or new == current:
            break
        current = new
        if complete:
            break
    return current
