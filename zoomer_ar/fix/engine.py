"""Run fixers over a directory: findings, a unified diff (``git apply`` compatible) or in-place fixes.

The diff splits lines as git does (``\\n`` only, :mod:`.lines`) and names files relative to the
folder given (apply inside it), or, for a single file, relative to the current directory (apply
here; see :func:`diff_path`).

Only regular ``*.py`` and ``*.ipynb`` files under the root are read: hidden folders, virtual
environments (``.venv``, ``site-packages``, any folder holding ``pyvenv.cfg``, ``venv`` and ``env``
unless they hold an ``__init__.py``), setuptools' ``build`` output (a ``build`` folder holding
``lib``, ``lib.*`` or ``bdist.*``: copies of the program's files), ``__pycache__`` and
``node_modules`` are skipped and symbolic links (files or folders) are never followed, so
nothing outside the root is read or written: a linked file (given as the PATH, or met in a
folder) is listed as skipped with a one-line reason, never read, diffed or replaced by a regular
file (``git`` records a link as a link: a text patch of it would not apply). Files are decoded
with their PEP 263 encoding (BOM and coding cookie honoured) and written back in it, line
endings untouched. A file that does not parse is reported with a one-line message and skipped.

Notebooks (``*.ipynb``) are read as JSON, never as Python: the fixers run over their code cells
(:mod:`.notebooks`: magics masked, findings at ``nb.ipynb:cell N:LINE:COL``, fixes rewriting
only the code cells' ``source`` so the diff is one of the JSON text).

``scopes`` (``run``) confines the fixes of a file to some functions (``<module>`` for code
outside any function): ``analyze --source`` patches only the code its findings point at.
"""

from __future__ import annotations

import difflib
import io
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import libcst as cst

from ..errors import InputError
from . import notebooks
from .base import Context, Fixer, SourceParseError, StaticMatch, apply_fixer, collect_matches
from .lines import split_git_lines
from .registry import Registry, load_registry

SKIP_DIRS = {"site-packages", "__pycache__", "node_modules"}
#: folder names of virtual environments, skipped unless the folder is a package of the program's own
#: (``env/__init__.py``: a reinforcement-learning environment, not a virtualenv)
VENV_NAMES = {"venv", "env"}
MAX_FILE_BYTES = 5 * 1024 * 1024
MAX_PASSES = 3


# --------------------------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------------------------


def split_ids(ids: str | Iterable[str] | None) -> list[str]:
    if ids is None:
        return []
    if isinstance(ids, str):
        ids = [ids]
    out: list[str] = []
    for chunk in ids:
        out.extend(p.strip() for p in str(chunk).split(",") if p.strip())
    return out


@dataclass(frozen=True)
class Selection:
    """The fixers that run (``fixers``) and the names of those whose fixes are applied
    (``fixing``: opt-in fixers only when selected explicitly)."""

    fixers: tuple[Fixer, ...]
    fixing: frozenset[str]

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fixers]


def select_fixers(
    select: str | Iterable[str] | None = None,
    ignore: str | Iterable[str] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    registry: Registry | None = None,
) -> Selection:
    """Resolve ``--select``/``--ignore`` (fixer names or pattern ids, comma-separated)."""
    reg = registry or load_registry()
    sel = split_ids(select)
    chosen = reg.resolve(sel) if sel else list(reg.fixers)
    explicit = {f.name for f in reg.resolve([s for s in sel if s.strip().lower() != "all"])} if sel else set()
    ignored = {f.name for f in reg.resolve(split_ids(ignore))}
    chosen = [c for c in chosen if c.name not in ignored]
    fixers = tuple(reg.instantiate(chosen, options))
    fixing = frozenset(f.name for f in fixers if not f.opt_in or f.name in explicit)
    return Selection(fixers, fixing)


# --------------------------------------------------------------------------------------------
# One source
# --------------------------------------------------------------------------------------------


class FixerCrash(Exception):
    """A fixer raised on some input: reported for that file, never fatal for the run."""


def _from_recursion(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised while handling, a RecursionError."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, RecursionError):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _crash(fixer: Fixer, exc: Exception) -> FixerCrash:
    """The one-line report of a fixer's failure. libcst's own recursion (positions, code
    generation) runs out on trees a few hundred levels deep that the parser accepted: that is
    the file's nesting, not a fixer bug, and formatting such an error may itself recurse (a
    node's repr), so neither is formatted from the exception."""
    if _from_recursion(exc):
        return FixerCrash("cannot analyse: nesting too deep")
    try:
        text = f"{type(exc).__name__}: {exc}"
    except RecursionError:
        text = type(exc).__name__
    return FixerCrash(f"fixer {fixer.name} failed: {text}".splitlines()[0])


def detect_source(source: str, path: str, selection: Selection) -> list[StaticMatch]:
    ctx = Context(source, path, fixing=selection.fixing)
    out: list[StaticMatch] = []
    for fixer in selection.fixers:
        try:
            out.extend(collect_matches([fixer], ctx))
        except Exception as exc:  # a bug in one fixer must not stop the others
            raise _crash(fixer, exc) from exc
    out.sort(key=lambda m: (m.line, m.column, m.pattern, m.fixer))
    return out


def fix_source_with(source: str, path: str, selection: Selection, findings: Sequence[StaticMatch] | None = None,
                    scope: Iterable[str] | None = None) -> str:
    """Apply the selection's fixing fixers in turn (each output re-parsed by apply_fixer).

    ``scope``: the names of the functions (``<module>``: code outside any function) whose
    findings may be fixed; a finding flagged elsewhere is left as it is (None: everywhere)."""
    allowed = None if scope is None else frozenset(scope)
    if findings is None:
        findings = detect_source(source, path, selection)
    findings = confine(findings, source, path, allowed)
    current = source
    for _ in range(MAX_PASSES):
        wanted = {m.fixer for m in findings if m.fixable}
        if not wanted:
            break
        for fixer in selection.fixers:
            if fixer.name in wanted:
                try:
                    if allowed is None:
                        current = apply_fixer(fixer, current, path, fixing=selection.fixing)
                    else:
                        current = _apply_fixer_in(fixer, current, path, selection.fixing, allowed)
                except SourceParseError:
                    raise
                except Exception as exc:
                    raise _crash(fixer, exc) from exc
        findings = confine(detect_source(current, path, selection), current, path, allowed)
    return current


# --------------------------------------------------------------------------------------------
# Scopes: the functions a fix may touch
# --------------------------------------------------------------------------------------------

#: the scope of code outside any function (module level, class bodies)
MODULE_SCOPE = "<module>"


def _def_spans(ctx: Context) -> list[tuple[int, int, str]]:
    spans = []
    for fn in ctx.nodes(cst.FunctionDef):
        rng = ctx.pos(fn)
        spans.append((rng.start.line, rng.end.line, fn.name.value))
    return spans


def _scope_at(spans: list[tuple[int, int, str]], line: int) -> str:
    """The name of the innermost function holding ``line`` (``<module>`` outside any)."""
    best: tuple[int, str] | None = None
    for start, end, name in spans:
        if start <= line <= end and (best is None or start >= best[0]):
            best = (start, name)
    return best[1] if best else MODULE_SCOPE


def scope_of(source: str, line: int, path: str = "<string>") -> str:
    """The scope (function name or ``<module>``) of line ``line`` of ``source``."""
    return _scope_at(_def_spans(Context(source, path)), line)


def confine(findings: Sequence[StaticMatch], source: str, path: str, scope: frozenset[str] | None) -> list[StaticMatch]:
    """``findings`` with those flagged outside ``scope`` no longer fixable (None: unchanged)."""
    if scope is None or not any(m.fixable for m in findings):
        return list(findings)
    spans = _def_spans(Context(source, path))
    return [m.model_copy(update={"fixable": False}) if m.fixable and _scope_at(spans, m.line) not in scope else m
            for m in findings]


def _apply_fixer_in(fixer: Fixer, source: str, path: str, fixing: Iterable[str], scope: frozenset[str]) -> str:
    """:func:`~.base.apply_fixer` for the edits flagged inside ``scope`` only (an edit's
    changes go together: a fix flagged in scope may change a line elsewhere, such as the read
    of an accumulator after its loop)."""
    def in_scope(ctx: Context):
        spans = _def_spans(ctx)
        return lambda e: _scope_at(spans, ctx.pos(e.node).start.line) in scope

    return apply_fixer(fixer, source, path, fixing=fixing, keep=in_scope)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def _is_venv(path: Path) -> bool:
    if path.name in VENV_NAMES and not (path / "__init__.py").is_file():
        return True
    return (path / "pyvenv.cfg").is_file() or _is_build_output(path)


def _is_build_output(path: Path) -> bool:
    """setuptools' build folder (``build/lib/pkg/...``, ``build/lib.linux-x86_64-cpython-311``,
    ``build/bdist.*``): copies of the program's files, which a fix would change beside the real ones
    (and ``--source`` could map a frame to)."""
    if path.name != "build" or (path / "__init__.py").is_file():
        return False
    try:
        return any(c.is_dir() and (c.name == "lib" or c.name.startswith(("lib.", "bdist.", "temp."))) for c in path.iterdir())
    except OSError:
        return False


def iter_python_files(root: Path) -> Iterator[Path]:
    """``*.py`` regular files under ``root`` (sorted), skipping hidden/venv folders and links."""
    yield from _walk(root, (".py",), links=False)


def iter_source_files(root: Path) -> Iterator[Path]:
    """What ``fix`` reads: ``*.py`` and ``*.ipynb`` files under ``root`` (sorted), skipping
    hidden/venv folders and linked folders; linked files are yielded (:func:`process_file`
    lists them as skipped, unread). A file root is yielded whatever its name."""
    yield from _walk(root, (".py", notebooks.SUFFIX), links=True)


def _walk(root: Path, suffixes: tuple[str, ...], *, links: bool) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".")
            and d not in SKIP_DIRS
            and not (here / d).is_symlink()
            and not _is_venv(here / d)
        )
        for name in sorted(filenames):
            if not name.lower().endswith(suffixes) or name.startswith("."):
                continue
            p = here / name
            if p.is_symlink():
                if links:
                    yield p
                continue
            if not p.is_file():
                continue
            yield p


def decode(raw: bytes) -> tuple[str, str]:
    """(text, encoding) following PEP 263 (BOM, coding cookie; default utf-8)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as exc:
        raise ValueError(str(exc).splitlines()[0]) from None
    try:
        return raw.decode(encoding), encoding
    except (UnicodeDecodeError, LookupError) as exc:
        raise ValueError(str(exc).splitlines()[0]) from None  # names the codec: "'utf-8' codec can't decode ..."


@dataclass
class FileResult:
    path: str  # relative to the root, posix separators
    abspath: Path
    findings: list[StaticMatch] = field(default_factory=list)
    before: str | None = None
    after: str | None = None
    encoding: str = "utf-8"
    error: str | None = None
    left_out: int = 0  # notebook cells left out (named in `error`): the file itself was analysed, not skipped
    stat: os.stat_result | None = None
    diff_path: str | None = None  # the name in the diff when not ``path`` (see diff_path())

    def error_line(self, shown: str | None = None) -> str:
        where = shown or self.path
        err = self.error or ""
        return f"{where}:{err}" if err[:1].isdigit() or err.startswith("cell ") else f"{where}: {err}"

    @property
    def changed(self) -> bool:
        return self.before is not None and self.after is not None and self.after != self.before

    def diff(self) -> str:
        if not self.changed:
            return ""
        bom = "\ufeff" if self.encoding == "utf-8-sig" else ""  # the BOM is part of line 1 on disk
        return unified_diff(self.diff_path or self.path, bom + (self.before or ""), bom + (self.after or ""))

    def diff_bytes(self) -> bytes:
        """The diff in the file's own encoding (headers in UTF-8), as ``git apply`` needs it."""
        text = self.diff()
        if not text:
            return b""
        head, sep, body = text.partition("\n@@")
        encoding = "utf-8" if self.encoding == "utf-8-sig" else self.encoding
        return head.encode("utf-8", "surrogateescape") + (sep + body).encode(encoding)


@dataclass
class RunResult:
    root: Path
    files: list[FileResult]
    selection: Selection

    @property
    def findings(self) -> list[StaticMatch]:
        return [m for f in self.files for m in f.findings]

    @property
    def errors(self) -> list[str]:
        """One line per skipped file: ``path:line:col: reason`` or ``path: reason`` (a notebook:
        the cells left out, ``nb.ipynb:cell 4:2:5: reason; cell 6:...``, its other cells analysed)."""
        return [f.error_line() for f in self.files if f.error]

    @property
    def skipped(self) -> list[FileResult]:
        """The files not analysed (a notebook with cells left out was analysed: see ``left_out``)."""
        return [f for f in self.files if f.error and not f.left_out]

    @property
    def changed(self) -> list[FileResult]:
        return [f for f in self.files if f.changed]

    def diff(self) -> str:
        return "".join(f.diff() for f in self.files)

    def diff_bytes(self) -> bytes:
        return b"".join(f.diff_bytes() for f in self.files)


_GIT_ESCAPES = {"\a": "a", "\b": "b", "\t": "t", "\n": "n", "\v": "v", "\f": "f", "\r": "r", '"': '"', "\\": "\\"}


def git_quote(name: str) -> str:
    """``name`` as git writes it in a diff header: as it is, or, when it holds a quote, a backslash
    or a control character (a newline would end the header line, a tab its name), in double
    quotes with C escapes (``"a/new\\nline.py"``), which ``git apply`` and ``patch`` read back."""
    if not any(c in _GIT_ESCAPES or ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return name
    out = []
    for c in name:
        if c in _GIT_ESCAPES:
            out.append("\\" + _GIT_ESCAPES[c])
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\{ord(c):03o}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def unified_diff(relpath: str, before: str, after: str, context: int = 3) -> str:
    """A unified diff with ``a/``/``b/`` prefixes that ``git apply`` and ``patch -p1`` accept
    (original line endings kept; ``\\ No newline at end of file`` where needed).

    Lines are split the way git splits them (at ``\\n`` only: see :mod:`.lines`), so a form feed,
    a U+2028 in a string or old-Mac ``\\r`` endings stay inside their line."""
    a = split_git_lines(before)
    b = split_git_lines(after)
    out: list[str] = []
    for i, line in enumerate(difflib.unified_diff(a, b, git_quote(f"a/{relpath}"), git_quote(f"b/{relpath}"), n=context)):
        if i < 2:  # the ---/+++ headers (a removed "--x" line also starts with "---")
            out.append(line.rstrip("\r\n") + "\n")
        elif line.endswith("\n"):
            out.append(line)
        else:  # the last line of a side, without a newline
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _rel(root: Path, path: Path) -> str:
    """A file's name in findings and messages: relative to the root folder (a file root: its folder)."""
    base = root.parent if root.is_file() else root
    return path.relative_to(base).as_posix()


def _git_top(folder: Path) -> Path | None:
    for p in (folder, *folder.parents):
        if (p / ".git").exists():
            return p
    return None


def diff_path(root: Path, path: Path) -> str:
    """A file's name in the unified diff (after ``a/``/``b/``).

    * Root a folder: relative to it, so the diff applies with ``git apply`` (or ``patch -p1``)
      run inside that folder (``analyze --source``'s patch.diff applies in the source folder).
    * Root a file: relative to the current directory when the file is inside it, so ``git
      apply`` run where ``fix FILE --diff`` ran patches that very file; a file outside the
      current directory: relative to the top of the git work tree holding it (apply there), else
      its bare name (apply in its folder).
    """
    if not root.is_file():
        return _rel(root, path)
    try:
        cwd = Path.cwd()
        bases = [cwd, cwd.resolve()]
        candidates = [Path(os.path.abspath(path)), path.parent.resolve() / path.name]  # links above the file resolved
    except OSError:  # the current directory is gone
        bases, candidates = [], [path] if path.is_absolute() else []
    for p in candidates:
        for base in bases:
            try:
                return p.relative_to(base).as_posix()
            except ValueError:
                continue
    if not candidates:
        return path.name
    real = candidates[-1]
    top = _git_top(real.parent)
    return real.relative_to(top).as_posix() if top is not None else path.name


def _link_reason(path: Path) -> str:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    target = " ".join(target.split())
    return f"a symbolic link (to {target}), not followed; run on the file it points to"


#: Header markers of generated code (protoc's "DO NOT EDIT!", Meta's and others' "@generated"): its code
#: is rewritten by its generator, and it can be large (a 5 MB _pb2.py parses in ~1 min and ~4 GB).
GENERATED_MARKERS = ("@generated", "DO NOT EDIT")
GENERATED_HEAD = 2048  # characters of the file's head where a marker counts


def generated_marker(text: str) -> str | None:
    """The generated-code marker in the head of ``text`` (comments or docstring), or None."""
    head = text[:GENERATED_HEAD]
    return next((m for m in GENERATED_MARKERS if m in head), None)


def process_file(root: Path, path: Path, selection: Selection, *, fix: bool, scope: Iterable[str] | None = None) -> FileResult:
    """Findings (and with ``fix`` the fixed text) of one file; ``scope`` confines the fixes
    (see :func:`fix_source_with`). A notebook is handled by :mod:`.notebooks`; a symbolic link
    is never read (skipped with its reason)."""
    rel = _rel(root, path)
    res = FileResult(rel, path)
    if root.is_file():
        res.diff_path = diff_path(root, path)
    if path.is_symlink():
        res.error = _link_reason(path)
        return res
    notebook = notebooks.is_notebook(path.name)
    limit = notebooks.MAX_NOTEBOOK_BYTES if notebook else MAX_FILE_BYTES
    try:
        res.stat = path.stat()
        if res.stat.st_size > limit:
            res.error = f"larger than {limit // (1024 * 1024)} MiB, not read"
            return res
        raw = path.read_bytes()
    except OSError as exc:
        res.error = f"cannot read: {exc.strerror or exc}"
        return res
    if notebook:
        return _process_notebook(res, raw, selection, fix=fix)
    try:
        text, res.encoding = decode(raw)
    except ValueError as exc:
        res.error = f"cannot decode: {exc}"
        return res
    res.before = text
    marker = generated_marker(text)
    if marker is not None:
        res.error = f"a generated file (its header says {marker!r}), not read: change what generates it"
        return res
    allowed = None if scope is None else frozenset(scope)
    try:
        res.findings = confine(detect_source(text, rel, selection), text, rel, allowed)
        if fix and any(m.fixable for m in res.findings):
            res.after = fix_source_with(text, rel, selection, res.findings, allowed)
        else:
            res.after = text
    except SourceParseError as exc:
        res.error = f"{exc.line}:{exc.column}: {exc.reason}"
        res.after = res.before
    except FixerCrash as exc:
        res.error = str(exc)
        res.after = res.before
    if res.after != res.before and res.after is not None:
        try:
            res.after.encode(res.encoding)
        except UnicodeEncodeError:
            res.error = f"the fix cannot be written in {res.encoding}; left unchanged"
            res.after = res.before
    return res


def _process_notebook(res: FileResult, raw: bytes, selection: Selection, *, fix: bool) -> FileResult:
    """A notebook's code cells through the fixers (:mod:`.notebooks`); ``before``/``after`` are
    the JSON text. Cells that do not parse are named in ``error`` and the others still fixed."""
    res.encoding = "utf-8-sig" if raw.startswith(b"\xef\xbb\xbf") else "utf-8"
    try:
        text = raw.decode(res.encoding)
    except UnicodeDecodeError as exc:
        res.error = f"cannot decode: not UTF-8 JSON ({exc.reason} at byte {exc.start})"
        return res
    res.before = res.after = text

    def detect(source: str, path: str) -> list[StaticMatch]:
        return detect_source(source, path, selection)

    def fixed(source: str, path: str, findings: Sequence[StaticMatch]) -> str:
        return fix_source_with(source, path, selection, findings)

    try:
        out = notebooks.process(text, res.path, detect, fixed if fix else None)
    except notebooks.NotebookError as exc:
        res.error = str(exc)
        return res
    except FixerCrash as exc:
        res.error = str(exc)
        return res
    except SourceParseError as exc:  # the cells parsed alone but not together
        res.error = f"{exc.line}:{exc.column}: {exc.reason} (the code cells together)"
        return res
    res.findings, res.after = out.findings, out.after
    if out.errors:
        res.error = "; ".join(out.errors)
        res.left_out = len(out.errors)
    return res


def run(
    root: Path | str,
    *,
    select: str | Iterable[str] | None = None,
    ignore: str | Iterable[str] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    fix: bool = False,
    registry: Registry | None = None,
    only: Iterable[Path] | None = None,
    scopes: Mapping[str, Iterable[str]] | None = None,
    jobs: int = 1,
    progress: "Callable[[int, int], None] | None" = None,
) -> RunResult:
    """Detect (and with ``fix=True`` compute fixes) for every Python file and notebook under
    ``root`` (with ``only``: those of them, and no others). ``scopes`` maps a file (relative to
    ``root``, as ``FileResult.path``) to the functions whose findings may be fixed
    (``<module>``: code outside any function); its other findings are reported, not fixable, and
    a file not in ``scopes`` is fixed everywhere. ``jobs`` > 1 reads the files in that many
    worker processes (:func:`_run_parallel`); the result is the same. ``progress(done, total)``
    is called after each file (files in order)."""
    root = Path(root)
    if not root.exists():
        raise InputError(str(root), "no such file or directory")
    if not (root.is_dir() or root.is_file()):
        raise InputError(str(root), "not a directory or a file")
    selection = select_fixers(select, ignore, options, registry)
    paths = iter_source_files(root)
    if only is not None:
        keep = {Path(q).resolve() for q in only}
        paths = [q for q in paths if not q.is_symlink() and q.resolve() in keep]
    confined = {Path(k).as_posix(): v for k, v in (scopes or {}).items()}
    tasks = [(root, q, fix, None if (c := confined.get(_rel(root, q))) is None else tuple(c)) for q in paths]
    files = None
    if jobs > 1 and registry is None and len(tasks) >= PARALLEL_MIN_FILES:
        files = _run_parallel(tasks, min(jobs, len(tasks)), (split_ids(select), split_ids(ignore), options), progress)
    if files is None:
        files = []
        for r, q, f, c in tasks:
            files.append(process_file(r, q, selection, fix=f, scope=c))
            if progress is not None:
                progress(len(files), len(tasks))
    return RunResult(root, files, selection)


#: below this many files a pool of worker processes costs more (a fresh interpreter each, importing
#: libcst and the fixers: about a second) than it saves
PARALLEL_MIN_FILES = 32
_WORKER_SELECTION: Selection | None = None


def _worker_start(select: list[str], ignore: list[str], options: Mapping[str, Mapping[str, Any]] | None) -> None:
    global _WORKER_SELECTION
    _WORKER_SELECTION = select_fixers(select, ignore, options)


def _worker_file(task: tuple) -> FileResult:
    root, path, fix, scope = task
    assert _WORKER_SELECTION is not None
    return process_file(root, path, _WORKER_SELECTION, fix=fix, scope=scope)


def _run_parallel(tasks: list[tuple], jobs: int, selection_args: tuple,
                  progress: "Callable[[int, int], None] | None" = None) -> list[FileResult] | None:
    """process_file for each task in ``jobs`` spawned processes (spawn: safe from a process that
    runs threads), in the tasks' order; each worker builds the same selection from the same
    arguments. None when the pool cannot start or breaks (a worker killed): the caller then runs
    the files in this process, as without ``jobs``."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from ..children import no_cwd_imports  # a user's folder may hold a multiprocessing/ or random.py

    try:
        with no_cwd_imports(), ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                                   initializer=_worker_start, initargs=selection_args) as pool:
            out: list[FileResult] = []
            for res in pool.map(_worker_file, tasks, chunksize=max(1, min(8, len(tasks) // (4 * jobs)))):
                out.append(res)
                if progress is not None:
                    progress(len(out), len(tasks))
            return out
    except (BrokenProcessPool, OSError):
        return None


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes, mode: int | None = None, owner: tuple[int, int] | None = None) -> None:
    """Replace ``path`` with ``data`` atomically (temp file in the same folder, fsync, rename),
    keeping the file mode and, where this process may set them, its owner and group (root fixing
    a user's tree must not leave the user a root-owned file); on any error the original is untouched."""
    if mode is None or owner is None:
        st = path.stat()
        mode = stat.S_IMODE(st.st_mode) if mode is None else mode
        owner = (st.st_uid, st.st_gid) if owner is None else owner
    tmp = _synced_copy(path, data, ".zoomer-tmp", owner)
    try:
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def write_in_place(path: Path, data: bytes) -> None:
    """Rewrite ``path``'s own inode with ``data``: a file with other hard links (or names) keeps
    them all, and its mode, owner, ACLs and extended attributes stay as they are. A copy of the
    old bytes is written and synced beside it first; if writing the new bytes fails halfway, the
    old ones are written back and the copy deleted; should that fail too, the error names the
    copy, which is kept."""
    original = path.read_bytes()
    backup = _synced_copy(path, original, ".zoomer-backup")
    try:
        _overwrite(path, data)
    except BaseException as exc:
        try:
            _overwrite(path, original)
        except BaseException:
            raise OSError(f"{getattr(exc, 'strerror', None) or exc}; the file may be half written, its old "
                          f"text is kept in {backup}") from exc
        _unlink_quietly(backup)
        raise
    _unlink_quietly(backup)


def _synced_copy(path: Path, data: bytes, suffix: str, owner: tuple[int, int] | None = None) -> str:
    """A hidden file beside ``path`` holding ``data``, synced to disk (given ``owner``, where this process
    may set it); removed again if writing it fails."""
    # the name shortened: a file whose own name is near the 255-byte limit must still get a temp file
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:40]}.", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            if owner is not None:
                _keep_owner(fh.fileno(), owner)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp


def _overwrite(path: Path, data: bytes) -> None:
    with open(path, "r+b") as fh:  # the same inode: no O_TRUNC before the new bytes are in
        fh.write(data)
        fh.truncate()
        fh.flush()
        os.fsync(fh.fileno())


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _keep_owner(fd: int, owner: tuple[int, int]) -> None:
    """Give the new file the old one's owner and group: both when this process may (root), else
    the group alone when the user belongs to it; otherwise it stays the user's (as git leaves it)."""
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) == owner or not hasattr(os, "fchown"):
        return
    for uid, gid in (owner, (-1, owner[1])):
        try:
            os.fchown(fd, uid, gid)
            return
        except OSError:
            continue


def apply(result: RunResult) -> list[FileResult]:
    """Write every changed file in place. A file modified since it was read is left alone. A
    file with one link is replaced atomically (write_atomic); one with hard links is rewritten in
    its own inode (write_in_place), so that every link sees the fix."""
    written: list[FileResult] = []
    for f in result.changed:
        try:
            if f.abspath.is_symlink():  # never replace a link with a regular file
                f.error = "a symbolic link; left unchanged"
                continue
            st = f.abspath.stat()
            if f.stat is not None and (st.st_mtime_ns, st.st_size) != (f.stat.st_mtime_ns, f.stat.st_size):
                f.error = "changed while fixing; left unchanged"
                continue
            if not st.st_mode & 0o222 or not os.access(f.abspath, os.W_OK):
                # the replacement goes through the folder: without this, a file marked read-only was rewritten
                f.error = "cannot write: a read-only file; left unchanged"
                continue
            data = (f.after or "").encode(f.encoding)
            if st.st_nlink > 1:  # a rename would leave the other links with the old text
                write_in_place(f.abspath, data)
            else:
                write_atomic(f.abspath, data, stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid))
            written.append(f)
        except OSError as exc:
            f.error = f"cannot write: {exc.strerror or exc}"
    return written
