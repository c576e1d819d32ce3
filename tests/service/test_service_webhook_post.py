"""The webhook with --webhook-post, end to end: `zoomer-ar serve` (one embedded worker) with GITHUB_TOKEN,
signed pull_request deliveries, and the fake GitHub REST API of tests/review (a real HTTP server on
127.0.0.1) that records every request. What a delivery may and may not decide: which pull request is
posted to (a usable number only) and where the token goes (never a host the payload names)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from zoomer_ar.service.webhook import sign

from service_testutil import Server, wait_job

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "review"))
from review_testutil import FakeGitHub, must_hold_repo  # noqa: E402

SECRET = "post-secret"
REPO = "acme/trainer"


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A clone holding both commits (main, and feature with a training loop): nothing to fetch."""
    repo = must_hold_repo(tmp_path_factory.mktemp("clone") / "trainer")
    return {"path": repo.path, "base": repo.sha("main"), "head": repo.sha("feature")}


@pytest.fixture(scope="module")
def github():
    with FakeGitHub(REPO) as fake:
        yield fake


@pytest.fixture(scope="module")
def server(tmp_path_factory, clone, github):
    s = Server(tmp_path_factory.mktemp("hookpost"), args=(
        "--webhook-secret", SECRET, "--webhook-repo", f"{REPO}={clone['path']}", "--webhook-post"),
        env={"GITHUB_TOKEN": github.token, "GITHUB_API_URL": github.url})
    yield s
    s.stop()


def _deliver(server, payload: dict) -> httpx.Response:
    body = json.dumps(payload).encode()
    return httpx.post(server.url + "/v1/github/webhook", content=body, timeout=30, headers={
        "X-GitHub-Event": "pull_request", "Content-Type": "application/json", "X-Hub-Signature-256": sign(SECRET, body)})


def _payload(clone, number, api: str) -> dict:
    return {"action": "opened", "number": number,
            "repository": {"full_name": REPO, "url": f"{api}/repos/{REPO}"},
            "pull_request": {"number": number, "base": {"sha": clone["base"]}, "head": {"sha": clone["head"]}}}


def _run(server, payload) -> dict:
    r = _deliver(server, payload)
    assert r.status_code == 202, r.text
    with server.client(server.token("github")) as c:
        body = wait_job(c, r.json()["job_id"], server=server)
    assert body["state"] == "done", (body, server.logs())
    return body


@pytest.mark.parametrize("number", [True, False, 0, -3, 1.0, "7", None])
def test_a_delivery_without_a_usable_pr_number_posts_nothing(server, clone, github, number):
    """`"number": true` was PR 1 (bool is an int in Python): the worker posted the review to pull request #1."""
    before = len(github.requests)
    body = _run(server, _payload(clone, number, github.url))
    assert body["name"] == REPO
    assert body["result"]["pr"] is None and body["result"]["posted"] is False
    assert body["result"]["notes"] == ["not posted: the event carries no pull-request number"]
    assert github.requests[before:] == []


def test_a_usable_pr_number_is_posted_to(server, clone, github):
    before = len(github.requests)
    body = _run(server, _payload(clone, 7, github.url))
    assert body["name"] == f"{REPO}#7" and body["result"]["posted"] is True, body
    calls = [(r.method, r.path) for r in github.requests[before:]]
    assert ("POST", f"/repos/{REPO}/issues/7/comments") in calls
    assert not any("/1/" in path for _, path in calls)


def test_the_payloads_repository_url_does_not_receive_the_token(server, clone, github):
    """The worker posted to the API named by the payload's repository.url, with the server's GITHUB_TOKEN:
    anyone who could get a delivery signed chose the host that received the token."""
    with FakeGitHub(REPO, token="attacker") as evil:
        before = len(github.requests)
        body = _run(server, _payload(clone, 9, evil.url))
        assert evil.requests == []
    assert body["result"]["posted"] is True, body
    assert ("POST", f"/repos/{REPO}/issues/9/comments") in [(r.method, r.path) for r in github.requests[before:]]
    assert all(r.headers["authorization"] == f"Bearer {github.token}" for r in github.requests[before:])


def test_an_old_job_with_an_api_url_in_its_params_posts_to_the_configured_api(tmp_path, clone, github, monkeypatch):
    """A review job queued before the fix carries the payload's api_url in its params: it is ignored."""
    from zoomer_ar.service import queue as Q
    from zoomer_ar.service.config import Settings
    from zoomer_ar.service.worker import run_review

    with FakeGitHub(REPO, token="attacker") as evil:
        monkeypatch.setenv("GITHUB_TOKEN", github.token)
        settings = Settings(data_dir=tmp_path, github_api_url=github.url)
        claim = Q.Claim(job_id="j", lease_token="t", worker="w", attempt=1, kind="review", name=REPO, team_id=1,
                        team="github", input_dir=None, params={
                            "repository": REPO, "repo_path": str(clone["path"]), "pr": 11, "base_sha": clone["base"],
                            "head_sha": clone["head"], "post": True, "api_url": evil.url})
        summary, _ = run_review(claim, settings)
        assert evil.requests == []
    assert summary["posted"] is True
    assert ("POST", f"/repos/{REPO}/issues/11/comments") in github.calls()


def test_a_worker_without_github_token_says_why_it_did_not_post(tmp_path, clone, github, monkeypatch):
    """--webhook-post with no GITHUB_TOKEN in the worker's environment: the review was done and silently not
    posted ("posted": false and nothing saying why)."""
    from zoomer_ar.service import queue as Q
    from zoomer_ar.service.config import Settings
    from zoomer_ar.service.worker import run_review

    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    before = len(github.requests)
    claim = Q.Claim(job_id="j", lease_token="t", worker="w", attempt=1, kind="review", name=REPO, team_id=1,
                    team="github", input_dir=None, params={
                        "repository": REPO, "repo_path": str(clone["path"]), "pr": 12, "base_sha": clone["base"],
                        "head_sha": clone["head"], "post": True})
    summary, artifacts = run_review(claim, Settings(data_dir=tmp_path, github_api_url=github.url))
    assert summary["posted"] is False and "review.md" in artifacts
    assert summary["notes"] == ["not posted: GITHUB_TOKEN is not set in the worker's environment"]
    assert github.requests[before:] == []


@pytest.mark.parametrize("url", ["ftp://example.com", "not a url", "https://", "https://h/api?x=1"])
def test_a_github_api_url_that_is_not_http_is_a_usage_error(url):
    from service_testutil import zoomer

    for args, env in (((f"--github-api-url={url}",), None), ((), {"GITHUB_API_URL": url})):
        out = zoomer("worker", "--exit-when-idle", "--db", "sqlite://", *args, env=env, timeout=60)
        assert out.returncode == 2, out
        assert "--github-api-url (or GITHUB_API_URL)" in out.stderr and repr(url) in out.stderr
        assert "Traceback" not in out.stderr


def test_settings_take_the_github_api_url_from_the_environment(monkeypatch):
    from zoomer_ar.service.config import Settings

    monkeypatch.delenv("GITHUB_API_URL", raising=False)
    assert Settings.from_env().github_api_url == "https://api.github.com"
    monkeypatch.setenv("GITHUB_API_URL", "https://ghe.example.invalid/api/v3/")
    assert Settings.from_env().github_api_url == "https://ghe.example.invalid/api/v3"
    assert Settings.from_env(github_api_url="http://127.0.0.1:9").github_api_url == "http://127.0.0.1:9"
