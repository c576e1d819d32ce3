"""Notebooks (.ipynb) in a pull request: the changed code cells are reviewed as Python, findings point
at the notebook's JSON line and name the cell, and the suggested fixes are valid for the .ipynb file
(GitHub suggestions, `git apply`, SARIF replacements), leaving every other byte as it was."""

from __future__ import annotations

import json
import re
import subprocess

from review_testutil import GitRepo, sarif_errors

from zoomer_ar.cli import main
from zoomer_ar.review import review
from zoomer_ar.review.render import github_payload, render_markdown, render_text
from zoomer_ar.review.sarif import to_sarif

NB = "analysis.ipynb"


def code(source: str | list[str], **extra) -> dict:
    src = source if isinstance(source, str) and extra.pop("one_string", False) else (
        source.splitlines(True) if isinstance(source, str) else source)
    return {"cell_type": "code", "execution_count": extra.pop("n", None), "metadata": {}, "outputs": extra.pop("outputs", []),
            "source": src, **extra}


def markdown(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text.splitlines(True)}


def dumps(cells: list[dict]) -> str:
    """As nbformat writes a notebook: indent 1, sorted keys, non-ASCII kept, a final newline."""
    nb = {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
          "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


IMPORTS = "import torch\nfrom torch.utils.data import DataLoader\n"
OLD_LOADER = "loader0 = DataLoader(ds0, batch_size=8)\nx = 1\n"  # the PR changes x only
OLD_LOOP = "for step, b in enumerate(loader0):\n    loss = model(b).sum()\n    print(step, loss.item())\n"  # untouched
SETUP = ("%matplotlib inline\n"
         "opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)\n"
         "!nvidia-smi\n"
         "model?\n")
TRAIN = ("for step, (x, y) in enumerate(loader):\n"
         "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
         "    loss.backward()\n"
         "    opt.step()\n"
         "    print(step, loss.item())")  # a cell's last line has no line break
BROKEN = "def broken(:\n    pass\n"
TIMED = "for i in range(10):\n    %time y = model(x)\n    torch.cuda.synchronize()\n"
ONE_STRING = "for i in range(3):\n    y = model(x)\n    torch.cuda.empty_cache()\n"

BASE_CELLS = [code(IMPORTS), markdown("# Training\n"), code(OLD_LOADER, id="c-loader"), code(OLD_LOOP, id="c-loop")]
FEATURE_CELLS = [
    code(IMPORTS), markdown("# Training\n"), code(OLD_LOADER.replace("x = 1", "x = 2"), id="c-loader"),
    code(OLD_LOOP, id="c-loop"), code(SETUP), code(TRAIN), code(BROKEN), code(TIMED), code(ONE_STRING, one_string=True),
]

#: (rule, cell, line in the cell) of the findings on the lines the PR changes
EXPECTED = [
    ("single-tensor-optimizer", 5, 2),
    ("sync-point", 6, 5),
    ("sync-point", 8, 3),
    ("allocator-churn", 9, 3),
]

FIXED = {
    5: SETUP.replace("foreach=False", "foreach=True"),
    6: TRAIN.replace("    print(step, loss.item())", "    if step % 100 == 0:\n        print(step, loss.item())"),
    8: "for i in range(10):\n    %time y = model(x)\n",
    9: "for i in range(3):\n    y = model(x)\n",
}


def notebook_repo(path) -> GitRepo:
    repo = GitRepo(path)
    repo.write(NB, dumps(BASE_CELLS))
    repo.commit("base")
    repo.branch("feature")
    repo.write(NB, dumps(FEATURE_CELLS))
    repo.commit("notebook: training")
    return repo


def json_line(text: str, needle: str) -> int:
    """The line of the notebook's JSON text holding ``needle`` (as JSON-escaped text)."""
    esc = json.dumps(needle, ensure_ascii=False)[1:-1]
    hits = [i for i, line in enumerate(text.splitlines(), 1) if esc in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def cell_json_line(text: str, cell: int, line: int) -> int:
    """Where nbformat's layout puts line ``line`` of cell ``cell``: the cell's ``"source"`` key line
    (one a cell, markdown cells included), then one JSON line a source line (one string: that line)."""
    keys = [i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith('   "source": ')]
    at = keys[cell - 1]
    return at if text.splitlines()[at - 1].startswith('   "source": "') else at + line


def sources(text: str) -> dict[int, str]:
    """Cell number -> its source text."""
    cells = json.loads(text)["cells"]
    return {i: "".join(c["source"]) if isinstance(c["source"], list) else c["source"] for i, c in enumerate(cells, 1)}


def apply_suggestions(text: str, findings) -> str:
    """Each suggestion as GitHub commits it: lines start_line..line replaced by the block."""
    lines = text.splitlines(True)
    for f in sorted((f for f in findings if f.suggestion is not None), key=lambda f: -f.comment_line):
        first = f.comment_start_line or f.comment_line
        lines[first - 1:f.comment_line] = [f.suggestion + "\n"]
    return "".join(lines)


def test_changed_cells_reviewed_with_json_locations_and_cell_names(tmp_path):
    repo = notebook_repo(tmp_path / "r")
    text = dumps(FEATURE_CELLS)
    result = review(repo.path, "main", "feature")
    assert [(f.rule_id, f.cell, f.cell_line) for f in result.findings] == EXPECTED
    # the DataLoader of cell 3 (same cell as a changed line) and the .item() loop of the untouched cell 4: not reported
    assert result.files_changed == 1 and result.notebooks_changed == 1 and result.files_reviewed == 1
    lines = text.splitlines()
    for f in result.findings:
        assert f.path == NB and f.message.startswith(f"cell {f.cell}, line {f.cell_line}: ")
        cell_line = sources(text)[f.cell].splitlines()[f.cell_line - 1]
        assert f.line == cell_json_line(text, f.cell, f.cell_line) and f.snippet == cell_line.strip()
        assert json.dumps(cell_line)[1:-1] in lines[f.line - 1]
        assert f.comment_line is not None and f.comment_line >= f.line - 1
    by = {(f.cell, f.cell_line): f for f in result.findings}
    assert lines[by[5, 2].line - 1][by[5, 2].column - 1:].startswith("torch.optim.Adam(")
    assert lines[by[5, 2].end_line - 1][:by[5, 2].end_column - 1].endswith("foreach=False)")
    assert lines[by[6, 5].line - 1][by[6, 5].column - 1:].startswith("loss.item()")
    # the cell that does not parse: named, with its JSON line; the others are reviewed
    assert [(e.path, e.line, e.message) for e in result.errors] == [
        (NB, json_line(text, "def broken(:\n"), "cell 7, line 1: cannot parse: invalid syntax")]
    assert lines[result.errors[0].line - 1][result.errors[0].column - 1:].startswith(":\\n")


def test_a_new_notebook_reviews_every_cell(tmp_path):
    """The same notebook added whole: the anti-patterns of cells 3 and 4 (left out above because
    the change did not touch them) are found, so their absence above is the changed-lines rule."""
    repo = GitRepo(tmp_path / "r")
    repo.write("README.md", "x\n")
    repo.commit("base")
    repo.branch("feature")
    repo.write(NB, dumps(FEATURE_CELLS))
    repo.commit("add")
    found = [(f.rule_id, f.cell, f.cell_line) for f in review(repo.path, "main", "feature").findings]
    assert found == [("dataloader-bound", 3, 1), ("sync-point", 4, 3), *EXPECTED]


def test_a_rewrite_over_a_magic_line_is_never_offered():
    """A fix whose lines include a masked IPython line (here an edit inserting an import above a
    cell's `%matplotlib inline`, as a fixer adding a module-level name does) gets no suggestion and
    no diff, even though the magic would come back unchanged."""
    from zoomer_ar.fix import notebooks
    from zoomer_ar.review.diff import FileDiff
    from zoomer_ar.review.models import ReviewFinding
    from zoomer_ar.review.notebook import _Notebook, _Positions

    text = dumps([code("%matplotlib inline\nopt = torch.optim.SGD(p, foreach=False)\n")])
    (cell,) = notebooks.read_cells(text)
    notebooks.mask(cell, "t")
    newlines = [i for i, ch in enumerate(text) if ch == "\n"]
    pm = _Positions(text, newlines, cell)
    nb = _Notebook(FileDiff(path=NB, added={9, 10}, hunks=[(1, 30)]), text, [cell], newlines)

    def finding(edit: dict) -> ReviewFinding:
        return ReviewFinding(rule_id="r", fixer="f", title="t", severity="low", message="m", path=NB, line=2, column=1,
                             end_line=2, end_column=5, statement_line=2, fixable=True, edits=[edit])

    (placeholder,) = cell.magics  # an import inserted above the magic, which it writes back unchanged
    over = {"line": 1, "column": 1, "end_line": 3, "end_column": 1, "text": f"import os\n{placeholder}\nopt = 1\n"}
    assert nb.fix_of(finding(over), cell, pm) is None
    below = {"line": 2, "column": 1, "end_line": 3, "end_column": 1, "text": "opt = 1\n"}
    fix = nb.fix_of(finding(below), cell, pm)
    assert fix is not None and fix.json_rw.new == '    "opt = 1\\n"\n'


def test_suggestions_applied_as_github_does_leave_a_valid_fixed_notebook(tmp_path):
    repo = notebook_repo(tmp_path / "r")
    text = dumps(FEATURE_CELLS)
    result = review(repo.path, "main", "feature")
    assert all(f.suggestion is not None for f in result.findings)
    # the magic lines are never part of a change's cell lines; the %time line keeps its text
    for f in result.findings:
        assert "%matplotlib" not in f.suggestion and "!nvidia-smi" not in f.suggestion and "model?" not in f.suggestion
    fixed = apply_suggestions(text, result.findings)
    after = sources(fixed)
    before = sources(text)
    assert {n: after[n] for n in FIXED} == FIXED
    assert {n: s for n, s in after.items() if n not in FIXED} == {n: s for n, s in before.items() if n not in FIXED}
    assert json.loads(fixed)["metadata"] == json.loads(text)["metadata"]
    # every line outside the cells' sources is the same bytes (a source line: an item, or one string)
    def rest(t: str) -> list[str]:
        return [ln for ln in t.splitlines() if not ln.startswith(("    ", '   "source": "'))]

    assert rest(fixed) == rest(text)


def test_fix_diffs_apply_with_git_apply_and_the_fixed_notebook_reviews_clean(tmp_path):
    repo = notebook_repo(tmp_path / "r")
    result = review(repo.path, "main", "feature")
    patch = f"--- a/{NB}\n+++ b/{NB}\n" + "".join(f.fix_diff for f in result.findings)
    for f in result.findings:
        assert f.fix_diff.startswith("@@ -")
    (tmp_path / "fix.diff").write_text(patch)
    repo.git("apply", "--unidiff-zero", str(tmp_path / "fix.diff"))
    fixed = (repo.path / NB).read_text(encoding="utf-8")
    assert {n: sources(fixed)[n] for n in FIXED} == FIXED
    assert fixed == apply_suggestions(dumps(FEATURE_CELLS), result.findings)
    # what changed is only cell sources' lines (git's own diff of the file)
    diff = repo.git("diff", "-U0", NB)
    changed = [ln for ln in diff.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    assert changed and all(re.match(r'^[+-](    "|   "source": ")', ln) for ln in changed)
    repo.commit("apply the review's fixes")
    again = review(repo.path, "main", "feature")
    assert again.findings == []  # idempotent: nothing more to suggest
    assert [e.message for e in again.errors] == ["cell 7, line 1: cannot parse: invalid syntax"]


def test_outputs_text_markdown_github_and_sarif(tmp_path):
    repo = notebook_repo(tmp_path / "r")
    text = dumps(FEATURE_CELLS)
    result = review(repo.path, "main", "feature")
    opt = json_line(text, "opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)\n")
    out = render_text(result)
    assert re.search(rf"^{NB}:{opt}:\d+: medium single-tensor-optimizer cell 5, line 2: torch.optim.Adam .*\[suggestion\]$", out, re.M)
    assert f"{NB}:{json_line(text, 'def broken(:' + chr(10))}:" in out and "cell 7, line 1: cannot parse" in out
    md = render_markdown(result)
    assert f"`{NB}:{opt}`" in md and "cell 5, line 2: torch.optim.Adam" in md and "**Could not analyse**" in md
    payload = github_payload(result)
    assert {(c["path"], c["line"]) for c in payload["comments"]} == {(NB, f.comment_line) for f in result.findings}
    assert all("```suggestion" in c["body"] for c in payload["comments"])
    doc = to_sarif(result)
    assert sarif_errors(doc) == []
    results = doc["runs"][0]["results"]
    assert [(r["ruleId"], r["properties"]["cell"], r["properties"]["cellLine"]) for r in results] == EXPECTED
    assert results[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == opt
    assert results[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == NB
    # the SARIF fixes, applied to the .ipynb's text, give the fixed notebook
    lines = text.splitlines(True)
    for r in sorted(results, key=lambda r: -r["fixes"][0]["artifactChanges"][0]["replacements"][0]["deletedRegion"]["startLine"]):
        (rep,) = r["fixes"][0]["artifactChanges"][0]["replacements"]
        reg = rep["deletedRegion"]
        assert reg["startColumn"] == 1 and reg["endColumn"] == 1
        lines[reg["startLine"] - 1:reg["endLine"] - 1] = [rep["insertedContent"]["text"]]
    assert {n: sources("".join(lines))[n] for n in FIXED} == FIXED
    notes = doc["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert [n["locations"][0]["physicalLocation"]["region"]["startLine"] for n in notes] == [json_line(text, "def broken(:\n")]


def test_cli_text_format(tmp_path, capsys):
    repo = notebook_repo(tmp_path / "r")
    rc = main(["review", "--repo", str(repo.path), "--base", "main", "--head", "feature", "--format", "text"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in out + err
    assert out.count(f"{NB}:") == len(EXPECTED) + 1
    assert out.splitlines()[-1].startswith("4 findings on changed lines in 1 changed notebook;")


def test_summary_counts_python_files_and_notebooks_apart():
    from zoomer_ar.review.models import ReviewResult
    from zoomer_ar.review.render import _changed_files

    def said(py: int, books: int) -> str:
        return _changed_files(ReviewResult(repo="r", base="b", base_sha="x", head=None, head_sha=None,
                                           merge_base_sha="x", files_changed=py + books, notebooks_changed=books))

    assert said(1, 0) == "1 changed Python file" and said(0, 0) == "0 changed Python files"
    assert said(0, 1) == "1 changed notebook" and said(2, 3) == "2 changed Python files and 3 notebooks"


def test_unchanged_code_in_a_changed_notebook_is_not_reviewed(tmp_path):
    """Outputs and execution counts change on every run of a notebook: no cell source changed, no finding."""
    repo = GitRepo(tmp_path / "r")
    repo.write(NB, dumps(FEATURE_CELLS[:6]))
    repo.commit("base")
    repo.branch("feature")
    ran = [dict(c, execution_count=7, outputs=[{"name": "stdout", "output_type": "stream", "text": ["ok\n"]}])
           if c["cell_type"] == "code" else c for c in FEATURE_CELLS[:6]]
    repo.write(NB, dumps(ran))
    repo.commit("ran it")
    result = review(repo.path, "main", "feature")
    assert result.findings == [] and result.errors == [] and result.files_changed == 1


def test_one_string_source_only_the_changed_line_counts(tmp_path):
    """A source written as one string is one JSON line: the cell's old text says which line changed."""
    old = "for i in range(3):\n    torch.cuda.empty_cache()\n    y = model(x)\n"
    new = old + "    torch.cuda.synchronize()\n"
    repo = GitRepo(tmp_path / "r")
    repo.write(NB, dumps([code(IMPORTS), code(old, one_string=True, id="a1")]))
    repo.commit("base")
    repo.branch("feature")
    repo.write(NB, dumps([code(IMPORTS), code(new, one_string=True, id="a1")]))
    repo.commit("sync")
    result = review(repo.path, "main", "feature")
    assert [(f.rule_id, f.cell, f.cell_line) for f in result.findings] == [("sync-point", 2, 4)]
    f = result.findings[0]
    text = (repo.path / NB).read_text(encoding="utf-8")
    assert f.line == json_line(text, new)
    fixed = apply_suggestions(text, result.findings)
    assert sources(fixed)[2] == old


def test_a_moved_comma_is_not_a_changed_line(tmp_path):
    """Deleting a source's last line takes the comma off the JSON line before it: that line's code
    did not change, so its anti-pattern is not the change's; a loop whose body lost its last line is."""
    opt = "opt = torch.optim.SGD(p, foreach=False)\nprint(1)\n"
    loop = "for p in model.parameters():\n    p.grad.zero_()\n    print(p)\n"
    repo = GitRepo(tmp_path / "r")
    repo.write(NB, dumps([code(IMPORTS), code(opt, id="o"), code(loop, id="l")]))
    repo.commit("base")
    repo.branch("feature")
    repo.write(NB, dumps([code(IMPORTS), code(opt.replace("print(1)\n", ""), id="o"), code(loop.replace("    print(p)\n", ""), id="l")]))
    repo.commit("drop the prints")
    diff = repo.git("diff", "main", "feature")
    assert '+    "opt = torch.optim.SGD(p, foreach=False)\\n"' in diff  # git sees the line changed
    assert [(f.rule_id, f.cell, f.cell_line) for f in review(repo.path, "main", "feature").findings] == [
        ("zero-grad-not-none", 3, 1)]


def test_escaped_characters_keep_their_escaping_and_columns(tmp_path):
    """Quotes, backslashes, a tab and non-ASCII text before the flagged code on its line, in a file
    written with ASCII escapes (\\u00e9): columns count the JSON text's characters, and the fixed
    line keeps the file's escaping."""
    cell = 'import torch\nx = "d\\"éjà\tvu"; opt = torch.optim.SGD(params, lr=0.1, foreach=False)  # é\ny = 1\n'
    repo = GitRepo(tmp_path / "r")
    repo.write(NB, dumps([code("import torch\n")]))
    repo.commit("base")
    repo.branch("feature")
    text = dumps([code("import torch\n"), code(cell)]).encode("ascii", "backslashreplace").decode().replace("\\xe9", "\\u00e9").replace("\\xe0", "\\u00e0")
    assert json.loads(text)["cells"][1]["source"][1] == cell.splitlines(True)[1]
    repo.write(NB, text)
    repo.commit("optimizer")
    result = review(repo.path, "main", "feature")
    (f,) = result.findings
    assert (f.rule_id, f.cell, f.cell_line) == ("single-tensor-optimizer", 2, 2)
    line = text.splitlines()[f.line - 1]
    assert line[f.column - 1:].startswith("torch.optim.SGD(params") and line[f.end_column - 2] == ")"
    fixed = apply_suggestions(text, result.findings)
    assert sources(fixed)[2] == cell.replace("foreach=False", "foreach=True")
    assert fixed.isascii() and "\\u00e9j\\u00e0\\tvu" in fixed.splitlines()[f.line - 1]
    assert fixed.replace("foreach=True", "foreach=False") == text


def test_cell_magics(tmp_path):
    """A %%bash cell is not Python (not reviewed); a %%timeit cell is reviewed below its first line,
    which stays as it is."""
    bash = "%%bash\nfor i in 1 2; do torch.optim.SGD(p, foreach=False); done\n"
    timed = "%%timeit\nopt = torch.optim.SGD(p, foreach=False)\n"
    repo = GitRepo(tmp_path / "r")
    repo.write(NB, dumps([code(IMPORTS)]))
    repo.commit("base")
    repo.branch("feature")
    text = dumps([code(IMPORTS), code(bash), code(timed)])
    repo.write(NB, text)
    repo.commit("magics")
    result = review(repo.path, "main", "feature")
    assert [(f.rule_id, f.cell, f.cell_line) for f in result.findings] == [("single-tensor-optimizer", 3, 2)]
    assert result.errors == []
    assert sources(apply_suggestions(text, result.findings))[3] == "%%timeit\nopt = torch.optim.SGD(p, foreach=True)\n"


def test_a_file_that_is_not_a_notebook_is_one_note(tmp_path):
    repo = GitRepo(tmp_path / "r")
    repo.write("README.md", "x\n")
    repo.commit("base")
    repo.branch("feature")
    repo.write("bad.ipynb", "{not json\n")
    repo.write("v3.ipynb", json.dumps({"worksheets": [], "nbformat": 3}) + "\n")
    repo.write("r.ipynb", json.dumps({"cells": [code("x <- 1\n")], "metadata": {"kernelspec": {"language": "R"}}}) + "\n")
    repo.write("latin1.ipynb", dumps([code("x = 'caf\u00e9'\n")]).encode("latin-1"))
    repo.commit("notebooks")
    result = review(repo.path, "main", "feature")
    assert result.findings == []
    msgs = {e.path: e.message for e in result.errors}
    assert msgs["bad.ipynb"].startswith("not a notebook: invalid JSON")
    assert "nbformat 3" in msgs["v3.ipynb"] and "kernel language r" in msgs["r.ipynb"]
    assert msgs["latin1.ipynb"].startswith("cannot decode: not UTF-8 JSON")


def test_magic_inside_a_rewrite_is_reported_without_a_fix(tmp_path):
    """A loop whose fix would replace a line magic with it: reported, no suggestion, no diff."""
    src = "for p in model.parameters():\n    !echo hi\n    p.grad.zero_()\n"
    repo = GitRepo(tmp_path / "r")
    repo.write(NB, dumps([code(IMPORTS)]))
    repo.commit("base")
    repo.branch("feature")
    repo.write(NB, dumps([code(IMPORTS), code(src)]))
    repo.commit("zero")
    result = review(repo.path, "main", "feature")
    assert [(f.rule_id, f.cell, f.suggestion, f.fix_diff) for f in result.findings] == [("zero-grad-not-none", 2, None, "")]


def test_working_tree_notebook(tmp_path):
    repo = notebook_repo(tmp_path / "r")
    repo.checkout("main")
    repo.write(NB, dumps(FEATURE_CELLS))
    result = review(repo.path, "HEAD", None)
    assert [(f.rule_id, f.cell, f.cell_line) for f in result.findings] == EXPECTED
    subprocess.run(["git", "checkout", "--", NB], cwd=repo.path, check=True)
