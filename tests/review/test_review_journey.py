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
