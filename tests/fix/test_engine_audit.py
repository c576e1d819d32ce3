"""Audit of the fix engine and source mapping: notebooks, symbolic links, moved functions and the
code patch.diff may touch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.fix import engine

REPO = Path(__file__).resolve().parents[2]
SCEN = REPO / "training_data" / "scenarios"
EXAMPLES = REPO / "examples" / "traces"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check,
                          env={**GIT_ENV, "HOME": str(cwd)})


def _repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "--allow-empty", "-m", "init")
    return path


# --------------------------------------------------------------------------------------------
# 1. Notebooks
# --------------------------------------------------------------------------------------------

CELLS = [
    ("markdown", "# Training \u00e9t\u00e9\n", None),
    ("code", "%matplotlib inline\nimport torch\n!pip list\nfrom torch.utils.data import DataLoader", None),
    ("code", "opt = torch.optim.Adam(params, foreach=False)\nloader = DataLoader(ds, batch_size=32)",
     [{"name": "stdout", "output_type": "stream", "text": ["hello\n"]}]),
    ("code", "for step, b in enumerate(loader):\n    %time out = model(b)\n    opt.zero_grad(set_to_none=False)\n"
             "    torch.cuda.empty_cache()", None),
    ("code", "def broken(:\n    pass", None),
    ("code", "%%bash\necho opt.zero_grad(set_to_none=False)", None),
    ("code", "%%time\nopt.zero_grad(set_to_none=False)\n", None),
]


def _notebook(cells=CELLS, *, indent=1, lines=True, ensure_ascii=False, language="python", newline=True) -> str:
    doc = {"cells": [], "metadata": {"kernelspec": {"display_name": "Python 3", "language": language, "name": "python3"}},
           "nbformat": 4, "nbformat_minor": 5}
    for n, (kind, source, outputs) in enumerate(cells):
        cell = {"cell_type": kind, "id": f"c{n}", "metadata": {}, "source": source.splitlines(True) if lines else source}
        if kind == "code":
            cell = {"cell_type": kind, "execution_count": n, "id": f"c{n}", "metadata": {"tags": []},
                    "outputs": outputs or [], "source": cell["source"]}
        doc["cells"].append(cell)
    return json.dumps(doc, indent=indent, ensure_ascii=ensure_ascii) + ("\n" if newline else "")


def test_notebook_findings_name_cell_and_line(tmp_path: Path, capsys):
    """`fix nb.ipynb` parsed the JSON as Python: "0 findings (0 fixable) in 1 file"."""
    nb = tmp_path / "nb.ipynb"
    nb.write_text(_notebook())
    assert main(["fix", str(nb)]) == 0
    cap = capsys.readouterr()
    out = cap.out.replace(str(tmp_path) + "/", "")
    assert "nb.ipynb:cell 3:1:7: single-tensor-optimizer" in out
    assert "nb.ipynb:cell 3:2:10: dataloader-bound" in out
    assert "nb.ipynb:cell 4:3:5: zero-grad-not-none" in out  # below a masked `%time` line
    assert "nb.ipynb:cell 7:2:1: zero-grad-not-none" in out  # a %%time cell: its body is Python
    assert "cell 6" not in out  # %%bash: not Python
    assert "zoomer-ar: left out " in cap.err and "nb.ipynb:cell 5:1:12: cannot parse" in cap.err  # the cell is named
    # the others analysed: the notebook is not counted as a skipped file
    assert "5 findings (5 fixable) in 1 file; 1 notebook cell left out" in cap.err
    assert "skipped" not in cap.err


def test_fix_dir_reads_notebooks(tmp_path: Path):
    """`fix DIR` skipped .ipynb files ("0 files")."""
    (tmp_path / "nb.ipynb").write_text(_notebook())
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "nb-checkpoint.ipynb").write_text(_notebook())
    result = engine.run(tmp_path, fix=True)
    assert [f.path for f in result.files] == ["nb.ipynb"]
    assert {m.path for m in result.findings} == {"nb.ipynb:cell 3", "nb.ipynb:cell 4", "nb.ipynb:cell 7"}
    assert result.errors == ["nb.ipynb:cell 5:1:12: cannot parse: invalid syntax"]
    assert result.skipped == [] and result.files[0].left_out == 1


def test_notebook_diff_applies_and_apply_keeps_the_json(tmp_path: Path, capsys):
    repo = tmp_path / "repo"
    repo.mkdir()
    nb = repo / "nb.ipynb"
    original = _notebook()
    nb.write_text(original)
    _repo(repo)
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        assert main(["fix", "nb.ipynb", "--diff"]) == 0
    finally:
        os.chdir(cwd)
    diff = capsys.readouterr().out
    assert diff.startswith("--- a/nb.ipynb\n+++ b/nb.ipynb\n")
    (tmp_path / "p.diff").write_text(diff)
    check = _git(repo, "apply", "--check", str(tmp_path / "p.diff"), check=False)
    assert check.returncode == 0, check.stderr
    _git(repo, "apply", str(tmp_path / "p.diff"))
    patched = nb.read_text()
    nb.write_text(original)

    assert main(["fix", str(nb), "--apply"]) == 0
    assert nb.read_text() == patched  # --apply writes what --diff shows
    before, after = json.loads(original), json.loads(patched)
    for b, a in zip(before["cells"], after["cells"]):
        assert {k: v for k, v in a.items() if k != "source"} == {k: v for k, v in b.items() if k != "source"}
    # the worker count computed when the notebook runs: `import os` among the imports (after the magic), the
    # constant after them, in the cell that holds them
    assert [c["source"] for c in after["cells"]][:3] == [c["source"] for c in before["cells"]][:1] + [[
        "%matplotlib inline\n", "import os\n", "import torch\n", "!pip list\n", "from torch.utils.data import DataLoader\n",
        "\n", "DATALOADER_WORKERS = max(0, min(\n", "    8,\n",
        "    (len(os.sched_getaffinity(0)) if hasattr(os, \"sched_getaffinity\") else os.cpu_count() or 1)\n",
        "    // int(os.environ.get(\"LOCAL_WORLD_SIZE\") or 1) - 1,\n", "))"], [
        "opt = torch.optim.Adam(params, foreach=True)\n",
        "loader = DataLoader(ds, batch_size=32, num_workers=DATALOADER_WORKERS, pin_memory=True, "
        "persistent_workers=DATALOADER_WORKERS > 0)"]]
    assert after["cells"][3]["source"] == ["for step, b in enumerate(loader):\n", "    %time out = model(b)\n",
                                           "    opt.zero_grad(set_to_none=True)"]
    assert after["cells"][4:6] == before["cells"][4:6]  # the unparsable cell and the %%bash cell
    assert after["cells"][6]["source"] == ["%%time\n", "opt.zero_grad(set_to_none=True)\n"]
    # only the changed lines differ: same indentation, key order, escaping, trailing newline
    changed = [l for l in diff.splitlines() if l.startswith(("+", "-")) and not l.startswith(("+++", "---"))]
    assert len(changed) == 18 and all(l[1:].startswith("    \"") for l in changed)
    assert patched.endswith("}\n")
    capsys.readouterr()
    assert main(["fix", str(nb), "--diff"]) == 0
    assert capsys.readouterr().out == ""  # idempotent


@pytest.mark.parametrize("layout", [
    {"indent": 2, "lines": False},
    {"indent": None, "lines": True, "ensure_ascii": True, "newline": False},
    {"indent": 4, "lines": True, "ensure_ascii": True},
])
def test_notebook_layouts_are_kept(tmp_path: Path, layout):
    nb = tmp_path / "nb.ipynb"
    original = _notebook(**layout)
    nb.write_text(original)
    result = engine.run(nb, fix=True)
    (fr,) = result.files
    assert fr.changed
    engine.apply(result)
    text = nb.read_text()
    before, after = json.loads(original), json.loads(text)
    for k, (b, a) in enumerate(zip(before["cells"], after["cells"])):
        src = a["source"] if isinstance(a["source"], str) else "".join(a["source"])
        if k in (2, 3, 6):
            assert "foreach=True" in src or "set_to_none=True" in src
        if k == 1:
            assert "import os\n" in src and "DATALOADER_WORKERS = " in src
        assert type(a["source"]) is type(b["source"])
        b["source"] = a["source"]
    assert after == before
    assert list(json.loads(text, object_pairs_hook=lambda p: [k for k, _ in p])) == list(
        json.loads(original, object_pairs_hook=lambda p: [k for k, _ in p]))
    assert text.endswith("\n") == original.endswith("\n")
    if layout.get("ensure_ascii"):
        assert "\\u00e9" in text and "\u00e9" not in text
    # the bytes before the first changed cell are untouched
    first = original.index("%matplotlib")
    assert text[:first] == original[:first]
    assert engine.run(nb, fix=True).changed == []


def test_notebook_crlf_and_bom(tmp_path: Path):
    nb = tmp_path / "nb.ipynb"
    original = _notebook().replace("\n", "\r\n")
    nb.write_bytes(b"\xef\xbb\xbf" + original.encode())
    result = engine.run(nb, fix=True)
    engine.apply(result)
    raw = nb.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf{\r\n") and b"\n" not in raw.replace(b"\r\n", b"")
    assert "set_to_none=True" in raw.decode("utf-8-sig")


def test_notebooks_that_cannot_be_analysed_are_skipped_with_a_reason(tmp_path: Path, capsys):
    (tmp_path / "r.ipynb").write_text(_notebook(language="R"))
    (tmp_path / "bad.ipynb").write_text("import torch\nopt = torch.optim.Adam(p, foreach=False)\n")
    (tmp_path / "old.ipynb").write_text(json.dumps({"nbformat": 3, "worksheets": []}))
    result = engine.run(tmp_path, fix=True)
    assert result.findings == [] and result.changed == []
    errors = result.errors
    assert len(errors) == 3 and all("\n" not in e and "cannot parse" not in e for e in errors)
    assert errors[0].startswith("bad.ipynb: not a notebook: invalid JSON")
    assert errors[1].startswith("old.ipynb: nbformat 3")
    assert errors[2] == "r.ipynb: not a Python notebook (kernel language r): not analysed"
    assert main(["fix", str(tmp_path)]) == 0
    assert "0 findings (0 fixable) in 3 files; 3 skipped" in capsys.readouterr().err


def test_a_string_line_starting_with_percent_is_not_masked(tmp_path: Path):
    cells = [("code", "import torch\ns = (\"a %s\"\n     % 'b')\nopt = torch.optim.Adam(p, foreach=False)\n", None)]
    nb = tmp_path / "nb.ipynb"
    nb.write_text(_notebook(cells))
    result = engine.run(nb, fix=True)
    assert result.errors == []
    engine.apply(result)
    src = "".join(json.loads(nb.read_text())["cells"][0]["source"])
    assert src == cells[0][1].replace("foreach=False", "foreach=True")


# --------------------------------------------------------------------------------------------
# 2. Symbolic links
# --------------------------------------------------------------------------------------------

VICTIM = "import torch\nopt = torch.optim.Adam(params, foreach=False)\n"


def test_linked_file_is_skipped_never_replaced(tmp_path: Path, capsys):
    """`fix link.py --apply` replaced the link with a regular file and left the target as it was;
    `--diff` printed a patch that `git apply --check` rejects (git records the link)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text(VICTIM)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "link.py").symlink_to(outside / "victim.py")
    _repo(repo)
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        assert main(["fix", "link.py", "--diff"]) == 0
        cap = capsys.readouterr()
        assert cap.out == ""
        assert "skipped link.py: a symbolic link" in cap.err and "not followed" in cap.err
        assert main(["fix", "link.py", "--apply"]) == 0
        cap = capsys.readouterr()
    finally:
        os.chdir(cwd)
    assert (repo / "link.py").is_symlink()
    assert (outside / "victim.py").read_text() == VICTIM
    assert "0 files rewritten" in cap.err


def test_linked_file_in_a_folder_is_listed_as_skipped(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text(VICTIM)
    project = tmp_path / "p"
    project.mkdir()
    (project / "own.py").write_text(VICTIM)
    (project / "link.py").symlink_to(outside / "victim.py")
    (project / "nb.ipynb").symlink_to(outside / "victim.py")
    result = engine.run(project, fix=True)
    assert [f.path for f in result.changed] == ["own.py"]
    assert [e.split(":")[0] for e in result.errors] == ["link.py", "nb.ipynb"]
    assert all("symbolic link" in e for e in result.errors)
    assert result.diff().count("+++ ") == 1
    engine.apply(result)
    assert (project / "link.py").is_symlink() and (outside / "victim.py").read_text() == VICTIM
    # `only` (analyze --source) never brings a link in through its target
    only = engine.run(project, fix=True, only=[outside / "victim.py", project / "own.py"])
    assert [f.path for f in only.files] == ["own.py"]


def test_apply_never_writes_through_a_link(tmp_path: Path):
    """A file turned into a link after it was read is left alone."""
    (tmp_path / "a.py").write_text(VICTIM)
    (tmp_path / "target.py").write_text("x = 1\n")
    result = engine.run(tmp_path / "a.py", fix=True)
    (tmp_path / "a.py").unlink()
    (tmp_path / "a.py").symlink_to(tmp_path / "target.py")
    assert engine.apply(result) == []
    assert (tmp_path / "a.py").is_symlink() and (tmp_path / "target.py").read_text() == "x = 1\n"


# --------------------------------------------------------------------------------------------
# 3. Source mapping: moved functions, and the code patch.diff touches
# --------------------------------------------------------------------------------------------

LOOP = '''import torch


def helper(opt):
    opt.zero_grad(set_to_none=False)
    return opt


def train_step(layer, opt, x):
    opt.zero_grad(set_to_none=False)
    y = layer(x)
    total = y.sum()
    total.backward()
    opt.step()
    print(total.item())
    return total
'''


def _with_frames(finding, frames):
    events = [e.model_copy(update={"frames": frames}) for e in finding.evidence.events[:1]]
    return finding.model_copy(update={"evidence": finding.evidence.model_copy(update={"frames": frames, "events": events})})


def test_every_finding_of_a_moved_function_gets_its_new_line(tmp_path: Path):
    """loop.py's train_step was at line 3 when recorded (`loop.py(3): train_step`); a helper was
    inserted above it since. sync-point moved to the .item() in train_step, but fp32-matmul (no
    statement to locate) kept the trace's line 3, which is now in helper."""
    from zoomer_ar.analyze import analyze_path
    from zoomer_ar.models import SourceFrame
    from zoomer_ar.sourcemap import SourceIndex, map_finding

    (tmp_path / "loop.py").write_text(LOOP)
    index = SourceIndex(tmp_path)
    analysis = analyze_path(EXAMPLES / "fp32_matmul")
    frame = SourceFrame(file="/home/u/job/loop.py", line=3, function="train_step")
    fp32 = next(f for f in analysis.findings if f.pattern == "fp32-matmul")
    mapped = map_finding(index, _with_frames(fp32.model_copy(update={"pattern": "fp32-matmul"}), [frame]))
    train_def = LOOP.splitlines().index("def train_step(layer, opt, x):") + 1
    assert [(fr.resolved_path, fr.resolved_line) for fr in mapped.all_frames()] == [("loop.py", train_def)] * 2
    assert "def train_step" in mapped.evidence.frames[0].snippet.splitlines()[1]
    sync = map_finding(index, _with_frames(fp32.model_copy(update={"pattern": "sync-point"}), [frame]))
    assert sync.evidence.frames[0].resolved_line == LOOP.splitlines().index("    print(total.item())") + 1
    # a frame whose line still starts its function is kept; an unknown function keeps the line
    same = map_finding(index, _with_frames(fp32, [frame.model_copy(update={"line": train_def})]))
    assert same.evidence.frames[0].resolved_line == train_def
    gone = map_finding(index, _with_frames(fp32, [frame.model_copy(update={"function": "renamed"})]))
    assert gone.evidence.frames[0].resolved_line == 3


def _moved_scenario(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("zero_grad_not_none.py", "_common.py", "sync_point.py"):
        shutil.copy(SCEN / name, src / name)
    path = src / "zero_grad_not_none.py"
    text = path.read_text()
    helper = "def helper(opt):\n    opt.zero_grad(set_to_none=False)\n    return opt\n\n\n"
    path.write_text(text.replace("def train_step(", helper + "def train_step(", 1))
    return src


def test_patch_touches_only_the_functions_the_findings_point_at(tmp_path: Path):
    """patch.diff rewrote zero_grad(set_to_none=False) in helper() too, a function the trace
    never shows: only the functions of the findings' frames and located statements are patched."""
    from zoomer_ar.analyze import analyze_path
    from zoomer_ar.sourcemap import files_ran, map_sources, patch_scopes

    src = _moved_scenario(tmp_path)
    text = (src / "zero_grad_not_none.py").read_text()
    analysis = map_sources(analyze_path(EXAMPLES / "zero_grad_not_none"), src)
    zg = next(f for f in analysis.findings if f.pattern == "zero-grad-not-none")
    planted = text.splitlines().index("def train_step(model, opt, x, y):") + 2
    assert zg.evidence.frames[0].resolved_line == planted
    only = files_ran(analysis)
    assert only == ["zero_grad_not_none.py"]
    scopes = patch_scopes(analysis, src)
    assert "train_step" in scopes["zero_grad_not_none.py"] and "helper" not in scopes["zero_grad_not_none.py"]
    result = engine.run(src, select=["zero-grad-set-to-none"], fix=True, only=[src / q for q in only], scopes=scopes)
    diff = result.diff()
    assert diff.count("+    opt.zero_grad(set_to_none=True)") == 1
    hunk = [l for l in diff.splitlines() if l.startswith("@@")]
    assert len(hunk) == 1
    new = engine.fix_source_with(text, "x.py", engine.select_fixers(["zero-grad-set-to-none"]), scope=["train_step"])
    assert new.splitlines()[planted - 1] == "    opt.zero_grad(set_to_none=True)"
    assert "def helper(opt):\n    opt.zero_grad(set_to_none=False)" in new
    # the helper's finding is still listed, as not fixable in this run
    (fr,) = result.files
    assert [(m.line, m.fixable) for m in fr.findings if m.pattern == "zero-grad-not-none"] == [
        (planted - 5, False), (planted, True)]
    # without scopes (zoomer-ar fix) both are fixed
    assert engine.run(src / "zero_grad_not_none.py", fix=True).diff().count("set_to_none=True") == 2


def test_a_fix_flagged_in_scope_keeps_all_its_changes(tmp_path: Path):
    """An edit's changes go together: loop-item-sync flagged in train_step also rewrites the read
    after the loop in main; scoping to train_step keeps the whole fix."""
    text = (SCEN / "sync_point.py").read_text()
    sel = engine.select_fixers(["loop-item-sync"])
    whole = engine.fix_source_with(text, "sync_point.py", sel)
    assert engine.fix_source_with(text, "sync_point.py", sel, scope=["train_step"]) == whole != text
    assert engine.fix_source_with(text, "sync_point.py", sel, scope=["main"]) == text
    assert engine.scope_of(text, 1) == engine.MODULE_SCOPE


@pytest.mark.parametrize("together", [True, False], ids=["cells-joined", "cell-by-cell"])
def test_a_synchronize_in_a_timed_cell_is_not_removed(tmp_path: Path, together):
    # `%%timeit` times the whole cell: the synchronize in its loop is what the time waits for (it was
    # removed, and the cell then timed the launches); the same loop in an untimed cell is fixed. The
    # cell-by-cell path (cells that do not parse together: a late __future__ import) keeps it too.
    cells = [("code", "import torch\nx = torch.zeros(3, device='cuda')", None),
             ("code", "%%timeit\nfor i in range(3):\n    y = x * 2\n    torch.cuda.synchronize()", None),
             ("code", "for i in range(3):\n    y = x * 2\n    torch.cuda.synchronize()", None)]
    if not together:
        cells.append(("code", "from __future__ import annotations", None))
    nb = tmp_path / "nb.ipynb"
    nb.write_text(_notebook(cells))
    result = engine.run(tmp_path, fix=True)
    found = {(m.path, m.fixable) for m in result.findings if m.fixer == "loop-synchronize"}
    assert found == {("nb.ipynb:cell 2", False), ("nb.ipynb:cell 3", True)}
    timed = next(m for m in result.findings if m.path == "nb.ipynb:cell 2")
    assert "the notebook cell is timed" in timed.message
    after = json.loads(result.files[0].after)
    assert "torch.cuda.synchronize()" in "".join(after["cells"][1]["source"])
    assert "torch.cuda.synchronize()" not in "".join(after["cells"][2]["source"])


def test_notebook_keeps_an_import_that_a_magic_or_a_left_out_cell_may_use(tmp_path: Path):
    """Removing `empty_cache()` from a notebook's loop removed `from torch.cuda import
    empty_cache` too, while a `%timeit empty_cache()` line (masked from the analysis) and a cell
    that does not parse still used it: the notebook stopped with a NameError. Notebook cells run
    in any order and see each other's names, so an import there stays."""
    cells = [
        ("code", "from torch.cuda import empty_cache\n", None),
        ("code", "for b in loader:\n    step(b)\n    empty_cache()\n", None),
        ("code", "%timeit empty_cache()\n", None),
    ]
    nb = tmp_path / "nb.ipynb"
    nb.write_text(_notebook(cells))
    assert main(["fix", str(nb), "--apply"]) == 0
    fixed = json.loads(nb.read_text())
    sources = ["".join(c["source"]) for c in fixed["cells"]]
    assert sources[1] == "for b in loader:\n    step(b)\n"
    assert sources[0] == "from torch.cuda import empty_cache\n"
    assert sources[2] == "%timeit empty_cache()\n"
