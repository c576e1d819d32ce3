"""The must-hold path, as docs/service.md documents it, with the CLI only: a fresh store and data folder,
`zoomer-ar token create`, `zoomer-ar serve`, `zoomer-ar worker`; upload a real trace with a source archive,
download the report and a patch that applies to the uploaded sources; the refusals hold on that server."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from zoomer_ar.service.webhook import sign

from service_testutil import (
    EXAMPLE_DL,
    PY,
    REPO,
    RESNET_NW0,
    SCENARIOS,
    TRAIN_PY,
    env_for_subprocess,
    folder_tar_gz,
    shared_trace,
    tar_gz,
    trace_file,
    zip_bomb,
    zoomer,
)


def _extract(data: bytes, dest: Path) -> None:
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        tf.extractall(dest, filter="data")


def _apply(patch: bytes, tree: Path) -> None:
    """The patch applies at the root of the uploaded source tree: `git apply --check`, then `patch -p1`."""
    (tree / "zoomer.patch").write_bytes(patch)
    check = subprocess.run(["git", "apply", "--check", "zoomer.patch"], cwd=tree, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    done = subprocess.run(["patch", "-p1", "--forward", "-i", "zoomer.patch"], cwd=tree, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """serve + one worker, started the way docs/service.md says (the server's embedded worker is off here)."""
    root = tmp_path_factory.mktemp("e2e")
    db = f"sqlite:///{root / 'zoomer.db'}"
    data = root / "data"
    secret = "e2e-secret"
    made = zoomer("token", "create", "--team", "ml", "--name", "e2e", "--db", db)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("zat_") and "not shown again" in made.stderr
    listed = zoomer("token", "list", "--db", db)
    assert "ml" in listed.stdout and token not in listed.stdout
    logs = {n: open(root / f"{n}.log", "wb") for n in ("serve", "worker")}
    server = subprocess.Popen(
        [PY, "-m", "zoomer_ar.cli", "serve", "--port", "0", "--port-file", str(root / "port"), "--db", db, "--data",
         str(data), "--embedded-workers", "0", "--max-upload-mb", "64", "--webhook-secret", secret],
        stdout=logs["serve"], stderr=subprocess.STDOUT, env=env_for_subprocess(), cwd=REPO)
    worker = subprocess.Popen([PY, "-m", "zoomer_ar.cli", "worker", "--db", db, "--data", str(data), "--poll", "0.2"],
                              stdout=logs["worker"], stderr=subprocess.STDOUT, env=env_for_subprocess(), cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not (root / "port").exists():
            assert server.poll() is None and time.monotonic() < deadline, (root / "serve.log").read_text()
            time.sleep(0.05)
        url = f"http://127.0.0.1:{int((root / 'port').read_text())}"
        while True:
            try:
                if httpx.get(url + "/v1/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (root / "serve.log").read_text()
            time.sleep(0.1)
        yield {"url": url, "token": token, "secret": secret, "root": root, "pid": server.pid}
    finally:
        for p in (worker, server):
            p.send_signal(signal.SIGTERM)
        for p in (worker, server):
            try:
                p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs.values():
            f.close()


def _client(stack) -> httpx.Client:
    return httpx.Client(base_url=stack["url"], headers={"Authorization": f"Bearer {stack['token']}"}, timeout=120)


def _run_job(stack, files: dict, data: dict) -> dict:
    with _client(stack) as c:
        r = c.post("/v1/jobs", files=files, data=data)
        assert r.status_code == 202, r.text
        jid = r.json()["id"]
        deadline = time.monotonic() + 240
        while (body := c.get(f"/v1/jobs/{jid}").json())["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline, (body, (stack["root"] / "worker.log").read_text()[-3000:])
            time.sleep(0.25)
        assert body["state"] == "done", (body, (stack["root"] / "worker.log").read_text()[-3000:])
        return body


def test_real_trace_with_a_training_script(stack, tmp_path):
    trace = trace_file(shared_trace(RESNET_NW0))
    src = tar_gz({"train.py": TRAIN_PY})
    body = _run_job(stack, {"trace": (trace.name, trace.read_bytes()), "source": ("train-src.tar.gz", src)},
                    {"job": "resnet50", "gpus": "8", "gpu_hour_cost": "2.5"})
    assert "dataloader-bound" in body["result"]["patterns"] and body["result"]["patch"] is True
    with _client(stack) as c:
        report = c.get(f"/v1/jobs/{body['id']}/report.html")
        assert report.status_code == 200 and "dataloader-bound" in report.text.lower().replace("_", "-")
        patch = c.get(f"/v1/jobs/{body['id']}/patch.diff")
        assert patch.status_code == 200
    tree = tmp_path / "src"
    _extract(src, tree)
    _apply(patch.content, tree)
    fixed = (tree / "train.py").read_text()
    assert "num_workers=0" not in fixed and "num_workers=DATALOADER_WORKERS" in fixed
    compile(fixed, "train.py", "exec")


def test_example_rank_folder_with_the_scenarios_as_source(stack, tmp_path):
    ranks = folder_tar_gz(EXAMPLE_DL, arcroot="dataloader_bound", suffix="")  # rank-0 trace + job.json
    src = folder_tar_gz(SCENARIOS, suffix=".py")
    body = _run_job(stack, {"ranks": ("dataloader_bound.tar.gz", ranks), "source": ("scenarios.tar.gz", src)},
                    {"job": "scenario-dl"})
    assert body["name"] == "dataloader_bound" and "dataloader-bound" in body["result"]["patterns"]
    with _client(stack) as c:
        patch = c.get(f"/v1/jobs/{body['id']}/patch.diff").content
        findings = c.get(f"/v1/jobs/{body['id']}/findings").json()
        relaunch = c.get(f"/v1/jobs/{body['id']}/relaunch.yaml").text
    assert b"dataloader_bound.py" in patch
    dl = next(f for f in findings["findings"] if f["pattern"] == "dataloader-bound")
    assert "dataloader_bound.py" in json.dumps(dl)  # mapped to the uploaded sources
    assert "dataloader_bound.py" in relaunch  # the recorded command line from job.json
    tree = tmp_path / "scenarios"
    _extract(src, tree)
    _apply(patch, tree)
    before = (SCENARIOS / "dataloader_bound.py").read_text()
    after = (tree / "dataloader_bound.py").read_text()
    line = next(x for x in before.splitlines() if "DataLoader(" in x and "num_workers=0" in x)
    assert line in before and line not in after
    assert any("DataLoader(" in x and "num_workers=" in x and "num_workers=0" not in x for x in after.splitlines())
    compile(after, "dataloader_bound.py", "exec")


def test_refusals_hold_on_the_documented_stack(stack):
    trace = trace_file(EXAMPLE_DL)
    with httpx.Client(base_url=stack["url"], timeout=60) as anon:
        assert anon.post("/v1/jobs", files={"trace": ("t.json.gz", trace.read_bytes())}).status_code == 401
        assert anon.get("/v1/jobs", headers={"Authorization": "Bearer zat_wrong"}).status_code == 401
        body = b'{"zen": "x"}'
        assert anon.post("/v1/github/webhook", content=body, headers={"X-GitHub-Event": "ping",
                         "X-Hub-Signature-256": sign("wrong", body)}).status_code == 401
        assert anon.post("/v1/github/webhook", content=body, headers={"X-GitHub-Event": "ping",
                         "X-Hub-Signature-256": sign(stack["secret"], body)}).status_code == 200
    other = zoomer("token", "create", "--team", "other", "--db", f"sqlite:///{stack['root'] / 'zoomer.db'}").stdout.strip()
    with _client(stack) as c, httpx.Client(base_url=stack["url"], headers={"Authorization": f"Bearer {other}"},
                                           timeout=60) as o:
        mine = c.post("/v1/jobs", files={"trace": (trace.name, trace.read_bytes())})
        assert mine.status_code == 202
        jobs = c.get("/v1/jobs").json()["jobs"]
        assert mine.json()["id"] in {j["id"] for j in jobs}
        assert all(o.get(f"/v1/jobs/{j['id']}").status_code == 404 for j in jobs)
        assert o.get(f"/v1/jobs/{mine.json()['id']}/report.html").status_code == 404
        assert o.get("/v1/jobs").json()["jobs"] == []
        for name, data, needle in [
            ("abs.tar.gz", tar_gz({"/etc/cron.d/x.py": b"1"}), "absolute path"),
            ("up.tar.gz", tar_gz({"../../x.py": b"1"}), "'..'"),
            ("link.tar.gz", tar_gz({"a.py": b"1"}, links={"l.py": ("sym", "/etc/shadow")}), "symbolic link"),
            ("bomb.zip", zip_bomb(64 << 20), "decompression bomb"),
        ]:
            r = c.post("/v1/jobs", files={"trace": (trace.name, trace.read_bytes()), "source": (name, data)})
            assert r.status_code == 400 and needle in r.json()["detail"], r.text
        big = c.post("/v1/jobs", files={"trace": ("big.json", b"[" + b" " * (65 << 20) + b"]")})
        assert big.status_code == 413


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_a_large_upload_is_streamed_not_held_in_memory(stack):
    import os

    blob = os.urandom(48 << 20)  # 48 MiB (the limit here is 64)
    with _client(stack) as c:
        c.get("/v1/jobs")  # warm
        before = _peak_rss_mb(stack["pid"])
        r = c.post("/v1/jobs", files={"trace": ("big.json", blob)})
        assert r.status_code == 202, r.text
    grown = _peak_rss_mb(stack["pid"]) - before
    assert grown < 24, f"the server's peak memory grew by {grown:.0f} MiB for a 48 MiB upload"
