"""Jupyter notebooks (``*.ipynb``) for the fix stage: the fixers run over the code cells.

A notebook is never parsed as Python. Its JSON is read, and the code cells of a Python notebook
(nbformat 4; a notebook whose kernel language is not Python is skipped with a one-line reason)
are analysed together, as one module in cell order, since they share one namespace (the
``import torch`` of the first cell names the ``torch.optim.SGD`` of the fifth):

* IPython syntax is masked, never rewritten: a line magic (``%time ...``, ``!pip ...``,
  ``x = !ls``, ``obj?``) becomes a placeholder line for the parse and is restored afterwards,
  byte for byte; a cell whose magic makes the whole cell something other than Python
  (``%%bash``, ``%%html``, ``%%writefile``...) is left out; ``%%time``/``%%timeit``/``%%capture``
  /``%%prun`` cells are analysed below their first line.
* A cell that still does not parse is named (``cell 4:2:5: cannot parse: ...``) and left out; the
  other cells are analysed and fixed.
* Findings name the cell (its 1-based position among all the notebook's cells, markdown cells
  included, as Jupyter's ``[n]`` position in the file) and the line inside it:
  ``nb.ipynb:cell 3:2:5: pattern message`` (``path`` ``nb.ipynb:cell 3``, ``line`` 2).
* Fixes rewrite only the ``source`` of the code cells they change, in the layout the file uses
  (a list of lines or one string, same indentation, same escaping); every other byte of the
  JSON (outputs, metadata, key order, indentation, trailing newline) stays as it is, so
  ``--diff`` is a diff of the JSON text that ``git apply`` applies to the ``.ipynb``.

Fixes that would move code from one cell to another (or a placeholder out of its cell) are not
made across cells: the cells are then fixed one by one instead.
"""

from __future__ import annotations

import json
import re
import secrets
from bisect import bisect_right
from dataclasses import dataclass, field
from json.decoder import scanstring
from typing import Any, Callable, Sequence

from .base import CELL_MARKER, TIMED_MARK, SourceParseError, StaticMatch, parse_source
from .lines import split_lines

SUFFIX = ".ipynb"
#: outputs (images, tables) make notebooks large; the code inside is what is parsed
MAX_NOTEBOOK_BYTES = 64 * 1024 * 1024

#: cell magics whose body is Python run as usual (the first line is masked)
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})

Detect = Callable[[str, str], list[StaticMatch]]
Fix = Callable[[str, str, Sequence[StaticMatch]], str]


class NotebookError(ValueError):
    """The notebook cannot be analysed at all (one-line reason); the file is skipped."""


def is_notebook(name: str) -> bool:
    return name.lower().endswith(SUFFIX)


# --------------------------------------------------------------------------------------------
# Reading the JSON with the positions of each code cell's source
# --------------------------------------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


@dataclass
class _Source:
    """A code cell's ``source`` value: where it lies in the JSON text and how it is laid out."""

    start: int
    end: int
    items: list[tuple[str, str]] | None  # (value, raw JSON text) per line; None: one string
    open_ws: str = ""
    sep: str = ","
    close_ws: str = ""


@dataclass
class Cell:
    index: int  # 0-based position in "cells"
    text: str
    source: _Source
    masked: str | None = None  # the Python text analysed (magics masked); None: left out
    magics: dict[str, str] = field(default_factory=dict)  # placeholder -> original line
    error: str | None = None

    @property
    def number(self) -> int:
        return self.index + 1


def _skip(text: str, i: int) -> int:
    return _WS.match(text, i).end()  # type: ignore[union-attr]


def _expect(text: str, i: int, ch: str) -> int:
    if i >= len(text) or text[i] != ch:
        raise NotebookError(f"not a notebook: expected {ch!r} at offset {i}")
    return i + 1


def _members(text: str, i: int):
    """(key, value start, index after the value) of the object at ``i``; values skipped."""
    i = _skip(text, _expect(text, i, "{"))
    if text.startswith("}", i):
        return
    while True:
        _expect(text, i, '"')
        key, i = scanstring(text, i + 1)
        i = _skip(text, i)
        i = _skip(text, _expect(text, i, ":"))
        start = i
        yield key, start
        _, i = _DECODER.raw_decode(text, start)
        i = _skip(text, i)
        if text.startswith("}", i):
            return
        i = _skip(text, _expect(text, i, ","))


def array_elements(text: str, i: int) -> list[tuple[int, int]]:
    """(start, end) of each element of the array at ``i``."""
    out: list[tuple[int, int]] = []
    i = _skip(text, _expect(text, i, "["))
    if text.startswith("]", i):
        return out
    while True:
        _, end = _DECODER.raw_decode(text, i)
        out.append((i, end))
        i = _skip(text, end)
        if text.startswith("]", i):
            return out
        i = _skip(text, _expect(text, i, ","))


def _source_layout(text: str, start: int) -> _Source:
    value, end = _DECODER.raw_decode(text, start)
    if isinstance(value, str):
        return _Source(start, end, None)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NotebookError("not a notebook: a cell's source is neither a string nor a list of strings")
    spans = array_elements(text, start)
    items = [(json.loads(text[a:b]), text[a:b]) for a, b in spans]
    src = _Source(start, end, items)
    if spans:
        src.open_ws = text[start + 1:spans[0][0]]
        src.close_ws = text[spans[-1][1]:end - 1]
        src.sep = text[spans[0][1]:spans[1][0]] if len(spans) > 1 else "," + src.open_ws
    return src


def read_cells(text: str) -> list[Cell]:
    """The code cells of a Python notebook (nbformat 4) with their sources' positions."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise NotebookError(f"not a notebook: invalid JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        if isinstance(doc, dict) and "worksheets" in doc:
            raise NotebookError("nbformat 3 notebook (no top-level cells): not analysed")
        raise NotebookError("not a notebook: no list of cells")
    language = _language(doc.get("metadata"))
    if language and language != "python":
        raise NotebookError(f"not a Python notebook (kernel language {language}): not analysed")
    cells: list[Cell] = []
    try:
        for key, start in _members(text, 0):
            if key != "cells":
                continue
            cells = []  # a repeated key: the last one counts, as for json.loads
            for index, (a, _b) in enumerate(array_elements(text, start)):
                cell = doc["cells"][index] if index < len(doc["cells"]) else None
                if not isinstance(cell, dict) or cell.get("cell_type") != "code":
                    continue
                for ckey, cstart in _members(text, a):
                    if ckey == "source":
                        src = _source_layout(text, cstart)
                        value = "".join(v for v, _ in src.items) if src.items is not None else json.loads(text[src.start:src.end])
                        cells = [c for c in cells if c.index != index] + [Cell(index, value, src)]
    except NotebookError:
        raise
    except (ValueError, IndexError) as exc:
        raise NotebookError(f"not a notebook: {str(exc).splitlines()[0]}") from None
    return cells


def _language(meta: Any) -> str | None:
    if not isinstance(meta, dict):
        return None
    for key, sub in (("kernelspec", "language"), ("language_info", "name")):
        value = meta.get(key)
        if isinstance(value, dict) and isinstance(value.get(sub), str) and value[sub].strip():
            return value[sub].strip().lower()
    return None


# --------------------------------------------------------------------------------------------
# IPython syntax
# --------------------------------------------------------------------------------------------

_CELL_MAGIC = re.compile(r"\s*%%(\w+)")
_ASSIGN_MAGIC = re.compile(r"\s*[\w.\[\]'\", ]+?\s*=\s*[%!]")
_HELP = re.compile(r"\s*(\?{1,2}[\w.]+|[\w.]+\?{1,2})\s*$")


def _is_magic(line: str) -> bool:
    body = line.rstrip("\r\n")
    stripped = body.lstrip()
    return (stripped.startswith(("%", "!"))
            or _ASSIGN_MAGIC.match(body) is not None
            or _HELP.match(body) is not None)


def mask(cell: Cell, nonce: str) -> None:
    """Set ``cell.masked`` (Python text, one line per original line) or ``cell.error`` /
    leave it out (a cell magic whose body is not Python)."""
    text = cell.text
    if not text.strip():
        return
    lines = split_lines(text)
    first = _CELL_MAGIC.match(lines[0]) if lines else None
    if first is not None and first.group(1) not in PYTHON_CELL_MAGICS:
        return  # %%bash, %%html, %%writefile...: not Python
    candidates = [i for i, line in enumerate(lines) if (i == 0 and first is not None) or _is_magic(line)]
    if first is None:
        try:  # plain Python: never masked (a line of a string or an expression may start with %)
            parse_source(text, None)
            cell.masked = text
            return
        except SourceParseError as exc:
            if not candidates:
                cell.error = f"cell {cell.number}:{exc.line}:{exc.column}: {exc.reason}"
                return
    masked = list(lines)
    for k, i in enumerate(candidates):
        line = lines[i]
        body = line.rstrip("\r\n")
        indent = body[: len(body) - len(body.lstrip())]
        placeholder = f"__zoomer_magic_{nonce}_{cell.number}_{k}__"
        cell.magics[placeholder] = body.lstrip()
        masked[i] = indent + placeholder + line[len(body):]
    masked_text = "".join(masked)
    try:
        parse_source(masked_text, None)
    except SourceParseError as exc:
        cell.magics.clear()
        cell.error = f"cell {cell.number}:{exc.line}:{exc.column}: {exc.reason}"
        return
    cell.masked = masked_text


def unmask(cell: Cell, text: str) -> str | None:
    """``text`` (a fixed version of ``cell.masked``) with its placeholders back as the magic
    lines they stand for; None when a placeholder is missing or repeated."""
    if not cell.magics:
        return text
    lines = split_lines(text)
    seen: set[str] = set()
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        name = body.strip()
        if name in cell.magics:
            if name in seen or body.rstrip() != body:
                return None
            seen.add(name)
            indent = body[: len(body) - len(body.lstrip())]
            lines[i] = indent + cell.magics[name] + line[len(body):]
    return "".join(lines) if seen == set(cell.magics) else None


# --------------------------------------------------------------------------------------------
# Findings, fixes, the new JSON text
# --------------------------------------------------------------------------------------------


@dataclass
class Result:
    findings: list[StaticMatch]
    after: str
    errors: list[str]


def _move(m: StaticMatch, path: str, cell: Cell, first_line: int) -> StaticMatch:
    """A match of the analysed module as a match in ``cell`` (whose line 1 is ``first_line``)."""
    last = first_line + len(split_lines(cell.masked or "")) - 1
    shift = first_line - 1
    edits = [e.model_copy(update={"line": e.line - shift, "end_line": e.end_line - shift})
             for e in m.edits if first_line <= e.line and e.end_line <= last + 1]
    return m.model_copy(update={
        "path": f"{path}:cell {cell.number}",
        "line": m.line - shift,
        "end_line": m.end_line - shift,
        "statement_line": max(1, m.statement_line - shift),
        "edits": edits,
    })


#: cell magics that time or profile the whole cell: code there is measured (base.Context.timed)
TIMING_CELL_MAGICS = frozenset({"time", "timeit", "prun"})


def cell_marker(nonce: str, cell: Cell) -> str:
    first = _CELL_MAGIC.match(split_lines(cell.text)[0]) if cell.text.strip() else None
    timed = f" {TIMED_MARK}" if first is not None and first.group(1) in TIMING_CELL_MAGICS else ""
    return f"{CELL_MARKER}{nonce} {cell.number}{timed}"


def joined_cells(cells: list[Cell], nonce: str) -> tuple[str, list[int]]:
    """The cells as one module, each after a marker comment; the first line of each cell."""
    parts: list[str] = []
    starts: list[int] = []
    line = 1
    for cell in cells:
        text = cell.masked or ""
        if not text.endswith(("\n", "\r")):
            text += "\n"
        parts.append(cell_marker(nonce, cell) + "\n")
        starts.append(line + 1)
        parts.append(text)
        line += 1 + len(split_lines(text))
    return "".join(parts), starts


def _split(fixed: str, cells: list[Cell], nonce: str) -> list[str] | None:
    """The fixed module cut back into the cells' texts; None when the markers moved."""
    pieces: list[list[str]] = [[]]
    expected = [cell_marker(nonce, c) for c in cells]
    found = 0
    for line in split_lines(fixed):
        if line.rstrip("\r\n") == (expected[found] if found < len(expected) else None):
            found += 1
            pieces.append([])
        elif nonce in line and line.lstrip().startswith(CELL_MARKER):
            return None
        else:
            pieces[-1].append(line)
    if found != len(cells):
        return None
    prefix = "".join(pieces[0])  # code a fixer put above the first cell belongs to that cell
    out = []
    for k, cell in enumerate(cells):
        text = ("".join(pieces[k + 1]) if k else prefix + "".join(pieces[1]))
        if not (cell.masked or "").endswith(("\n", "\r")) and text.endswith("\n"):
            text = text[:-1]  # the newline joined_cells added
        out.append(text)
    return out


def _new_cell_text(cell: Cell, fixed_masked: str) -> str | None:
    """The cell's new text, or None when the fix cannot be kept (does not parse alone, lost a
    magic line)."""
    if fixed_masked == cell.masked:
        return cell.text
    try:
        parse_source(fixed_masked, None)
    except SourceParseError:
        return None
    return unmask(cell, fixed_masked)


def _fix_each(cells: list[Cell], path: str, detect: Detect, fix: Fix | None, errors: list[str],
              nonce: str) -> tuple[list[StaticMatch], dict[int, str]]:
    """Cell by cell (each after its marker, as in the joined module): the findings and the new texts."""
    findings: list[StaticMatch] = []
    texts: dict[int, str] = {}
    for cell in cells:
        try:
            head = cell_marker(nonce, cell) + "\n"
            source = head + (cell.masked or "")
            found = detect(source, path)
            findings.extend(_move(m, path, cell, 2) for m in found)
            if fix is not None and any(m.fixable for m in found):
                fixed = fix(source, path, found)
                new = _new_cell_text(cell, fixed[len(head):]) if fixed.startswith(head) else None
                if new is None:
                    errors.append(f"cell {cell.number}: its fix does not fit in the cell; left unchanged")
                elif new != cell.text:
                    texts[cell.index] = new
        except SourceParseError as exc:
            errors.append(f"cell {cell.number}:{exc.line}:{exc.column}: {exc.reason}")
        except Exception as exc:  # FixerCrash: one cell, not the notebook
            errors.append(f"cell {cell.number}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    return findings, texts


def process(text: str, path: str, detect: Detect, fix: Fix | None) -> Result:
    """Findings (``path:cell N``, cell lines) and, with ``fix``, the notebook's new JSON text.

    Raises NotebookError when the file is not a notebook the fixers can read."""
    cells = read_cells(text)
    nonce = secrets.token_hex(4)
    while nonce in text:
        nonce = secrets.token_hex(4)
    errors: list[str] = []
    for cell in cells:
        mask(cell, nonce)
        if cell.error:
            errors.append(cell.error)
    good = [c for c in cells if c.masked is not None]
    findings: list[StaticMatch] = []
    texts: dict[int, str] = {}
    if good:
        joined, starts = joined_cells(good, nonce)
        try:
            found = detect(joined, path)
        except SourceParseError:  # cells valid alone but not together (a late __future__ import)
            found = None
        if found is None:
            findings, texts = _fix_each(good, path, detect, fix, errors, nonce)
        else:
            for m in found:
                k = _cell_at(starts, m.line)
                findings.append(_move(m, path, good[k], starts[k]))
            if fix is not None and any(m.fixable for m in found):
                pieces = _split(fix(joined, path, found), good, nonce)
                new = [None if pieces is None else _new_cell_text(c, p) for c, p in zip(good, pieces or [None] * len(good))]
                if pieces is None or any(n is None for n in new):  # a fix crossing cells: fix them one by one
                    findings, texts = _fix_each(good, path, detect, fix, errors, nonce)
                else:
                    texts = {c.index: n for c, n in zip(good, new) if n is not None and n != c.text}
    after = rewrite(text, cells, texts) if texts else text
    findings.sort(key=lambda m: (int(m.path.rsplit(" ", 1)[1]), m.line, m.column, m.pattern, m.fixer))
    return Result(findings, after, errors)


def _cell_at(starts: list[int], line: int) -> int:
    """The position (in ``starts``) of the cell holding line ``line`` of the joined module."""
    return max(0, bisect_right(starts, line) - 1)


def rewrite(text: str, cells: list[Cell], texts: dict[int, str]) -> str:
    """``text`` with the sources of the cells in ``texts`` (index -> new source) replaced in
    the layout the file uses; checked to differ from the original only there."""
    ascii_only = all(ord(ch) < 128 for ch in text) and "\\u" in text
    out = text
    for cell in sorted((c for c in cells if c.index in texts), key=lambda c: c.source.start, reverse=True):
        src = cell.source
        new = texts[cell.index]
        if src.items is None:
            encoded = json.dumps(new, ensure_ascii=ascii_only)
        else:
            raw = {v: r for v, r in src.items}
            parts = [raw.get(v) or json.dumps(v, ensure_ascii=ascii_only) for v in new.splitlines(True)]
            encoded = "[" + src.open_ws + src.sep.join(parts) + src.close_ws + "]" if parts else "[]"
        out = out[:src.start] + encoded + out[src.end:]
    expected = json.loads(text)
    for index, new in texts.items():
        layout = next(c.source for c in cells if c.index == index)
        expected["cells"][index]["source"] = new if layout.items is None else new.splitlines(True)
    if json.loads(out) != expected:  # pragma: no cover - a bug here must not damage a notebook
        raise NotebookError("internal error rewriting the notebook; left unchanged")
    return out
