"""Helpers for the service tests (tests/service has no conftest: the modules import this one).

- `Server`: `zoomer-ar serve` as a subprocess on 127.0.0.1, on a free port the server picks itself
  (`--port 0 --port-file`), with its own SQLite store (or a given URL) and data folder;
- `WorkerProc`: a `zoomer-ar worker` subprocess (optionally slowed by the worker's test hooks; more options and
  environment variables);
- uploads, polling, archive builders (benign and hostile), a small training-script source archive;
- `pg_url()`: a fresh PostgreSQL database from ZOOMER_TEST_PG_URL (required under CI, else skipped).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
import zipfile
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from zoomer_ar.store.db import dispose_engine

REPO = Path(__file__).resolve().parents[2]
SHARED_TRACES = Path(os.environ.get("ZOOMER_SHARED_TRACES", REPO.parent / "shared" / "traces"))
RESNET_NW0 = SHARED_TRACES / "kineto" / "resnet50_num_workers_0"
EXAMPLE_DL = REPO / "examples" / "traces" / "dataloader_bound"
SCENARIOS = REPO / "training_data" / "scenarios"
PY = sys.executable

TRAIN_PY = b'''import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    ds = TensorDataset(torch.randn(256, 3, 32, 32), torch.randint(0, 10, (256,)))
    loader = DataLoader(ds, batch_size=32, num_workers=0)
    model = torch.nn.Conv2d(3, 8, 3)
    for x, y in loader:
        model(x)


if __name__ == "__main__":
    main()
'''


def shared_trace(path: Path) -> Path:
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"the real-trace corpus is missing at {path}")
        pytest.skip(f"real-trace corpus not found at {path}")
    return path


def trace_file(folder: Path) -> Path:
    files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")) and "trace" in p.name)
    assert files, folder
    return files[0]


def unique_trace(path: Path) -> bytes:
    """The trace's events with different bytes (a new content hash: not yet recorded anywhere)."""
    import gzip

    raw = path.read_bytes()
    text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    return gzip.compress(text + b" " * (1 + uuid.uuid4().int % 4096))


def env_for_subprocess(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ZOOMER_SERVICE_TEST_DELAY_S", None)
    env.pop("ZOOMER_SERVICE_TEST_ANALYSIS_DELAY_S", None)
    env.pop("ZOOMER_SERVICE_JOB_TIMEOUT_S", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def zoomer(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "zoomer_ar.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=env_for_subprocess(env), cwd=REPO)


def _tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class WorkerProc:
    def __init__(self, root: Path, db: str, data: Path, *, lease: float = 30.0, delay: float | None = None,
                 name: str | None = None, poll: float = 0.2, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        self.name = name or f"worker-{uuid.uuid4().hex[:6]}"
        self.log = root / f"{self.name}.log"
        extra = {"ZOOMER_SERVICE_TEST_DELAY_S": str(delay)} if delay else {}
        extra.update(env or {})
        self.proc = subprocess.Popen(
            [PY, "-m", "zoomer_ar.cli", "worker", "--db", db, "--data", str(data), "--lease", str(lease),
             "--poll", str(poll), "--log-level", "info", *args],
            stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env_for_subprocess(extra), cwd=REPO,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self) -> str:
        return _tail(self.log)


class Server:
    """`zoomer-ar serve` on 127.0.0.1 with a port it picks; `url`, `token(team)`, `stop()`."""

    def __init__(self, root: Path, *, db: str | None = None, args: tuple[str, ...] = (), embedded_workers: int = 1,
                 env: dict[str, str] | None = None):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.data = root / "data"
        self.db = db or f"sqlite:///{root / 'store.db'}"
        self.log = root / "server.log"
        port_file = root / "port"
        self.proc = subprocess.Popen(
            [PY, "-m", "zoomer_ar.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
             "--db", self.db, "--data", str(self.data), "--embedded-workers", str(embedded_workers),
             "--log-level", "info", *args],
            stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env_for_subprocess(env), cwd=REPO,
        )
        deadline = time.monotonic() + 120
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{_tail(self.log)}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        self.url = f"http://127.0.0.1:{self.port}"
        while True:
            try:
                if httpx.get(self.url + "/v1/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy:\n{_tail(self.log)}")
            time.sleep(0.1)
        self.workers: list[WorkerProc] = []

    def token(self, team: str, name: str = "") -> str:
        from zoomer_ar.service.auth import create_token
        from zoomer_ar.store.db import open_store

        return create_token(open_store(self.db), team, name)[0]

    def worker(self, **kw) -> WorkerProc:
        w = WorkerProc(self.root, self.db, self.data, **kw)
        self.workers.append(w)
        return w

    def client(self, token: str | None = None, timeout: float = 60) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def logs(self) -> str:
        return _tail(self.log) + "".join(f"\n--- {w.name}\n{w.logs()}" for w in self.workers)

    def stop(self) -> None:
        for w in self.workers:
            w.stop()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        from zoomer_ar.store.db import dispose_engine

        dispose_engine(self.db)


def upload(client: httpx.Client, *, trace: Path | bytes | None = None, ranks: Path | bytes | None = None,
           source: Path | bytes | None = None, names: dict[str, str] | None = None, **fields) -> httpx.Response:
    names = names or {}
    files = {}
    for key, val in (("trace", trace), ("ranks", ranks), ("source", source)):
        if val is None:
            continue
        if isinstance(val, Path):
            files[key] = (names.get(key, val.name), val.read_bytes(), "application/octet-stream")
        else:
            files[key] = (names.get(key, f"{key}.bin"), val, "application/octet-stream")
    data = {k: str(v) for k, v in fields.items() if v is not None}
    return client.post("/v1/jobs", files=files, data=data)


def wait_job(client: httpx.Client, job_id: str, *, states=("done", "failed"), timeout: float = 180,
             server: Server | None = None) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        body = r.json()
        if body["state"] in states:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {body['state']} after {timeout} s: {body}\n"
                                 f"{server.logs() if server else ''}")
        time.sleep(0.2)


# --- archives -------------------------------------------------------------------------------------------


def tar_gz(entries: dict[str, bytes], *, links: dict[str, tuple[str, str]] | None = None,
           then: dict[str, bytes] | None = None) -> bytes:
    """A .tar.gz of regular files; `links`: name -> ("sym" | "hard", target); `then`: more files after those
    (a name of `entries` again: the same name twice in the archive)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in [*entries.items(), *(then or {}).items()]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
        for name, (kind, target) in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


def zip_bytes(entries: dict[str, bytes], *, symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            info.external_attr = (0o120777 << 16)
            zf.writestr(info, target)
    return buf.getvalue()


def zip_bomb(uncompressed: int = 64 << 20) -> bytes:
    """One entry of zeros: a few KiB compressed, `uncompressed` bytes inflated (ratio ~1000:1)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("zeros.py", "w", force_zip64=True) as fh:
            block = b"\0" * (1 << 20)
            for _ in range(uncompressed // len(block)):
                fh.write(block)
    return buf.getvalue()


def source_archive(kind: str = "tar") -> bytes:
    entries = {"train.py": TRAIN_PY}
    return tar_gz(entries) if kind == "tar" else zip_bytes(entries)


def folder_tar_gz(folder: Path, *, arcroot: str | None = None, suffix: str = ".py") -> bytes:
    """A .tar.gz of the files under `folder` ending with `suffix` ('' = all), under `arcroot/` when given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and p.name.endswith(suffix):
                rel = p.relative_to(folder).as_posix()
                tf.add(p, arcname=f"{arcroot}/{rel}" if arcroot else rel, recursive=False)
    return buf.getvalue()


# --- PostgreSQL -------------------------------------------------------------------------------------------


def pg_server_url() -> str:
    url = os.environ.get("ZOOMER_TEST_PG_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is required in CI: ZOOMER_TEST_PG_URL is not set (eval \"$(.ci/start-postgres)\")")
        pytest.skip("PostgreSQL variant skipped: ZOOMER_TEST_PG_URL is not set (eval \"$(bash .ci/start-postgres)\")")
    return url


def create_pg_database(server_url: str) -> tuple[str, callable]:
    """A fresh database on the server; returns (its URL, drop())."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from zoomer_ar.store.db import dispose_engine, resolve_url

    name = f"zs_{uuid.uuid4().hex[:16]}"
    admin = create_engine(resolve_url(server_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except Exception as exc:  # noqa: BLE001
        admin.dispose()
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL variant skipped: cannot create a database on ZOOMER_TEST_PG_URL ({exc})")
    url = make_url(resolve_url(server_url)).set(database=name).render_as_string(hide_password=False)

    def drop() -> None:
        dispose_engine(url)
        with admin.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return url, drop


def load_json(resp: httpx.Response) -> dict:
    return json.loads(resp.content)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A fresh store: SQLite, and PostgreSQL where ZOOMER_TEST_PG_URL (or CI's server) is there."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        yield url
        dispose_engine(url)
    else:
        url, drop = create_pg_database(pg_server_url())
        try:
            yield url
        finally:
            drop()


@contextmanager
def server_on(kind: str, root: Path, **kw):
    """A Server on a fresh store of `kind` ("sqlite", or "postgresql": a database of its own, dropped after)."""
    drop = db = None
    if kind == "postgresql":
        db, drop = create_pg_database(pg_server_url())
    s = Server(root, db=db, **kw)
    try:
        yield s
    finally:
        s.stop()
        if drop is not None:
            drop()


def alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
