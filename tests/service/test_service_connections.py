"""The connection cap (`--max-connections`) on a real server: N connections are served at once, a request on one
more is answered 503 in the API's JSON error shape and its connection closed, and a place freed is taken again."""

from __future__ import annotations

import json
import socket
import time

import pytest

from service_testutil import Server, zoomer

CAP = 2


def _get(sock: socket.socket) -> bytes:
    """GET /v1/health on `sock`; the response's head and body (read until the body is complete or the socket closes)."""
    sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), None)
            if length is not None and len(body) >= length:
                return data
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"no complete answer: {data!r}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("conns") / "srv", args=("--max-connections", str(CAP)), embedded_workers=0)
    yield srv
    srv.stop()


def _connect(srv: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=20)


def test_past_the_cap_a_request_gets_503(server):
    held = [_connect(server) for _ in range(CAP)]
    try:
        for sock in held:  # the cap's connections are all served, and stay open (keep-alive)
            assert _get(sock).startswith(b"HTTP/1.1 200 "), "a connection within the cap was refused"
        extra = _connect(server)
        answer = _get(extra)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        head, _, body = answer.partition(b"\r\n\r\n")
        headers = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
        assert headers[b"connection"] == b"close"
        # the API's error shape, as every other error (before: uvicorn's plain-text "Service Unavailable")
        assert headers[b"content-type"] == b"application/json", answer
        detail = json.loads(body)["detail"]
        assert f"limit of {CAP} connections" in detail and "--max-connections" in detail, detail
        assert int(headers[b"retry-after"]) > 0 and headers[b"x-content-type-options"] == b"nosniff"
        assert extra.recv(1) == b""  # closed by the server
        extra.close()
        assert _get(held[0]).startswith(b"HTTP/1.1 200 ")  # those within the cap go on being served
        held.pop().close()
        deadline = time.monotonic() + 10  # the server sees the close, and the freed place is taken again
        while True:
            with _connect(server) as again:
                if _get(again).startswith(b"HTTP/1.1 200 "):
                    break
            assert time.monotonic() < deadline, "the place freed was not taken again"
            time.sleep(0.1)
    finally:
        for sock in held:
            sock.close()
    assert "Exceeded concurrency limit" in server.log.read_text(errors="replace")


def test_bad_cap_exits_2(tmp_path):
    r = zoomer("serve", "--port", "0", "--data", str(tmp_path / "d"), "--max-connections", "-1")
    assert r.returncode == 2 and "--max-connections" in r.stderr and "Traceback" not in r.stderr
    r = zoomer("serve", "--port", "0", "--data", str(tmp_path / "d"), env={"ZOOMER_SERVICE_MAX_CONNECTIONS": "-3",
                                                                            "ZOOMER_DB": f"sqlite:///{tmp_path}/s.db"})
    assert r.returncode == 2 and "ZOOMER_SERVICE_MAX_CONNECTIONS" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("request_bytes, status, said", [
    (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400, "bad Content-Length"),
    (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400,
     "conflicting Content-Length headers"),
    (b"GARBAGE\r\n\r\n", 400, "illegal request line: 'GARBAGE'"),
    (b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (20 << 10), 431, "request line and headers too large"),
])
def test_a_request_http_cannot_parse_gets_the_json_error_shape(server, request_bytes, status, said):
    # before: uvicorn's plain-text "Invalid HTTP request received." (always 400), unreadable as the API's JSON errors
    with _connect(server) as sock:
        sock.sendall(request_bytes)
        answer = b""
        while chunk := sock.recv(65536):  # the server answers and closes the connection
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer
    headers = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
    assert headers[b"content-type"] == b"application/json" and headers[b"connection"] == b"close", answer
    detail = json.loads(body)["detail"]
    assert said in detail and "\n" not in detail, detail
