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
