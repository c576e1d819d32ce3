"""zoomer_ar.review.review on real git repositories: only changed lines, suggestions, configuration,
suppression, renames, deletions, binary and unparsable files, huge diffs."""

from __future__ import annotations

import pytest
from review_testutil import (
    BASE_TRAIN,
    FEATURE_TRAIN,
    MUST_HOLD,
    GitRepo,
    line_of,
    must_hold_repo,
)

from zoomer_ar.errors import InputError
from zoomer_ar.review import review
from zoomer_ar.review.catalogue import DEFAULT_SEVERITY


def _ids(result):
    return [(f.rule_id, f.line) for f in result.findings]


def test_must_hold_three_findings_on_added_lines_with_suggestions(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    result = review(repo.path, "main", "feature")
    assert _ids(result) == MUST_HOLD
    # the DataLoader without workers in evaluate() (unchanged lines) is not reported
    assert line_of(BASE_TRAIN, "DataLoader(dataset, batch_size=64)") not in [f.line for f in result.findings]
    by_rule = {f.rule_id: f for f in result.findings}
    # the DataLoader's fix also adds `import os` and DATALOADER_WORKERS after the imports, outside the hunk:
    # no suggestion, the fix as a diff
    loader = by_rule["dataloader-bound"]
    assert loader.suggestion is None and "+DATALOADER_WORKERS = max(0, min(" in loader.fix_diff
    assert ("+    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=DATALOADER_WORKERS, pin_memory=True, "
            "persistent_workers=DATALOADER_WORKERS > 0)") in loader.fix_diff
    assert by_rule["single-tensor-optimizer"].suggestion == "    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)"
    assert by_rule["sync-point"].suggestion == "        if step % 100 == 0:\n            print(step, loss.item())"
    for f in result.findings:
        assert f.comment_line == f.line and f.comment_start_line is None
        assert f.fixable and f.fingerprint and f.fix_diff.startswith("@@")
        assert f.severity == DEFAULT_SEVERITY[f.rule_id]
        assert f.title and f.title != f.rule_id  # from rules/<id>.yaml
    assert result.files_changed == 1 and result.errors == [] and result.head_sha == repo.sha("feature")


def test_same_patterns_on_unchanged_lines_are_not_reported(tmp_path):
    repo = GitRepo(tmp_path / "r")
    repo.write("train.py", FEATURE_TRAIN)
    repo.commit("everything already there")
    repo.branch("feature")
    repo.write("train.py", FEATURE_TRAIN + "\n\ndef unrelated():\n    return 42\n")
    repo.commit("unrelated change")
    assert review(repo.path, "main", "feature").findings == []


def test_modified_line_is_a_changed_line(tmp_path):
    repo = GitRepo(tmp_path / "r")
    clean = FEATURE_TRAIN.replace("foreach=False", "foreach=True")
    repo.write("train.py", clean)
    repo.commit("clean")
    repo.branch("feature")
    repo.write("train.py", clean.replace("lr=1e-3, foreach=True", "lr=3e-4, foreach=False"))
    repo.commit("regress")
    assert [f.rule_id for f in review(repo.path, "main", "feature").findings] == ["single-tensor-optimizer"]


ZERO_LOOP_BASE = '''\
import torch


def step(model, opt, batch):
    loss = model(batch).sum()
    loss.backward()
    opt.step()
    for p in model.parameters():
        p.grad.zero_()
    return loss
'''


def test_loop_whose_body_changed_is_reported(tmp_path):
    # the zero-grad loop is flagged as a whole: a change inside its body makes it a changed loop
    repo = GitRepo(tmp_path / "r")
    repo.write("step.py", ZERO_LOOP_BASE)
    repo.commit("base")
    repo.branch("feature")
    repo.write("step.py", ZERO_LOOP_BASE.replace("        p.grad.zero_()", "        p.grad.data.zero_()"))
    repo.commit("touch the loop body")
    result = review(repo.path, "main", "feature")
    assert [f.rule_id for f in result.findings] == ["zero-grad-not-none"]
    f = result.findings[0]
    assert f.line == line_of(ZERO_LOOP_BASE, "for p in model.parameters()") and f.end_line > f.line


def test_deletion_inside_a_flagged_loop_is_a_change(tmp_path):
    base = ZERO_LOOP_BASE.replace("        p.grad.zero_()\n", "        p.grad.zero_()\n        count = 1\n")
    repo = GitRepo(tmp_path / "r")
    repo.write("step.py", base)
    repo.commit("base")
    repo.branch("feature")
    repo.write("step.py", ZERO_LOOP_BASE.replace("        p.grad.zero_()\n    return", "        p.grad.zero_()\n\n    return"))
    repo.commit("drop a line from the loop")
    result = review(repo.path, "main", "feature")
    # the removed `count = 1` was inside the flagged loop, followed by an added blank line: still touched
    assert [f.rule_id for f in result.findings] == ["zero-grad-not-none"]
    assert result.findings[0].comment_line is not None


def test_pure_deletion_inside_loop(tmp_path):
    base = ZERO_LOOP_BASE.replace("        p.grad.zero_()\n", "        count = 1\n        p.grad.zero_()\n")
    repo = GitRepo(tmp_path / "r")
    repo.write("step.py", base)
    repo.commit("base")
    repo.branch("feature")
    repo.write("step.py", ZERO_LOOP_BASE)
    repo.commit("only delete a line")
    result = review(repo.path, "main", "feature")
    assert [f.rule_id for f in result.findings] == ["zero-grad-not-none"]
    f = result.findings[0]
    loop = line_of(ZERO_LOOP_BASE, "for p in model.parameters()")
    # the rewrite replaces the two-line loop: a multi-line suggestion inside the hunk
    assert (f.comment_start_line, f.comment_line) == (loop, loop + 1)
    assert f.suggestion == "    model.zero_grad(set_to_none=True)"


def test_suggestion_only_when_the_rewrite_fits_in_a_hunk(tmp_path):
    # accumulate rewrite: `.item()` in the loop and `float(total)` after it; only the loop line changes,
    # far (more than 3 context lines) from the read after the loop
    filler = "".join(f"        h{i} = {i}\n" for i in range(12))
    base = (
        "import torch\n\n\ndef run(model, loader):\n    total = 0.0\n    for x in loader:\n"
        "        loss = model(x)\n        total += loss.sum()\n" + filler + "    return total\n"
    )
    repo = GitRepo(tmp_path / "r")
    repo.write("acc.py", base)
    repo.commit("base")
    repo.branch("feature")
    repo.write("acc.py", base.replace("total += loss.sum()", "total += loss.item()"))
    repo.commit("read each step")
    result = review(repo.path, "main", "feature")
    assert [f.rule_id for f in result.findings] == ["sync-point"]
    f = result.findings[0]
    assert f.fixable and f.suggestion is None  # the rewrite spans lines outside the hunk
    assert "+        total += loss.detach()" in f.fix_diff and "float(total)" in f.fix_diff
    assert f.comment_line == f.line


def test_inline_suppression_and_config(tmp_path):
    repo = GitRepo(tmp_path / "r")
    repo.write("train.py", BASE_TRAIN)
    repo.commit("base")
    repo.branch("feature")
    repo.write("train.py", FEATURE_TRAIN.replace("print(step, loss.item())", "print(step, loss.item())  # zoomer: ignore[sync-point]"))
    repo.write("legacy/old_train.py", FEATURE_TRAIN)
    repo.write("pyproject.toml", """\
[project]
name = "demo"

[tool.zoomer-ar]
ignore = ["optimizer-foreach"]
exclude = ["legacy/"]
severity = { "dataloader-bound" = "critical" }
fail-on = "critical"
max-inline-comments = 5
other-stage-key = "left alone"
""")
    repo.commit("feature")
    result = review(repo.path, "main", "feature")
    assert [(f.rule_id, f.severity) for f in result.findings] == [("dataloader-bound", "critical")]
    assert result.config_fail_on == "critical" and result.config_max_inline == 5
    assert any("excluded" in n for n in result.notes)
    assert "single-tensor-optimizer" not in result.rules
    # the select flag replaces the configured lists
    assert [f.rule_id for f in review(repo.path, "main", "feature", select="sync-point,single-tensor-optimizer", ignore=[]).findings] == [
        "single-tensor-optimizer"]


@pytest.mark.parametrize("toml, message", [
    ('[tool.zoomer-ar]\nselect = ["no-such-rule"]\n', "unknown pattern id"),
    ('[tool.zoomer-ar]\nseverity = { "sync-point" = "urgent" }\n', "expected one of"),
    ('[tool.zoomer-ar]\nexclude = 3\n', "path globs"),
    ('[tool.zoomer-ar\n', "invalid TOML"),
])
def test_invalid_config_is_an_input_error(tmp_path, toml, message):
    repo = must_hold_repo(tmp_path / "r")
    repo.write("pyproject.toml", toml)
    repo.commit("config")
    with pytest.raises(InputError, match=message):
        review(repo.path, "main", "feature")


def test_renames_deletions_binary_and_unparsable_files(tmp_path):
    repo = GitRepo(tmp_path / "r")
    repo.write("old_name.py", FEATURE_TRAIN)
    repo.write("moved_and_edited.py", BASE_TRAIN)
    repo.write("gone.py", FEATURE_TRAIN)
    repo.write("blob.py", b"\x00\x01\x02 not text")
    repo.write("data.bin", b"\x00\xff")
    repo.commit("base")
    repo.branch("feature")
    repo.git("mv", "old_name.py", "new_name.py")  # pure rename: nothing to review
    (repo.path / "pkg").mkdir()
    repo.git("mv", "moved_and_edited.py", "pkg/moved.py")
    repo.write("pkg/moved.py", BASE_TRAIN + "\n\ndef more(ds):\n    return DataLoader(ds)\n")
    repo.git("rm", "-q", "gone.py")
    repo.write("blob.py", b"\x00\x01\x03 still not text")
    repo.write("data.bin", b"\x00\xfe")
    repo.write("broken.py", "def train(:\n    loader = DataLoader(ds)\n")
    repo.write("ok.py", "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader(ds)\n")
    repo.commit("feature")
    result = review(repo.path, "main", "feature")
    assert [(f.path, f.rule_id) for f in result.findings] == [("ok.py", "dataloader-bound"), ("pkg/moved.py", "dataloader-bound")]
    assert result.findings[1].line == line_of(BASE_TRAIN + "\n\ndef more(ds):\n    return DataLoader(ds)\n", "return DataLoader(ds)")
    assert [(e.path, e.line) for e in result.errors] == [("broken.py", 1)]
    assert "cannot parse" in result.errors[0].message
    assert [(s.path, s.message) for s in result.skipped] == [("blob.py", "binary file")]
    assert {"new_name.py", "pkg/moved.py", "ok.py", "broken.py", "blob.py"} <= set(_changed(repo))


def _changed(repo):
    from zoomer_ar.review.diff import collect

    return [f.path for f in collect(repo.path, "main", "feature").files]


def test_review_uses_the_merge_base(tmp_path):
    # main moves on after the branch: its new findings are not the feature branch's
    repo = must_hold_repo(tmp_path / "r")
    repo.checkout("main")
    repo.write("other.py", "from torch.utils.data import DataLoader\nloader = DataLoader(ds)\n")
    repo.commit("main moves on")
    assert _ids(review(repo.path, "main", "feature")) == MUST_HOLD


def test_working_tree_and_paths(tmp_path):
    repo = GitRepo(tmp_path / "r")
    repo.write("train.py", BASE_TRAIN)
    repo.write("b.py", "x = 1\n")
    repo.commit("base")
    repo.write("train.py", FEATURE_TRAIN)
    repo.write("b.py", "from torch.utils.data import DataLoader\nloader = DataLoader(ds)\n")
    repo.git("add", "b.py")
    result = review(repo.path, "HEAD", None)
    assert result.head_sha is None
    assert [(f.path, f.rule_id) for f in result.findings] == [("b.py", "dataloader-bound"), *(("train.py", r) for r, _ in MUST_HOLD)]
    only = review(repo.path, "HEAD", None, paths=["b.py"])
    assert [f.path for f in only.findings] == ["b.py"]


def test_bad_refs_and_not_a_repository(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    with pytest.raises(InputError, match="not a commit"):
        review(repo.path, "no-such-branch", "feature")
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputError, match="not a git repository"):
        review(tmp_path / "plain", "main", "feature")


def test_fingerprints_are_stable_when_code_moves(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    first = {f.rule_id: f.fingerprint for f in review(repo.path, "main", "feature").findings}
    repo.write("train.py", FEATURE_TRAIN.replace('"""Training utilities."""\n', '"""Training utilities."""\n\nVERSION = 2\n\n'))
    repo.commit("push 2: lines move down")
    second = review(repo.path, "main", "feature").findings
    assert {f.rule_id: f.fingerprint for f in second} == first
    assert all(f.line > dict(MUST_HOLD)[f.rule_id] for f in second)


def test_huge_diff_many_files_and_a_large_file(tmp_path):
    repo = GitRepo(tmp_path / "r")
    repo.write("keep.py", "x = 1\n")
    repo.commit("base")
    repo.branch("feature")
    for i in range(300):
        repo.write(f"pkg/m{i:03d}.py", f"def f{i}(x):\n    return x + {i}\n")
    repo.write("pkg/train_000.py", FEATURE_TRAIN)
    big = "".join(f"def g{i}(x):\n    return x * {i}\n\n" for i in range(4000))
    repo.write("pkg/big.py", "import torch\nfrom torch.utils.data import DataLoader\n" + big + "loader = DataLoader(ds)\n")
    repo.commit("huge")
    from zoomer_ar.fix.registry import load_registry
    from zoomer_ar.review.prefilter import KEYS

    known = [n for n in load_registry().names if n in KEYS]  # a fixer added later always runs (never pruned)
    result = review(repo.path, "main", "feature", jobs=2, select=known)
    assert result.files_changed == 302
    # a new file: every line is added, the DataLoader in evaluate() too
    assert [(f.path, f.rule_id) for f in result.findings] == [
        ("pkg/big.py", "dataloader-bound"), ("pkg/train_000.py", "dataloader-bound"), *(("pkg/train_000.py", r) for r, _ in MUST_HOLD)]
    assert result.files_parsed <= 5  # the prefilter spares the 300 helper modules


def test_parallel_and_sequential_agree(tmp_path):
    repo = GitRepo(tmp_path / "r")
    repo.write("keep.py", "x = 1\n")
    repo.commit("base")
    repo.branch("feature")
    for i in range(12):
        repo.write(f"t{i}.py", FEATURE_TRAIN)
    repo.commit("many")
    seq = review(repo.path, "main", "feature", jobs=1)
    par = review(repo.path, "main", "feature", jobs=2)
    assert [f.model_dump() for f in seq.findings] == [f.model_dump() for f in par.findings]
    assert len(seq.findings) == 12 * 4  # new files: evaluate()'s DataLoader too


def test_odd_paths_are_read_back(tmp_path):
    from zoomer_ar.review.diff import collect

    repo = GitRepo(tmp_path / "r")
    repo.write("keep.py", "x = 1\n")
    repo.commit("base")
    repo.branch("feature")
    names = ["sp ace.py", "ünïcödé.py", 'quo"te.py', "tab\there.py", "dir with space/b a.py"]
    for n in names:
        repo.write(n, "from torch.utils.data import DataLoader\nloader = DataLoader(ds)\n")
    repo.write("bin ary.py", b"\x00\x01")
    repo.commit("odd names")
    diff = collect(repo.path, "main", "feature")
    assert sorted(f.path for f in diff.files) == sorted([*names, "bin ary.py"])
    assert [f.binary for f in diff.files if f.path == "bin ary.py"] == [True]
    result = review(repo.path, "main", "feature")
    assert sorted(f.path for f in result.findings) == sorted(names)
    assert [s.path for s in result.skipped] == ["bin ary.py"]


def test_rename_with_edit_and_pure_rename(tmp_path):
    from zoomer_ar.review.diff import collect

    repo = GitRepo(tmp_path / "r")
    repo.write("a.py", FEATURE_TRAIN)
    repo.write("b.py", FEATURE_TRAIN)
    repo.commit("base")
    repo.branch("feature")
    repo.git("mv", "a.py", "renamed.py")
    repo.git("mv", "b.py", "edited.py")
    repo.write("edited.py", FEATURE_TRAIN.replace("lr=1e-3", "lr=2e-3"))
    repo.commit("renames")
    by_path = {f.path: f for f in collect(repo.path, "main", "feature").files}
    assert by_path["renamed.py"].status == "renamed" and by_path["renamed.py"].old_path == "a.py" and not by_path["renamed.py"].changed
    assert by_path["edited.py"].status == "renamed" and by_path["edited.py"].added == {line_of(FEATURE_TRAIN, "lr=1e-3")}
    assert [(f.path, f.rule_id) for f in review(repo.path, "main", "feature").findings] == [("edited.py", "single-tensor-optimizer")]
