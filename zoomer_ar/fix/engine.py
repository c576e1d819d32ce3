"""Run fixers over a directory: findings, a unified diff (``git apply`` compatible) or in-place fixes.

The diff splits lines as git does (``\\n`` only, :mod:`.lines`) and names files relative to the
folder given (apply inside it), or, for a single file, relative to the current directory (apply
here; see :func:`diff_path`).

Only regular ``*.py`` files under the root are read: hidden folders, virtual environments
(``.venv``, ``site-packages``, any folder holding ``pyvenv.cfg``), ``__pycache__`` and
``node_modules`` are skipped and symbolic links (files or folders) are never followed, so
nothing outside the root is read or written. Files are decoded with their PEP 263 encoding
(BOM and coding cookie honoured) and written back in it, line endings untouched. A file that
does not parse is reported with a one-line message and skipped.
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
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ..errors import InputError
from .base import Context, Fixer, SourceParseError, StaticMatch, apply_fixer, collect_matches
from .lines import split_git_lines
from .registry import Registry, load_registry

SKIP_DIRS = {"site-packages", "__pycache__", "node_modules", "venv", "env"}
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


def fix_source_with(source: str, path: str, selection: Selection, findings: Sequence[StaticMatch] | None = None) -> str:
    """Apply the selection's fixing fixers in turn (each output re-parsed by apply_fixer)."""
    if findings is None:
        findings = detect_source(source, path, selection)
    current = source
    for _ in range(MAX_PASSES):
        wanted = {m.fixer for m in findings if m.fixable}
        if not wanted:
            break
        for fixer in selection.fixers:
            if fixer.name in wanted:
                try:
                    current = apply_fixer(fixer, current, path, fixing=selection.fixing)
                except SourceParseError:
                    raise
                except Exception as exc:
                    raise _crash(fixer, exc) from exc
        findings = detect_source(current, path, selection)
    return current


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def _is_venv(path: Path) -> bool:
    return (path / "pyvenv.cfg").is_file()


def iter_python_files(root: Path) -> Iterator[Path]:
    """``*.py`` regular files under ``root`` (sorted), skipping hidden/venv folders and links."""
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
            if not name.endswith(".py") or name.startswith("."):
                continue
            p = here / name
            if p.is_symlink() or not p.is_file():
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
        raise ValueError(f"cannot decode as {encoding}: {exc}".splitlines()[0]) from None


@dataclass
class FileResult:
    path: str  # relative to the root, posix separators
    abspath: Path
    findings: list[StaticMatch] = field(default_factory=list)
    before: str | None = None
    after: str | None = None
    encoding: str = "utf-8"
    error: str | None = None
    stat: os.stat_result | None = None
    diff_path: str | None = None  # the name in the diff when not ``path`` (see diff_path())

    def error_line(self, shown: str | None = None) -> str:
        where = shown or self.path
        err = self.error or ""
        return f"{where}:{err}" if err[:1].isdigit() else f"{where}: {err}"

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
        """One line per skipped file: ``path:line:col: reason`` or ``path: reason``."""
        return [f.error_line() for f in self.files if f.error]

    @property
    def changed(self) -> list[FileResult]:
        return [f for f in self.files if f.changed]

    def diff(self) -> str:
        return "".join(f.diff() for f in self.files)

    def diff_bytes(self) -> bytes:
        return b"".join(f.diff_bytes() for f in self.files)


def unified_diff(relpath: str, before: str, after: str, context: int = 3) -> str:
    """A unified diff with ``a/``/``b/`` prefixes that ``git apply`` and ``patch -p1`` accept
    (original line endings kept; ``\\ No newline at end of file`` where needed).

    Lines are split the way git splits them (at ``\\n`` only: see :mod:`.lines`), so a form feed,
    a U+2028 in a string or old-Mac ``\\r`` endings stay inside their line."""
    a = split_git_lines(before)
    b = split_git_lines(after)
    out: list[str] = []
    for i, line in enumerate(difflib.unified_diff(a, b, f"a/{relpath}", f"b/{relpath}", n=context)):
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


def process_file(root: Path, path: Path, selection: Selection, *, fix: bool) -> FileResult:
    rel = _rel(root, path)
    res = FileResult(rel, path)
    if root.is_file():
        res.diff_path = diff_path(root, path)
    try:
        res.stat = path.stat()
        if res.stat.st_size > MAX_FILE_BYTES:
            res.error = f"skipped: larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB"
            return res
        raw = path.read_bytes()
    except OSError as exc:
        res.error = f"cannot read: {exc.strerror or exc}"
        return res
    try:
        text, res.encoding = decode(raw)
    except ValueError as exc:
        res.error = f"cannot decode: {exc}"
        return res
    res.before = text
    try:
        res.findings = detect_source(text, rel, selection)
        if fix and any(m.fixable for m in res.findings):
            res.after = fix_source_with(text, rel, selection, res.findings)
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


def run(
    root: Path | str,
    *,
    select: str | Iterable[str] | None = None,
    ignore: str | Iterable[str] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    fix: bool = False,
    registry: Registry | None = None,
    only: Iterable[Path] | None = None,
) -> RunResult:
    """Detect (and with ``fix=True`` compute fixes) for every Python file under ``root`` (with
    ``only``: those of them, and no others)."""
    root = Path(root)
    if not root.exists():
        raise InputError(str(root), "no such file or directory")
    if not (root.is_dir() or root.is_file()):
        raise InputError(str(root), "not a directory or a file")
    selection = select_fixers(select, ignore, options, registry)
    paths = iter_python_files(root)
    if only is not None:
        keep = {Path(q).resolve() for q in only}
        paths = [q for q in paths if q.resolve() in keep]
    files = [process_file(root, q, selection, fix=fix) for q in paths]
    return RunResult(root, files, selection)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically (temp file in the same folder, fsync, rename),
    keeping the file mode; on any error the original is untouched."""
    if mode is None:
        mode = stat.S_IMODE(path.stat().st_mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".zoomer-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def apply(result: RunResult) -> list[FileResult]:
    """Write every changed file in place. A file modified since it was read is left alone."""
    written: list[FileResult] = []
    for f in result.changed:
        try:
            st = f.abspath.stat()
            if f.stat is not None and (st.st_mtime_ns, st.st_size) != (f.stat.st_mtime_ns, f.stat.st_size):
                f.error = "changed while fixing; left unchanged"
                continue
            write_atomic(f.abspath, (f.after or "").encode(f.encoding), stat.S_IMODE(st.st_mode))
            written.append(f)
        except OSError as exc:
            f.error = f"cannot write: {exc.strerror or exc}"
    return written
