"""Defects found by reviewing real training scripts (pytorch/examples, nanoGPT) as a pre-merge bot:
each case is a short construct of those scripts, written here, reviewed end to end on a real git
repository, with the suggestion applied the way GitHub applies it (the commented lines replaced by
the block's lines)."""

from __future__ import annotations

import ast
import re

from review_testutil import GitRepo

from zoomer_ar.fix import engine as fix_engine
from zoomer_ar.review import review
from zoomer_ar.review.render import github_payload


def _applied(text: str, comment: dict) -> str:
    """``text`` with the comment's suggestion applied as GitHub does: lines start_line..line replaced."""
    m = re.search(r"^(`{3,})suggestion\n(.*?)^\1$", comment["body"], re.S | re.M)
    assert m, comment["body"]
    lines = text.splitlines(keepends=True)
    start = comment.get("start_line") or comment["line"]
    return "".join(lines[:start - 1]) + m.group(2) + "".join(lines[comment["line"]:])


# the file defines DATALOADER_WORKERS already (as one the dataloader-workers fixer changed before): the
# fix is then the call's edit alone, which a suggestion can carry
LOADER_BASE = '''import os

import torch
from torch.utils.data import DataLoader

DATALOADER_WORKERS = max(0, min(8, (os.cpu_count() or 1) - 1))


def main(dataset, model):
    loader = DataLoader(
        dataset, batch_size=32, shuffle=True,
        num_workers=4)
    for x in loader:
        model(x)


if __name__ == "__main__":
    main(None, None)
'''


def test_multi_line_call_suggestion_keeps_its_indentation(tmp_path):
    """imagenet/main.py's `train_loader = torch.utils.data.DataLoader(` spans three lines inside
    `def main():`: the fixer's edit for the call is written at column 0, so the suggestion (and the
    diff, and the SARIF fix) moved its continuation lines four columns left. It parsed, but it was
    not the stated fix alone; it is now what `zoomer-ar fix` writes."""
    head = LOADER_BASE.replace("num_workers=4)", "num_workers=0)")
    repo = GitRepo(tmp_path / "r")
    repo.write("train.py", LOADER_BASE)
    repo.commit("base")
    repo.branch("feat")
    repo.write("train.py", head)
    repo.commit("debug loader")
    result = review(repo.path, base="main", head="feat")
    [finding] = result.findings
    assert finding.rule_id == "dataloader-bound" and finding.suggestion is not None
    [comment] = github_payload(result)["comments"]
    applied = _applied(head, comment)
    ast.parse(applied)
    fixed = fix_engine.fix_source_with(head, "train.py", fix_engine.select_fixers(["dataloader-workers"]))
    assert applied == fixed
    for line in finding.fix_diff.splitlines():
        if line.startswith(("+", "-")):
            assert line[1:].startswith("        "), finding.fix_diff
    # the SARIF replacement (the finding's edits) applied to the file gives the same text
    lines = head.splitlines(keepends=True)
    [edit] = finding.edits
    offset = [0]
    for line in lines:
        offset.append(offset[-1] + len(line))
    a = offset[edit["line"] - 1] + edit["column"] - 1
    b = offset[edit["end_line"] - 1] + edit["end_column"] - 1
    assert head[:a] + edit["text"] + head[b:] == fixed


MERGED_BASE = '''import torch


def train(loader, model, optimizer):
    for batch_idx, (data, target) in enumerate(loader):
        loss = model(data, target)
        loss.backward()
        optimizer.step()  # update the weights
'''


def test_a_suggestion_merged_from_two_findings_says_so(tmp_path):
    """mnist/main.py with `print(loss.item(), torch.zeros(3).to("cuda").sum())` added after
    `optimizer.step()`: the loss.item() fix (log every 100 steps) rewrites the line the
    factory-on-device fix rewrites, so the two became one suggestion. Applying it also fixed the
    other finding, and neither comment said so: the merged suggestion now names the other finding
    it fixes, and that finding's comment points to it."""
    head = MERGED_BASE + '        print(loss.item(), torch.zeros(3).to("cuda").sum())\n'
    repo = GitRepo(tmp_path / "r")
    repo.write("train.py", MERGED_BASE)
    repo.commit("base")
    repo.branch("feat")
    repo.write("train.py", head)
    repo.commit("debug")
    result = review(repo.path, base="main", head="feat")
    by_rule = {f.rule_id: f for f in result.findings}
    pair = [by_rule["sync-point"], by_rule["extra-copy"]]
    [host] = [f for f in pair if f.suggestion is not None]  # the merged suggestion
    [other] = [f for f in pair if f is not host]
    assert "if batch_idx % 100 == 0:" in host.suggestion and 'torch.zeros(3, device="cuda")' in host.suggestion
    comments = {re.search(r"rule=(\S+)", c["body"]).group(1): c for c in github_payload(result)["comments"]}
    merged = comments[host.rule_id]
    ast.parse(_applied(head, merged))
    assert f"`{other.rule_id}`" in merged["body"] and f"line {other.line}" in merged["body"]
    assert [(a["rule_id"], a["line"]) for a in host.also_fixes] == [(other.rule_id, other.line)]
    assert other.fixed_by_suggestion_on == merged.get("start_line", merged["line"])
    assert f"suggestion on line {other.fixed_by_suggestion_on}" in comments[other.rule_id]["body"]


def test_a_deleted_calls_comment_leaves_the_next_line_to_its_own_finding(tmp_path):
    """`torch.cuda.empty_cache()  # free memory` then `print(loss.item())`: the empty_cache fix
    used to move its trailing comment onto the print's line, so its suggestion rewrote that line
    too and swallowed the loss.item() fix. Its suggestion now replaces its own line with the
    comment, and the print keeps a suggestion of its own; both apply, one after the other."""
    head = MERGED_BASE + "        torch.cuda.empty_cache()  # free memory\n        print(loss.item())\n"
    repo = GitRepo(tmp_path / "r")
    repo.write("train.py", MERGED_BASE)
    repo.commit("base")
    repo.branch("feat")
    repo.write("train.py", head)
    repo.commit("debug")
    result = review(repo.path, base="main", head="feat")
    by_rule = {f.rule_id: f for f in result.findings}
    cache, item = by_rule["allocator-churn"], by_rule["sync-point"]
    assert cache.suggestion == "        # free memory" and not cache.also_fixes
    assert item.suggestion is not None and "if batch_idx % 100 == 0:" in item.suggestion
    comments = {re.search(r"rule=(\S+)", c["body"]).group(1): c for c in github_payload(result)["comments"]}
    both = _applied(_applied(head, comments["sync-point"]), comments["allocator-churn"])
    fixed = fix_engine.fix_source_with(head, "train.py", fix_engine.select_fixers(["loop-empty-cache", "loop-item-sync"]))
    assert both == fixed


LATIN1_BASE = ("# -*- coding: latin-1 -*-\n# entra\xeenement\nimport torch\n\n\ndef train(loader, model, opt):\n"
               "    for x in loader:\n        loss = model(x)  # perte \xe9lev\xe9e\n        loss.backward()\n        opt.step()\n")


def test_no_suggestion_block_in_a_file_that_is_not_utf8(tmp_path):
    """A Latin-1 file (its coding cookie says so) got suggestion blocks; GitHub's suggestions are
    UTF-8 text, so committing one wrote `r\\xc3\\xa9initialise` into a Latin-1 file (mojibake in
    the comment, and in a string literal a changed value). Such a file now gets the fix as a diff."""
    head = LATIN1_BASE.replace("        opt.step()\n", "        opt.step()\n        opt.zero_grad(set_to_none=False)  # r\xe9initialise\n")
    repo = GitRepo(tmp_path / "r")
    repo.write("latin.py", LATIN1_BASE.encode("latin-1"))
    repo.write("utf8.py", LATIN1_BASE.replace("latin-1", "utf-8"))
    repo.commit("base")
    repo.branch("feat")
    repo.write("latin.py", head.encode("latin-1"))
    repo.write("utf8.py", head.replace("latin-1", "utf-8"))
    repo.commit("zero_grad")
    result = review(repo.path, base="main", head="feat")
    by_path = {f.path: f for f in result.findings}
    assert by_path["utf8.py"].suggestion is not None  # the same change in a UTF-8 file keeps its suggestion
    latin = by_path["latin.py"]
    assert latin.rule_id == "zero-grad-not-none" and latin.suggestion is None
    assert "set_to_none=True" in latin.fix_diff and latin.comment_line == 11
    [comment] = [c for c in github_payload(result)["comments"] if c["path"] == "latin.py"]
    assert "```suggestion" not in comment["body"] and "```diff" in comment["body"]


ITEM_BASE = '''import torch


def train(loader, model, optimizer):
    history = []
    for step, (x, y) in enumerate(loader):
        loss = model(x, y)
        loss.backward()
        optimizer.step()
    return history
'''


def test_a_new_finding_on_the_line_of_an_outdated_comment_is_posted(tmp_path):
    """Push 1 adds `print(step, loss.item())`: commented inline. Push 2 replaces that line with
    `history.append(y.float().mean().item())`, another host read on the same line number. GitHub marks the first
    comment outdated (its `line` is null, its `original_line` is still that number), and the
    same-rule-same-line guard read `original_line` too: the new finding was never posted. The guard
    now reads only `line` (the comment's place in the current diff)."""
    from review_testutil import FakeGitHub

    from zoomer_ar.review.github import Client, GitHubTarget, post

    repo = GitRepo(tmp_path / "r")
    repo.write("train.py", ITEM_BASE)
    repo.commit("base")
    repo.branch("feat")
    push1 = ITEM_BASE.replace("        optimizer.step()\n", "        optimizer.step()\n        print(step, loss.item())\n")
    repo.write("train.py", push1)
    repo.commit("log the loss")
    with FakeGitHub("acme/trainer") as gh:
        target = GitHubTarget(api_url=gh.url, repository="acme/trainer", pr=7, token=gh.token)
        client = Client(gh.url, gh.token, backoff=0.0, max_wait=2.0)
        first = review(repo.path, base="main", head="feat")
        assert [f.rule_id for f in first.findings] == ["sync-point"]
        assert post(first, target, client=client).inline_posted == 1
        [old] = gh.review_comments[7]
        repo.write("train.py", push1.replace("print(step, loss.item())", "history.append(y.float().mean().item())"))
        repo.commit("keep the losses")
        second = review(repo.path, base="main", head="feat")
        [f] = second.findings
        assert f.rule_id == "sync-point" and f.comment_line == old["line"] and f.fingerprint not in old["body"]
        old["line"] = None  # GitHub: the commented line changed, the comment is outdated
        out = post(second, target, client=client)
        assert out.inline_posted == 1 and out.inline_duplicates == 0
        assert len(gh.review_comments[7]) == 2
