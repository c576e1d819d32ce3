"""The GitHub webhook end to end: a signed pull_request event queues a `review` job; a worker fetches the PR's
commits into the configured clone (from its origin's pull/N/head ref) and runs zoomer_ar.review on them."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from zoomer_ar.service.webhook import sign

from service_testutil import Server, wait_job

SECRET = "hook-secret"
BASE = '''"""Training utilities."""
import torch
from torch.utils.data import DataLoader


def evaluate(model, dataset):
    total = 0.0
    return total
'''
HEAD = BASE + '''

def train(model, dataset):
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    for step, (x, y) in enumerate(loader):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        print(step, loss.item())
'''
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


def git(cwd: Path, *args: str) -> str:
    import os

    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **GIT_ENV})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """origin (with the PR as refs/pull/7/head only) and the service's clone (without the PR's head commit)."""
    root = tmp_path_factory.mktemp("gh")
    origin = root / "origin"
    origin.mkdir()
    git(origin, "init", "-q", "-b", "main")
    (origin / "train.py").write_text(BASE)
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "base")
    base = git(origin, "rev-parse", "HEAD")
    clone = root / "clone"
    git(root, "clone", "-q", str(origin), str(clone))
    git(origin, "checkout", "-q", "-b", "feature")
    (origin / "train.py").write_text(HEAD)
    git(origin, "commit", "-q", "-am", "train loop")
    head = git(origin, "rev-parse", "HEAD")
    git(origin, "update-ref", "refs/pull/7/head", head)
    git(origin, "checkout", "-q", "main")
    git(origin, "branch", "-q", "-D", "feature")  # only the pull ref has it, as on GitHub for a fork's PR
    return {"clone": clone, "base": base, "head": head}


@pytest.fixture(scope="module")
def server(tmp_path_factory, repos):
    s = Server(tmp_path_factory.mktemp("hook"), args=(
        "--webhook-secret", SECRET, "--webhook-repo", f"acme/trainer={repos['clone']}", "--webhook-team", "platform"))
    yield s
    s.stop()


def _deliver(server, payload: dict, event: str = "pull_request", secret: str = SECRET,
             delivery: str | None = None) -> httpx.Response:
    """A delivery as GitHub sends it: each with its own X-GitHub-Delivery id, unless `delivery` (a redelivery)."""
    body = json.dumps(payload).encode()
    return httpx.post(server.url + "/v1/github/webhook", content=body, timeout=30, headers={
        "X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "Content-Type": "application/json", "X-Hub-Signature-256": sign(secret, body)})


def _pr(repos, action: str = "opened") -> dict:
    return {"action": action, "number": 7,
            "repository": {"full_name": "acme/trainer", "url": "https://api.github.com/repos/acme/trainer"},
            "pull_request": {"number": 7, "base": {"sha": repos["base"], "ref": "main"},
                             "head": {"sha": repos["head"], "ref": "feature"}}}


def test_pull_request_event_runs_review(server, repos):
    assert _deliver(server, _pr(repos), secret="wrong").status_code == 401
    r = _deliver(server, _pr(repos))
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "queued"
    jid = r.json()["job_id"]
    with server.client(server.token("platform")) as c:
        body = wait_job(c, jid, server=server)
        assert body["state"] == "done", (body, server.logs())
        assert body["kind"] == "review" and body["name"] == "acme/trainer#7"
        assert body["result"]["posted"] is False  # --webhook-post is off
        review = c.get(f"/v1/jobs/{jid}/review.json").json()
        rules = {f["rule_id"] for f in review["findings"]}
        assert {"dataloader-bound", "single-tensor-optimizer", "sync-point"} <= rules, rules
        assert all(f["path"] == "train.py" for f in review["findings"])
        assert review["head_sha"] == repos["head"]
        md = c.get(f"/v1/jobs/{jid}/review.md")
        assert md.status_code == 200 and "dataloader" in md.text.lower()
        sarif = c.get(f"/v1/jobs/{jid}/review.sarif").json()
        assert sarif["version"] == "2.1.0"
        assert c.get(f"/v1/jobs/{jid}/report.html").status_code == 404
    with server.client(server.token("vision")) as other:
        assert other.get(f"/v1/jobs/{jid}").status_code == 404
    # the worker fetched the PR's head into the clone
    assert git(repos["clone"], "cat-file", "-t", repos["head"]) == "commit"


def test_unknown_commits_fail_the_review_job_with_the_reason(server, repos):
    payload = _pr(repos, "synchronize")
    payload["number"] = payload["pull_request"]["number"] = 8
    payload["pull_request"]["head"]["sha"] = "f" * 40
    r = _deliver(server, payload)
    assert r.status_code == 202
    with server.client(server.token("platform")) as c:
        body = wait_job(c, r.json()["job_id"], server=server)
    assert body["state"] == "failed" and "ffffffffffff" in body["error"] and "not found" in body["error"]


def test_a_redelivered_delivery_is_reviewed_once_unless_its_review_failed(server, repos):
    """GitHub redelivers a delivery with the same X-GitHub-Delivery (by hand, or after a timeout): the review job it
    queued answers again (one review, one post on the pull request); a delivery whose review failed runs again."""
    payload = _pr(repos, "reopened")
    first = _deliver(server, payload, delivery="redelivered-1")
    assert first.status_code == 202, first.text
    jid = first.json()["job_id"]
    again = _deliver(server, payload, delivery="redelivered-1")
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "duplicate" and again.json()["job_id"] == jid
    assert "redelivered-1" in again.json()["reason"]
    other = _deliver(server, payload, delivery="redelivered-2")  # another delivery of the same event: its own job
    assert other.status_code == 202 and other.json()["job_id"] != jid
    with server.client(server.token("platform")) as c:
        names = [j["id"] for j in c.get("/v1/jobs", params={"limit": 500}).json()["jobs"]]
        assert names.count(jid) == 1
        wait_job(c, jid, server=server)
        wait_job(c, other.json()["job_id"], server=server)

    failing = _pr(repos, "synchronize")
    failing["number"] = failing["pull_request"]["number"] = 9
    failing["pull_request"]["head"]["sha"] = "e" * 40
    r = _deliver(server, failing, delivery="redelivered-3")
    with server.client(server.token("platform")) as c:
        assert wait_job(c, r.json()["job_id"], server=server)["state"] == "failed"
        retry = _deliver(server, failing, delivery="redelivered-3")
        assert retry.status_code == 202 and retry.json()["job_id"] != r.json()["job_id"], retry.text
        assert wait_job(c, retry.json()["job_id"], server=server)["state"] == "failed"


def test_a_delivery_declaring_more_than_the_cap_is_413_before_its_body(server):
    # before: the server waited for the declared terabyte (or read 25 MB of it) and the client got the read
    # timeout's 408; the declared length alone now answers 413, as POST /v1/jobs does
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/github/webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"X-GitHub-Event: pull_request\r\nContent-Length: 1000000000000\r\n\r\n{}")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    detail = json.loads(answer.partition(b"\r\n\r\n")[2])["detail"]
    assert detail == "payload larger than 26,214,400 bytes (Content-Length: 1,000,000,000,000)", detail
