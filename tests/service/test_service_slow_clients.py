"""Slow clients (slowloris) on a real server: a connection that sends its headers or its body too slowly is
answered 408 and closed after the read timeout, and leaves nothing on disk; the server keeps serving others.

The server is configured through the environment (ZOOMER_SERVICE_READ_TIMEOUT_S, ZOOMER_SERVICE_MIN_BODY_RATE_KIB)
and raw sockets stall at chosen points of a request.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from service_testutil import Server, source_archive, upload, wait_job, trace_file, unique_trace, EXAMPLE_DL

TIMEOUT = 2.0  # the server's read timeout in these tests
RATE_KIB = 4.0  # the server's minimum body rate (KiB/s) past the first TIMEOUT seconds
CLOSED_WITHIN = TIMEOUT + 8.0  # slack for a busy 2-core machine


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("slow"), embedded_workers=0,
               env={"ZOOMER_SERVICE_READ_TIMEOUT_S": str(TIMEOUT), "ZOOMER_SERVICE_MIN_BODY_RATE_KIB": str(RATE_KIB)})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def token(server):
    return server.token("slow", "tester")


def _connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=CLOSED_WITHIN + 5)
    return sock


def _read_until_closed(sock: socket.socket, deadline_s: float, since: float | None = None) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds since `since` (a monotonic
    time taken before connecting: the server's clock cannot start earlier; default now) that took; fails when the
    connection is still open `deadline_s` after that."""
    t0 = time.monotonic() if since is None else since
    sock.settimeout(0.2)
    got = bytearray()
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if time.monotonic() - t0 > deadline_s:
                pytest.fail(f"the server kept a stalled connection open for over {deadline_s:.0f} s "
                            f"(received so far: {bytes(got)[:200]!r})")
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        got.extend(chunk)
    return bytes(got), time.monotonic() - t0


def _status_and_detail(raw: bytes) -> tuple[int, str]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["detail"]


def _multipart_head(token: str, length: int) -> bytes:
    return (f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: multipart/form-data; boundary=XyZ\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


PART = (b'--XyZ\r\nContent-Disposition: form-data; name="trace"; filename="t.json"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n")


def _jobs_on_disk(server) -> list[str]:
    d = server.data / "jobs"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_stalled_headers_are_answered_408_and_closed(server):
    # timed from before the connection (the server's clock starts when it accepts it): a test process held up
    # between connecting and reading (a loaded machine) must not make the server's timeout look early
    t0 = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: the headers never end
        raw, took = _read_until_closed(sock, CLOSED_WITHIN, since=t0)
    assert took >= TIMEOUT - 0.5
    status, detail = _status_and_detail(raw)
    assert status == 408
    assert "headers" in detail and f"{TIMEOUT:g} s" in detail, detail


def test_a_connection_that_sends_nothing_is_closed(server):
    t0 = time.monotonic()
    with _connect(server) as sock:
        raw, took = _read_until_closed(sock, CLOSED_WITHIN, since=t0)
    assert took >= TIMEOUT - 0.5
    assert raw == b""  # nothing was asked: nothing is answered


def test_headers_trickled_a_byte_at_a_time_are_cut_off(server):
    request = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 200 + b"\r\n\r\n"
    t0 = time.monotonic()
    with _connect(server) as sock:
        closed = False
        for byte in request:  # one byte every 0.1 s: 25 s for the whole request
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
            if time.monotonic() - t0 > CLOSED_WITHIN:
                break
        raw, _ = _read_until_closed(sock, CLOSED_WITHIN) if not closed else (b"", 0.0)
    assert time.monotonic() - t0 < CLOSED_WITHIN + 1
    if raw:
        assert _status_and_detail(raw)[0] == 408


def test_stalled_body_is_answered_408_and_the_upload_is_removed(server, token):
    before = _jobs_on_disk(server)
    t0 = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(_multipart_head(token, 100_000) + PART + b'{"traceEvents": [')  # then nothing more
        raw, took = _read_until_closed(sock, CLOSED_WITHIN, since=t0)
    assert took >= TIMEOUT - 0.5
    status, detail = _status_and_detail(raw)
    assert status == 408
    assert "body" in detail, detail
    deadline = time.monotonic() + 10
    while _jobs_on_disk(server) != before and time.monotonic() < deadline:  # the handler cleans up as it unwinds
        time.sleep(0.1)
    assert _jobs_on_disk(server) == before


def test_body_trickled_below_the_minimum_rate_is_cut_off(server, token):
    """One byte every 0.5 s never leaves the connection idle for the timeout, but stays far below the rate."""
    t0 = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(_multipart_head(token, 100_000) + PART)
        closed = False
        while time.monotonic() - t0 < CLOSED_WITHIN:
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.5)
            sock.settimeout(0.01)
            try:
                if sock.recv(65536, socket.MSG_PEEK):
                    break  # the server answered
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed = True
                break
        raw = b"" if closed else _read_until_closed(sock, CLOSED_WITHIN)[0]
    took = time.monotonic() - t0
    assert took < CLOSED_WITHIN, f"a trickling body held the connection for {took:.1f} s"
    if raw:
        status, detail = _status_and_detail(raw)
        assert status == 408 and "KiB/s" in detail, detail


def test_server_serves_others_while_slow_clients_wait_and_normal_uploads_work(server, token):
    stalled = [_connect(server) for _ in range(20)]
    try:
        for s in stalled:
            s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n")
        r = httpx.get(server.url + "/v1/health", timeout=5)
        assert r.status_code == 200
        with server.client(token) as c:
            r = upload(c, trace=unique_trace(trace_file(EXAMPLE_DL)), source=source_archive(),
                       names={"trace": "dl.pt.trace.json.gz", "source": "src.tar.gz"})
            assert r.status_code == 202, r.text
            assert wait_job(c, r.json()["id"], states=("queued",), timeout=5)["state"] == "queued"
    finally:
        for s in stalled:
            s.close()


def test_a_slow_but_steady_upload_is_not_cut_off(server, token):
    """A body sent in pieces, each well within the timeout and above the minimum rate, is accepted."""
    payload = unique_trace(trace_file(EXAMPLE_DL))
    body = (PART + payload + b"\r\n--XyZ--\r\n")
    with _connect(server) as sock:
        sock.sendall(_multipart_head(token, len(body)))
        step = max(1, len(body) // 8)
        for i in range(0, len(body), step):  # 8 pieces over about 3 s (> the timeout in all)
            sock.sendall(body[i:i + step])
            time.sleep(0.4)
        raw, _ = _read_until_closed_or_answer(sock)
    assert raw.startswith(b"HTTP/1.1 202"), raw[:300]


def _read_until_closed_or_answer(sock: socket.socket) -> tuple[bytes, float]:
    t0 = time.monotonic()
    sock.settimeout(30)
    got = bytearray()
    while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < _length(bytes(got)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got.extend(chunk)
    return bytes(got), time.monotonic() - t0


def _length(raw: bytes) -> int:
    for line in raw.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return int(v)
    return 0


@pytest.mark.parametrize(("args", "env", "says"), [
    (("--read-timeout", "0"), {}, "--read-timeout"),
    ((), {"ZOOMER_SERVICE_READ_TIMEOUT_S": "0"}, "ZOOMER_SERVICE_READ_TIMEOUT_S"),
    ((), {"ZOOMER_SERVICE_READ_TIMEOUT_S": "soon"}, "ZOOMER_SERVICE_READ_TIMEOUT_S"),
    ((), {"ZOOMER_SERVICE_MIN_BODY_RATE_KIB": "-1"}, "ZOOMER_SERVICE_MIN_BODY_RATE_KIB"),
    (("--min-body-rate", "-1"), {}, "--min-body-rate"),
])
def test_bad_read_limits_are_one_line_and_exit_2(tmp_path, args, env, says):
    from service_testutil import zoomer

    r = zoomer("serve", "--port", "0", "--db", f"sqlite:///{tmp_path / 's.db'}", "--data", str(tmp_path / "d"),
               *args, env=env, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
