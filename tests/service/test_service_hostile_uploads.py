"""Hostile uploads found by an audit with a real server: tar metadata headers that tarfile reads whole
into memory (GNU long names, pax headers) or recursively, and sparse members."""

from __future__ import annotations

import gzip
import io
import tarfile
import tracemalloc
import zlib
from pathlib import Path

import pytest

from zoomer_ar.service.archives import ArchiveError, ArchiveLimits, safe_extract

from service_testutil import Server, tar_gz, upload

LIMITS = ArchiveLimits(max_bytes=1 << 30, max_entries=20_000, max_ratio=1e9)


def _meta_header_bomb(kind: bytes, announced: int) -> bytes:
    """A .tar.gz whose first header is a metadata header (`kind`) announcing `announced` bytes of 'a'."""
    hdr = tarfile.TarInfo("././@LongLink")
    hdr.type = kind
    hdr.size = announced
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [co.compress(hdr.tobuf(format=tarfile.GNU_FORMAT))]
    block = b"a" * (1 << 20)
    for _ in range(announced >> 20):
        out.append(co.compress(block))
    member = tarfile.TarInfo("x.py")
    member.size = 2
    out += [co.compress(member.tobuf(format=tarfile.GNU_FORMAT) + b"1\n".ljust(512, b"\0") + b"\0" * 1024),
            co.flush()]
    return b"".join(out)


def _long_name_chain(n: int) -> bytes:
    buf = io.BytesIO()
    for _ in range(n):
        h = tarfile.TarInfo("././@LongLink")
        h.type = tarfile.GNUTYPE_LONGNAME
        h.size = 5
        buf.write(h.tobuf(format=tarfile.GNU_FORMAT) + b"a.py\0".ljust(512, b"\0"))
    t = tarfile.TarInfo("x.py")
    t.size = 2
    buf.write(t.tobuf(format=tarfile.GNU_FORMAT) + b"1\n".ljust(512, b"\0") + b"\0" * 1024)
    return gzip.compress(buf.getvalue())


def _refused(tmp_path: Path, data: bytes, needle: str) -> tuple[str, int]:
    arc = tmp_path / "a.tgz"
    arc.write_bytes(data)
    dest = tmp_path / "out"
    tracemalloc.start()
    try:
        with pytest.raises(ArchiveError) as info:
            safe_extract(arc, dest, LIMITS, what="source archive")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert needle in str(info.value), str(info.value)
    assert not dest.exists()
    return str(info.value), peak


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                                  tarfile.XGLTYPE], ids=["longname", "longlink", "pax", "global-pax"])
def test_huge_tar_metadata_header_is_refused_before_it_is_read(tmp_path, kind):
    # 64 MiB announced (~64 KB compressed): tarfile would read it all into memory before yielding a member
    data = _meta_header_bomb(kind, 64 << 20)
    assert len(data) < 1 << 20
    _msg, peak = _refused(tmp_path, data, "tar metadata header")
    assert peak < 8 << 20, f"{peak:,} bytes allocated for a refused header"


def test_chained_long_names_are_refused_not_a_recursion_error(tmp_path):
    _refused(tmp_path, _long_name_chain(5000), "tar metadata headers")


def test_ordinary_long_names_and_pax_headers_still_extract(tmp_path):
    long = "/".join(f"folder{i}" for i in range(40)) + "/x.py"  # 300+ characters: a long name header
    for fmt, name in ((tarfile.GNU_FORMAT, "gnu"), (tarfile.PAX_FORMAT, "pax")):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as tf:
            info = tarfile.TarInfo(long)
            info.size = 2
            info.pax_headers = {"comment": "x" * 1000} if fmt == tarfile.PAX_FORMAT else {}
            tf.addfile(info, io.BytesIO(b"1\n"))
        arc = tmp_path / f"{name}.tgz"
        arc.write_bytes(buf.getvalue())
        safe_extract(arc, tmp_path / name, LIMITS)
        assert (tmp_path / name / long).read_bytes() == b"1\n"


def test_sparse_members_are_refused(tmp_path):
    # an old GNU sparse header (type 'S'): tarfile reads its extension blocks into a list, without bound
    h = tarfile.TarInfo("s.py")
    h.type = tarfile.GNUTYPE_SPARSE
    h.size = 0
    raw = bytearray(h.tobuf(format=tarfile.GNU_FORMAT))
    _refused(tmp_path, gzip.compress(bytes(raw) + b"\0" * 1024), "sparse file")
    # pax sparse (GNU.sparse.major=1: the map is read from the data blocks)
    p = tarfile.TarInfo("p.py")
    p.size = 512
    p.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "p.py",
                     "GNU.sparse.realsize": "10"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(p, io.BytesIO(b"1\n0\n10\n".ljust(512, b"\0")))
    _refused(tmp_path, buf.getvalue(), "sparse file")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("hostile"), embedded_workers=0)
    yield s
    s.stop()


def test_server_answers_400_to_tar_header_bombs(server):
    token = server.token("vision", "alice")
    trace = b'{"traceEvents": []}'
    with server.client(token) as c:
        for data, needle in ((_long_name_chain(5000), "tar metadata headers"),
                             (_meta_header_bomb(tarfile.GNUTYPE_LONGNAME, 64 << 20), "tar metadata header"),
                             (tar_gz({"a.py": b"1"}), None)):
            r = upload(c, trace=trace, source=data, names={"trace": "t.json", "source": "src.tar.gz"})
            if needle is None:
                assert r.status_code == 202, r.text
                continue
            assert r.status_code == 400, r.text
            assert r.headers["content-type"] == "application/json"
            assert r.json()["detail"].startswith("source archive: ") and needle in r.json()["detail"]


def test_overlong_multipart_boundary_is_400_not_500(server):
    token = server.token("vision", "alice")
    boundary = "b" * 300  # python-multipart refuses boundaries over 256 bytes (RFC 2046: 70)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"trace\"; filename=\"t.json\"\r\n\r\n"
            f"{{\"traceEvents\": []}}\r\n--{boundary}--\r\n").encode()
    with server.client(token) as c:
        r = c.post("/v1/jobs", content=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 400, r.text
    assert "boundary" in r.json()["detail"]


def _zip_directory_bomb(entries: int) -> bytes:
    """A zip whose central directory holds `entries` minimal entries while its end record declares one."""
    import struct

    one = struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0) + b"a"
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, 1, 0) + b"a"
    cd = one * entries
    return local + cd + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(cd), len(local), 0)


def test_zip_central_directory_is_counted_before_zipfile_reads_it(tmp_path):
    # 200,000 entries in 9.4 MB: zipfile would build them all (~75 MB) before the 20,000-entry cap is checked
    data = _zip_directory_bomb(200_000)
    _msg, peak = _refused(tmp_path, data, "more than 20,000 entries")
    assert peak < 4 << 20, f"{peak:,} bytes allocated to refuse a zip of {len(data):,} bytes"
    # an ordinary zip still extracts
    from service_testutil import zip_bytes

    arc = tmp_path / "ok.zip"
    arc.write_bytes(zip_bytes({f"d/f{i}.py": b"x" for i in range(300)}))
    assert safe_extract(arc, tmp_path / "ok", LIMITS).files == 300


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's peak memory from /proc")
def test_json_bodies_are_capped_before_the_token_is_checked(server):
    # FastAPI reads a JSON body whole before its dependencies (the token check) run
    def body():
        yield b'{"job_id": "' + b"0" * 32 + b'", "pattern": "dataloader-bound", "label": "positive", "note": "'
        for _ in range(96):
            yield b"a" * (1 << 20)
        yield b'"}'

    before = _peak_rss_mb(server.proc.pid)
    with server.client() as c:  # no token
        r = c.post("/v1/verdicts", content=body(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    assert "larger than" in r.json()["detail"]
    grown = _peak_rss_mb(server.proc.pid) - before
    assert grown < 32, f"the server's peak memory grew by {grown:.0f} MiB for a 96 MiB JSON body"
    with server.client() as c:  # a declared length over the cap: refused before reading
        r = c.post("/v1/verdicts", content=b"{}" + b" " * (2 << 20), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["detail"].startswith("request body larger than")
    token = server.token("vision", "alice")
    with server.client(token) as c:  # an ordinary verdict body is read as before
        r = c.post("/v1/verdicts", json={"job_id": "0" * 32, "pattern": "dataloader-bound", "label": "positive"})
        assert r.status_code == 404, r.text


def test_every_answer_says_nosniff_and_an_unforeseen_error_is_json(tmp_path):
    """Downloads (report.md, a notebook: the trace's names are the user's text, `<script>` included) had no
    `X-Content-Type-Options: nosniff`, and an unforeseen exception answered a plain-text 'Internal Server Error'
    where every other error is JSON."""
    import asyncio

    import httpx

    from zoomer_ar.service.app import create_app
    from zoomer_ar.service.config import Settings

    server = Server(tmp_path / "srv", embedded_workers=0)
    try:
        with server.client() as c:
            for path in ("/v1/health", "/v1/jobs", "/openapi.json"):
                assert c.get(path).headers.get("x-content-type-options") == "nosniff", path
    finally:
        server.stop()

    app = create_app(Settings(data_dir=tmp_path / "inproc", db=f"sqlite:///{tmp_path / 'z.db'}"))

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret detail")

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/boom")

    r = asyncio.run(call())
    assert r.status_code == 500 and r.headers["content-type"].startswith("application/json")
    assert r.json()["detail"].startswith("internal error (RuntimeError)") and "secret detail" not in r.text


def test_a_job_json_nested_too_deep_is_ignored_not_an_internal_error(server):
    # a rank archive's job.json (the capture helper's record, read for the relaunch spec) nested 100,000 deep:
    # the job failed as 'internal error: RecursionError: maximum recursion depth exceeded ...'; such a job.json
    # is now ignored as an unreadable one is, and the trace is analysed
    from service_testutil import EXAMPLE_DL, trace_file, wait_job

    worker = server.worker()
    try:
        rank = trace_file(EXAMPLE_DL).read_bytes()
        ranks = tar_gz({"run/rank-0.pt.trace.json.gz": rank, "run/job.json": b"[" * 100_000 + b"]" * 100_000})
        with server.client(server.token("deep")) as c:
            r = upload(c, ranks=ranks, names={"ranks": "run.tar.gz"}, record="false")
            assert r.status_code == 202, r.text
            job = wait_job(c, r.json()["id"], server=server)
        assert job["state"] == "done", job
        assert "relaunch.yaml" in job["artifacts"] and "dataloader-bound" in job["result"]["patterns"], job
    finally:
        worker.stop()
