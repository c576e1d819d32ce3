"""Posting to GitHub, against a real HTTP server on 127.0.0.1 that implements the endpoints used:
exact requests, create vs update of the summary, no repeated inline comments, the cap, rate
limits (403/429 with headers), 5xx retries, 422 fallback and configuration from the environment."""

from __future__ import annotations

import json
import time

import pytest
from review_testutil import FEATURE_TRAIN, MUST_HOLD, FakeGitHub, Failure, must_hold_repo

from zoomer_ar.errors import InputError
from zoomer_ar.review import review
from zoomer_ar.review.github import Client, GitHubError, GitHubTarget, post, pr_from_event, target_from_env
from zoomer_ar.review.render import SUMMARY_MARKER

REPO = "acme/trainer"
PR = 7


@pytest.fixture
def gh():
    with FakeGitHub(REPO) as fake:
        yield fake


@pytest.fixture
def result(tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    return review(repo.path, "main", "feature")


def _post(gh: FakeGitHub, result, **kw):
    target = GitHubTarget(api_url=gh.url, repository=REPO, pr=PR, token=gh.token)
    client = Client(gh.url, gh.token, backoff=0.0, max_wait=2.0)
    return post(result, target, client=client, **kw)


ISSUE_COMMENTS = f"/repos/{REPO}/issues/{PR}/comments"
REVIEW_COMMENTS = f"/repos/{REPO}/pulls/{PR}/comments"
REVIEWS = f"/repos/{REPO}/pulls/{PR}/reviews"


def test_first_run_creates_the_summary_and_one_review(gh, result):
    out = _post(gh, result)
    assert gh.calls() == [("GET", ISSUE_COMMENTS), ("GET", REVIEW_COMMENTS), ("POST", ISSUE_COMMENTS), ("POST", REVIEWS)]
    for r in gh.requests:
        assert r.headers["authorization"] == f"Bearer {gh.token}"
        assert r.headers["accept"] == "application/vnd.github+json"
        assert r.headers["x-github-api-version"] == "2022-11-28"
    assert gh.requests[0].query == {"per_page": ["100"]}
    summary = gh.requests[2].body["body"]
    assert summary.startswith(SUMMARY_MARKER) and "**3 findings**" in summary
    review_body = gh.requests[3].body
    assert review_body["commit_id"] == result.head_sha and review_body["event"] == "COMMENT"
    comments = review_body["comments"]
    assert [(c["path"], c["line"], c["side"]) for c in comments] == [("train.py", line, "RIGHT") for _, line in MUST_HOLD]
    assert all("<!-- zoomer-ar:finding rule=" in c["body"] for c in comments)
    # the DataLoader's fix reaches past the hunk (`import os` and DATALOADER_WORKERS after the imports): a diff
    assert ["```suggestion\n" in c["body"] for c in comments] == [r != "dataloader-bound" for r, _ in MUST_HOLD]
    assert "foreach=True" in comments[1]["body"]
    assert out.summary == "created" and out.inline_posted == 3 and out.inline_duplicates == 0
    assert len(gh.issue_comments[PR]) == 1 and len(gh.review_comments[PR]) == 3


def test_second_run_updates_and_never_repeats(gh, result):
    _post(gh, result)
    first_id = gh.issue_comments[PR][0]["id"]
    gh.requests.clear()
    out = _post(gh, result)
    assert gh.calls() == [
        ("GET", ISSUE_COMMENTS),
        ("GET", REVIEW_COMMENTS), ("GET", REVIEW_COMMENTS),  # 3 comments, pages of 2
        ("PATCH", f"/repos/{REPO}/issues/comments/{first_id}"),
    ]
    assert out.summary == "updated" and out.inline_posted == 0 and out.inline_duplicates == 3
    assert len(gh.issue_comments[PR]) == 1 and len(gh.review_comments[PR]) == 3 and len(gh.reviews[PR]) == 1


def test_summary_found_among_other_comments_on_a_later_page(gh, result):
    gh.issue_comments[PR] = [{"id": i, "body": f"human comment {i}"} for i in range(1, 4)]
    gh.issue_comments[PR].append({"id": 50, "body": SUMMARY_MARKER + "\nold summary"})
    _post(gh, result)
    assert ("PATCH", f"/repos/{REPO}/issues/comments/50") in gh.calls()
    assert [c["id"] for c in gh.issue_comments[PR]] == [1, 2, 3, 50]
    assert "**3 findings**" in gh.issue_comments[PR][-1]["body"]
    # the Link header's next page was followed
    assert [r.query.get("page") for r in gh.requests if r.path == ISSUE_COMMENTS] == [None, ["2"]]


def test_a_new_push_posts_only_new_findings(gh, tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    _post(gh, review(repo.path, "main", "feature"))
    repo.write("train.py", FEATURE_TRAIN + "\n\ndef flush():\n    for _ in range(3):\n        torch.cuda.empty_cache()\n")
    repo.commit("push 2")
    gh.requests.clear()
    out = _post(gh, review(repo.path, "main", "feature"))
    posted = [r for r in gh.requests if r.method == "POST" and r.path == REVIEWS]
    assert len(posted) == 1 and [c["body"].split("`")[1] for c in posted[0].body["comments"]] == ["allocator-churn"]
    assert out.inline_posted == 1 and out.inline_duplicates == 3 and out.summary == "updated"


def test_same_rule_on_the_same_line_is_not_repeated_even_if_the_code_changed(gh, result):
    # a comment already there (from an earlier push) on the same path, line and rule
    f = result.findings[0]
    gh.review_comments[PR] = [{"id": 1, "path": f.path, "line": f.comment_line, "original_line": f.comment_line,
                               "body": f"old\n<!-- zoomer-ar:finding rule={f.rule_id} fp={'0' * 32}:1 -->"}]
    out = _post(gh, result)
    assert out.inline_duplicates == 1 and out.inline_posted == 2


def test_inline_comments_are_capped(gh, result):
    out = _post(gh, result, max_comments=2)
    assert out.inline_posted == 2 and out.inline_over_cap == 1
    assert "over the cap of 2" in gh.issue_comments[PR][0]["body"]
    out = _post(gh, result, max_comments=2)  # the next run posts what the cap held back
    assert out.inline_posted == 1 and out.inline_duplicates == 2 and out.inline_over_cap == 0


def test_primary_rate_limit_is_a_clear_error(gh, result):
    reset = int(time.time()) + 3600
    gh.failures.append(Failure("GET", ISSUE_COMMENTS, 403, {"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "0",
                                                           "X-RateLimit-Reset": str(reset)}, {"message": "API rate limit exceeded"}))
    with pytest.raises(GitHubError) as err:
        _post(gh, result)
    msg = str(err.value)
    assert "rate limit exceeded" in msg and "5000 requests/hour" in msg and "resets at" in msg and "GET /repos/acme/trainer/issues/7/comments" in msg
    assert err.value.status == 403 and len(gh.requests) == 1  # no retry: the reset is an hour away


def test_short_rate_limit_waits_are_honoured(gh, result):
    gh.failures.append(Failure("GET", ISSUE_COMMENTS, 429, {"Retry-After": "0"}, {"message": "slow down"}))
    reset = int(time.time())  # already reset
    gh.failures.append(Failure("POST", REVIEWS, 403, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(reset)}))
    out = _post(gh, result)
    assert gh.calls() == [("GET", ISSUE_COMMENTS), ("GET", ISSUE_COMMENTS), ("GET", REVIEW_COMMENTS),
                          ("POST", ISSUE_COMMENTS), ("POST", REVIEWS), ("POST", REVIEWS)]
    assert out.inline_posted == 3


def test_secondary_rate_limit_with_a_long_wait_stops(gh, result):
    gh.failures.append(Failure("POST", ISSUE_COMMENTS, 403, {"Retry-After": "120"},
                               {"message": "You have exceeded a secondary rate limit"}))
    with pytest.raises(GitHubError, match=r"secondary rate limit .*retry after 120 s"):
        _post(gh, result)


def test_server_errors_are_retried(gh, result):
    gh.failures.append(Failure("GET", REVIEW_COMMENTS, 502, times=2))
    out = _post(gh, result)
    assert gh.calls()[:4] == [("GET", ISSUE_COMMENTS), ("GET", REVIEW_COMMENTS), ("GET", REVIEW_COMMENTS), ("GET", REVIEW_COMMENTS)]
    assert out.inline_posted == 3


def test_persistent_server_errors_fail_with_a_message(gh, result):
    gh.failures.append(Failure("POST", ISSUE_COMMENTS, 500, times=10, body={"message": "boom"}))
    with pytest.raises(GitHubError, match=r"POST /repos/acme/trainer/issues/7/comments: 500 server error after retries: boom"):
        _post(gh, result)
    assert [c for c in gh.calls() if c[0] == "POST"] == [("POST", ISSUE_COMMENTS)] * 4  # 1 + 3 retries


def test_lines_github_refuses_fall_back_to_the_review_body(gh, result):
    gh.reject_lines.add(("train.py", MUST_HOLD[0][1]))
    out = _post(gh, result)
    reviews = [r for r in gh.requests if r.path == REVIEWS]
    assert len(reviews) == 2 and "comments" not in reviews[1].body
    assert "did not accept" in reviews[1].body["body"] and "train.py:" in reviews[1].body["body"]
    assert out.notes and out.inline_posted == 0


def test_bad_token_and_unreachable_api(gh, result):
    target = GitHubTarget(api_url=gh.url, repository=REPO, pr=PR, token="wrong")
    with pytest.raises(GitHubError, match="401 Unauthorized: Bad credentials"):
        post(result, target, client=Client(gh.url, "wrong", backoff=0.0))
    url = gh.url
    gh.__exit__(None, None, None)
    with pytest.raises(GitHubError, match="cannot reach the GitHub API"):
        post(result, GitHubTarget(url, REPO, PR, "t"), client=Client(url, "t", backoff=0.0, retries=1))


def test_target_from_the_environment(tmp_path):
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"action": "opened", "number": 12, "pull_request": {"number": 12}}))
    env = {"GITHUB_TOKEN": "x", "GITHUB_REPOSITORY": "o/r", "GITHUB_EVENT_PATH": str(event),
           "GITHUB_API_URL": "https://ghe.example.invalid/api/v3/"}
    t = target_from_env(env=env)
    assert (t.api_url, t.repository, t.pr, t.token) == ("https://ghe.example.invalid/api/v3", "o/r", 12, "x")
    assert target_from_env(pr=3, env=env).pr == 3
    assert target_from_env(env={k: v for k, v in env.items() if k != "GITHUB_API_URL"}).api_url == "https://api.github.com"
    issue = tmp_path / "issue.json"
    issue.write_text(json.dumps({"issue": {"number": 5, "pull_request": {"url": "u"}}}))
    assert pr_from_event(str(issue)) == 5
    with pytest.raises(InputError, match="GITHUB_TOKEN"):
        target_from_env(env={"GITHUB_REPOSITORY": "o/r"})
    with pytest.raises(InputError, match="pull-request number"):
        target_from_env(env={"GITHUB_TOKEN": "x", "GITHUB_REPOSITORY": "o/r"})
    with pytest.raises(InputError, match="owner/name"):
        target_from_env(pr=1, env={"GITHUB_TOKEN": "x", "GITHUB_REPOSITORY": "nope"})


def test_clean_review_posts_nothing_but_clears_an_old_summary(gh, tmp_path):
    repo = must_hold_repo(tmp_path / "r")
    clean = review(repo.path, "feature", "feature")
    out = _post(gh, clean)
    assert gh.calls() == [("GET", ISSUE_COMMENTS), ("GET", REVIEW_COMMENTS)] and out.summary.startswith("not needed")
    _post(gh, review(repo.path, "main", "feature"))
    gh.requests.clear()
    out = _post(gh, clean)
    assert out.summary == "updated" and "No performance anti-patterns" in gh.issue_comments[PR][0]["body"]
    assert not [r for r in gh.requests if r.path == REVIEWS]
