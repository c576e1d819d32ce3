"""How a training program takes settings on its command line, read statically from its source.

The relaunch spec must not append settings the program rejects (Hydra-style ``k=v`` to an argparse
program exits with "unrecognized arguments"). The program is never imported or run: its file and
the local modules it imports are parsed with ``ast`` and their ``argparse`` options, Hydra entry
points and ``OmegaConf.from_cli`` calls tell which settings a command line can carry. For a Hydra
program the ``@hydra.main`` decorator's ``config_path``/``config_name`` (literal arguments only)
say where its YAML config lies (hydra_config.py reads it); the string constants of the program's
files tell which keys it reads with ``cfg.get("key")``. An argparse option's aliases (``-j``,
``--workers``) and how many values it takes let a recorded occurrence be replaced, not repeated.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Literal

Style = Literal["hydra", "argparse", "unknown"]

#: local modules followed from the script (its own imports, transitively): enough for a helper
#: module holding the parser, bounded so a large repository is not parsed whole
MAX_MODULES = 40
#: a module larger than this is not parsed (the fix stage's limit, fix.engine.MAX_FILE_BYTES): parsing and
#: walking an 11 MB script took 40 s and 2.2 GB; a command line is not defined in such a file
MAX_MODULE_BYTES = 5 * 1024 * 1024
#: argparse actions whose option takes a value on the command line
VALUE_ACTIONS = {None, "store", "append", "extend"}
#: a recorded argument that is a Hydra-style override (``key=value``, ``+key=value``, ``~key``)
HYDRA_ARG = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][\w.\-/@]*=")


@dataclass(frozen=True)
class HydraMain:
    """Where a ``@hydra.main`` entry point takes its config from: ``config_path`` (relative to
    ``file``, the module declaring it) and ``config_name``; ``static`` is False when either is not a
    literal in the decorator (a name, an expression: not known without running the program)."""

    file: Path
    config_path: str | None
    config_name: str | None
    static: bool = True


@dataclass
class ProgramCli:
    """What the program's command line accepts: its style and (argparse) its value-taking options."""

    style: Style
    #: normalised long option (no dashes, '-' as '_') -> the option as declared ("--num-workers")
    options: dict[str, str] = field(default_factory=dict)
    #: why the style was chosen, for the spec's notes
    evidence: str = ""
    #: declared option -> every name of its add_argument call ("--num-workers", "-j")
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: declared options that take exactly one value (nargs unset): ``--opt VALUE`` is two tokens
    single_value: set[str] = field(default_factory=set)
    #: the program's files read (the script first, then its local imports)
    files: list[Path] = field(default_factory=list)
    #: the @hydra.main entry point, when there is one
    hydra: HydraMain | None = None
    #: string constants of the program's files (``cfg.get("compile")`` reads key "compile")
    strings: frozenset[str] = frozenset()

    def option_for(self, key: str) -> str | None:
        """The declared option that sets config key ``key`` ("dataloader.num_workers" matches
        --dataloader.num_workers, --dataloader-num-workers or --num-workers), else None."""
        for candidate in (key, key.replace(".", "_"), key.rsplit(".", 1)[-1]):
            found = self.options.get(_normalise(candidate))
            if found:
                return found
        return None


def _normalise(name: str) -> str:
    return name.lstrip("-").replace("-", "_").lower()


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _local_module(name: str, level: int, here: Path, roots: list[Path]) -> Path | None:
    """The file a (possibly relative) import names, when it lies in the program's own folders."""
    parts = name.split(".") if name else []
    if level > len(here.parents) + 1:
        return None
    bases = [here.parents[level - 2] if level > 1 else here] if level else roots
    for base in bases:
        stem = base.joinpath(*parts) if parts else base
        for cand in (stem.with_suffix(".py") if parts else None, stem / "__init__.py"):
            if cand is not None and cand.is_file():
                return cand
    return None


def _imports(tree: ast.Module, here: Path, roots: list[Path]) -> list[Path]:
    out: list[Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [p for a in node.names if (p := _local_module(a.name, 0, here, roots))]
        elif isinstance(node, ast.ImportFrom):
            p = _local_module(node.module or "", node.level, here, roots)
            if p:
                out.append(p)
    return out


def _const_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    return ""


@dataclass
class _Scan:
    argparse: bool = False
    hydra: bool = False
    omegaconf_cli: bool = False
    options: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    single_value: set[str] = field(default_factory=set)
    hydra_main: HydraMain | None = None
    strings: set[str] = field(default_factory=set)
    too_large: list[str] = field(default_factory=list)  # modules not parsed (MAX_MODULE_BYTES)


def _hydra_main_names(tree: ast.Module) -> set[str]:
    """The dotted names under which this module can call ``hydra.main`` (``hydra.main``, ``h.main``
    after ``import hydra as h``, ``main`` after ``from hydra import main``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {f"{a.asname or a.name}.main" for a in node.names if a.name == "hydra"}
        elif isinstance(node, ast.ImportFrom) and node.module == "hydra" and not node.level:
            names |= {a.asname or a.name for a in node.names if a.name == "main"}
    return names


#: the longest string constant kept as a possible config key
MAX_KEY_CHARS = 100


def _hydra_main(decorator: ast.expr, path: Path) -> HydraMain:
    """config_path / config_name of a ``@hydra.main(...)`` decorator (positional or keyword)."""
    if not isinstance(decorator, ast.Call):
        return HydraMain(path, None, None)
    given: dict[str, ast.expr] = dict(zip(("config_path", "config_name"), decorator.args))
    given.update({k.arg: k.value for k in decorator.keywords if k.arg in ("config_path", "config_name")})
    static = not any(k.arg is None for k in decorator.keywords)
    values: dict[str, str | None] = {}
    for name in ("config_path", "config_name"):
        node = given.get(name)
        if node is None or (isinstance(node, ast.Constant) and node.value is None):
            values[name] = None
        elif _const_str(node) is not None:
            values[name] = _const_str(node)
        else:
            values[name], static = None, False
    return HydraMain(path, values["config_path"], values["config_name"], static)


def _scan_tree(tree: ast.Module, scan: _Scan, path: Path | None = None) -> None:
    """Collect argparse options and Hydra/OmegaConf entry points of one module (importing hydra for
    its utilities does not make a Hydra command line: the ``@hydra.main`` decorator does)."""
    hydra_main = _hydra_main_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) <= MAX_KEY_CHARS:
            scan.strings.add(node.value)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            scan.argparse |= any(m.split(".")[0] == "argparse" for m in mods)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                if _dotted(d) in hydra_main:
                    scan.hydra = True
                    if scan.hydra_main is None and path is not None:
                        scan.hydra_main = _hydra_main(d, path)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "from_cli" and _dotted(node.func.value).endswith("OmegaConf"):
                scan.omegaconf_cli = True
            elif node.func.attr == "add_argument":
                _add_option(node, scan)


def _add_option(call: ast.Call, scan: _Scan) -> None:
    """Record a value-taking option of an ``add_argument`` call (flags and counters take none)."""
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = _const_str(kw["action"]) if "action" in kw else None
    if "action" in kw and action not in VALUE_ACTIONS:
        return
    nargs = kw.get("nargs")
    if isinstance(nargs, ast.Constant) and nargs.value == 0:
        return
    names = tuple(s for a in call.args if (s := _const_str(a)) and s.startswith("-"))
    for name in (n for n in names if n.startswith("--")):
        scan.options[_normalise(name)] = name
        scan.aliases[name] = names
        if nargs is None and action in (None, "store", "append"):
            scan.single_value.add(name)


def find_script(script: str, source_dir: Path | None) -> Path | None:
    """The recorded script's file in ``source_dir``: by its recorded relative path, by its name at
    the top, else the one file of that name below (None when absent or ambiguous)."""
    if source_dir is None or not source_dir.is_dir() or not script.endswith(".py"):
        return None
    p = Path(script)
    for cand in ([] if p.is_absolute() else [source_dir / p]) + [source_dir / p.name]:
        if cand.is_file():
            return cand
    hits = list(islice((h for h in source_dir.rglob(p.name) if h.is_file() and ".git" not in h.parts), 2))
    return hits[0] if len(hits) == 1 else None


def scan_program(script_file: Path, source_dir: Path | None = None) -> ProgramCli:
    """How ``script_file`` takes settings, from its source and its local imports (never run)."""
    roots = [script_file.parent] + ([source_dir] if source_dir and source_dir != script_file.parent else [])
    scan, seen, todo = _Scan(), set(), [script_file]
    while todo and len(seen) < MAX_MODULES:
        path = todo.pop(0).resolve()
        if path in seen:
            continue
        seen.add(path)
        try:
            if path.stat().st_size > MAX_MODULE_BYTES:
                scan.too_large.append(path.name)
                continue
        except OSError:
            continue
        tree = _parse(path)
        if tree is None:
            continue
        scan.files.append(path.name)
        scan.paths.append(path)
        _scan_tree(tree, scan, path)
        todo += _imports(tree, path.parent, roots)
    where = ", ".join(scan.files[:4]) or script_file.name
    read = dict(files=list(scan.paths), strings=frozenset(scan.strings))
    if scan.hydra or scan.omegaconf_cli:
        what = "@hydra.main" if scan.hydra else "OmegaConf.from_cli"
        return ProgramCli("hydra", evidence=f"{what} in {where}", hydra=scan.hydra_main, **read)
    if scan.argparse or scan.options:
        return ProgramCli("argparse", options=dict(scan.options), evidence=f"argparse in {where}",
                          aliases=dict(scan.aliases), single_value=set(scan.single_value), **read)
    skipped = (f" ({', '.join(scan.too_large[:4])} not read: over {MAX_MODULE_BYTES // (1024 * 1024)} MB)"
               if scan.too_large else "")
    return ProgramCli("unknown", evidence=f"no argparse or Hydra command line found in {where}{skipped}", **read)


def style_from_args(args: list[str]) -> ProgramCli:
    """Without the source: Hydra when the recorded command already carried ``k=v`` overrides,
    else unknown (options seen in ``--x`` form do not tell which other options exist)."""
    if any(HYDRA_ARG.match(a) for a in args):
        return ProgramCli("hydra", evidence="the recorded command carries key=value overrides")
    return ProgramCli("unknown", evidence="the program's source was not given (--source)")
