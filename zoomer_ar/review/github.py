"""Posting a review to a GitHub pull request (REST API, standard library HTTP).

Settings come from the environment GitHub Actions provides: ``GITHUB_TOKEN``, ``GITHUB_REPOSITORY``
(owner/name), ``GITHUB_API_URL`` (GitHub Enterprise Server included; default
https://api.github.com) and the pull-request number from the event payload at
``GITHUB_EVENT_PATH`` (or ``--pr``).

One run:

1. ``GET /repos/{repo}/issues/{pr}/comments`` (all pages): the summary comment this tool posted
   before carries a hidden marker; it is updated (``PATCH /repos/{repo}/issues/comments/{id}``)
   rather than a new one created (``POST /repos/{repo}/issues/{pr}/comments``).
2. ``GET /repos/{repo}/pulls/{pr}/comments`` (all pages): inline comments this tool posted carry a
   marker with the rule and the finding's fingerprint; a finding already commented (same
   fingerprint, or same rule on the same path and line) is not commented again.
   A clean review with no earlier summary posts nothing (no noise on clean pull requests); with
   one, the summary is updated to say the findings are gone.
3. Only when there are findings not commented inline and an earlier summary exists (so an
   earlier run may have posted a fallback review, see 4): ``GET /repos/{repo}/pulls/{pr}/reviews``
   (all pages); a finding listed, with its marker, in the body of a review this tool posted is
   not posted again either.
4. ``POST /repos/{repo}/pulls/{pr}/reviews`` with at most ``max_comments`` new inline comments
   (event ``COMMENT``); nothing when there is nothing new. If GitHub refuses a line (422), the
   review is posted again without inline comments, listing them in its body, each with its
   finding marker (so the next run recognises them).

Rate limits: a 403/429 with ``Retry-After`` or an exhausted ``X-RateLimit-Remaining`` waits
when the wait is short (``max_wait``), otherwise stops with a message giving the reset time.
5xx answers and connection errors are retried with backoff. Any other error stops the run with
GitHub's message.

A POST creates a comment or a review, so it is not repeated blindly: when its answer is lost after
the request went out (the connection dropped or timed out while waiting, an answer cut short, a
5xx), GitHub may have created it. Before posting again, the run lists what the POST would have
created (the summary comment by its marker; the review's inline comments and review bodies by
their finding markers) and, when it is there, takes it instead of posting a duplicate. Requests
that never reached GitHub (connection refused, DNS) are retried as before.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Callable, Mapping

from ..errors import InputError, ZoomerError
from .models import ReviewFinding, ReviewResult
from .render import SUMMARY_MARKER, inline_comment, inline_marker, parse_inline_marker, parse_markers, render_markdown
from .safe_text import readable_all

DEFAULT_API_URL = "https://api.github.com"
USER_AGENT = "zoomer-ar-review"
_NEXT_RE = re.compile(r'<([^>]+)>\s*;\s*rel="next"')


class GitHubError(ZoomerError):
    """The GitHub API refused or failed a request (message says which and why)."""

    exit_code = 1

    def __init__(self, message: str, status: int | None = None):
        self.status = status
        super().__init__(message)


@dataclass
class GitHubTarget:
    api_url: str
    repository: str  # owner/name
    pr: int
    token: str


def pr_number(value: Any) -> int | None:
    """A pull-request number: a positive int that is not a bool (JSON `true` is an int in Python); else None.
    The Actions event reader and the service's webhook and worker all take the number through it."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def pr_from_event(path: str | None) -> int | None:
    """The pull-request number in a GitHub Actions event payload (None: none usable there)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            event = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(event, dict):
        return None
    pr = event.get("pull_request")
    if isinstance(pr, dict) and pr_number(pr.get("number")) is not None:
        return pr["number"]
    issue = event.get("issue")
    if isinstance(issue, dict) and issue.get("pull_request") and pr_number(issue.get("number")) is not None:
        return issue["number"]
    return pr_number(event.get("number"))


def target_from_env(pr: int | None = None, repository: str | None = None, env: Mapping[str, str] | None = None) -> GitHubTarget:
    env = os.environ if env is None else env
    token = env.get("GITHUB_TOKEN") or env.get("GH_TOKEN")
    if not token:
        raise InputError(None, "--post needs a token in GITHUB_TOKEN (in a workflow: env: GITHUB_TOKEN: ${{ secrets.GITHUB_TOKEN }})")
    repository = repository or env.get("GITHUB_REPOSITORY")
    if not repository or not re.fullmatch(r"[\w.-]+/[\w.-]+", repository):
        raise InputError(None, f"--post needs GITHUB_REPOSITORY as owner/name (got {repository!r})")
    number = pr if pr is not None else pr_from_event(env.get("GITHUB_EVENT_PATH"))
    if number is None:
        raise InputError(None, "--post needs the pull-request number: --pr N, or a pull_request event at GITHUB_EVENT_PATH")
    api = (env.get("GITHUB_API_URL") or DEFAULT_API_URL).rstrip("/")
    return GitHubTarget(api_url=api, repository=repository, pr=int(number), token=token)


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------


#: methods whose repetition changes nothing more than their first run (a PATCH sets the same body again)
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "PATCH", "DELETE"})


class Client:
    def __init__(self, api_url: str, token: str, *, retries: int = 3, max_wait: float = 60.0, backoff: float = 1.0,
                 timeout: float = 30.0, sleep: Callable[[float], None] = time.sleep):
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.retries = retries
        self.max_wait = max_wait
        self.backoff = backoff
        self.timeout = timeout
        self.sleep = sleep
        self.requests = 0

    def _url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else f"{self.api_url}{path}"

    def request(self, method: str, path: str, body: Any = None, *,
                confirm: Callable[[], Any] | None = None) -> tuple[Any, Mapping[str, str]]:
        """One API call, retried as the module docstring says.

        A non-idempotent request (POST) whose answer is lost after it was sent (a dropped or timed-out
        connection, an answer cut short, a 5xx) may have been applied: it is sent again only when
        ``confirm`` is given and finds nothing. ``confirm()`` looks for what the request would have
        created and returns it (then returned here, with no headers) or None. Without ``confirm`` such
        a request is not repeated: one GitHubError line says it may have been applied."""
        url = self._url(path)
        shown = f"{method} {urllib.parse.urlsplit(url).path}"
        data = json.dumps(readable_all(body)).encode() if body is not None else None  # no lone surrogate (safe_text)
        repeatable = method.upper() in IDEMPOTENT
        attempt = 0
        while True:
            attempt += 1
            req = urllib.request.Request(url, data=data, method=method)
            req.add_header("Accept", "application/vnd.github+json")
            req.add_header("Authorization", f"Bearer {self.token}")
            req.add_header("X-GitHub-Api-Version", "2022-11-28")
            req.add_header("User-Agent", USER_AGENT)
            if data is not None:
                req.add_header("Content-Type", "application/json")
            self.requests += 1
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
                    headers = {k.lower(): v for k, v in resp.headers.items()}
            except urllib.error.HTTPError as err:
                raw = err.read() if err.fp is not None else b""
                headers = {k.lower(): v for k, v in (err.headers or {}).items()}
                wait = self._retry_wait(err.code, headers, attempt)
                if err.code >= 500 and not repeatable:  # GitHub may have applied it
                    found = self._confirm(confirm, shown, f"{err.code} server error")
                    if found is not None:
                        return found, {}
                if wait is not None:
                    self.sleep(wait)
                    continue
                raise GitHubError(self._message(shown, err.code, headers, raw), err.code) from None
            except urllib.error.URLError as err:
                # urllib raises URLError while connecting and sending (the request did not reach GitHub)
                if attempt <= self.retries:
                    self.sleep(min(self.max_wait, self.backoff * 2 ** (attempt - 1)))
                    continue
                reason = getattr(err, "reason", None) or f"{type(err).__name__}: {err}"
                raise GitHubError(f"cannot reach the GitHub API at {self.api_url} ({shown}): {reason}") from None
            except (TimeoutError, ConnectionError, OSError, http.client.HTTPException) as err:
                # after the request was sent: no answer (dropped, timed out), one cut short (IncompleteRead)
                # or one that is not HTTP at all (BadStatusLine)
                reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
                if not repeatable:
                    found = self._confirm(confirm, shown, reason)
                    if found is not None:
                        return found, {}
                if attempt <= self.retries:
                    self.sleep(min(self.max_wait, self.backoff * 2 ** (attempt - 1)))
                    continue
                raise GitHubError(f"cannot reach the GitHub API at {self.api_url} ({shown}): {reason}") from None
            try:
                return (json.loads(raw) if raw.strip() else None), headers
            except ValueError:  # a proxy's HTML page, say
                text = raw.decode("utf-8", "replace").strip().splitlines()
                raise GitHubError(f"GitHub API {shown}: the answer is not JSON ({text[0][:120] if text else ''!r}): "
                                  f"is GITHUB_API_URL ({self.api_url}) the API?") from None

    def _confirm(self, confirm: Callable[[], Any] | None, shown: str, what: str) -> Any:
        """What a request whose answer was lost created (confirm()), else None: send it again."""
        if confirm is None:
            raise GitHubError(f"GitHub API {shown}: {what} after the request was sent; not repeated, "
                              "since GitHub may have applied it (check the pull request)")
        return confirm()

    def _retry_wait(self, status: int, headers: Mapping[str, str], attempt: int) -> float | None:
        if attempt > self.retries:
            return None
        if status in (403, 429):
            if "retry-after" in headers:
                try:
                    wait = max(0.0, float(headers["retry-after"]))  # a negative one: now
                except ValueError:
                    return None
                return wait if wait <= self.max_wait else None
            if headers.get("x-ratelimit-remaining") == "0":
                wait = _reset_in(headers)
                return wait if wait is not None and wait <= self.max_wait else None
            if status == 429:
                wait = self.backoff * 2 ** (attempt - 1)
                return wait if wait <= self.max_wait else None
            return None
        if status >= 500:
            return min(self.max_wait, self.backoff * 2 ** (attempt - 1))
        return None

    @staticmethod
    def _message(shown: str, status: int, headers: Mapping[str, str], raw: bytes) -> str:
        try:
            doc = json.loads(raw) if raw.strip() else {}
        except ValueError:
            doc = {}
        gh = doc.get("message", "") if isinstance(doc, dict) else ""
        errors = doc.get("errors") if isinstance(doc, dict) else None
        if errors:
            details = "; ".join(
                str(e.get("message") or e.get("code") or e) if isinstance(e, dict) else str(e) for e in errors[:3]
            )
            gh = f"{gh} ({details})" if gh else details
        if not gh:
            gh = raw.decode("utf-8", "replace").strip()[:200]
        if status in (403, 429) and ("retry-after" in headers or headers.get("x-ratelimit-remaining") == "0" or status == 429):
            if headers.get("x-ratelimit-remaining") == "0":
                wait = _reset_in(headers)
                reset = headers.get("x-ratelimit-reset")
                when = datetime.fromtimestamp(int(reset), UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if reset and reset.isdigit() else "unknown"
                limit = headers.get("x-ratelimit-limit", "?")
                return (f"GitHub API rate limit exceeded ({shown}, {status}): the {limit} requests/hour of this token are used up; "
                        f"it resets at {when}" + (f" (in {wait:.0f} s)" if wait is not None else "") + ". Re-run the job after that.")
            after = headers.get("retry-after")
            return (f"GitHub API secondary rate limit ({shown}, {status}): "
                    + (f"asked to retry after {after} s" if after else "too many requests") + f"; {gh}".rstrip("; "))
        if status == 401:
            return f"GitHub API {shown}: 401 Unauthorized: {gh} (is GITHUB_TOKEN valid?)"
        if status == 403:
            return f"GitHub API {shown}: 403 Forbidden: {gh} (the token needs pull-requests: write and issues: write)"
        if status == 404:
            return f"GitHub API {shown}: 404 Not Found: {gh} (check GITHUB_REPOSITORY and the pull-request number)"
        if status >= 500:
            return f"GitHub API {shown}: {status} server error after retries: {gh}"
        return f"GitHub API {shown}: {status}: {gh}"

    def paginate(self, path: str) -> list[Any]:
        sep = "&" if "?" in path else "?"
        url: str | None = f"{path}{sep}per_page=100"
        out: list[Any] = []
        pages = 0
        while url and pages < 100:
            doc, headers = self.request("GET", url)
            pages += 1
            if isinstance(doc, list):
                out.extend(doc)
            m = _NEXT_RE.search(headers.get("link", ""))
            url = m.group(1) if m else None
        return out


def _reset_in(headers: Mapping[str, str]) -> float | None:
    reset = headers.get("x-ratelimit-reset")
    if not reset or not reset.isdigit():
        return None
    return max(0.0, int(reset) - time.time())


# --------------------------------------------------------------------------------------------
# Posting
# --------------------------------------------------------------------------------------------


@dataclass
class PostOutcome:
    summary: str = ""  # "created" | "updated"
    summary_id: int | None = None
    summary_url: str | None = None
    review_id: int | None = None
    inline_posted: int = 0
    inline_duplicates: int = 0
    inline_over_cap: int = 0
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [f"summary comment {self.summary}" + (f" ({self.summary_url})" if self.summary_url else "")]
        parts.append(f"{self.inline_posted} inline comment{'s' if self.inline_posted != 1 else ''} posted")
        if self.inline_duplicates:
            parts.append(f"{self.inline_duplicates} already posted")
        if self.inline_over_cap:
            parts.append(f"{self.inline_over_cap} over the cap")
        return "; ".join(parts)


def _existing_inline(comments: list[Any]) -> tuple[set[str], set[tuple[str, int, str]]]:
    fps: set[str] = set()
    keys: set[tuple[str, int, str]] = set()
    for c in comments:
        if not isinstance(c, dict):
            continue
        mark = parse_inline_marker(str(c.get("body") or ""))
        if mark is None:
            continue
        rule, fp = mark
        fps.add(fp)
        # `line` is the comment's place in the pull request's current diff (null once outdated);
        # `original_line` is where it was when posted: another finding can be there now
        line = c.get("line")
        if isinstance(line, int):
            keys.add((str(c.get("path")), line, rule))
    return fps, keys


def _existing_in_reviews(reviews: list[Any]) -> set[str]:
    """Fingerprints of the findings listed in the bodies of reviews (the 422 fallback)."""
    fps: set[str] = set()
    for r in reviews:
        if isinstance(r, dict):
            fps.update(fp for _rule, fp in parse_markers(str(r.get("body") or "")))
    return fps


def post(result: ReviewResult, target: GitHubTarget, *, max_comments: int = 25, client: Client | None = None) -> PostOutcome:
    """Create or update the summary comment and post new inline comments as one review."""
    client = client or Client(target.api_url, target.token)
    repo, pr = target.repository, target.pr
    outcome = PostOutcome()

    issue_comments = client.paginate(f"/repos/{repo}/issues/{pr}/comments")
    mine = [c for c in issue_comments if isinstance(c, dict) and isinstance(c.get("id"), int)
            and SUMMARY_MARKER in str(c.get("body") or "")]

    review_comments = client.paginate(f"/repos/{repo}/pulls/{pr}/comments")
    fps, keys = _existing_inline(review_comments)
    inline: list[ReviewFinding] = [f for f in result.findings if f.comment_line is not None]
    new = [f for f in inline if f.fingerprint not in fps and (f.path, f.comment_line, f.rule_id) not in keys]
    if new and mine:  # a fallback review (GitHub refused the lines) follows a summary: read those too
        listed = _existing_in_reviews(client.paginate(f"/repos/{repo}/pulls/{pr}/reviews"))
        new = [f for f in new if f.fingerprint not in listed]
    outcome.inline_duplicates = len(inline) - len(new)
    to_post = new[:max(0, max_comments)]
    outcome.inline_over_cap = len(new) - len(to_post)

    no_line = len(result.findings) - len(inline)
    reasons = []
    if no_line:
        reasons.append(f"{no_line} ha{'ve' if no_line != 1 else 's'} no line in the diff's hunks")
    if outcome.inline_over_cap:
        reasons.append(f"{outcome.inline_over_cap} over the cap of {max_comments} inline comments per run")
    body = render_markdown(result, not_inline=no_line + outcome.inline_over_cap, not_inline_reason="; ".join(reasons))

    def summary_posted() -> dict[str, Any] | None:
        """The summary comment a POST whose answer was lost created (brought to this body), else None."""
        found = [c for c in client.paginate(f"/repos/{repo}/issues/{pr}/comments") if isinstance(c, dict)
                 and isinstance(c.get("id"), int) and SUMMARY_MARKER in str(c.get("body") or "")]
        if not found:
            return None
        if found[-1].get("body") == body:
            return found[-1]
        patched, _ = client.request("PATCH", f"/repos/{repo}/issues/comments/{found[-1]['id']}", {"body": body})
        return patched if isinstance(patched, dict) else found[-1]

    doc: Any = None
    if mine:
        cid = mine[-1]["id"]
        doc, _ = client.request("PATCH", f"/repos/{repo}/issues/comments/{cid}", {"body": body})
        outcome.summary = "updated"
    elif result.findings or result.errors:
        doc, _ = client.request("POST", f"/repos/{repo}/issues/{pr}/comments", {"body": body}, confirm=summary_posted)
        outcome.summary = "created"
    else:
        outcome.summary = "not needed (nothing to report)"
    if isinstance(doc, dict):
        outcome.summary_id = doc.get("id")
        outcome.summary_url = doc.get("html_url")

    if to_post:
        n = len(to_post)
        head = f"Zoomer AR: {n} new performance finding{'s' if n != 1 else ''} on changed lines"
        review_body = head + (f"; summary: {outcome.summary_url}" if outcome.summary_url else "") + "."
        payload: dict[str, Any] = {"event": "COMMENT", "body": review_body, "comments": [inline_comment(f) for f in to_post]}
        if result.head_sha:
            payload = {"commit_id": result.head_sha, **payload}
        wanted = {f.fingerprint for f in to_post}

        def review_posted() -> dict[str, Any] | None:
            """The review a POST whose answer was lost created (found by its findings' markers, inline or in
            a fallback review's body), else None."""
            for c in client.paginate(f"/repos/{repo}/pulls/{pr}/comments"):
                mark = parse_inline_marker(str(c.get("body") or "")) if isinstance(c, dict) else None
                if mark is not None and mark[1] in wanted:
                    return {"id": c.get("pull_request_review_id")}
            for r in client.paginate(f"/repos/{repo}/pulls/{pr}/reviews"):
                if isinstance(r, dict) and wanted & {fp for _rule, fp in parse_markers(str(r.get("body") or ""))}:
                    return r
            return None

        try:
            doc, _ = client.request("POST", f"/repos/{repo}/pulls/{pr}/reviews", payload, confirm=review_posted)
            outcome.inline_posted = n
        except GitHubError as exc:
            if exc.status != 422:
                raise
            listing = "\n".join(f"- `{f.path}:{f.line}` `{f.rule_id}`: {f.message} {inline_marker(f)}" for f in to_post)
            fallback = {k: v for k, v in payload.items() if k != "comments"}
            fallback["body"] = review_body + "\n\nGitHub did not accept these as inline comments (" + str(exc) + "):\n\n" + listing
            doc, _ = client.request("POST", f"/repos/{repo}/pulls/{pr}/reviews", fallback, confirm=review_posted)
            outcome.notes.append(f"GitHub refused the inline comments (422); posted them in the review body instead: {exc}")
        if isinstance(doc, dict):
            outcome.review_id = doc.get("id")
    return outcome
