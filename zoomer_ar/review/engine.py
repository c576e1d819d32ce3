"""The review: run the fixers' static detectors on the Python files a diff changes and keep the
findings on changed lines.

A finding is kept when its flagged code (the expression, the statement holding it, or the whole
loop for loop-level findings) overlaps a line the diff adds or modifies, or encloses a place where
lines were deleted (a loop whose body changed). Its inline comment goes on the flagged line when
that line is in a hunk, else on the first changed line inside it; a fixable finding whose rewrite
lies inside one hunk carries the rewrite as a GitHub suggestion, checked to leave code that parses
alone and together with the file's other suggestions (see :class:`_Suggestions`).

Line numbers are Python's (``\\n``, ``\\r\\n`` or a lone ``\\r`` ends a line); git's differ only in a
file with lone ``\\r`` line endings, whose diff is translated (:meth:`FileDiff.in_python_lines`)
and whose comment lines are translated back (GitHub comments on git's lines).

Notebooks (``*.ipynb``) are reviewed by :mod:`.notebook`: their changed code cells, findings at the
JSON line of the flagged code, fixes as edits of the JSON text.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..errors import InputError
from ..fix import engine as fix_engine
from ..fix.base import SourceParseError, StaticMatch
from ..fix.lines import LineMap, has_lone_cr
from . import catalogue, prefilter
from .config import ReviewConfig, load_text
from .diff import DiffResult, FileDiff, collect
from .models import FileNote, ReviewFinding, ReviewResult
from .notebook import MAX_NOTEBOOK_BYTES, NotebookError, is_notebook, review_notebook
from .suggest import MAX_SUGGESTION_LINES, Rewrite, apply_rewrites, parse_check, rewrite, split_lines

PARALLEL_MIN_FILES = 8
_BLOCK_STARTS = ("for ", "for(", "while ", "while(", "async for ", "with ", "async with ")


@dataclass
class _Job:
    path: str
    text: str
    fd: FileDiff
    prefilter: bool = True


# --------------------------------------------------------------------------------------------
# Detection (in this process or in workers)
# --------------------------------------------------------------------------------------------

_SELECTIONS: dict[Any, fix_engine.Selection] = {}


def _selection(select: tuple[str, ...], ignore: tuple[str, ...], options_key: str) -> fix_engine.Selection:
    key = (select, ignore, options_key)
    sel = _SELECTIONS.get(key)
    if sel is None:
        import json

        options = json.loads(options_key) if options_key else None
        sel = _SELECTIONS[key] = fix_engine.select_fixers(list(select) or None, list(ignore) or None, options)
    return sel


_Out = tuple[str, list[dict], "FileNote | None", bool]


def _detect(job: _Job, select: tuple[str, ...], ignore: tuple[str, ...], options_key: str) -> _Out:
    """(path, matches, error, parsed): the prefilter, then the selected fixers the prefilter keeps."""
    sel = _selection(select, ignore, options_key)
    names = [f.name for f in sel.fixers]
    wanted, parse = prefilter.plan(job.text, job.fd, names) if job.prefilter else (set(names), True)
    if not parse:
        return job.path, [], None, False
    subset = fix_engine.Selection(tuple(f for f in sel.fixers if f.name in wanted), sel.fixing)
    try:
        matches = fix_engine.detect_source(job.text, job.path, subset)
    except SourceParseError as exc:
        return job.path, [], FileNote(path=job.path, line=exc.line, column=exc.column, message=exc.reason), True
    except fix_engine.FixerCrash as exc:
        return job.path, [], FileNote(path=job.path, message=str(exc)), True
    except RecursionError:
        return job.path, [], FileNote(path=job.path, message="cannot analyse: too deeply nested"), True
    return job.path, [m.model_dump() for m in matches], None, True


def _detect_chunk(jobs: list[_Job], select: tuple[str, ...], ignore: tuple[str, ...], options_key: str) -> list[_Out]:
    return [_detect(j, select, ignore, options_key) for j in jobs]


def _run_jobs(jobs: list[_Job], select: tuple[str, ...], ignore: tuple[str, ...], options_key: str, workers: int) -> list[_Out]:
    if workers <= 1 or len(jobs) < PARALLEL_MIN_FILES or sys.platform == "win32":
        return [_detect(j, select, ignore, options_key) for j in jobs]
    import multiprocessing as mp

    try:
        ctx = mp.get_context("fork")
    except ValueError:  # pragma: no cover - platforms without fork
        return [_detect(j, select, ignore, options_key) for j in jobs]
    # big files first, so one large file does not finish last; chunks of similar total size
    order = sorted(jobs, key=lambda j: -len(j.text))
    chunks: list[list[_Job]] = [[] for _ in range(min(len(order), workers * 4))]
    sizes = [0] * len(chunks)
    for j in order:
        i = sizes.index(min(sizes))
        chunks[i].append(j)
        sizes[i] += len(j.text) + 1000
    out: list[_Out] = []
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = [pool.submit(_detect_chunk, c, select, ignore, options_key) for c in chunks if c]
            for fut in futures:
                out.extend(fut.result())
    except (BrokenProcessPool, OSError):  # a worker died (memory) or processes cannot be started
        return [_detect(j, select, ignore, options_key) for j in jobs]
    return out


# --------------------------------------------------------------------------------------------
# Findings on changed lines
# --------------------------------------------------------------------------------------------


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _span_text(lines: Sequence[str], m: StaticMatch) -> str:
    if m.line < 1 or m.line > len(lines):
        return ""
    if m.line == m.end_line:
        return lines[m.line - 1][m.column - 1:m.end_column - 1]
    parts = [lines[m.line - 1][m.column - 1:]]
    parts.extend(lines[m.line:m.end_line - 1])
    if m.end_line - 1 < len(lines):
        parts.append(lines[m.end_line - 1][:m.end_column - 1])
    return "".join(parts)


def fingerprint(rule: str, fixer: str, path: str, code: str, occurrence: int) -> str:
    """Stable across pushes: no line numbers, only what is flagged and where (file)."""
    digest = hashlib.sha256(f"{rule}\0{fixer}\0{path}\0{_normalise(code)[:2000]}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"{digest[:32]}:{occurrence}"


def to_findings(fd: FileDiff, source: str, matches: Iterable[StaticMatch], overrides: Mapping[str, str], *,
                selection: fix_engine.Selection | None = None, git_lines: LineMap | None = None,
                suggestions: bool = True) -> list[ReviewFinding]:
    """The findings on the diff's changed lines, with their inline-comment lines and suggestions.

    ``fd``'s line numbers are Python's (see :meth:`FileDiff.in_python_lines`); ``git_lines``
    (when they differ from git's) turns the comment lines back into git's, the lines GitHub
    comments on. ``selection``: the fixers that ran (their options), for suggestions rebuilt from
    the fixed file (default: the fixers named by the matches, default options). ``suggestions``:
    False for a file GitHub cannot take a suggestion block into (its bytes are not UTF-8): the
    fixes are shown as diffs."""
    lines = split_lines(source)
    out: list[ReviewFinding] = []
    cands: list[_Candidate] = []
    seen: dict[tuple[str, str, str], int] = {}
    planner = _Suggestions(fd, source, lines, selection, git_lines, blocks=suggestions)
    for m in matches:
        first = min(m.statement_line, m.line)
        code = _span_text(lines, m)
        key = (m.pattern, m.fixer, _normalise(code))
        seen[key] = seen.get(key, 0) + 1
        occurrence = seen[key]
        block = 0 < m.line <= len(lines) and lines[m.line - 1].lstrip().startswith(_BLOCK_STARTS)
        if not fd.touches(first, max(m.end_line, m.line), block=block):
            continue
        f = ReviewFinding(
            rule_id=m.pattern,
            fixer=m.fixer,
            title=catalogue.title(m.pattern),
            severity=catalogue.severity_for(m.pattern, m.fixer, dict(overrides)),
            message=m.message,
            path=fd.path,
            line=m.line,
            column=m.column,
            end_line=m.end_line,
            end_column=m.end_column,
            statement_line=m.statement_line,
            snippet=(lines[m.line - 1].strip() if 0 < m.line <= len(lines) else "")[:200],
            fixable=m.fixable,
            opt_in=m.opt_in,
            fingerprint=fingerprint(m.pattern, m.fixer, fd.path, code, occurrence),
        )
        rw = rewrite(lines, m.edits) if m.edits else None
        edits = [e.model_dump() for e in m.edits]
        if rw is not None and _multi_line_expression(m.edits):
            written = planner.as_fixer_writes(m.fixer, rw)
            if written is not rw:
                rw, edits = written, [_whole_lines_edit(lines, written)]
        if rw is not None:
            f.fix_diff = rw.diff(fd.path)
            f.edits = edits
        if rw is not None and m.fixable:
            cands.append(_Candidate(len(out), m, rw))
        out.append(f)
    chosen = planner.plan(cands)
    for i, f in enumerate(out):
        rw = chosen.get(i)
        if rw is not None:
            f.suggestion = rw.suggestion
            f.comment_line = rw.last
            f.comment_start_line = rw.first if rw.first < rw.last else None
        elif fd.hunk_of(f.line) is not None:
            f.comment_line = f.line
        else:
            first = min(f.statement_line, f.line)
            last = max(f.end_line, f.line)
            f.comment_line = fd.first_added(first, last)
            if f.comment_line is None:  # a deletion inside the flagged code: the line before the gap
                gaps = [k for k in fd.deletions if first <= k <= last]
                if gaps and fd.hunk_of(min(gaps)) is not None:
                    f.comment_line = min(gaps)
        if git_lines is not None and not git_lines.identity:  # GitHub counts git's lines
            if f.comment_line is not None:
                f.comment_line = git_lines.git_line(f.comment_line)
            if f.comment_start_line is not None:
                start = git_lines.git_line(f.comment_start_line)
                f.comment_start_line = start if start < (f.comment_line or 0) else None
    for i, others in planner.merged.items():  # one suggestion applying several findings' fixes: say so
        if chosen.get(i) is None:
            continue
        host = out[i]
        host.also_fixes = [{"rule_id": out[o].rule_id, "fixer": out[o].fixer, "line": out[o].line} for o in others]
        for o in others:
            out[o].fixed_by_suggestion_on = host.comment_start_line or host.comment_line
    return out


# --------------------------------------------------------------------------------------------
# Suggestions that parse, alone and together
# --------------------------------------------------------------------------------------------


def _multi_line_expression(edits: Sequence[Any]) -> bool:
    """Whether an edit replaces an expression (not whole statements) with text of several lines:
    such a rewrite (a `DataLoader(` call spanning lines inside a function) is taken from the file
    the fixers write whole, so its continuation lines have the indentation `zoomer-ar fix` gives
    them (the edits' text has had it too since Context.text_edit writes at the statement's indent)."""
    return any(e.column > 1 and "\n" in e.text for e in edits)


def _whole_lines_edit(lines: Sequence[str], rw: Rewrite) -> dict[str, Any]:
    """A rewrite as one text edit replacing its whole lines (the form of a finding's ``edits``)."""
    if rw.last < len(lines) or lines[rw.last - 1].endswith(("\n", "\r")):
        end_line, end_column = rw.last + 1, 1
    else:  # the file's last line, without a line break
        end_line, end_column = rw.last, len(lines[rw.last - 1]) + 1
    return {"line": rw.first, "column": 1, "end_line": end_line, "end_column": end_column, "text": rw.new}



@dataclass
class _Candidate:
    index: int  # the finding's position in to_findings' list
    match: StaticMatch
    rw: Rewrite


def _overlap(a: Rewrite, b: Rewrite) -> bool:
    return a.first <= b.last and b.first <= a.last


def _no_code_between(lines: Sequence[str], last: int, first: int) -> bool:
    """Whether lines last+1..first-1 are all blank or comments (nothing between two statements)."""
    for n in range(last + 1, first):
        text = lines[n - 1].strip() if 0 < n <= len(lines) else ""
        if text and not text.startswith("#"):
            return False
    return True


def _region(old: list[str], new: list[str], first: int, last: int) -> Rewrite | None:
    """Lines first..last of ``old`` (widened to whole changes) and what ``new`` has for them."""
    all_ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    ops = [op for op in all_ops if op[0] != "equal"]
    a0, a1 = first - 1, last  # 0-based, end exclusive
    grown = True
    while grown:
        grown = False
        for _tag, i1, i2, _j1, _j2 in ops:
            inside = (i1 < a1 and i2 > a0) if i1 < i2 else a0 < i1 < a1
            if inside and (i1 < a0 or i2 > a1):
                a0, a1 = min(a0, i1), max(a1, i2)
                grown = True
    j0 = j1 = None
    for tag, i1, i2, k1, k2 in all_ops:
        if j0 is None and i1 <= a0 < i2:
            j0 = k1 + (a0 - i1) if tag == "equal" else k1
        if j1 is None and i1 < a1 <= i2:
            j1 = k1 + (a1 - i1) if tag == "equal" else k2
    if j0 is None or j1 is None or j1 < j0:
        return None
    before, after = "".join(old[a0:a1]), "".join(new[j0:j1])
    if before == after:
        return None
    return Rewrite(a0 + 1, a1, before, after)


class _Suggestions:
    """Which fixable findings carry a GitHub suggestion, and which one.

    Each suggestion is checked to leave code that parses when applied alone, and all of a file's
    suggestions together too: suggestions on neighbouring lines whose combination would not
    parse (two deleted statements that were a loop's whole body) become one suggestion, on the
    first of those findings, rebuilt from the file the fixers themselves write (a ``pass`` kept);
    a suggestion that cannot be made to parse is left out (the comment shows the fix as a diff)."""

    def __init__(self, fd: FileDiff, source: str, lines: list[str], selection: fix_engine.Selection | None,
                 git_lines: LineMap | None, *, blocks: bool = True):
        self.fd = fd
        self.blocks = blocks
        self.source = source
        self.lines = lines
        self.selection = selection
        self.git_lines = git_lines if git_lines is not None and not git_lines.identity else None
        self._check = None
        self._fixed: dict[frozenset[str], list[str] | None] = {}
        #: a finding whose suggestion also applies other findings' fixes -> those findings
        self.merged: dict[int, list[int]] = {}

    # -- checks ---------------------------------------------------------------------------------

    def parses(self, rws: Sequence[Rewrite]) -> bool:
        if self._check is None:
            self._check = parse_check(self.source)
        return self._check(apply_rewrites(self.lines, rws))

    def usable(self, rw: Rewrite | None) -> bool:
        if not self.blocks or rw is None or rw.last - rw.first >= MAX_SUGGESTION_LINES or not self.fd.in_one_hunk(rw.first, rw.last):
            return False
        gl = self.git_lines
        if gl is not None:  # GitHub replaces whole git lines: only where they are whole Python lines
            if gl.first(gl.git_line(rw.first)) != rw.first or has_lone_cr(rw.old + rw.new):
                return False
        return True

    # -- rebuilding from the fixed file ---------------------------------------------------------

    def fixed_region(self, fixers: set[str], first: int, last: int) -> Rewrite | None:
        key = frozenset(fixers)
        if key not in self._fixed:
            self._fixed[key] = None
            try:
                sel = self.selection if self.selection is not None else fix_engine.select_fixers(sorted(fixers))
                subset = fix_engine.Selection(tuple(f for f in sel.fixers if f.name in fixers), sel.fixing | key)
                fixed = fix_engine.fix_source_with(self.source, self.fd.path, subset)
            except Exception:  # a fixer that cannot rewrite this file: no suggestion, not a failed review
                fixed = None
            if fixed is not None and fixed != self.source:
                self._fixed[key] = split_lines(fixed)
        new = self._fixed[key]
        return _region(self.lines, new, first, last) if new is not None else None

    def as_fixer_writes(self, fixer: str, rw: Rewrite) -> Rewrite:
        """``rw`` as the fixer writes those lines into the file (``zoomer-ar fix``): the same
        lines, re-indented where the match's edit lost the block's indentation; ``rw`` itself
        when the fixed file changes other lines there (it cannot be told apart)."""
        written = self.fixed_region({fixer}, rw.first, rw.last)
        if written is None or (written.first, written.last) != (rw.first, rw.last) or written.new == rw.new:
            return rw
        return written

    # -- planning -------------------------------------------------------------------------------

    def plan(self, cands: list[_Candidate]) -> dict[int, Rewrite]:
        cands = [c for c in cands if self.usable(c.rw)]
        if not cands:
            return {}
        cands.sort(key=lambda c: (c.rw.first, c.rw.last, c.index))
        alone = {c.index: self.parses([c.rw]) for c in cands}
        clusters: list[list[_Candidate]] = []
        for c in cands:
            if clusters:
                cur = clusters[-1]
                end = max(x.rw.last for x in cur)
                if (self.fd.hunk_of(c.rw.first) == self.fd.hunk_of(cur[0].rw.first)
                        and (c.rw.first <= end + 1 or _no_code_between(self.lines, end, c.rw.first))):
                    cur.append(c)
                    continue
            clusters.append([c])
        plans: list[list[tuple[int, Rewrite]]] = [self._cluster(cl, alone) for cl in clusters]
        chosen: dict[int, Rewrite] = {}
        accepted: list[Rewrite] = []
        together = [rw for p in plans for _, rw in p]
        if self._disjoint(together) and self.parses(together):
            return {i: rw for p in plans for i, rw in p}
        for p in plans:  # rare: clusters that interact; keep those that still parse with the others
            rws = [rw for _, rw in p]
            if p and self._disjoint([*accepted, *rws]) and self.parses([*accepted, *rws]):
                accepted.extend(rws)
                chosen.update(dict(p))
        return chosen

    @staticmethod
    def _disjoint(rws: Sequence[Rewrite]) -> bool:
        ordered = sorted(rws, key=lambda r: r.first)
        return all(a.last < b.first for a, b in zip(ordered, ordered[1:]))

    def _cluster(self, cl: list[_Candidate], alone: dict[int, bool]) -> list[tuple[int, Rewrite]]:
        """(finding index, rewrite) of one group of neighbouring candidates."""
        rws = [c.rw for c in cl]
        if all(alone[c.index] for c in cl) and (len(cl) == 1 or (self._disjoint(rws) and self.parses(rws))):
            return [(c.index, c.rw) for c in cl]
        first, last = min(r.first for r in rws), max(r.last for r in rws)
        merged = rewrite(self.lines, [e for c in cl for e in c.match.edits]) if len(cl) > 1 else None
        if not (self.usable(merged) and self.parses([merged])):
            merged = self.fixed_region({c.match.fixer for c in cl}, first, last)
        if self.usable(merged) and self.parses([merged]):
            self.merged[cl[0].index] = [c.index for c in cl[1:]]
            return [(cl[0].index, merged)]
        keep: list[tuple[int, Rewrite]] = []  # the fix cannot be offered whole: the parts that parse
        for c in cl:
            rws = [rw for _, rw in keep] + [c.rw]
            if alone[c.index] and self._disjoint(rws) and self.parses(rws):
                keep.append((c.index, c.rw))
        return keep


# --------------------------------------------------------------------------------------------
# The review
# --------------------------------------------------------------------------------------------


def _read_config(diff: DiffResult) -> ReviewConfig:
    if diff.head_sha is None:
        p = diff.root / "pyproject.toml"
        text = p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None
    else:
        import git

        repo: git.Repo = diff.repo  # type: ignore[assignment]
        try:
            blob = repo.commit(diff.head_sha).tree / "pyproject.toml"
            text = blob.data_stream.read().decode("utf-8", errors="replace")
        except KeyError:
            text = None
    return load_text(text, "pyproject.toml")


def _old_text(diff: DiffResult, fd: FileDiff) -> str | None:
    """The old side of a changed file, decoded (None: an added file, or it cannot be read)."""
    try:
        raw = diff.read_old(fd)
        return fix_engine.decode(raw)[0] if raw is not None else None
    except Exception:
        return None


def _is_utf8(raw: bytes) -> bool:
    """Whether a file's bytes are UTF-8: GitHub writes a suggestion's text as UTF-8, so committing one
    into a Latin-1 file (a coding cookie) would turn its accented characters into mojibake."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _ids(v: str | Iterable[str] | None) -> list[str]:
    return fix_engine.split_ids(v)


def review(
    repo: str | os.PathLike[str] = ".",
    base: str = "HEAD",
    head: str | None = None,
    *,
    paths: Iterable[str] = (),
    select: str | Iterable[str] | None = None,
    ignore: str | Iterable[str] | None = None,
    config: ReviewConfig | None = None,
    trace: str | os.PathLike[str] | None = None,
    db: str | None = None,
    db_week: str | None = None,
    jobs: int | None = None,
    use_prefilter: bool = True,
) -> ReviewResult:
    """Review the Python files changed between ``base`` (its merge base with head) and ``head``
    (None: the working tree). ``select``/``ignore`` (pattern ids or fixer names) replace the
    repository's ``[tool.zoomer-ar]`` lists when given."""
    t0 = time.perf_counter()
    diff = collect(repo, base, head, paths=paths)
    try:
        return _review(diff, t0, select=select, ignore=ignore, config=config, trace=trace, db=db, db_week=db_week,
                       jobs=jobs, use_prefilter=use_prefilter)
    finally:
        close = getattr(diff.repo, "close", None)
        if close is not None:
            close()  # GitPython's persistent `git cat-file` processes


def _review(diff: DiffResult, t0: float, *, select, ignore, config, trace, db, db_week, jobs, use_prefilter) -> ReviewResult:
    cfg = config if config is not None else _read_config(diff)
    sel_ids = _ids(select) if select is not None else list(cfg.select)
    ign_ids = _ids(ignore) if ignore is not None else list(cfg.ignore)
    import json

    options_key = json.dumps(cfg.options, sort_keys=True) if cfg.options else ""
    selection = _selection(tuple(sel_ids), tuple(ign_ids), options_key)
    result = ReviewResult(
        repo=str(diff.root), base=diff.base, base_sha=diff.base_sha, head=diff.head, head_sha=diff.head_sha,
        merge_base_sha=diff.merge_base_sha, files_changed=len(diff.files),
        notebooks_changed=sum(is_notebook(fd.path) for fd in diff.files), config_source=cfg.source,
        config_fail_on=cfg.fail_on, config_max_inline=cfg.max_inline_comments,
        rules=sorted({f.pattern for f in selection.fixers}),
    )
    work: list[_Job] = []
    notebook_work: list[tuple[FileDiff, bytes]] = []
    sources: dict[str, tuple[FileDiff, str, LineMap | None, bool]] = {}
    excluded = 0
    for fd in diff.files:
        if cfg.excluded(fd.path):
            excluded += 1
            continue
        if fd.binary:
            result.skipped.append(FileNote(path=fd.path, message="binary file"))
            continue
        if not fd.changed:
            continue  # a pure rename or mode change: no line to review
        try:
            raw = diff.read(fd)
        except (OSError, KeyError) as exc:
            result.errors.append(FileNote(path=fd.path, message=f"cannot read: {exc}"))
            continue
        notebook = is_notebook(fd.path)
        if len(raw) > (MAX_NOTEBOOK_BYTES if notebook else fix_engine.MAX_FILE_BYTES):
            result.skipped.append(FileNote(path=fd.path, message=f"too large to review ({len(raw):,} bytes)"))
            continue
        if b"\0" in raw:
            result.skipped.append(FileNote(path=fd.path, message="binary file"))
            continue
        if notebook:  # JSON: reviewed cell by cell below, in this process
            result.files_reviewed += 1
            notebook_work.append((fd, raw))
            continue
        try:
            text, _enc = fix_engine.decode(raw)
        except ValueError as exc:
            result.errors.append(FileNote(path=fd.path, message=f"cannot decode: {exc}"))
            continue
        result.files_reviewed += 1
        git_lines = None
        if has_lone_cr(text):  # old-Mac line endings: git's line numbers are not Python's
            git_lines = LineMap(text)
            fd = fd.in_python_lines(text, _old_text(diff, fd))
        sources[fd.path] = (fd, text, git_lines, _is_utf8(raw))
        work.append(_Job(fd.path, text, fd, use_prefilter))
    if excluded:
        result.notes.append(f"{excluded} changed Python file{'s' if excluded != 1 else ''} excluded by [tool.zoomer-ar] exclude")
    workers = jobs if jobs is not None else min(os.cpu_count() or 1, 8)
    findings: list[ReviewFinding] = []
    for path, dumped, note, parsed in _run_jobs(work, tuple(sel_ids), tuple(ign_ids), options_key, workers):
        result.files_parsed += parsed
        if note is not None:
            result.errors.append(note)
            continue
        fd, text, git_lines, utf8 = sources[path]
        findings.extend(to_findings(fd, text, [StaticMatch.model_validate(d) for d in dumped], cfg.severity,
                                    selection=selection, git_lines=git_lines, suggestions=utf8))
    for fd, raw in notebook_work:
        found, notes = _review_notebook(diff, fd, raw, selection, cfg.severity)
        result.files_parsed += 1
        findings.extend(found)
        result.errors.extend(notes)
    findings.sort(key=lambda f: (f.path, f.line, f.column, f.rule_id, f.fixer))
    result.findings = findings
    result.errors.sort(key=lambda n: n.path)
    result.skipped.sort(key=lambda n: n.path)
    if trace is not None or db is not None:
        from .evidence import attach

        result.notes.extend(attach(result.findings, trace=trace, db=db, week=db_week, overrides=cfg.severity))
    result.seconds = time.perf_counter() - t0
    return result


def _review_notebook(diff: DiffResult, fd: FileDiff, raw: bytes, selection: fix_engine.Selection,
                     overrides: Mapping[str, str]) -> tuple[list[ReviewFinding], list[FileNote]]:
    """A changed notebook's findings and notes (:mod:`.notebook`); one that cannot be read as a
    notebook, or that a fixer fails on, is one note naming the reason."""
    encoding = "utf-8-sig" if raw.startswith(b"\xef\xbb\xbf") else "utf-8"
    try:
        text = raw.decode(encoding)
        old_raw = diff.read_old(fd) if fd.old_blob is not None else None
    except UnicodeDecodeError as exc:
        return [], [FileNote(path=fd.path, message=f"cannot decode: not UTF-8 JSON ({exc.reason} at byte {exc.start})")]
    except (OSError, KeyError, ValueError):
        old_raw = None
    old_text = old_raw.decode("utf-8-sig", errors="replace") if old_raw is not None else None
    try:
        return review_notebook(fd, text, old_text, selection, overrides)
    except NotebookError as exc:
        return [], [FileNote(path=fd.path, message=str(exc))]
    except fix_engine.FixerCrash as exc:
        return [], [FileNote(path=fd.path, message=str(exc))]
    except RecursionError:
        return [], [FileNote(path=fd.path, message="cannot analyse: too deeply nested")]


def fail_count(result: ReviewResult, threshold: str | None) -> int:
    """Findings at or above ``threshold`` (none/None: 0)."""
    if not threshold or threshold == "none":
        return 0
    if threshold not in catalogue.SEVERITIES:
        raise InputError(None, f"--fail-on: expected one of none, {', '.join(catalogue.SEVERITIES)}, got {threshold!r}")
    return sum(1 for f in result.findings if catalogue.at_least(f.severity, threshold))
