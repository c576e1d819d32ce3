"""The review: run the fixers' static detectors on the Python files a diff changes and keep the
findings on changed lines.

A finding is kept when its flagged code (the expression, the statement holding it, or the whole
loop for loop-level findings) overlaps a line the diff adds or modifies, or encloses a place where
lines were deleted (a loop whose body changed). Its inline comment goes on the flagged line when
that line is in a hunk, else on the first changed line inside it; a fixable finding whose rewrite
lies inside one hunk carries the rewrite as a GitHub suggestion.
"""

from __future__ import annotations

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
from . import catalogue, prefilter
from .config import ReviewConfig, load_text
from .diff import DiffResult, FileDiff, collect
from .models import FileNote, ReviewFinding, ReviewResult
from .suggest import MAX_SUGGESTION_LINES, rewrite, split_lines

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


def to_findings(fd: FileDiff, source: str, matches: Iterable[StaticMatch], overrides: Mapping[str, str]) -> list[ReviewFinding]:
    lines = split_lines(source)
    out: list[ReviewFinding] = []
    seen: dict[tuple[str, str, str], int] = {}
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
        if rw is not None:
            f.fix_diff = rw.diff(fd.path)
            f.edits = [e.model_dump() for e in m.edits]
        if rw is not None and m.fixable and rw.last - rw.first < MAX_SUGGESTION_LINES and fd.in_one_hunk(rw.first, rw.last):
            f.suggestion = rw.suggestion
            f.comment_line = rw.last
            f.comment_start_line = rw.first if rw.first < rw.last else None
        elif fd.hunk_of(m.line) is not None:
            f.comment_line = m.line
        else:
            f.comment_line = fd.first_added(first, max(m.end_line, m.line))
            if f.comment_line is None:  # a deletion inside the flagged code: the line before the gap
                gaps = [k for k in fd.deletions if first <= k <= max(m.end_line, m.line)]
                if gaps and fd.hunk_of(min(gaps)) is not None:
                    f.comment_line = min(gaps)
        out.append(f)
    return out


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
        merge_base_sha=diff.merge_base_sha, files_changed=len(diff.files), config_source=cfg.source,
        config_fail_on=cfg.fail_on, config_max_inline=cfg.max_inline_comments,
        rules=sorted({f.pattern for f in selection.fixers}),
    )
    work: list[_Job] = []
    sources: dict[str, tuple[FileDiff, str]] = {}
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
        if len(raw) > fix_engine.MAX_FILE_BYTES:
            result.skipped.append(FileNote(path=fd.path, message=f"too large to review ({len(raw):,} bytes)"))
            continue
        if b"\0" in raw:
            result.skipped.append(FileNote(path=fd.path, message="binary file"))
            continue
        try:
            text, _enc = fix_engine.decode(raw)
        except ValueError as exc:
            result.errors.append(FileNote(path=fd.path, message=f"cannot decode: {exc}"))
            continue
        result.files_reviewed += 1
        sources[fd.path] = (fd, text)
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
        fd, text = sources[path]
        findings.extend(to_findings(fd, text, [StaticMatch.model_validate(d) for d in dumped], cfg.severity))
    findings.sort(key=lambda f: (f.path, f.line, f.column, f.rule_id, f.fixer))
    result.findings = findings
    result.errors.sort(key=lambda n: n.path)
    result.skipped.sort(key=lambda n: n.path)
    if trace is not None or db is not None:
        from .evidence import attach

        result.notes.extend(attach(result.findings, trace=trace, db=db, week=db_week, overrides=cfg.severity))
    result.seconds = time.perf_counter() - t0
    return result


def fail_count(result: ReviewResult, threshold: str | None) -> int:
    """Findings at or above ``threshold`` (none/None: 0)."""
    if not threshold or threshold == "none":
        return 0
    if threshold not in catalogue.SEVERITIES:
        raise InputError(None, f"--fail-on: expected one of none, {', '.join(catalogue.SEVERITIES)}, got {threshold!r}")
    return sum(1 for f in result.findings if catalogue.at_least(f.severity, threshold))
