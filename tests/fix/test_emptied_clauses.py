"""A fixer that deletes the only statement of an `else:`/`elif`/`finally:` left `else: pass`.

loop-synchronize and loop-empty-cache delete a call; where it was all a clause held, the clause now
goes where that changes nothing: an `else:` always, a `finally:` of a `try` that keeps a handler,
a last `elif` whose test has no side effects. A middle `elif` (its cases would fall to the next
branch), an `elif` testing a call, and a clause holding a comment keep `pass`.
"""

from __future__ import annotations

import ast

import pytest

from fix_testutil import apply_text_edits

from zoomer_ar.fix import api

SELECT = ["loop-synchronize", "loop-empty-cache"]
HEAD = "import torch\nfor s in range(3):\n"


def _fix(body: str) -> str:
    src = HEAD + body
    out = api.fix_source(src, select=SELECT)
    ast.parse(out)
    assert api.fix_source(out, select=SELECT) == out  # idempotent
    return out[len(HEAD):]


@pytest.mark.parametrize(("body", "expected"), [
    ("    if s:\n        f(s)\n    else:\n        torch.cuda.synchronize()\n    g()\n",
     "    if s:\n        f(s)\n    g()\n"),
    ("    if s: f(s)\n    else: torch.cuda.empty_cache()\n    g()\n",
     "    if s: f(s)\n    g()\n"),
    ("    for b in loader:\n        f(b)\n    else:\n        torch.cuda.synchronize()\n",
     "    for b in loader:\n        f(b)\n"),
    ("    while s:\n        s = f(s)\n    else:\n        torch.cuda.empty_cache()\n",
     "    while s:\n        s = f(s)\n"),
    ("    try:\n        f(s)\n    except ValueError:\n        g()\n    else:\n        torch.cuda.synchronize()\n",
     "    try:\n        f(s)\n    except ValueError:\n        g()\n"),
    ("    try:\n        f(s)\n    except ValueError:\n        g()\n    finally:\n        torch.cuda.synchronize()\n",
     "    try:\n        f(s)\n    except ValueError:\n        g()\n"),
    # an else holding only an `if` that empties: both go
    ("    if s:\n        f(s)\n    else:\n        if verbose:\n            torch.cuda.synchronize()\n    g()\n",
     "    if s:\n        f(s)\n    g()\n"),
    # the last elif of a chain, its test free of side effects
    ("    if s == 1:\n        f(s)\n    elif s == 2:\n        g(s)\n    elif s == 3:\n        torch.cuda.synchronize()\n    h()\n",
     "    if s == 1:\n        f(s)\n    elif s == 2:\n        g(s)\n    h()\n"),
])
def test_an_emptied_clause_goes(body, expected):
    assert _fix(body) == expected


@pytest.mark.parametrize("body", [
    # a later branch: dropping the elif would send s == 5 to other()
    "    if s == 10:\n        f(s)\n    elif s == 5:\n        torch.cuda.synchronize()\n    else:\n        other()\n",
    # the test calls something: it must still run when s is falsy
    "    if s:\n        f(s)\n    elif should(s):\n        torch.cuda.synchronize()\n    g()\n",
    # try/finally without a handler needs its finally
    "    try:\n        f(s)\n    finally:\n        torch.cuda.synchronize()\n",
    # a comment in the clause is kept, with the clause
    "    if s:\n        f(s)\n    # otherwise: flush\n    else:\n        torch.cuda.synchronize()\n    g()\n",
])
def test_a_clause_that_must_stay_keeps_pass(body):
    out = _fix(body)
    assert "torch.cuda" not in out and "pass" in out
    assert out.count("\n") == body.count("\n")  # only the call became `pass`


def test_crlf_and_tabs_are_kept():
    src = "import torch\r\nfor s in range(3):\r\n\tif s:\r\n\t\tf(s)\r\n\telse:\r\n\t\ttorch.cuda.synchronize()\r\n\tg()\r\n"
    assert api.fix_source(src, select=SELECT) == "import torch\r\nfor s in range(3):\r\n\tif s:\r\n\t\tf(s)\r\n\tg()\r\n"


def test_the_text_edit_is_the_whole_statement():
    """The findings' text edits (review suggestions) rewrite the statement that owned the clause."""
    src = HEAD + "    if s:\n        f(s)\n    else:\n        torch.cuda.synchronize()\n    g()\n"
    (m,) = api.static_findings(src, "x.py", select=SELECT)
    assert [(e.line, e.end_line, e.text) for e in m.edits] == [(3, 7, "    if s:\n        f(s)\n")]


@pytest.mark.parametrize(("body", "gone"), [
    # a trailing comment stays where the deleted call was, on a line of its own
    ("    f(s)\n    torch.cuda.empty_cache()  # free memory\n    print(s)\n", [4]),
    # so do the comments above it, and the blank line before the next statement is not touched
    ("    f(s)\n    # free memory\n    torch.cuda.empty_cache()  # every step\n\n    print(s)\n", [4, 5]),
])
def test_a_deleted_lines_comments_do_not_rewrite_the_next_statement(body, gone):
    """The text edits (review suggestions) cover the deleted line and its own comments, never the
    next statement's line: it is left as it was, and the comments stay on lines of their own."""
    src = HEAD + body
    (m,) = api.static_findings(src, "x.py", select=SELECT)
    lines = src.splitlines(keepends=True)
    touched = {n for e in m.edits for n in range(e.line, e.end_line if e.end_column == 1 else e.end_line + 1)}
    assert touched == set(gone)
    assert all(ln.lstrip().startswith("#") for e in m.edits for ln in e.text.splitlines())
    fixed = api.fix_source(src, select=SELECT)
    assert apply_text_edits(src, m.edits) == fixed
    kept = [ln for i, ln in enumerate(lines, 1) if i not in gone]
    assert [ln for ln in fixed.splitlines(keepends=True) if not ln.lstrip().startswith("#")] == kept


@pytest.mark.parametrize("body", [
    "    f(s); torch.cuda.empty_cache(); g(s)\n",
    "    torch.cuda.empty_cache() ;  f(s)\n",
    "    f(s); torch.cuda.empty_cache()\n    g(s)\n",
    "    torch.cuda.empty_cache(); \\\n  f(s)\n",
])
def test_a_call_deleted_from_a_line_of_several_statements_takes_its_semicolon(body):
    """`a; b; c` less `b`: the text edits (review suggestions) deleted `b` but left its `;`, which
    gave `a; ; c` or a line starting with `;` (neither parses); they now give what the fixer writes."""
    src = HEAD + body
    (m,) = api.static_findings(src, "x.py", select=SELECT)
    fixed = api.fix_source(src, select=SELECT)
    assert apply_text_edits(src, m.edits) == fixed
    ast.parse(fixed)
