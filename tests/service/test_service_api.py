"""The HTTP API on a real uvicorn server (subprocess, 127.0.0.1, a free port): authentication, team scoping,
concurrent uploads, size limits, hostile archives, webhook signatures, verdicts and digest, the published schema."""

from __future__ import annotations

import gzip
import json
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from zoomer_ar.service.app import openapi_json
from zoomer_ar.service.webhook import sign

from service_testutil import (
    EXAMPLE_DL,
    REPO,
    Server,
    source_archive,
    tar_gz,
    trace_file,
    unique_trace,
    upload,
    wait_job,
    zip_bomb,
    zip_bytes,
)

SECRET = "s3cret-for-tests"
SMALL_TRACE = trace_file(EXAMPLE_DL)  # 285 KB, in the repository


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("api"), args=(
        "--max-upload-mb", "3", "--max-archive-mb", "48", "--max-archive-entries", "200",
        "--webhook-secret", SECRET))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tokens(server):
    return {"vision": server.token("vision", "alice"), "speech": server.token("speech", "bob")}


@pytest.fixture(scope="module")
def done_job(server, tokens):
    """One finished analysis of team vision (with a source archive), of trace content no other team recorded."""
    with server.client(tokens["vision"]) as c:
        r = upload(c, trace=unique_trace(SMALL_TRACE), source=source_archive(),
                   names={"trace": "dl.pt.trace.json.gz", "source": "src.tar.gz"}, job="dl", gpu_hour_cost="3")
        assert r.status_code == 202, r.text
        body = wait_job(c, r.json()["id"], server=server)
        assert body["state"] == "done", body
        return body


def _jobs_on_disk(server) -> set[str]:
    d = server.data / "jobs"
    return {p.name for p in d.iterdir()} if d.exists() else set()


# --- schema --------------------------------------------------------------------------------------------


def test_sqlite_server_runs_one_embedded_worker(server):
    import time

    deadline = time.monotonic() + 120
    while "zoomer_ar.service.worker: worker " not in (log := server.log.read_text()):  # the worker has started
        assert time.monotonic() < deadline, log
        time.sleep(0.2)
    assert "(1 embedded worker)" in log
    assert log.count("zoomer_ar.service.worker: worker ") == 1


def test_published_openapi_is_current(server):
    published = (REPO / "docs" / "openapi.json").read_text()
    assert published == openapi_json(), "docs/openapi.json is stale: run `zoomer-ar openapi --out docs/openapi.json`"
    served = httpx.get(server.url + "/openapi.json").json()
    assert served == json.loads(published)
    paths = set(served["paths"])
    for p in ("/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/findings", "/v1/jobs/{job_id}/report.html",
              "/v1/jobs/{job_id}/patch.diff", "/v1/jobs/{job_id}/relaunch.yaml", "/v1/jobs/{job_id}/notebook.ipynb",
              "/v1/verdicts", "/v1/digest", "/v1/github/webhook"):
        assert p in paths


# --- authentication and teams ------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer zat_not-a-real-token"},
                                     {"Authorization": "Bearer"}, {"Authorization": "Basic dXNlcjpwYXNz"},
                                     {"Authorization": "zat_no_scheme"}])
def test_missing_and_wrong_tokens_are_refused(server, headers):
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as c:
        before = _jobs_on_disk(server)
        calls = [c.get("/v1/jobs"), c.get("/v1/jobs/" + "0" * 32), c.get("/v1/jobs/" + "0" * 32 + "/report.html"),
                 c.get("/v1/digest"), c.post("/v1/verdicts", json={"job_id": "0" * 32, "pattern": "sync-point",
                                                                   "label": "positive"}),
                 upload(c, trace=SMALL_TRACE)]
        for r in calls:
            assert r.status_code == 401, (r.request.url, r.status_code, r.text)
            assert r.headers.get("www-authenticate") == "Bearer"
            assert "token" in r.json()["detail"]
        assert _jobs_on_disk(server) <= before, "an unauthenticated upload wrote nothing"


def test_revoked_token_is_refused(server):
    from zoomer_ar.service.auth import create_token, revoke_token
    from zoomer_ar.store.db import open_store

    engine = open_store(server.db)
    tok, tid = create_token(engine, "vision", "temp")
    with server.client(tok) as c:
        assert c.get("/v1/jobs").status_code == 200
        revoke_token(engine, tid)
        r = c.get("/v1/jobs")
        assert r.status_code == 401 and "revoked" in r.json()["detail"]


def test_concurrent_uploads_and_team_isolation(server, tokens):
    def one(i: int):
        team = "vision" if i % 2 == 0 else "speech"
        with server.client(tokens[team]) as c:
            r = upload(c, trace=SMALL_TRACE, job=f"concurrent-{i}", names={"trace": f"run{i}.pt.trace.json.gz"})
            return team, r

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(one, range(6)))
    ids = {team: [] for team in tokens}
    for team, r in results:
        assert r.status_code == 202, r.text
        assert r.headers["location"] == f"/v1/jobs/{r.json()['id']}"
        ids[team].append(r.json()["id"])
    assert len({j for v in ids.values() for j in v}) == 6
    for team, job_ids in ids.items():
        other = "speech" if team == "vision" else "vision"
        with server.client(tokens[team]) as mine, server.client(tokens[other]) as theirs:
            for jid in job_ids:
                body = wait_job(mine, jid, server=server)
                assert body["state"] == "done" and body["team"] == team, body
                # another team's job does not exist for them
                assert theirs.get(f"/v1/jobs/{jid}").status_code == 404
                for route in ("findings", "report.html", "relaunch.yaml", "notebook.ipynb", "patch.diff"):
                    r = theirs.get(f"/v1/jobs/{jid}/{route}")
                    assert r.status_code == 404 and "not found" in r.json()["detail"]
                r = theirs.post("/v1/verdicts", json={"job_id": jid, "pattern": "dataloader-bound", "label": "negative"})
                assert r.status_code == 404
            listed = {j["id"] for j in mine.get("/v1/jobs", params={"limit": 500}).json()["jobs"]}
            assert set(job_ids) <= listed
            assert not listed & set(ids[other])


def test_results_and_formats(server, tokens, done_job):
    jid = done_job["id"]
    assert done_job["result"]["patch"] is True and "dataloader-bound" in done_job["result"]["patterns"]
    with server.client(tokens["vision"]) as c:
        f = c.get(f"/v1/jobs/{jid}/findings")
        assert f.status_code == 200 and f.headers["content-type"].startswith("application/json")
        assert any(x["pattern"] == "dataloader-bound" for x in f.json()["findings"])
        html = c.get(f"/v1/jobs/{jid}/report.html")
        assert html.status_code == 200 and html.headers["content-type"].startswith("text/html") and "<html" in html.text
        patch = c.get(f"/v1/jobs/{jid}/patch.diff")
        assert patch.status_code == 200 and patch.text.startswith("--- a/train.py")
        assert "attachment" in patch.headers["content-disposition"]
        rl = c.get(f"/v1/jobs/{jid}/relaunch.yaml")
        assert rl.status_code == 200 and rl.headers["content-type"].startswith("application/yaml") and rl.text.strip()
        nb = c.get(f"/v1/jobs/{jid}/notebook.ipynb")
        assert nb.status_code == 200 and json.loads(nb.content)["nbformat"] == 4
        assert c.get(f"/v1/jobs/{jid}/review.md").status_code == 404
    assert not (server.data / "jobs" / jid).exists(), "a finished job's uploads are removed"


def test_patch_without_source_is_404_with_reason(server, tokens):
    with server.client(tokens["speech"]) as c:
        r = upload(c, trace=unique_trace(SMALL_TRACE), names={"trace": "fresh.json.gz"}, job="nosource", record="false")
        body = wait_job(c, r.json()["id"], server=server)
        assert body["state"] == "done" and body["result"]["recorded"] is False
        p = c.get(f"/v1/jobs/{body['id']}/patch.diff")
        assert p.status_code == 404 and "source archive" in p.json()["detail"]
        v = c.post("/v1/verdicts", json={"job_id": body["id"], "pattern": "dataloader-bound", "label": "positive"})
        assert v.status_code == 409 and "no recorded analysis" in v.json()["detail"]


def test_verdicts_and_digest(server, tokens, done_job):
    jid = done_job["id"]
    with server.client(tokens["vision"]) as c:
        v = c.post("/v1/verdicts", json={"job_id": jid, "pattern": "dataloader-bound", "label": "positive",
                                         "note": "confirmed by profiling"})
        assert v.status_code == 201, v.text
        assert v.json()["author"] == "vision/alice"
        bad = c.post("/v1/verdicts", json={"job_id": jid, "pattern": "no-such-pattern", "label": "positive"})
        assert bad.status_code == 422
        d = c.get("/v1/digest")
        assert d.status_code == 200, d.text
        body = d.json()
        assert body["team"] == "vision" and body["runs"] >= 1
        assert "dataloader-bound" in {p["pattern"] for p in body["patterns"]}
        assert all(j["team"] == "vision" and j["job"].startswith("vision/") for j in body["jobs"])
        assert c.get("/v1/digest", params={"format": "md"}).headers["content-type"].startswith("text/markdown")
        assert c.get("/v1/digest", params={"format": "html"}).text.lstrip().startswith("<")
        assert c.get("/v1/digest", params={"week": "2026-W99"}).status_code == 422
    from sqlalchemy import select

    from zoomer_ar.store.db import open_store, read_session
    from zoomer_ar.store.orm import Verdict

    with read_session(open_store(server.db)) as s:
        row = s.execute(select(Verdict.author, Verdict.source, Verdict.label)).all()
    assert ("vision/alice", "service", "positive") in row


# --- refusals -------------------------------------------------------------------------------------------------


def test_oversized_upload_is_413(server, tokens):
    before = _jobs_on_disk(server)
    with server.client(tokens["vision"]) as c:
        r = upload(c, trace=b"{" + b" " * (4 << 20) + b"}", names={"trace": "big.json"})
        assert r.status_code == 413, r.text
        assert "too large" in r.json()["detail"]
    assert _jobs_on_disk(server) <= before, "an oversized upload leaves nothing on disk"
    # a declared length far past the limit is refused before any of the body is read
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tokens["vision"].encode()
                     + b"\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: 1000000000000\r\n\r\n")
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


HOSTILE = [
    ("source", "abs.tar.gz", tar_gz({"/tmp/zoomer-evil.py": b"x = 1\n"}), "absolute path"),
    ("source", "dotdot.tar.gz", tar_gz({"../zoomer-evil.py": b"x = 1\n"}), "escapes the archive root ('..')"),
    ("source", "deep-dotdot.zip", zip_bytes({"a/../../zoomer-evil.py": b"x = 1\n"}), "'..'"),
    ("source", "abs.zip", zip_bytes({"/tmp/zoomer-evil.py": b"x = 1\n"}), "absolute path"),
    ("source", "symlink.tar.gz", tar_gz({"train.py": b"x = 1\n"}, links={"passwd.py": ("sym", "/etc/passwd")}),
     "symbolic link; links are not allowed"),
    ("source", "hardlink.tar.gz", tar_gz({"train.py": b"x = 1\n"}, links={"h.py": ("hard", "/etc/passwd")}),
     "hard link"),
    ("source", "symlink.zip", zip_bytes({"train.py": b"x = 1\n"}, symlinks={"passwd.py": "/etc/passwd"}),
     "symbolic link"),
    ("source", "bomb.zip", zip_bomb(64 << 20), "decompression bomb"),
    ("source", "many.tar.gz", tar_gz({f"m{i}.py": b"" for i in range(300)}), "more than 200 entries"),
    ("source", "garbage.zip", b"this is not an archive", "not a .tar.gz, .tgz, .tar or .zip archive"),
    ("ranks", "ranks-dotdot.tar.gz", tar_gz({"../rank-0.json": b"{}"}), "rank archive: entry"),
    ("ranks", "ranks-bomb.zip", zip_bomb(64 << 20), "decompression bomb"),
    ("ranks", "no-traces.zip", zip_bytes({"notes.txt": b"hello"}), "no trace files"),
    # an archive of several runs (a log folder of one subfolder per run): which subfolders hold rank files, so that
    # the client uploads each (before: 'no trace files in it', though it held two runs' files)
    ("ranks", "two-runs.tar.gz", tar_gz({"runs/a/rank-0.json": b"{}", "runs/b/rank-0.json": b"{}",
                                         "runs/b/rank-1.json": b"{}"}),
     "its subfolders hold some (a: 1 file, b: 2 files): one archive is one run; upload each of them as its own"),
    # a trace sent as the rank archive (before: 'not a readable tar archive (ReadError: invalid header)')
    ("ranks", "rank0.json.gz", gzip.compress(b'{"traceEvents": []}'), "single trace file (JSON), not an archive of "
     "rank files: send it as the field 'trace'"),
    ("ranks", "rank0.json", b'{"traceEvents": []}', "single trace file (JSON)"),
    # a newline in a rank's name reached the reports and the job's one-line error; a second entry of the same
    # name silently replaced the first (one rank analysed in place of the other)
    ("ranks", "newline.zip", zip_bytes({"rank\n0.json": b"{}"}), "entry 'rank\\n0.json' has control characters "
     "in its name ('\\n')"),
    ("ranks", "bidi.tar.gz", tar_gz({"rank-0\u202e.json": b"{}"}), "has control characters in its name ('\\u202e')"),
    ("ranks", "twice.tar.gz", tar_gz({"run/rank-0.json": b"{}"}, then={"run/rank-0.json": b"[]"}),
     "entry 'run/rank-0.json' is in the archive twice"),
]


@pytest.mark.parametrize("field,filename,data,needle", HOSTILE, ids=[h[1] for h in HOSTILE])
def test_hostile_archives_are_400(server, tokens, tmp_path, field, filename, data, needle):
    before = _jobs_on_disk(server)
    kw = {field: data}
    if field == "source":
        kw["trace"] = SMALL_TRACE
    with server.client(tokens["vision"]) as c:
        r = upload(c, names={field: filename}, **kw)
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert needle in detail, detail
    assert detail.startswith(("source archive", "rank archive")), detail
    assert _jobs_on_disk(server) <= before, "a refused upload leaves nothing on disk"
    for p in (Path("/tmp/zoomer-evil.py"), server.data / "zoomer-evil.py", server.data / "jobs" / "zoomer-evil.py"):
        assert not p.exists()


@pytest.mark.parametrize("fields,status,needle", [
    ({"gpus": "-1"}, 422, "gpus"),
    ({"week": "someday"}, 422, "week"),
    ({"gpu_hours": "nan"}, 422, "gpu_hours"),
    ({"record": "maybe"}, 422, "record"),
])
def test_bad_metadata_is_422(server, tokens, fields, status, needle):
    with server.client(tokens["vision"]) as c:
        r = upload(c, trace=SMALL_TRACE, **fields)
    assert r.status_code == status and needle in r.json()["detail"], r.text


def test_malformed_requests(server, tokens):
    with server.client(tokens["vision"]) as c:
        assert c.post("/v1/jobs", json={"trace": "x"}).status_code == 415
        r = c.post("/v1/jobs", content=b"--b\r\nContent-Disposition: form-data; name=\"trace\"\r\n\r\nxx",
                   headers={"Content-Type": "multipart/form-data; boundary=b"})
        assert r.status_code == 400 and "incomplete" in r.json()["detail"]
        r = c.post("/v1/jobs", files={"evil": ("x", b"1")})
        assert r.status_code == 400 and "unknown form field" in r.json()["detail"]
        r = c.post("/v1/jobs", data={"job": "x"}, files={"source": ("s.tgz", source_archive())})
        assert r.status_code == 400 and "is required" in r.json()["detail"]
        assert c.get("/v1/jobs/not-an-id").status_code == 422


def test_a_bad_trace_fails_its_job_with_the_reason(server, tokens):
    with server.client(tokens["vision"]) as c:
        r = upload(c, trace=b'{"nodes": []}', names={"trace": "et.json"})
        assert r.status_code == 202
        body = wait_job(c, r.json()["id"], server=server)
        assert body["state"] == "failed" and "execution trace" in body["error"], body
        rr = c.get(f"/v1/jobs/{body['id']}/report.html")
        assert rr.status_code == 409 and "failed" in rr.json()["detail"]


# --- webhook ------------------------------------------------------------------------------------------------


def _hook(server, body: bytes, signature: str | None, event: str = "ping") -> httpx.Response:
    headers = {"X-GitHub-Event": event, "Content-Type": "application/json"}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    return httpx.post(server.url + "/v1/github/webhook", content=body, headers=headers, timeout=30)


def test_webhook_signatures(server):
    body = json.dumps({"zen": "Keep it logically awesome."}).encode()
    assert _hook(server, body, None).status_code == 401
    assert _hook(server, body, "sha256=" + "0" * 64).status_code == 401
    assert _hook(server, body, sign("another-secret", body)).status_code == 401
    assert _hook(server, body, sign(SECRET, body).replace("sha256=", "sha1=")).status_code == 401
    assert _hook(server, body + b" ", sign(SECRET, body)).status_code == 401  # body changed after signing
    r = _hook(server, body, sign(SECRET, body))
    assert r.status_code == 200 and r.json()["status"] == "pong"
    assert "signature" in _hook(server, body, "sha256=00").json()["detail"]


def test_webhook_payloads(server):
    bad = b"{not json"
    assert _hook(server, bad, sign(SECRET, bad), "pull_request").status_code == 400
    pr = {"action": "opened", "number": 3, "repository": {"full_name": "acme/unknown"},
          "pull_request": {"number": 3, "base": {"sha": "a" * 40}, "head": {"sha": "b" * 40}}}
    body = json.dumps(pr).encode()
    r = _hook(server, body, sign(SECRET, body), "pull_request")
    assert r.status_code == 200 and r.json()["status"] == "ignored" and "not configured" in r.json()["reason"]
    closed = json.dumps({**pr, "action": "closed"}).encode()
    assert _hook(server, closed, sign(SECRET, closed), "pull_request").json()["status"] == "ignored"
    push = b"{}"
    assert _hook(server, push, sign(SECRET, push), "push").json()["status"] == "ignored"


@pytest.mark.parametrize("method, path, kw, field", [
    ("GET", "/v1/jobs", {"params": {"limit": "100000"}}, "limit"),
    ("GET", "/v1/jobs", {"params": {"state": "sleeping"}}, "state"),
    ("GET", "/v1/jobs/not-an-id", {}, "job_id"),
    ("DELETE", "/v1/jobs/not-an-id", {}, "job_id"),
    ("GET", "/v1/digest", {"params": {"week": "2026-W99"}}, "week"),
    ("GET", "/v1/digest", {"params": {"top": "0"}}, "top"),
    ("POST", "/v1/verdicts", {"json": {"job_id": "x" * 32, "pattern": "no-such-pattern", "label": "positive"}},
     "job_id"),
    ("POST", "/v1/verdicts", {"json": [1, 2]}, ""),
])
def test_invalid_parameters_are_422_in_the_api_error_shape(server, tokens, method, path, kw, field):
    # before: FastAPI's 422, a list of error objects under "detail"; every other error is {"detail": "<one line>"}
    with server.client(tokens["vision"]) as c:
        r = c.request(method, path, **kw)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and detail.startswith(field), detail
    published = json.loads(openapi_json())["paths"][path if "not-an-id" not in path else "/v1/jobs/{job_id}"]
    assert published[method.lower()]["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"}
