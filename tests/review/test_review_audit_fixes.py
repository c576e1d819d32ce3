"""Defects an audit of `zoomer-ar review` found, each checked end to end on real git repositories:

* files with form feeds or CR-only (old-Mac) line endings: findings on their changed lines are
  reported (git counts lines differently from Python);
* suggestions on neighbouring lines that each parse but together leave a loop without a body
  become one suggestion; every suggestion, alone and all together, leaves code that parses;
* the 422 fallback review is not posted again by the next run;
* ``-o`` to a directory or an unwritable place: one line, exit 2, nothing left behind;
* SARIF artifact URIs are percent-encoded;
* the summary shows base and head commits with the same number of characters;
* GitHub answers that are not JSON, cut short or not HTTP, a negative Retry-After and a summary
  comment without an id are GitHubErrors or passed over, not internal errors.
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from review_testutil import FakeGitHub, GitRepo, must_hold_repo, sarif_errors

from zoomer_ar.cli import main
from zoomer_ar.review import review
from zoomer_ar.review.github import Client, GitHubError, GitHubTarget, post
from zoomer_ar.review.render import render_markdown

REPO = "acme/trainer"
PR = 7
REVIEWS = f"/repos/{REPO}/pulls/{PR}/reviews"


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["review", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _branch_repo(path: Path, name: str, base: bytes | str, head: bytes | str) -> GitRepo:
    repo = GitRepo(path)
    repo.write(name, base)
    repo.commit("base")
    repo.branch("feat")
    repo.write(name, head)
    repo.commit("feat")
    return repo


# --------------------------------------------------------------------------------------------
# Line breaks: form feeds and CR-only files
# --------------------------------------------------------------------------------------------


def test_form_feed_lines_do_not_hide_findings(tmp_path):
    """str.splitlines counts a form feed as a line break: the prefilter then read the wrong lines
    and dropped the optimizer fixer for the added line."""
    base = "import torch\n\x0c\n\x0c\n\x0c\nx = 1\n"
    repo = _branch_repo(tmp_path / "r", "a.py", base, base + "opt = torch.optim.Adam(params, lr=1e-3, foreach=False)\n")
    result = review(repo.path, "main", "feat")
    assert [(f.rule_id, f.line, f.comment_line) for f in result.findings] == [("single-tensor-optimizer", 6, 6)]
    assert result.findings[0].suggestion == "opt = torch.optim.Adam(params, lr=1e-3, foreach=True)"


MAC_BASE = ("import torch\rfrom torch.utils.data import DataLoader\r\r\rdef train(model, ds):\r"
            "    loader = DataLoader(ds, batch_size=32)\r    for x in loader:\r        loss = model(x).sum()\r"
            "        loss.backward()\r")
MAC_HEAD = MAC_BASE + "        torch.cuda.synchronize()\r        print(loss.item())\r"


def test_cr_only_file_findings_on_changed_lines(tmp_path):
    """To git a CR-only file is one line: the review maps its change to Python's lines 10-11,
    reports what is there (not the DataLoader on an unchanged line) and comments on git's line 1."""
    repo = _branch_repo(tmp_path / "r", "mac.py", MAC_BASE.encode(), MAC_HEAD.encode())
    result = review(repo.path, "main", "feat")
    got = [(f.rule_id, f.line, f.comment_line, f.comment_start_line, f.suggestion) for f in result.findings]
    assert got == [("sync-point", 10, 1, None, None), ("sync-point", 11, 1, None, None)]
    assert "-        torch.cuda.synchronize()" in result.findings[0].fix_diff  # the rewrite is still shown, as a diff
    # a CR-only file added whole: every finding is on a changed line
    repo2 = GitRepo(tmp_path / "r2")
    repo2.write("README.md", "x\n")
    repo2.commit("base")
    repo2.branch("feat")
    repo2.write("mac.py", MAC_HEAD.encode())
    repo2.commit("feat")
    rules = [(f.rule_id, f.line, f.comment_line) for f in review(repo2.path, "main", "feat").findings]
    assert rules == [("dataloader-bound", 6, 1), ("sync-point", 10, 1), ("sync-point", 11, 1)]


def test_crlf_files_are_unaffected(tmp_path):
    base = MAC_BASE.replace("\r", "\r\n")
    repo = _branch_repo(tmp_path / "r", "w.py", base.encode(), MAC_HEAD.replace("\r", "\r\n").encode())
    got = [(f.rule_id, f.line, f.comment_line, f.suggestion is not None) for f in review(repo.path, "main", "feat").findings]
    assert got == [("sync-point", 10, 10, True), ("sync-point", 11, 11, False)]  # .item() outside enumerate: no rewrite


# --------------------------------------------------------------------------------------------
# Suggestions that parse alone and together
# --------------------------------------------------------------------------------------------


def _apply_suggestions(source: str, comments: list[dict]) -> str:
    """What GitHub's "commit suggestion" does: lines start_line..line become the block's body."""
    lines = source.splitlines(keepends=True)
    for c in sorted(comments, key=lambda c: -c["line"]):
        m = re.search(r"^(`{3,})suggestion\n(.*?)^\1$", c["body"], re.S | re.M)
        body = m.group(2)
        start = c.get("start_line") or c["line"]
        lines[start - 1:c["line"]] = [body] if body else []
    return "".join(lines)


def _suggested(payload: dict) -> list[dict]:
    return [c for c in payload["comments"] if "```suggestion" in c["body"]]


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


R2_BASE = "import torch\n\ndef f(loader):\n    for x in loader:\n        pass\n"
R2_HEAD = "import torch\n\ndef f(loader):\n    for x in loader:\n        torch.cuda.synchronize()\n        torch.cuda.empty_cache()\n"


def test_neighbouring_suggestions_become_one_that_parses(tmp_path, capsys):
    """r2: the loop body is synchronize() then empty_cache(); each deletion alone parses, both
    together leave the `for` empty. One suggestion covers both lines and keeps a `pass`."""
    repo = _branch_repo(tmp_path / "r", "a.py", R2_BASE, R2_HEAD)
    rc, out, _ = _run(capsys, "--repo", str(repo.path), "--base", "main", "--head", "feat", "--format", "github")
    assert rc == 0
    payload = json.loads(out)
    assert [c["body"].split("`")[1] for c in payload["comments"]] == ["sync-point", "allocator-churn"]
    suggested = _suggested(payload)
    assert len(suggested) == 1
    assert (suggested[0].get("start_line"), suggested[0]["line"]) == (5, 6)
    assert "```suggestion\n        pass\n```" in suggested[0]["body"]
    for c in suggested:
        assert _parses(_apply_suggestions(R2_HEAD, [c]))
    assert _apply_suggestions(R2_HEAD, suggested) == "import torch\n\ndef f(loader):\n    for x in loader:\n        pass\n"
    # the same code through `zoomer-ar fix`
    result = review(repo.path, "main", "feat")
    assert [f.suggestion for f in result.findings] == ["        pass", None]
    assert result.findings[1].comment_line == 6 and "empty_cache" in result.findings[1].fix_diff


ALL_SUGGESTIONS_HEAD = '''\
import torch
from torch.utils.data import DataLoader


def train(model, ds, opt):
    loader = DataLoader(ds, batch_size=32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    for x in loader:
        torch.cuda.synchronize()

        # flush
        torch.cuda.empty_cache()
    while True:
        torch.cuda.empty_cache()
    for z in loader:
        torch.cuda.synchronize()

        torch.cuda.empty_cache()
    for y in loader:
        torch.cuda.synchronize()
        loss = model(y).sum()
        print(loss.item())
'''


def test_every_suggestion_alone_and_all_together_parse(tmp_path, capsys):
    repo = _branch_repo(tmp_path / "r", "t.py", "import torch\n", ALL_SUGGESTIONS_HEAD)
    rc, out, _ = _run(capsys, "--repo", str(repo.path), "--base", "main", "--head", "feat", "--format", "github")
    payload = json.loads(out)
    suggested = _suggested(payload)
    assert rc == 0 and len(suggested) >= 4
    spans = sorted((c.get("start_line") or c["line"], c["line"]) for c in suggested)
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))  # no two suggestions share a line
    for c in suggested:
        assert _parses(_apply_suggestions(ALL_SUGGESTIONS_HEAD, [c])), c["body"]
    assert _parses(_apply_suggestions(ALL_SUGGESTIONS_HEAD, suggested))
    # adjacent findings that combine fine keep a suggestion each (DataLoader and optimizer lines)
    lines = {c["line"] for c in suggested}
    assert {6, 7} <= lines


# --------------------------------------------------------------------------------------------
# GitHub: the 422 fallback is not posted again
# --------------------------------------------------------------------------------------------


def _post(gh: FakeGitHub, result):
    target = GitHubTarget(api_url=gh.url, repository=REPO, pr=PR, token=gh.token)
    return post(result, target, client=Client(gh.url, gh.token, backoff=0.0, max_wait=2.0))


def test_fallback_review_is_not_posted_again(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    result = review(repo.path, "main", "feature")
    with FakeGitHub(REPO) as gh:
        for f in result.findings:  # GitHub refuses every line: the findings go in the review body
            gh.reject_lines.add((f.path, f.comment_line))
        first = _post(gh, result)
        assert first.notes and first.inline_posted == 0
        assert len(gh.reviews[PR]) == 1 and "did not accept" in gh.reviews[PR][0]["body"]
        assert gh.reviews[PR][0]["body"].count("<!-- zoomer-ar:finding rule=") == 3
        for _ in range(2):
            gh.requests.clear()
            again = _post(gh, result)
            assert not [r for r in gh.requests if r.method == "POST" and r.path == REVIEWS]
            assert ("GET", REVIEWS) in gh.calls()
            assert again.inline_duplicates == 3 and again.inline_posted == 0 and not again.notes
        assert len(gh.reviews[PR]) == 1
        # a new finding is still posted (GitHub accepts its line)
        repo.write("train.py", repo.path.joinpath("train.py").read_text() + "\n\ndef flush():\n    for _ in range(3):\n        torch.cuda.empty_cache()\n")
        repo.commit("push 2")
        out = _post(gh, review(repo.path, "main", "feature"))
        assert out.inline_posted == 1 and out.inline_duplicates == 3


def test_fallback_review_not_repeated_through_the_cli(tmp_path, capsys, monkeypatch):
    repo = must_hold_repo(tmp_path / "r")
    args = ["--repo", str(repo.path), "--base", "main", "--head", "feature", "--post", "--pr", str(PR), "--format", "text"]
    with FakeGitHub(REPO) as gh:
        for k, v in gh.env(pr=PR).items():
            monkeypatch.setenv(k, v)
        for f in review(repo.path, "main", "feature").findings:
            gh.reject_lines.add((f.path, f.comment_line))
        assert _run(capsys, *args)[0] == 0
        rc, _, err = _run(capsys, *args)
        assert rc == 0 and "3 already posted" in err
        assert len(gh.reviews[PR]) == 1 and [r.method for r in gh.requests if r.path == REVIEWS] == ["POST", "POST", "GET"]


# --------------------------------------------------------------------------------------------
# -o: one line, exit 2, nothing left behind
# --------------------------------------------------------------------------------------------


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".git" not in p.parts)


def test_output_to_a_directory_is_a_one_line_error(tmp_path, capsys):
    repo = must_hold_repo(tmp_path / "r")
    (tmp_path / "outdir").mkdir()
    before = _listing(tmp_path)
    rc, out, err = _run(capsys, "--repo", str(repo.path), "--base", "main", "--head", "feature", "-o", str(tmp_path / "outdir"))
    assert rc == 2 and out == ""
    assert err.strip().splitlines() == [f"zoomer-ar: error: cannot write {tmp_path / 'outdir'}: it is a directory"]
    assert _listing(tmp_path) == before  # no outdir.tmp


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_output_to_an_unwritable_place_is_a_one_line_error(tmp_path, capsys):
    repo = must_hold_repo(tmp_path / "r")
    rc, out, err = _run(capsys, "--repo", str(repo.path), "--base", "main", "--head", "feature", "-o", "/proc/x.md")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "cannot write /proc/x.md" in err and "internal error" not in err
    (tmp_path / "file").write_text("x")
    rc, _, err = _run(capsys, "--repo", str(repo.path), "--base", "main", "--head", "feature", "-o", str(tmp_path / "file" / "x.md"))
    assert rc == 2 and "cannot write" in err and len(err.strip().splitlines()) == 1


def test_failed_write_leaves_no_temporary_file_or_new_folder(tmp_path, monkeypatch):
    from zoomer_ar.errors import OutputError
    from zoomer_ar.review import cli

    def refuse(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OutputError, match="No space left on device"):
        cli._write("text\n", str(tmp_path / "new" / "deeper" / "out.md"))
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    cli._write("text\n", str(tmp_path / "new" / "out.md"))
    assert _listing(tmp_path) == ["new", "new/out.md"]
    assert (tmp_path / "new" / "out.md").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --------------------------------------------------------------------------------------------
# SARIF URIs, summary shas
# --------------------------------------------------------------------------------------------


def test_sarif_uris_are_percent_encoded(tmp_path, capsys):
    name = "my dir/a#1 %20é.py"
    repo = _branch_repo(tmp_path / "r", name, "import torch\n", "import torch\nopt = torch.optim.Adam(params, lr=1e-3, foreach=False)\n")
    repo.write("bad dir/b?.py", "def f(:\n")
    repo.commit("broken")
    rc, out, _ = _run(capsys, "--repo", str(repo.path), "--base", "main", "--head", "feat", "--format", "sarif")
    doc = json.loads(out)
    assert rc == 0 and sarif_errors(doc) == []
    run = doc["runs"][0]
    uris = [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]]
    uris += [c["artifactLocation"]["uri"] for r in run["results"] for fx in r.get("fixes", []) for c in fx["artifactChanges"]]
    uris += [n["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
             for n in run["invocations"][0]["toolExecutionNotifications"]]
    assert uris == ["my%20dir/a%231%20%2520%C3%A9.py", "my%20dir/a%231%20%2520%C3%A9.py", "bad%20dir/b%3F.py"]
    assert unquote(uris[0]) == name
    for u in uris:
        assert re.fullmatch(r"(?:[A-Za-z0-9\-._~/]|%[0-9A-F]{2})+", u)


def test_summary_shows_base_and_head_shas_alike(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    text = render_markdown(review(repo.path, "main", "feature"))
    m = re.search(r"base `([0-9a-f]+)` → head `([0-9a-f]+)`", text)
    assert m and len(m.group(1)) == len(m.group(2)) == 12
    assert repo.sha("main").startswith(m.group(1)) and repo.sha("feature").startswith(m.group(2))
    assert "head `working tree`" in render_markdown(review(repo.path, "main", None))


# --------------------------------------------------------------------------------------------
# GitHub answers that are not what the API sends
# --------------------------------------------------------------------------------------------

RAW_ANSWERS = {
    "html": b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 24\r\n\r\n<html>proxy error</html>",
    "truncated": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n[1,2",
    "not-http": b"GARBAGE\r\n\r\n",
}


def _raw_server(answer: bytes):
    """A server on 127.0.0.1 that answers every request with `answer` and closes the connection."""
    import socket
    import threading

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("kind", sorted(RAW_ANSWERS))
def test_github_answer_that_is_not_json_or_not_http_is_a_github_error(tmp_path, kind):
    """A 200 with an HTML page (a proxy), an answer cut short (IncompleteRead) or one that is not HTTP
    (BadStatusLine) made `review --post` an internal error (JSONDecodeError, IncompleteRead, BadStatusLine)."""
    result = review(must_hold_repo(tmp_path / "r").path, "main", "feature")
    sock, url = _raw_server(RAW_ANSWERS[kind])
    try:
        with pytest.raises(GitHubError) as err:
            post(result, GitHubTarget(url, REPO, PR, "t"), client=Client(url, "t", backoff=0.0, retries=1))
    finally:
        sock.close()
    assert f"/repos/{REPO}/issues/{PR}/comments" in str(err.value)
    assert ("not JSON" in str(err.value)) == (kind == "html"), str(err.value)


def test_negative_retry_after_and_a_comment_without_id(tmp_path):
    """`Retry-After: -5` made the client sleep a negative time (ValueError: internal error); an earlier
    summary comment listed without an id was a KeyError. Now the wait is none and the comment is passed over."""
    from review_testutil import Failure

    from zoomer_ar.review.render import SUMMARY_MARKER

    result = review(must_hold_repo(tmp_path / "r").path, "main", "feature")
    with FakeGitHub(REPO) as gh:
        gh.failures.append(Failure("GET", f"/repos/{REPO}/issues/{PR}/comments", 429, {"Retry-After": "-5"},
                                   {"message": "slow down"}))
        gh.issue_comments[PR] = [{"body": f"{SUMMARY_MARKER} an old summary, listed without its id"}]
        out = post(result, GitHubTarget(gh.url, REPO, PR, gh.token), client=Client(gh.url, gh.token, backoff=0.0))
    assert out.summary == "created" and out.inline_posted == 3
