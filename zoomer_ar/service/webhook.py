"""The GitHub webhook: signature check and pull-request events -> `review` jobs.

GitHub signs each delivery with the webhook's secret: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256
of the raw body>`. A delivery without it, with another algorithm, or with a wrong digest is refused
(401) before the body is parsed; so is every delivery when the server has no secret configured.

Events:
- `ping` -> 200 `{"status": "pong"}`;
- `pull_request` with action opened, synchronize, reopened or ready_for_review, for a repository
  configured with `--webhook-repo owner/name=PATH` (a local clone the worker fetches the PR's commits
  into when they are missing) -> a `review` job (202 with its id), run by a worker:
  `zoomer_ar.review.review(PATH, base=<base sha>, head=<head sha>)`, with review.json, review.md and
  review.sarif as artifacts, posted to the pull request when `--webhook-post` is set (GITHUB_TOKEN) and
  the event names it (a positive integer `number`; otherwise the review is not posted), on the GitHub API
  the server is configured with (`--github-api-url` / GITHUB_API_URL; never the payload's `repository.url`);
- anything else -> 200 `{"status": "ignored", "reason": ...}`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import Any

from ..review.github import pr_number
from .config import Settings

REVIEW_ACTIONS = ("opened", "synchronize", "reopened", "ready_for_review")
_SHA = re.compile(r"^[0-9a-fA-F]{7,64}$")


def sign(secret: str, body: bytes) -> str:
    """The X-Hub-Signature-256 value GitHub would send for `body`."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify(secret: str | None, body: bytes, header: str | None) -> bool:
    if not secret or not header or not header.startswith("sha256="):
        return False
    return hmac.compare_digest(sign(secret, body).encode("ascii"), header.strip().encode("ascii", "replace"))


class WebhookError(ValueError):
    """A signed delivery whose payload is unusable (400)."""


def review_job(settings: Settings, event: str | None, body: bytes) -> tuple[str, dict[str, Any]]:
    """What to do with a verified delivery: ("pong" | "ignored" | "review", details)."""
    if event == "ping":
        return "pong", {}
    if event != "pull_request":
        return "ignored", {"reason": f"event {event!r} is not handled"}
    try:
        payload = json.loads(body)
    except ValueError:
        raise WebhookError("payload is not JSON") from None
    if not isinstance(payload, dict):
        raise WebhookError("payload is not a JSON object")
    action = payload.get("action")
    if action not in REVIEW_ACTIONS:
        return "ignored", {"reason": f"pull_request action {action!r} is not reviewed"}
    pr, repo = payload.get("pull_request"), payload.get("repository")
    if not isinstance(pr, dict) or not isinstance(repo, dict):
        raise WebhookError("pull_request event without pull_request/repository objects")
    full = repo.get("full_name")
    base, head = (pr.get("base") or {}).get("sha"), (pr.get("head") or {}).get("sha")
    number = pr_number(pr.get("number"))
    if number is None:
        number = pr_number(payload.get("number"))
    if not isinstance(full, str) or not all(isinstance(s, str) and _SHA.match(s) for s in (base, head)):
        raise WebhookError("pull_request event without repository.full_name, base.sha and head.sha")
    path = settings.webhook_repos.get(full.lower())
    if path is None:
        return "ignored", {"reason": f"repository {full} is not configured on this server (--webhook-repo)"}
    # where the review is posted (with the server's GITHUB_TOKEN) is the server's setting (--github-api-url),
    # never the payload's repository.url: a delivery must not choose the host that receives the token
    return "review", {
        "repository": full, "repo_path": str(path), "pr": number,
        "base_sha": base, "head_sha": head, "action": action, "post": settings.webhook_post,
    }
