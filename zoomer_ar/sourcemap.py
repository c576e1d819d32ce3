"""Source mapping: resolve findings' Python frames to files and statements under a source folder.

Kineto frames look like `train.py(33): train_step` (the line is the function's `def`; the path is
relative to a sys.path entry, or absolute). A frame is resolved to the file under DIR whose path
shares the longest suffix with it; library frames were already dropped by the features stage.
Inside the function, the fix stage's `locate` finds the statement the finding is about (the
`.item()`, the `DataLoader(...)`, the `.to(...)`, the optimizer construction). When the function
holds no such statement (a DataLoader built in `main` but iterated in `train`), the same file is
searched statically for that pattern. When nothing is found, the location is the function's
`def`: where the source moved since the recording (lines inserted above it), the line it has now
(the function found by its name; of several of that name, each nn.Module's `forward`, the one whose
`def` lies nearest the recorded line, a tie going to the only one holding the finding's statement),
never the trace's line, which then lies in other code (unless nothing tells such functions apart).

A finding whose evidence has no Python frame (launch-bound's short kernels, the idle gaps of a
trace without stacks, a memory curve) is looked for statically in the job's own program: the
files the trace shows running (the other findings' frames, every user frame of the trace's
python_function events or call stacks, and the script job.json's argv names). Only when none of these resolves under the folder are the
other files searched, and those locations are marked unconfirmed (``function`` ends with
`` (unconfirmed)``, a note says so) and patch nothing: a folder of several programs is not
patched on a guess. A folder that holds a single Python file is that program. User code is
parsed, never run; each distinct frame is located once (a finding's events mostly repeat its frame),
each file parsed once, and a file above the fix stage's limit (``MAX_FILE_BYTES``, 5 MiB) not at all:
its frames keep the trace's line and a note says why. Symbolic links under the folder are not
followed (as the fix stage neither reads nor replaces them); a traced file that only a link could hold
is named in a note.

patch.diff changes only the code the findings point at (:func:`files_ran`, :func:`patch_scopes`):
the files their confirmed locations lie in, and in those files only the functions of the trace's
frames and the functions (or the module-level code) holding the located statements. Another
function of the same file with the same anti-pattern (a helper the trace never shows running) is
reported by `zoomer-ar fix`, not patched.
"""

from __future__ import annotations

import ast
import json
import os
import re
from functools import lru_cache
from pathlib import Path, PurePosixPath

from .errors import InputError
from .fix import engine
from .fix.api import locate, static_findings
from .fix.engine import FixerCrash, decode, iter_python_files
from .fix.nesting import nesting_problem
from .models import Analysis, Finding, SourceFrame


class SourceIndex:
    """Python files under a folder, looked up by path suffix; file text cached."""

    def __init__(self, root: Path):
        if not root.is_dir():
            raise InputError(str(root), "source folder not found")
        self.root = root.resolve()
        self.files = [p for p in iter_python_files(self.root)]
        self.by_name: dict[str, list[Path]] = {}
        for p in self.files:
            self.by_name.setdefault(p.name, []).append(p)
        self._text: dict[Path, str | None] = {}
        #: frame files that several files match equally well (frame file -> those files): not resolved
        self.ambiguous: dict[str, list[Path]] = {}
        #: resolved files too large to analyse (above the fix stage's limit): their frames keep the trace's line
        self.too_large: list[Path] = []
        #: each distinct frame located once: (pattern, the frame's fields) -> the located frame
        self.mapped: dict[tuple, SourceFrame] = {}
        self._links: list[Path] | None = None
        #: files that could not be read or decoded (path -> why); those a frame resolved to, in :attr:`unreadable`
        self.why_not: dict[Path, str] = {}
        self.unreadable: dict[Path, str] = {}

    @property
    def links(self) -> list[Path]:
        """The symbolic links under the folder that are not followed: ``*.py`` files and folders (in
        the folders the walk enters; listed on first use, for the note on frames nothing resolves)."""
        if self._links is None:
            self._links = []
            for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
                here = Path(dirpath)
                self._links += [here / d for d in sorted(dirnames) if (here / d).is_symlink()]
                self._links += [here / f for f in sorted(filenames) if f.endswith(".py") and (here / f).is_symlink()]
                dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in engine.SKIP_DIRS
                                     and not (here / d).is_symlink() and not engine._is_venv(here / d))
        return self._links

    def link_for(self, frame_file: str) -> Path | None:
        """A link under the folder that the traced file may lie behind: a linked ``*.py`` of its name, or a
        linked folder holding a file at the end of its path (only the link's listing is read)."""
        parts = PurePosixPath(frame_file.replace("\\", "/")).parts
        if not parts:
            return None
        for link in self.links:
            if link.name.endswith(".py"):
                if link.name == parts[-1]:
                    return link
                continue
            for k in range(len(parts), 0, -1):
                try:
                    if parts[-k] not in ("/", "..") and (link / Path(*parts[-k:])).is_file():
                        return link
                except (OSError, ValueError):
                    continue
        return None

    def resolve(self, frame_file: str, min_len: int = 1) -> Path | None:
        """The file whose path shares the longest suffix with ``frame_file``; on a tie, the one
        whose whole path is that suffix (``train.py`` over ``old/train.py`` for ``/home/u/proj/train.py``).
        Several equally good files and none of them whole (``a/train.py`` and ``b/train.py``): None,
        recorded in :attr:`ambiguous` (the trace cannot say which ran: never patched on a guess).
        A best match of fewer than ``min_len`` path parts is no match (and no ambiguity)."""
        parts = PurePosixPath(frame_file.replace("\\", "/")).parts
        if not parts:
            return None
        best: list[Path] = []
        best_len = 0
        for cand in self.by_name.get(parts[-1], []):
            rel = cand.relative_to(self.root).parts
            n = 0
            while n < min(len(rel), len(parts)) and rel[-1 - n] == parts[-1 - n]:
                n += 1
            if n > best_len:
                best, best_len = [cand], n
            elif n == best_len:
                best.append(cand)
        if best_len < min_len:
            return None
        if len(best) <= 1:
            return best[0] if best else None
        whole = [c for c in best if len(c.relative_to(self.root).parts) == best_len]
        if whole:
            return whole[0]
        self.ambiguous.setdefault(frame_file, best)
        return None

    def resolve_strict(self, frame_file: str) -> Path | None:
        """:meth:`resolve`, but a package's ``__init__.py`` must match its folder's name too (a
        trace's ``logging/__init__.py`` is not the folder's ``utils/__init__.py``)."""
        init = PurePosixPath(frame_file.replace("\\", "/")).name == "__init__.py"
        return self.resolve(frame_file, min_len=2 if init else 1)  # 2: the file and its folder

    def analysable(self, path: Path) -> bool:
        """Whether the file is small enough to parse (the fix stage's limit: it reads no larger file,
        and parsing one takes minutes and gigabytes); a larger one is recorded in :attr:`too_large`."""
        try:
            small = path.stat().st_size <= engine.MAX_FILE_BYTES
        except OSError:
            return False
        if not small and path not in self.too_large:
            self.too_large.append(path)
        return small

    def text(self, path: Path) -> str | None:
        """The file's text (PEP 263 decoding); None for one that cannot be read (:attr:`why_not` says why)."""
        if path not in self._text:
            try:
                self._text[path] = decode(path.read_bytes())[0]
            except OSError as exc:
                self._text[path] = None
                self.why_not[path] = exc.strerror or str(exc)
            except ValueError as exc:
                self._text[path] = None
                self.why_not[path] = f"cannot decode: {exc}"
        return self._text[path]

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


def _snippet(text: str, line: int, context: int = 1) -> str:
    lines = text.splitlines()
    lo, hi = max(1, line - context), min(len(lines), line + context)
    return "\n".join(f"{n:>5} | {lines[n - 1]}" for n in range(lo, hi + 1))


def _best_line(text: str, rel: str, frame: SourceFrame, pattern: str) -> int:
    """The statement to point at, by preference: a fixer's match inside the frame's function, a
    fixer's match elsewhere in the same file, a candidate site inside the function, the frame line."""
    inside = locate(text, frame.line, pattern, function=frame.function, path=rel)
    fixer_inside = sorted((m for m in inside if m.fixer), key=lambda m: (not m.fixable, m.line))
    if fixer_inside:
        return fixer_inside[0].line
    in_file = static_findings(text, rel, [pattern]) if _has_detector(pattern) else []
    in_file = sorted(in_file, key=lambda m: (not m.fixable, m.line))
    if in_file:
        return in_file[0].line
    if inside:
        return sorted(inside, key=lambda m: m.line)[0].line
    return function_line(text, frame)


def _moved_frame(text: str, rel: str, frame: SourceFrame, pattern: str) -> SourceFrame:
    """``frame`` at its function's ``def`` in ``text`` when the source moved since the recording and
    several functions share its name (each nn.Module's ``forward``; one alone is found by its name):
    the one whose ``def`` lies nearest the recorded line, and of several as near, the only one that
    holds a statement of ``pattern``. Otherwise ``frame`` as it is (no guess between them)."""
    defs = _defs_named(text, frame.function)
    if len(defs) < 2 or any(frame.line in lines for lines in defs):
        return frame
    gap = [min(abs(line - frame.line) for line in lines) for lines in defs]
    nearest = [lines for lines, g in zip(defs, gap) if g == min(gap)]
    if len(nearest) > 1:
        nearest = [lines for lines in nearest
                   if locate(text, lines[0], pattern, function=frame.function, path=rel)]
    return frame.model_copy(update={"line": nearest[0][0]}) if len(nearest) == 1 else frame


def _defs_named(text: str, name: str) -> list[tuple[int, ...]]:
    """For each function called ``name``: the lines its recorded frame may name (its ``def``'s and its
    first decorator's, which Python gives as the function's first line), the first decorator's first."""
    tree = _tree(text) if name and name != "<module>" else None
    if tree is None:
        return []
    return [tuple(sorted({n.lineno, *(d.lineno for d in n.decorator_list[:1])}))
            for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]


@lru_cache(maxsize=4)
def _tree(text: str) -> ast.Module | None:
    """``text`` parsed by ast, once for all the frames located in it; None when it does not parse or
    is nested too deeply for the parser (the fix stage skips such text too). Emptied after each
    :func:`map_sources` and :func:`patch_scopes`: a long-lived process keeps no user's code."""
    if nesting_problem(text) is not None:
        return None
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def function_line(text: str, frame: SourceFrame) -> int:
    """The line of the frame's function in ``text``: the frame's own line when a function of
    that name starts there (its ``def`` or first decorator), else the ``def`` of the one function
    of that name (the source moved since the recording), else the frame's line."""
    if not frame.function or frame.function == "<module>":
        return frame.line
    tree = _tree(text)
    if tree is None:
        return frame.line
    same = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == frame.function]
    if any(frame.line in {n.lineno, *(d.lineno for d in n.decorator_list)} for n in same):
        return frame.line
    return same[0].lineno if len(same) == 1 else frame.line


def _map_frame(index: SourceIndex, frame: SourceFrame, pattern: str) -> SourceFrame:
    """The frame located under the folder; the same frame of several events is located once."""
    key = (pattern, *frame.model_dump().values())
    if key not in index.mapped:
        index.mapped[key] = _locate_frame(index, frame, pattern)
    return index.mapped[key]


def _locate_frame(index: SourceIndex, frame: SourceFrame, pattern: str) -> SourceFrame:
    path = index.resolve_strict(frame.file)
    if path is None:
        return frame
    text = index.text(path)
    if text is None:  # the traced file, unreadable: said in a note (map_sources)
        index.unreadable[path] = index.why_not.get(path, "cannot read it")
        return frame
    rel = index.rel(path)
    if not index.analysable(path):  # too large to parse: the trace's line, as the fix stage leaves it unread
        return frame.model_copy(update={"resolved_path": rel, "resolved_line": frame.line,
                                        "snippet": _snippet(text, frame.line)})
    try:
        line = _best_line(text, rel, _moved_frame(text, rel, frame, pattern), pattern)
    except (InputError, FixerCrash):  # the file does not parse (or is too deep to analyse): keep the frame's line
        line = frame.line
    update = {"resolved_path": rel, "resolved_line": line, "snippet": _snippet(text, line)}
    if not frame.function or not _in_function(text, line, frame.function):
        # the statement lies in another function (the model or optimizer built in `main`, a conv in a
        # block builder): the location names the function that holds it, as a static match's does
        update["function"] = enclosing_function(text, line)
    return frame.model_copy(update=update)


def _in_function(text: str, line: int, name: str) -> bool:
    """Whether ``line`` lies inside a function called ``name`` (its decorators included), or, for
    ``<module>``, outside every function. Text that does not parse: True (nothing to say otherwise)."""
    if name == "<module>":
        return enclosing_function(text, line) == "<module>"
    tree = _tree(text)
    if tree is None:
        return True
    return any(min([n.lineno, *(d.lineno for d in n.decorator_list)]) <= line <= (n.end_lineno or n.lineno)
               for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)


def _has_detector(pattern: str) -> bool:
    from .fix.api import fixers_for

    return bool(fixers_for(pattern))


#: ends the ``function`` of a location found by a static search of files the trace does not show
#: running: shown as such in the reports, never patched (see files_ran)
UNCONFIRMED = " (unconfirmed)"


def is_unconfirmed(frame: SourceFrame) -> bool:
    return frame.function.endswith(UNCONFIRMED)


def enclosing_function(text: str, line: int) -> str:
    """The name of the innermost def around ``line`` (``<module>`` outside any). Text nested
    too deeply for a parser is not parsed (the fix stage skips it too): ``<module>``."""
    tree = _tree(text)
    if tree is None:
        return "<module>"
    best, best_start = "<module>", 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            end = getattr(node, "end_lineno", None) or node.lineno
            if start <= line <= end and start >= best_start:
                best, best_start = node.name, start
    return best


def _static_frames(index: SourceIndex, pattern: str, paths: list[Path], confirmed: bool) -> list[SourceFrame]:
    """The pattern's static matches (the fixers' detectors) in ``paths``, as located frames."""
    if not _has_detector(pattern):
        return []
    out = []
    for path in paths:
        text = index.text(path) if index.analysable(path) else None
        if text is None:
            continue
        rel = index.rel(path)
        try:
            matches = static_findings(text, rel, [pattern])
        except (InputError, FixerCrash):  # does not parse, or too deep to analyse: as fix skips it
            continue
        for m in sorted(matches, key=lambda m: (not m.fixable, m.line))[:3]:
            function = enclosing_function(text, m.line) + ("" if confirmed else UNCONFIRMED)
            out.append(SourceFrame(file=rel, line=m.line, function=function, resolved_path=rel, resolved_line=m.line,
                                   snippet=_snippet(text, m.line)))
    return out[:5]


def map_finding(index: SourceIndex, finding: Finding, ran: list[Path] | None = None, *, confirmed: bool = True) -> Finding:
    """``finding`` with its frames resolved under the folder. A finding none of whose frames
    resolves is looked for statically in ``ran`` (the job's own program) when it is known, else
    in the whole folder, as unconfirmed locations unless ``confirmed`` (a one-file folder)."""
    frames = [_map_frame(index, f, finding.pattern) for f in finding.evidence.frames]
    events = []
    for e in finding.evidence.events:
        events.append(e.model_copy(update={"frames": [_map_frame(index, f, finding.pattern) for f in e.frames[:1]]}))
    if not any(f.resolved_path for f in frames):
        if ran:
            frames = _static_frames(index, finding.pattern, ran, True) + frames
        elif not any(f.resolved_path for e in events for f in e.frames):
            frames = _static_frames(index, finding.pattern, index.files, confirmed) + frames
    evidence = finding.evidence.model_copy(update={"frames": frames, "events": events})
    return finding.model_copy(update={"evidence": evidence})


# --------------------------------------------------------------------------------------------
# The job's own program: the files the trace shows running
# --------------------------------------------------------------------------------------------

_FRAME_AT = re.compile(rb"\.py\((\d{1,9})\): ")
_SCAN_BUDGET = 2 << 30  # decompressed trace bytes read looking for Python frames, per job
_OVERLAP = 1024


def trace_frame_files(paths: list[Path], budget: int = _SCAN_BUDGET) -> list[str]:
    """The user files of the Python frames in trace files (``python_function`` event names and
    2021 ``Call stack`` args alike, ``train.py(33): train_step``), in order of first appearance,
    library files left out. Reads the files' bytes (no JSON decoding), at most ``budget``
    decompressed bytes in all."""
    from .features.names import is_library_file
    from .load.reader import StreamAbort, iter_trace_chunks

    seen: dict[str, None] = {}
    left = budget
    for path in paths:
        tail = b""
        try:
            for data, _ in iter_trace_chunks(path):
                buf = tail + data
                for m in _FRAME_AT.finditer(buf):
                    lo = max(0, m.start() - 400)
                    start = max(buf.rfind(b'"', lo, m.start()), buf.rfind(b";", lo, m.start()))
                    if start < 0 or (buf[start] == 0x22 and _escaped(buf, start)):  # a quote inside a string
                        continue
                    file = _json_text(buf[start + 1:m.start() + 3])
                    if file is None:
                        continue
                    file = file.strip()
                    if file and not is_library_file(file) and not file.startswith("<"):
                        seen.setdefault(file, None)
                tail = buf[-_OVERLAP:]
                left -= len(data)
                if left <= 0:
                    return list(seen)
        except (StreamAbort, OSError):
            continue
    return list(seen)


def _escaped(buf: bytes, at: int) -> bool:
    """Whether the byte at ``at`` is escaped: an odd run of backslashes before it."""
    n = 0
    while at - n - 1 >= 0 and buf[at - n - 1] == 0x5C:
        n += 1
    return n % 2 == 1


def _json_text(raw: bytes) -> str | None:
    """A piece of a JSON string as text, its escapes undone (``C:\\\\proj\\\\train.py``, as JSON writes a
    Windows path, is ``C:\\proj\\train.py``); None for a piece that is not one (a line break, a cut escape)."""
    if b"\n" in raw:
        return None
    if b"\\" not in raw:
        return raw.decode("utf-8", "replace")
    try:
        text = json.loads(b'"' + raw + b'"')
    except ValueError:
        return None
    return None if "\n" in text else text


def _job_script(analysis: Analysis) -> str | None:
    """The script the capture helper's job.json (beside the trace) records in argv[0]."""
    from .load.job import recorded_job

    argv = recorded_job(Path(analysis.job.path)).get("argv")
    if isinstance(argv, list) and argv and isinstance(argv[0], str) and argv[0].endswith(".py"):
        return argv[0]
    return None


def job_program(analysis: Analysis, index: SourceIndex) -> list[Path]:
    """The files under the folder that the trace shows running, in this order: the findings'
    frames, the trace's own Python frames, the script job.json names."""
    ran: list[Path] = []

    def add(file: str) -> None:
        path = index.resolve_strict(file)
        if path is not None and path not in ran:
            ran.append(path)

    for f in analysis.findings:
        for fr in f.all_frames():
            add(fr.file)
    if analysis.features.get("has_python_stacks", True) is not False:
        traces = [Path(r.path) for r in analysis.job.ranks if Path(r.path).is_file()]
        for file in trace_frame_files(traces):
            add(file)
    script = _job_script(analysis)
    if script:
        add(script)
    return ran


def map_sources(analysis: Analysis, source_dir: Path) -> Analysis:
    """Every finding's frames resolved under source_dir. A finding whose evidence has no Python
    frame that resolves is looked for statically in the job's own program (:func:`job_program`);
    only when nothing of the trace resolves are the other files searched, and what is found there
    is unconfirmed (shown, never patched; a note says so) unless the folder holds one file."""
    index = SourceIndex(Path(source_dir))
    ran = job_program(analysis, index)
    single = len(index.files) == 1
    try:
        findings = [map_finding(index, f, ran, confirmed=single) for f in analysis.findings]
    finally:
        _tree.cache_clear()
    notes = list(analysis.notes)
    seen: set[tuple[Path, ...]] = set()
    for frame_file, paths in index.ambiguous.items():
        if tuple(paths) in seen:  # the same files for another spelling (job.json's script, a relative frame)
            continue
        seen.add(tuple(paths))
        names = ", ".join(index.rel(p) for p in paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        notes.append(f"source: {len(paths)} files under {source_dir} match the traced {frame_file} equally ({names}): "
                     f"none is taken for it, nothing of it is patched; give --source the folder of the program that ran")
    linked: dict[Path, str] = {}
    for f in findings:
        for fr in f.all_frames():
            if fr.resolved_path is None and not is_unconfirmed(fr) and fr.file not in index.ambiguous:
                link = index.link_for(fr.file)
                if link is not None:
                    linked.setdefault(link, fr.file)
    for link, frame_file in linked.items():
        try:
            target = os.readlink(link)
        except OSError:
            target = "?"
        notes.append(f"source: {index.rel(link)} under {source_dir} is a symbolic link (to {target}), not followed (as "
                     f"`zoomer-ar fix` never reads or replaces one): the traced {frame_file} it may hold is not "
                     "located; give --source the folder it points into")
    for path, why in index.unreadable.items():
        notes.append(f"source: {index.rel(path)} cannot be read ({why}): its findings keep the trace's line, nothing "
                     "of it is patched")
    for path in index.too_large:
        notes.append(f"source: {index.rel(path)} is larger than {engine.MAX_FILE_BYTES // (1024 * 1024)} MiB: not "
                     "analysed (as `zoomer-ar fix` leaves it unread); its findings keep the trace's line, nothing of it "
                     "is patched")
    if not ran and not single:
        guessed = sorted({f.pattern for f in findings for fr in f.evidence.frames if is_unconfirmed(fr)})
        what = f"; the locations shown for {', '.join(guessed)} are unconfirmed static matches" if guessed else ""
        notes.append(f"source: no Python frame of the trace (nor job.json's script) resolves to a file under {source_dir}"
                     f"{what}; nothing is patched (`zoomer-ar fix {source_dir} --diff` lists every static fix)")
    return analysis.model_copy(update={"findings": findings, "notes": notes})


def files_ran(analysis: Analysis) -> list[str]:
    """The source files (relative to --source) that a mapped analysis's findings are located in:
    the code the trace shows running. patch.diff changes only these files; none when nothing
    resolved (a trace recorded without Python stacks, or a source folder that does not hold the
    traced code): locations found only by searching the folder are unconfirmed and patch nothing.

    A source folder often holds more than the program that was profiled (other entry points,
    scenario programs side by side, old experiments): patch.diff changes only the code the trace
    shows running, and never a program the trace does not show; inside those files, only the
    functions :func:`patch_scopes` names."""
    files = {fr.resolved_path for f in analysis.findings for fr in f.all_frames() if fr.resolved_path and not is_unconfirmed(fr)}
    return sorted(files)


def patch_scopes(analysis: Analysis, source_dir: Path) -> dict[str, list[str]]:
    """For each file of :func:`files_ran`, the functions patch.diff may change (``<module>``:
    the code outside any function, as :func:`enclosing_function` names it): the function of
    each confirmed frame located in it (the code the trace shows running) and the function
    holding each located statement (a DataLoader built in ``main``, a conv in a block builder).
    The fix stage leaves the file's other findings alone (``run(..., scopes=...)``), so a helper
    that the trace never shows is not patched because it repeats the anti-pattern."""
    root = Path(source_dir)
    texts: dict[str, str | None] = {}
    out: dict[str, set[str]] = {}
    for f in analysis.findings:
        for fr in f.all_frames():
            if not fr.resolved_path or is_unconfirmed(fr):
                continue
            names = out.setdefault(fr.resolved_path, set())
            if fr.function:
                names.add(fr.function)
            if fr.resolved_line is None:
                continue
            if fr.resolved_path not in texts:
                try:
                    texts[fr.resolved_path] = decode((root / fr.resolved_path).read_bytes())[0]
                except (OSError, ValueError):
                    texts[fr.resolved_path] = None
            text = texts[fr.resolved_path]
            if text is not None and len(text) <= engine.MAX_FILE_BYTES:  # a larger one is not patched
                names.add(enclosing_function(text, fr.resolved_line))
    _tree.cache_clear()
    return {path: sorted(names) for path, names in sorted(out.items())}
