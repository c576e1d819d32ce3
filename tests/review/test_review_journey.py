"""A pre-merge bot's journey: the repositories and diffs of real pull requests that broke the review."""

from __future__ import annotations

import subprocess

import pytest
from review_testutil import GIT_ENV, GitRepo, must_hold_repo

from zoomer_ar.cli import main
from zoomer_ar.errors import InputError
from zoomer_ar.review import review


def _shallow_clone(src: GitRepo, dest) -> GitRepo:
    """A depth-1 clone holding each branch's tip only (origin/<branch>, as a CI checkout with fetch-depth 1)."""
    import os

    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "clone", "-q", "--depth", "1", "--no-single-branch", f"file://{src.path}", str(dest)],
                   check=True, env=env, capture_output=True)
    clone = GitRepo.__new__(GitRepo)
    clone.path = dest
    return clone


def test_no_merge_base_is_an_error_not_a_review_of_the_base_branchs_later_commits(tmp_path, capsys):
    """Without a merge base (a shallow CI clone, unrelated histories) the review diffed BASE..HEAD as if BASE
    were the branch point: every line that `main` changed after the branch point showed up as a line the pull
    request adds, and the bot commented on code the pull request never touched. It is now bad input (exit 2)
    naming both refs, with the fetch that fixes a shallow clone."""
    repo = must_hold_repo(tmp_path / "r")
    repo.checkout("main")
    repo.write("loader.py", "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, num_workers=4)\n")
    repo.commit("main: a loader with workers")
    repo.write("loader.py", "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, num_workers=8)\n")
    repo.commit("main: more workers")
    repo.checkout("feature")
    repo.write("loader.py", "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds)\n")  # not in main
    repo.commit("feature: its own loader")
    full = {(f.path, f.rule_id) for f in review(repo.path, "main", "feature").findings}
    assert ("loader.py", "dataloader-bound") in full  # the full clone: the feature's own loader is its change

    clone = _shallow_clone(repo, tmp_path / "shallow")
    with pytest.raises(InputError, match="no common ancestor") as err:
        review(clone.path, "origin/main", "origin/feature")
    assert "shallow" in str(err.value) and "fetch" in str(err.value)
    capsys.readouterr()
    assert main(["review", "--repo", str(clone.path), "--base", "origin/main", "--head", "origin/feature",
                 "--format", "text"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no common ancestor" in lines[0], lines

    repo.git("checkout", "-q", "--orphan", "unrelated")
    repo.git("rm", "-rqf", ".")
    repo.write("other.py", "x = 1\n")
    repo.commit("unrelated history")
    with pytest.raises(InputError, match="no common ancestor") as err:
        review(repo.path, "unrelated", "feature")
    assert "shallow" not in str(err.value)


def test_the_actions_fetch_step_gives_a_shallow_checkout_its_merge_base(tmp_path):
    """actions/checkout fetches one commit by default; the Action's 'Make sure both commits are present' step
    fetched the base and head commits alone, so the review had no merge base (now an error, before a review of
    the base branch's later commits). The step now fetches the history a shallow clone lacks."""
    import os
    from pathlib import Path

    import yaml

    repo = must_hold_repo(tmp_path / "r")
    repo.checkout("main")
    repo.write("later.py", "x = 2\n")
    repo.commit("main moves on")
    clone = _shallow_clone(repo, tmp_path / "shallow")
    action = yaml.safe_load((Path(__file__).resolve().parents[2] / "action.yml").read_text())
    script = next(s for s in action["runs"]["steps"] if s["name"] == "Make sure both commits are present")["run"]
    env = {**os.environ, **GIT_ENV, "BASE": repo.sha("main"), "HEAD": repo.sha("feature")}
    proc = subprocess.run(["bash", "-e", "-c", script], cwd=clone.path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = review(clone.path, repo.sha("main"), repo.sha("feature"))
    assert {f.path for f in result.findings} == {"train.py"} and result.merge_base_sha == repo.sha("main~1")


SYNC_LOOP = b"import torch\n\n\ndef f(m, d):\n    for x in d:\n        torch.cuda.synchronize()\n        m(x)\n"


@pytest.fixture
def odd_paths_repo(tmp_path):
    """A feature branch adding a sync in a loop in files whose names are not UTF-8 (Latin-1 bytes) or hold a
    line break (git allows both)."""
    import os

    repo = GitRepo(tmp_path / "r")
    repo.write("README.md", "# x\n")
    repo.commit("base")
    repo.branch("feature")
    root = os.fsencode(repo.path)
    for name in (b"caf\xe9.py", b"new\nline.py"):
        with open(root + b"/" + name, "wb") as fh:
            fh.write(SYNC_LOOP)
    repo.commit("odd names")
    return repo


@pytest.mark.parametrize("fmt", ["json", "github", "sarif", "md", "text"])
def test_file_names_that_are_not_utf8_or_hold_a_line_break(odd_paths_repo, capsysbinary, fmt):
    """A file name that is not UTF-8 made `--format json` an internal error (exit 1: pydantic cannot encode
    the lone surrogate the name decodes to), `github` and `sarif` wrote it as a lone-surrogate escape
    ("\\udce9", a lone surrogate that strict JSON parsers and GitHub's UTF-8 text cannot hold), and `md` wrote the raw byte
    (invalid UTF-8 in the comment); a name with a line break split the `text` format's one line per finding.
    Every format is now valid UTF-8 (JSON that parses strictly); the name's byte is written as `\\xe9`, and the
    text format quotes such names as git does ("caf\\351.py", "new\\nline.py")."""
    import json

    capsysbinary.readouterr()
    rc = main(["review", "--repo", str(odd_paths_repo.path), "--base", "main", "--head", "feature", "--format", fmt])
    out, err = capsysbinary.readouterr()
    assert rc == 0, err
    text = out.decode("utf-8")  # strict: no invalid byte
    assert "\\udc" not in text and "\udce9" not in text
    if fmt in ("json", "github", "sarif"):
        json.loads(text)
    if fmt == "json":
        assert {f["path"] for f in json.loads(text)["findings"]} == {"caf\\xe9.py", "new\nline.py"}
    if fmt == "github":
        assert {c["path"] for c in json.loads(text)["comments"]} == {"caf\\xe9.py", "new\nline.py"}
    if fmt == "text":
        lines = text.splitlines()
        assert sum(" sync-point " in ln for ln in lines) == 2
        assert any(ln.startswith('"caf\\351.py":6:') for ln in lines), lines
        assert any(ln.startswith('"new\\nline.py":6:') for ln in lines), lines
    if fmt == "md":
        assert "caf\\xe9.py" in text
