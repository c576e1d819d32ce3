"""Notebooks (``*.ipynb``) in a review: the code cells a pull request changes, reviewed as Python.

A notebook is JSON (nbformat 4); git diffs that text and GitHub comments on its lines. The cells
are read with :mod:`zoomer_ar.fix.notebooks` (the stdlib ``json`` module, never ``nbformat``), which
also knows where each code cell's ``source`` lies in the text:

* **IPython syntax is masked**: a line magic, ``!shell``, ``x = !ls`` or ``obj?`` becomes a
  placeholder line (one line for one line, so cell line numbers hold) for the parse; a rewrite
  whose lines include such a line is never offered. A cell magic whose body is not Python
  (``%%bash``...) leaves its cell out; ``%%time``-like cells are reviewed below their first line.
  A changed cell that still does not parse is named under "Could not analyse"
  (``cell 5, line 1: cannot parse: ...``), and the other cells are reviewed.
* **The cells are analysed together** (one module in cell order, as the fix stage does: the
  ``import torch`` of the first cell names the ``torch.optim.SGD`` of the fifth).
* **Changed lines**: each cell line is mapped to the JSON line holding its text (one line a JSON
  line as nbformat writes it with ``indent=1``); a cell line is changed when that JSON line is one
  the diff adds. Where one JSON line holds several cell lines (a source written as one string), a
  Python-line diff against the same cell on the old side (same cell ``id``, else same position)
  says which of them changed.
* **Locations**: a finding's ``line``/``column`` (and SARIF region, inline comment) are the JSON
  line and column of the flagged code in the ``.ipynb`` file; ``cell``/``cell_line`` and the
  message (``cell 4, line 2: ...``) name the cell (its 1-based position among all the cells,
  markdown included).
* **Fixes**: the cell's new source is written into the JSON text in the layout the file uses
  (:func:`zoomer_ar.fix.notebooks.rewrite`: same escaping, every other byte unchanged), and the
  JSON lines that differ are the suggestion, the diff and the SARIF replacement.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..fix import engine as fix_engine
from ..fix import notebooks
from ..fix.base import SourceParseError, StaticMatch, TextEdit
from ..fix.lines import split_lines
from . import prefilter
from .diff import FileDiff
from .models import FileNote, ReviewFinding
from .suggest import MAX_SUGGESTION_LINES, Rewrite, apply_rewrites, cst_parses, rewrite

__all__ = ["MAX_NOTEBOOK_BYTES", "NotebookError", "is_notebook", "review_notebook"]

is_notebook = notebooks.is_notebook
NotebookError = notebooks.NotebookError
MAX_NOTEBOOK_BYTES = notebooks.MAX_NOTEBOOK_BYTES


# --------------------------------------------------------------------------------------------
# Where a cell's characters lie in the JSON text
# --------------------------------------------------------------------------------------------


def _raw_offsets(raw: str) -> list[int] | None:
    """For a JSON string literal ``raw`` (quotes included): the offset in ``raw`` of each
    character of its value, then of the closing quote; None if the count does not match."""
    out: list[int] = []
    j, end = 1, len(raw) - 1
    while j < end:
        out.append(j)
        if raw[j] != "\\":
            j += 1
        elif raw[j + 1] != "u":
            j += 2
        else:
            code = int(raw[j + 2:j + 6], 16)
            pair = (0xD800 <= code < 0xDC00 and raw.startswith("\\u", j + 6)
                    and 0xDC00 <= int(raw[j + 8:j + 12] or "0", 16) < 0xE000)
            j += 12 if pair else 6
    out.append(end)
    return out if len(out) - 1 == len(json.loads(raw)) else None


class _Positions:
    """Character offset in a cell's text -> (JSON line, JSON column), both 1-based."""

    def __init__(self, text: str, newlines: list[int], cell: notebooks.Cell):
        src = cell.source
        spans = notebooks.array_elements(text, src.start) if src.items is not None else [(src.start, src.end)]
        self.newlines = newlines
        self.pos: list[int] = []  # absolute offset of each character of cell.text, then one past it
        for a, b in spans:
            offs = _raw_offsets(text[a:b])
            if offs is None:  # cannot happen for valid JSON; keep going with the string's start
                offs = [1] * (len(json.loads(text[a:b])) + 1)
            self.pos.extend(a + o for o in offs[:-1])
        self.pos.append(spans[-1][1] - 1 if spans else src.start)
        self.line_starts: list[int] = []
        n = 0
        for line in split_lines(cell.text):
            self.line_starts.append(n)
            n += len(line)
        self.n_chars = n

    def at(self, offset: int) -> tuple[int, int]:
        p = self.pos[max(0, min(offset, len(self.pos) - 1))]
        k = bisect_right(self.newlines, p - 1)  # newlines before p
        start = self.newlines[k - 1] + 1 if k else 0
        return k + 1, p - start + 1

    def offset(self, line: int, column: int) -> int:
        if line > len(self.line_starts):
            return self.n_chars
        return self.line_starts[max(1, line) - 1] + max(1, column) - 1

    def json_line(self, cell_line: int) -> int:
        return self.at(self.offset(cell_line, 1))[0]

    def json_lines_of(self, cell_line: int) -> set[int]:
        """Every JSON line that holds a character of this cell line."""
        a = self.offset(cell_line, 1)
        b = self.line_starts[cell_line] if cell_line < len(self.line_starts) else self.n_chars
        first, last = self.at(a)[0], self.at(max(a, b - 1))[0]
        if last - first <= 1:
            return {first, last}
        return {self.at(o)[0] for o in range(a, b)}  # a line written over several strings


# --------------------------------------------------------------------------------------------
# The diff of the JSON as a diff of each cell
# --------------------------------------------------------------------------------------------


def _old_cells(old_text: str | None) -> tuple[dict[str, str], dict[int, str]]:
    """The old side's code cells: text by cell id and by position."""
    if old_text is None:
        return {}, {}
    try:
        cells = notebooks.read_cells(old_text)
        doc = json.loads(old_text)
    except (notebooks.NotebookError, ValueError):
        return {}, {}
    by_id = {}
    for c in cells:
        cid = doc["cells"][c.index].get("id")
        if isinstance(cid, str):
            by_id[cid] = c.text
    return by_id, {c.index: c.text for c in cells}


def _cell_diff(fd: FileDiff, pm: _Positions, cell: notebooks.Cell, old: str | None) -> FileDiff:
    """``fd`` (JSON lines) as the diff of one cell (its lines).

    A cell line is changed when the JSON line holding it is one the diff adds. ``old`` (the cell's
    text on the old side; None: a new cell, or not found) narrows that with a Python-line diff of
    the cell: a JSON line can change while the code on it does not (its trailing comma, when the
    line after it was the source's last and was deleted), or hold several cell lines (a source
    written as one string)."""
    n = len(pm.line_starts)
    json_of = {k: pm.json_line(k) for k in range(1, n + 1)}
    touched = {k for k in range(1, n + 1) if any(j in fd.added for j in pm.json_lines_of(k))}
    gaps: set[int] = set()
    first_json = pm.at(0)[0]
    open_line = _json_line_at(pm, cell.source.start)  # the line of the source's "[" (or its one string)
    last_json = json_of[n] if n else first_json
    for gap in fd.deletions:
        if open_line <= gap < first_json:
            gaps.add(0)
        elif first_json <= gap < last_json:
            gaps.add(max((k for k, j in json_of.items() if j <= gap), default=0))
    added, deletions = touched, gaps
    if old is not None and (touched or gaps):
        import difflib

        exact_added: set[int] = set()
        exact_gaps: set[int] = set()
        ops = difflib.SequenceMatcher(None, split_lines(old), split_lines(cell.text), autojunk=False).get_opcodes()
        for tag, _i1, _i2, j1, j2 in ops:
            if tag in ("replace", "insert"):
                exact_added.update(range(j1 + 1, j2 + 1))
            if tag in ("replace", "delete"):
                exact_gaps.add(j1)  # the new line before the gap
        added, deletions = touched & exact_added, exact_gaps
    hunks: list[tuple[int, int]] = []
    prev_hunk = None
    for k in range(1, n + 1):
        h = fd.hunk_of(json_of[k])
        if h is not None and h == prev_hunk and hunks and hunks[-1][1] == k - 1:
            hunks[-1] = (hunks[-1][0], k)
        elif h is not None:
            hunks.append((k, k))
        prev_hunk = h
    return FileDiff(path=fd.path, status=fd.status, added=added, deletions=deletions, hunks=hunks)


def _json_line_at(pm: _Positions, absolute: int) -> int:
    """The JSON line of an absolute offset of the text."""
    return bisect_right(pm.newlines, absolute - 1) + 1


# --------------------------------------------------------------------------------------------
# Detection: the cells together, as the fix stage reads them
# --------------------------------------------------------------------------------------------


def _inside(m: StaticMatch, first_line: int, n: int) -> bool:
    """Whether all of a match's edits lie in the cell whose lines are first_line.. (n lines)."""
    return all(first_line <= e.line and (e.end_line < first_line + n or (e.end_line == first_line + n and e.end_column == 1))
               for e in m.edits)


def _to_cell(m: StaticMatch, first_line: int, edits: bool = True) -> StaticMatch:
    """A match of a module in the lines of the cell that starts at ``first_line``; ``edits``
    False: without its edits (a fix reaching outside the cell is not offered)."""
    shift = first_line - 1
    moved = [e.model_copy(update={"line": e.line - shift, "end_line": e.end_line - shift}) for e in m.edits] if edits else []
    return m.model_copy(update={"line": m.line - shift, "end_line": m.end_line - shift,
                                "statement_line": max(1, m.statement_line - shift), "edits": moved})


def _alone(cell: notebooks.Cell, path: str, selection: fix_engine.Selection, nonce: str) -> list[StaticMatch]:
    """The cell's matches with the cell read alone (after its marker, as the fix stage reads it)."""
    head = notebooks.cell_marker(nonce, cell) + "\n"
    try:
        return [_to_cell(m, 2) for m in fix_engine.detect_source(head + (cell.masked or ""), path, selection)]
    except SourceParseError:
        return []


def _detect(cells: list[notebooks.Cell], path: str, selection: fix_engine.Selection, nonce: str) -> dict[int, list[StaticMatch]]:
    """Matches by cell index, in each cell's (masked) lines: the cells read together (one
    namespace), as the fix stage reads them. A match whose fix reaches another cell (an import
    added to the first cell) takes the fix the cell alone gets, as the fix stage then does, or none."""
    joined, starts = notebooks.joined_cells(cells, nonce)
    try:
        found = fix_engine.detect_source(joined, path, selection)
    except SourceParseError:  # cells that parse alone but not together (a late __future__ import)
        return {c.index: _alone(c, path, selection, nonce) for c in cells}
    out: dict[int, list[StaticMatch]] = {c.index: [] for c in cells}
    crossing: dict[int, list[int]] = {}
    for m in found:
        k = max(0, bisect_right(starts, m.line) - 1)
        cell = cells[k]
        inside = _inside(m, starts[k], len(split_lines(cell.masked or "")))
        if not inside:
            crossing.setdefault(k, []).append(len(out[cell.index]))
        out[cell.index].append(_to_cell(m, starts[k], edits=inside))
    for k, positions in crossing.items():
        cell = cells[k]
        n = len(split_lines(cell.masked or ""))
        alone = {(m.pattern, m.fixer, m.line, m.column): m for m in _alone(cell, path, selection, nonce) if _inside(m, 1, n)}
        for i in positions:
            m = out[cell.index][i]
            twin = alone.get((m.pattern, m.fixer, m.line, m.column))
            if twin is not None:
                out[cell.index][i] = m.model_copy(update={"edits": twin.edits, "fixable": twin.fixable})
    return out


# --------------------------------------------------------------------------------------------
# Fixes as rewrites of the JSON text
# --------------------------------------------------------------------------------------------


def _masked_lines(cell: notebooks.Cell) -> set[int]:
    names = set(cell.magics)
    return {k for k, line in enumerate(split_lines(cell.masked or ""), 1) if line.strip() in names}


@dataclass
class _Fix:
    finding: ReviewFinding
    cell: notebooks.Cell
    rw: Rewrite  # in the cell's masked lines
    json_rw: Rewrite  # in the JSON text's lines


def _json_lines(text: str) -> list[str]:
    """The lines of a JSON text as git counts them (``\\n`` only: JSON written with
    ``ensure_ascii=False`` holds U+2028 and form feeds raw, which ``str.splitlines`` would split)."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


class _Notebook:
    def __init__(self, fd: FileDiff, text: str, cells: list[notebooks.Cell], newlines: list[int]):
        self.fd = fd
        self.text = text
        self.cells = cells
        self.lines = _json_lines(text)
        self.newlines = newlines
        self.ascii_only = text.isascii() and "\\u" in text  # as notebooks.rewrite decides

    def new_text(self, texts: Mapping[int, str]) -> str | None:
        """The notebook with the sources of the cells in ``texts`` (index -> new text) replaced, in
        the layout the file uses, as ``zoomer-ar fix`` writes them (:func:`notebooks.rewrite`:
        unchanged lines keep their JSON text, new ones are escaped as the file escapes: ASCII
        escapes in an ASCII file that has some); every other byte as it was. None: an encoded
        source that does not read back as the new text."""
        out = self.text
        for cell in sorted((c for c in self.cells if c.index in texts), key=lambda c: c.source.start, reverse=True):
            src, new = cell.source, texts[cell.index]
            if src.items is None:
                encoded = json.dumps(new, ensure_ascii=self.ascii_only)
            else:
                raw = dict(src.items)
                parts = [raw.get(v) or json.dumps(v, ensure_ascii=self.ascii_only) for v in new.splitlines(True)]
                encoded = "[" + src.open_ws + src.sep.join(parts) + src.close_ws + "]" if parts else "[]"
            value = json.loads(encoded)
            if (value if isinstance(value, str) else "".join(value)) != new:  # pragma: no cover - never damage a notebook
                return None
            out = out[:src.start] + encoded + out[src.end:]
        return out

    def json_rewrite(self, new_json: str, cell: notebooks.Cell, first: int, last: int) -> Rewrite | None:
        """The JSON lines around first..last that differ in ``new_json``, whose only change is
        ``cell``'s source (so only the lines of that source are compared: a notebook's outputs
        can be hundreds of thousands of lines)."""
        from .engine import _region

        new = _json_lines(new_json)
        top = bisect_right(self.newlines, cell.source.start - 1)  # lines before the source's line
        bottom = bisect_right(self.newlines, cell.source.end - 1) + 1  # the line the source ends on
        delta = len(new) - len(self.lines)
        old_part, new_part = self.lines[top:bottom], new[top:bottom + delta]
        for a, b in ((first - top, last - top), (1, len(old_part))):
            rw = _region(old_part, new_part, max(1, a), min(len(old_part), b))
            if rw is None:
                continue
            rw = Rewrite(rw.first + top, rw.last + top, rw.old, rw.new)
            if self.applied([rw]) == new_json:
                return rw
        return None

    def applied(self, rws: Sequence[Rewrite]) -> str:
        return apply_rewrites(self.lines, rws)

    def cell_texts(self, fixes: Sequence[_Fix]) -> dict[int, str] | None:
        """Each fixed cell's new text with all of ``fixes`` applied (None: does not parse, or a
        masked line would not come back)."""
        out: dict[int, str] = {}
        for cell in {f.cell.index: f.cell for f in fixes}.values():
            masked = apply_rewrites(split_lines(cell.masked or ""), [f.rw for f in fixes if f.cell is cell])
            if not (prefilter.compiles(masked) or cst_parses(masked)):
                return None
            new = notebooks.unmask(cell, masked)
            if new is None:
                return None
            out[cell.index] = new
        return out

    def fix_of(self, f: ReviewFinding, cell: notebooks.Cell, pm: _Positions) -> _Fix | None:
        lines = split_lines(cell.masked or "")
        rw = rewrite(lines, [TextEdit(**e) for e in f.edits]) if f.edits else None
        if rw is None or any(rw.first <= k <= rw.last for k in _masked_lines(cell)):
            return None  # never a change touching an IPython line
        if rw.last == len(lines) and not rw.old.endswith(("\n", "\r")) and rw.new.endswith("\n"):
            rw = Rewrite(rw.first, rw.last, rw.old, rw.new[:-1])  # a cell's last line has no line break
        fix = _Fix(f, cell, rw, Rewrite(0, 0, "", ""))
        texts = self.cell_texts([fix])
        new_json = self.new_text(texts) if texts else None
        if new_json is None:
            return None
        json_rw = self.json_rewrite(new_json, cell, pm.json_line(rw.first), pm.json_line(rw.last))
        if json_rw is None:
            return None
        fix.json_rw = json_rw
        return fix

    def together(self, fixes: Sequence[_Fix]) -> bool:
        """Whether the fixes' JSON rewrites applied together give the notebook with every cell fixed."""
        ordered = sorted((x.json_rw for x in fixes), key=lambda r: r.first)
        if any(a.last >= b.first for a, b in zip(ordered, ordered[1:])):
            return False
        texts = self.cell_texts(fixes)
        return texts is not None and self.new_text(texts) == self.applied(ordered)

    def suggestable(self, fix: _Fix) -> bool:
        rw = fix.json_rw
        return (fix.finding.fixable and rw.last - rw.first < MAX_SUGGESTION_LINES
                and self.fd.in_one_hunk(rw.first, rw.last) and "\r" not in rw.old + rw.new)


def _whole_lines_edit(lines: Sequence[str], rw: Rewrite) -> dict[str, Any]:
    from .engine import _whole_lines_edit as whole

    return whole(lines, rw)


# --------------------------------------------------------------------------------------------
# The review of one notebook
# --------------------------------------------------------------------------------------------


def review_notebook(fd: FileDiff, text: str, old_text: str | None, selection: fix_engine.Selection,
                    overrides: Mapping[str, str]) -> tuple[list[ReviewFinding], list[FileNote]]:
    """The findings on the lines ``fd`` changes in the notebook ``text`` (its JSON), and notes on
    the changed cells that could not be analysed. Raises :class:`notebooks.NotebookError` when the
    file is not a notebook the fixers can read, FixerCrash when a fixer fails on it."""
    from .engine import to_findings

    cells = notebooks.read_cells(text)
    nonce = "review"
    while nonce in text:
        nonce += "_"
    newlines = [m.start() for m in re.finditer("\n", text)]
    by_id, by_index = _old_cells(old_text)
    doc_cells = json.loads(text)["cells"]
    notes: list[FileNote] = []
    good: list[notebooks.Cell] = []
    maps: dict[int, tuple[_Positions, FileDiff]] = {}
    for cell in cells:
        notebooks.mask(cell, nonce)
        pm = _Positions(text, newlines, cell)
        cid = doc_cells[cell.index].get("id")
        old = by_id.get(cid) if isinstance(cid, str) and by_id else by_index.get(cell.index)
        cfd = _cell_diff(fd, pm, cell, old)
        maps[cell.index] = (pm, cfd)
        if cell.error and cfd.changed:
            where, _, reason = cell.error.partition(": ")
            parts = where.split(":")  # "cell N:LINE:COL"
            line = int(parts[1]) if len(parts) > 2 else 1
            jline, jcol = pm.at(pm.offset(line, int(parts[2]) if len(parts) > 2 else 1))
            notes.append(FileNote(path=fd.path, line=jline, column=jcol,
                                  message=f"cell {cell.number}, line {line}: {reason}"))
        if cell.masked is not None:
            good.append(cell)
    changed = [c for c in good if maps[c.index][1].changed]
    if not changed:
        return [], notes
    matches = _detect(good, fd.path, selection, nonce)
    nb = _Notebook(fd, text, cells, newlines)
    findings: list[ReviewFinding] = []
    fixes: list[_Fix] = []
    for cell in changed:
        pm, cfd = maps[cell.index]
        cell_lines = split_lines(cell.text)
        for f in to_findings(cfd, cell.masked or "", matches[cell.index], overrides, selection=selection, suggestions=False):
            fix = nb.fix_of(f, cell, pm) if f.edits else None
            cl, cc = f.line, f.column
            f.cell, f.cell_line = cell.number, cl
            f.message = f"cell {cell.number}, line {cl}: {f.message}"
            f.snippet = (cell_lines[cl - 1].strip() if 0 < cl <= len(cell_lines) else "")[:200]
            f.line, f.column = pm.at(pm.offset(cl, cc))
            f.end_line, f.end_column = pm.at(pm.offset(f.end_line, f.end_column))
            f.statement_line = pm.json_line(f.statement_line)
            f.comment_line = pm.json_line(f.comment_line) if f.comment_line is not None else None
            f.comment_start_line = None
            f.fix_diff, f.edits = "", []
            if fix is not None:
                f.fix_diff = fix.json_rw.diff(fd.path)
                f.edits = [_whole_lines_edit(nb.lines, fix.json_rw)]
                fixes.append(fix)
            findings.append(f)
    accepted: list[_Fix] = []
    for fix in sorted((x for x in fixes if nb.suggestable(x)), key=lambda x: x.json_rw.first):
        if nb.together([*accepted, fix]):
            accepted.append(fix)
    for fix in accepted:
        f = fix.finding
        f.suggestion = fix.json_rw.suggestion
        f.comment_line = fix.json_rw.last
        f.comment_start_line = fix.json_rw.first if fix.json_rw.first < fix.json_rw.last else None
    seen: dict[str, int] = {}  # occurrence numbers across the notebook's cells, not per cell
    for f in sorted(findings, key=lambda f: (f.line, f.column)):
        digest = f.fingerprint.rsplit(":", 1)[0]
        seen[digest] = seen.get(digest, 0) + 1
        f.fingerprint = f"{digest}:{seen[digest]}"
    return findings, notes
