"""`review --post` creates each comment and review at most once, against the fake GitHub API (a real HTTP
server on 127.0.0.1) told to lose its answer to a POST after reading it: the connection dropped without
an answer, the client's timeout, a 502 - with the comment created first (as GitHub does when only the
answer is lost) or not. Before, the client sent the POST again blindly and the pull request got two
summary comments or two reviews."""

from __future__ import annotations

import pytest
from review_testutil import MUST_HOLD, FakeGitHub, Failure, must_hold_repo

from zoomer_ar.cli import main
from zoomer_ar.review import review
from zoomer_ar.review.github import Client, GitHubError, GitHubTarget, post
from zoomer_ar.review.render import SUMMARY_MARKER

REPO = "acme/trainer"
PR = 7
ISSUE_COMMENTS = f"/repos/{REPO}/issues/{PR}/comments"
REVIEWS = f"/repos/{REPO}/pulls/{PR}/reviews"

LOST = {  # how the answer to a POST is lost
    "dropped": {"drop": True},
    "timeout": {"drop": True, "delay": 1.0},
    "502": {"status": 502},
}


@pytest.fixture
def gh():
    with FakeGitHub(REPO) as fake:
        yield fake


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return review(must_hold_repo(tmp_path_factory.mktemp("r") / "r").path, "main", "feature")


def _post(gh: FakeGitHub, result, **kw):
    client = Client(gh.url, gh.token, backoff=0.0, max_wait=2.0, timeout=0.4)
    return post(result, GitHubTarget(gh.url, REPO, PR, gh.token), client=client, **kw)


def _posts(gh: FakeGitHub, path: str) -> int:
    return sum(1 for r in gh.requests if r.method == "POST" and r.path == path)


@pytest.mark.parametrize("lost", sorted(LOST))
def test_summary_created_but_its_answer_lost_is_not_posted_twice(gh, result, lost):
    gh.failures.append(Failure("POST", ISSUE_COMMENTS, apply=True, **LOST[lost]))
    out = _post(gh, result)
    assert [c["body"].startswith(SUMMARY_MARKER) for c in gh.issue_comments[PR]] == [True]
    assert _posts(gh, ISSUE_COMMENTS) == 1
    assert out.summary == "created" and out.summary_id == gh.issue_comments[PR][0]["id"]
    assert out.inline_posted == 3 and len(gh.reviews[PR]) == 1


@pytest.mark.parametrize("lost", sorted(LOST))
def test_summary_lost_before_github_created_it_is_posted_again(gh, result, lost):
    gh.failures.append(Failure("POST", ISSUE_COMMENTS, **LOST[lost]))
    out = _post(gh, result)
    assert len(gh.issue_comments[PR]) == 1 and _posts(gh, ISSUE_COMMENTS) == 2
    assert out.summary == "created" and out.summary_id == gh.issue_comments[PR][0]["id"]


@pytest.mark.parametrize("lost", sorted(LOST))
def test_review_created_but_its_answer_lost_is_not_posted_twice(gh, result, lost):
    gh.failures.append(Failure("POST", REVIEWS, apply=True, **LOST[lost]))
    out = _post(gh, result)
    assert len(gh.reviews[PR]) == 1 and len(gh.review_comments[PR]) == 3 and _posts(gh, REVIEWS) == 1
    assert out.inline_posted == 3 and out.review_id == gh.reviews[PR][0]["id"]


def test_fallback_review_created_but_its_answer_lost_is_not_posted_twice(gh, result):
    gh.reject_lines.add(("train.py", MUST_HOLD[0][1]))  # the inline review is refused (422): the fallback follows
    gh.failures.append(Failure("POST", REVIEWS, apply=True, drop=True, skip=1))  # the fallback: created, answer lost
    out = _post(gh, result)
    assert _posts(gh, REVIEWS) == 2 and len(gh.reviews[PR]) == 1 and "did not accept" in gh.reviews[PR][0]["body"]
    assert out.inline_posted == 0 and out.review_id == gh.reviews[PR][0]["id"] and out.notes


def test_a_summary_that_appeared_meanwhile_gets_this_runs_body(gh, result):
    """The answer is lost and the listing shows a summary comment with another body (another run's): it is updated."""
    gh.failures.append(Failure("POST", ISSUE_COMMENTS, drop=True))
    gh.issue_comments[PR] = []
    real_route = gh.route

    def route(req, host):  # the listing after the lost POST shows another run's summary
        if req.method == "GET" and req.path == ISSUE_COMMENTS and _posts(gh, ISSUE_COMMENTS) and not gh.issue_comments[PR]:
            gh.issue_comments[PR].append({"id": 99, "body": f"{SUMMARY_MARKER} another run"})
        return real_route(req, host)

    gh.route = route
    out = _post(gh, result)
    assert [c["id"] for c in gh.issue_comments[PR]] == [99] and "**3 findings**" in gh.issue_comments[PR][0]["body"]
    assert out.summary_id == 99 and _posts(gh, ISSUE_COMMENTS) == 1


def test_a_post_without_a_way_to_confirm_is_not_repeated(gh):
    gh.failures.append(Failure("POST", ISSUE_COMMENTS, apply=True, drop=True))
    client = Client(gh.url, gh.token, backoff=0.0)
    with pytest.raises(GitHubError, match=r"POST /repos/acme/trainer/issues/7/comments: .*not repeated, since "
                                          r"GitHub may have applied it"):
        client.request("POST", ISSUE_COMMENTS, {"body": "hello"})
    assert _posts(gh, ISSUE_COMMENTS) == 1 and len(gh.issue_comments[PR]) == 1


def test_a_summary_post_that_never_gets_an_answer_fails_after_the_retries(gh, result):
    gh.failures.append(Failure("POST", ISSUE_COMMENTS, drop=True, times=10))
    with pytest.raises(GitHubError, match=r"cannot reach the GitHub API at .* \(POST /repos/acme/trainer/issues/7/comments\)"):
        _post(gh, result)
    assert _posts(gh, ISSUE_COMMENTS) == 4 and gh.issue_comments[PR] == []  # 1 + 3 retries, each after a look


def test_review_post_cli_with_a_dropped_answer_posts_once(tmp_path, capsys, monkeypatch, gh):
    repo = must_hold_repo(tmp_path / "r")
    for k, v in gh.env(pr=PR, event_dir=tmp_path).items():
        monkeypatch.setenv(k, v)
    gh.failures.append(Failure("POST", ISSUE_COMMENTS, apply=True, drop=True))
    gh.failures.append(Failure("POST", REVIEWS, apply=True, drop=True))
    rc = main(["review", "--repo", str(repo.path), "--base", "main", "--head", "feature", "--post", "--format", "text"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "summary comment created" in err and "3 inline comments posted" in err
    assert len(gh.issue_comments[PR]) == 1 and len(gh.reviews[PR]) == 1 and len(gh.review_comments[PR]) == 3
