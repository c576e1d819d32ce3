"""A service job's results name the client's uploads, never the server's folders (`<data>/jobs/<id>/input/...`).

A real server and worker: a real trace and rank archives are uploaded, and findings.json, report.md,
report.html (and the other artifacts), the job's error, and the store's records of the run
(traces.path, the analysis' notes, `zoomer-ar history` and `digest`) are read back for the data folder.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from service_testutil import (
    EXAMPLE_DL,
    RESNET_NW0,
    Server,
    shared_trace,
    source_archive,
    tar_gz,
    trace_file,
    unique_trace,
    upload,
    wait_job,
    zoomer,
)

ARTIFACTS = ("findings", "report.md", "report.html", "relaunch.yaml", "notebook.ipynb", "patch.diff")
RANK_0 = "rank-0.pt.trace.json.gz"
COPY = "rank-0 copy.pt.trace.json.gz"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("client-paths"))
    srv.team_token = srv.token("ml")
    try:
        yield srv
    finally:
        srv.stop()


def _done(srv: Server, **files) -> tuple[dict, dict[str, str]]:
    """Upload, wait for the job, and fetch every artifact it has (name -> text)."""
    with srv.client(srv.team_token) as c:
        r = upload(c, **files)
        assert r.status_code == 202, r.text
        job = wait_job(c, r.json()["id"], server=srv)
        assert job["state"] == "done", (job, srv.logs())
        texts = {}
        for name in ARTIFACTS:
            got = c.get(f"/v1/jobs/{job['id']}/{name}")
            if got.status_code == 200:
                texts[name] = got.text
    assert {"findings", "report.md", "report.html"} <= set(texts)
    return job, texts


def _no_server_path(srv: Server, job_id: str, texts: dict[str, str]) -> None:
    for name, text in texts.items():
        for server_path in (str(srv.data), str(srv.data.resolve()), f"jobs/{job_id}", "/input/"):
            assert server_path not in text, f"{name} shows the server path {server_path!r}"


def test_a_trace_upload_is_named_as_its_file(server):
    trace = trace_file(shared_trace(RESNET_NW0))
    job, texts = _done(server, trace=unique_trace(trace), source=source_archive(),
                       names={"trace": trace.name, "source": "train-src.tar.gz"}, job="client-paths-trace")
    _no_server_path(server, job["id"], texts)
    info = json.loads(texts["findings"])["job"]
    assert info["path"] == trace.name and [r["path"] for r in info["ranks"]] == [trace.name]
    assert f"| Trace | `{trace.name}` (1 rank file" in texts["report.md"]
    assert trace.name in texts["report.html"]


def test_a_rank_archive_is_named_as_its_folder_and_entries(server):
    rank = (EXAMPLE_DL / RANK_0).read_bytes()
    ranks = tar_gz({f"dataloader_bound/{RANK_0}": rank, f"dataloader_bound/{COPY}": rank,
                    "dataloader_bound/job.json": (EXAMPLE_DL / "job.json").read_bytes()})
    job, texts = _done(server, ranks=ranks, names={"ranks": "dl-ranks.tar.gz"}, job="client-paths-ranks")
    _no_server_path(server, job["id"], texts)
    findings = json.loads(texts["findings"])
    info = findings["job"]
    assert info["path"] == "dataloader_bound"
    (analysed,), (skipped,) = [r["path"] for r in info["ranks"]], [s["path"] for s in info["skipped"]]
    assert sorted([analysed, skipped]) == [f"dataloader_bound/{COPY}", f"dataloader_bound/{RANK_0}"]  # one is a copy
    assert f"Skipped {skipped}: the same trace as {analysed.split('/')[-1]}" in findings["notes"]
    assert "| Trace | `dataloader_bound` (1 rank file" in texts["report.md"]

    # the store's records of the run name the same (what `history` and the digest are built from)
    store = sqlite3.connect(server.db.removeprefix("sqlite:///"))
    try:
        (path, notes), = store.execute(
            "SELECT traces.path, analyses.notes FROM analyses JOIN traces ON traces.id = analyses.trace_id "
            "WHERE analyses.id = ?", (job["result"]["analysis_id"],)).fetchall()
    finally:
        store.close()
    assert path == "dataloader_bound" and str(server.data) not in notes
    history = zoomer("history", "ml/client-paths-ranks", "--format", "json", "--db", server.db)
    digest = zoomer("digest", "--team", "ml", "--format", "md", "--db", server.db)
    assert history.returncode == 0 and digest.returncode == 0, history.stderr + digest.stderr
    _no_server_path(server, job["id"], {"history": history.stdout, "digest": digest.stdout})


def test_a_rank_archive_without_a_top_folder_is_named_as_the_archive(server):
    ranks = tar_gz({RANK_0: (EXAMPLE_DL / RANK_0).read_bytes()})
    job, texts = _done(server, ranks=ranks, names={"ranks": "my-ranks.tar.gz"}, record="false")
    _no_server_path(server, job["id"], texts)
    info = json.loads(texts["findings"])["job"]
    assert info["path"] == "my-ranks.tar.gz" and [r["path"] for r in info["ranks"]] == [RANK_0]


def test_a_failed_job_names_the_upload(server):
    with server.client(server.team_token) as c:
        r = upload(c, trace=b'{"traceEvents": "not a list"}', names={"trace": "mine.json"})
        assert r.status_code == 202, r.text
        job = wait_job(c, r.json()["id"], server=server)
    assert job["state"] == "failed" and "mine.json" in job["error"], job
    assert "trace/mine.json" not in job["error"] and str(server.data) not in job["error"], job["error"]


@pytest.mark.parametrize("sent, job_name", [
    ("rank3 (retry).pt.trace.json.gz", "rank3 (retry)"),  # spaces, parentheses: kept, not 'rank3_retry_'
    ("résumé-run.json", "résumé-run"),  # gzip content under a .json name, and a name that is not ASCII
    ("run 7.txt", "run 7.txt"),  # no trace suffix: stored as trace.json.gz on the server, shown as sent
])
def test_a_trace_renamed_by_the_client_is_read_by_content_and_shown_as_sent(server, sent, job_name):
    # the server stores the upload under a safe name of its own (ASCII, a trace suffix); the trace is read by its
    # content (gzip under a .json name too), and the job, its reports and the store name it as the client sent it
    # (before: 'rank3_retry_.pt.trace.json.gz', 'r_sum_-run.json', and 'trace.json.gz' for 'run 7.txt')
    trace = unique_trace(trace_file(EXAMPLE_DL))  # gzip
    job, texts = _done(server, trace=trace, names={"trace": sent}, record="false")
    _no_server_path(server, job["id"], texts)
    findings = json.loads(texts["findings"])
    assert findings["job"]["name"] == job_name and job["name"] == job_name, (findings["job"], job["name"])
    assert findings["job"]["path"] == sent and [r["path"] for r in findings["job"]["ranks"]] == [sent]
    assert f"| Trace | `{sent}` (1 rank file" in texts["report.md"]
    assert "dataloader-bound" in job["result"]["patterns"]  # read as the gzip it is


def test_a_trace_sent_without_a_file_name_is_read_and_named_trace(server):
    import gzip

    body = gzip.decompress(unique_trace(trace_file(EXAMPLE_DL)))  # plain JSON, no file name in the part
    with server.client(server.team_token) as c:
        r = c.post("/v1/jobs", content=b'--b\r\nContent-Disposition: form-data; name="trace"\r\n\r\n' + body
                   + b"\r\n--b--\r\n", headers={"Content-Type": "multipart/form-data; boundary=b"})
        assert r.status_code == 202, r.text
        job = wait_job(c, r.json()["id"], server=server)
        assert job["state"] == "done" and job["name"] == "trace", job
        info = c.get(f"/v1/jobs/{job['id']}/findings").json()["job"]
    assert info["path"] == "trace" and info["name"] == "trace"
