"""Read deadlines for slow clients (slowloris): uvicorn's h11 protocol with a clock on each request's headers and body.

uvicorn has no read timeout: a connection that sends nothing, or a request line and headers a
byte at a time, or a body that stalls, held its socket (and the request's task, and its partly
written upload) for ever. `guarded_protocol(limits)` is the protocol class `zoomer-ar serve` gives
uvicorn (`http=`); on each connection:

- **headers**: the request line and headers must arrive within `timeout_s` of the connection
  opening (or of the previous response, on a kept-alive connection);
- **body**: the body may not stall for `timeout_s` (no bytes), and must keep an average of
  `min_rate` bytes/s past its first `timeout_s` (its deadline is `start + timeout_s +
  received / min_rate`), so a trickle of a byte a second is cut off too. Time the server itself
  is not reading (uvicorn pauses reading while the handler is busy with what it got) does not count.

A request that misses its deadline is answered **408** `{"detail": "..."}` with `Connection: close`
(when no response was started; a connection that sent nothing is closed without an answer) and
the connection is closed; the handler waiting for the body sees a disconnect and removes what it wrote.
Once the body is complete the handler may take as long as it needs (archive checks, the database).

The same protocol keeps the connection cap (`max_connections`, `--max-connections`): a request on a
connection past it is answered **503** in the service's JSON error shape (`{"detail": "..."}`, with
`Retry-After` and `Connection: close`) and the connection closed. uvicorn's own cap
(`limit_concurrency`) answered a plain-text `Service Unavailable` that a client parsing the API's
errors as JSON could not read; it is left unset. A request h11 cannot parse (a bad or repeated
`Content-Length`, a malformed request line or chunk, headers past h11's buffer) is answered in the
same JSON shape (`{"detail": "invalid HTTP request: bad Content-Length"}`, 400, or h11's hint: 431
for headers too large) with `Connection: close`, where uvicorn answered a plain-text
`Invalid HTTP request received.`
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from dataclasses import dataclass
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("zoomer_ar.service.slow_clients")

HEADERS, BODY, HANDLER = "headers", "body", "handler"


@dataclass(frozen=True)
class ReadLimits:
    timeout_s: float = 30.0
    min_rate: float = 1024.0  # bytes/s a body must average past its first timeout_s; 0: no minimum rate


CAP_RETRY_AFTER_S = 5  # connections free up as requests finish: a client may try again soon


def _answer_408(detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = ("HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\nx-content-type-options: nosniff\r\n\r\n")
    return head.encode("ascii") + body


def _over_the_cap(cap: int) -> bytes:
    """The body of the 503 past the connection cap: the API's error shape."""
    return json.dumps({"detail": f"the server is serving its limit of {cap} connection{'s' if cap != 1 else ''} "
                                 "at once (--max-connections); try again in a few seconds"}).encode()


class _GuardedH11(H11Protocol):
    """H11Protocol with read deadlines and the connection cap (see the module docstring); `limits` and
    `max_connections` (0: no cap) are set by guarded_protocol."""

    limits: ReadLimits = ReadLimits()
    max_connections: int = 0

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - uvicorn's protocol arguments
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # the cap is this class's (a JSON 503), never uvicorn's plain-text one
        if self.max_connections:
            self.app = self._capped(self.app)

    def _capped(self, app):  # noqa: ANN001, ANN202 - ASGI apps
        cap = self.max_connections

        async def capped(scope, receive, send) -> None:  # noqa: ANN001 - ASGI
            # this connection and this request's task count with the others: past `cap` of either, refused
            if scope["type"] == "http" and (len(self.connections) > cap or len(self.tasks) > cap):
                log.warning("Exceeded concurrency limit: %d connections open, %d requests running (cap %d); "
                            "answered 503", len(self.connections), len(self.tasks), cap)
                body = _over_the_cap(cap)
                await send({"type": "http.response.start", "status": 503, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(CAP_RETRY_AFTER_S).encode()), (b"connection", b"close"),
                    (b"x-content-type-options", b"nosniff")]})
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            await app(scope, receive, send)

        return capped

    # --- the clock -------------------------------------------------------------------------------

    def _start(self, phase: str) -> None:
        now = self.loop.time()
        self._phase, self._since, self._last, self._received = phase, now, now, 0
        self._sent_any = False
        if phase == HANDLER:
            self._disarm()
        else:
            self._arm(now + self.limits.timeout_s)

    def _arm(self, when: float) -> None:
        self._disarm()
        self._timer = self.loop.call_at(when, self._on_deadline)

    def _disarm(self) -> None:
        timer = getattr(self, "_timer", None)
        if timer is not None:
            timer.cancel()
            self._timer = None

    def _deadline(self) -> float:
        t = self.limits.timeout_s
        if self._phase == HEADERS:
            return self._since + t
        rate = self.limits.min_rate
        by_rate = self._since + t + self._received / rate if rate > 0 else math.inf
        return min(self._last + t, by_rate)

    def _on_deadline(self) -> None:
        self._timer = None
        if self._phase == HANDLER or self.transport is None or self.transport.is_closing():
            return
        now = self.loop.time()
        if self._phase == BODY and self.flow is not None and self.flow.read_paused:
            # the server is not reading (its handler is busy with what it has): not the client's delay
            self._last, self._since = now, now - (self._received / self.limits.min_rate if self.limits.min_rate > 0 else 0)
            self._arm(now + self.limits.timeout_s)
            return
        deadline = self._deadline()
        if now < deadline:
            self._arm(deadline)
            return
        self._time_out(now)

    def _time_out(self, now: float) -> None:
        t = self.limits.timeout_s
        if self._phase == HEADERS:
            detail = f"request headers not received within {t:g} s; connection closed"
        elif now - self._last >= t:
            detail = f"request body stalled: no data for {t:g} s; connection closed"
        else:
            detail = (f"request body too slow: {self._received:,} bytes in {now - self._since:.0f} s, under "
                      f"{self.limits.min_rate / 1024:g} KiB/s; connection closed")
        log.warning("%s: %s", "%s:%d" % self.client if self.client else "client", detail)
        cycle = self.cycle if self._phase == BODY else None
        started = cycle is not None and cycle.response_started
        if not started and (self._phase == BODY or self._sent_any):
            self.transport.write(_answer_408(detail))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the handler's next read is a disconnect; it writes no answer of its own
            cycle.message_event.set()
        self._phase = HANDLER
        self.transport.close()

    def _after_events(self, before) -> None:  # noqa: ANN001 - the cycle before the events
        """The phase after uvicorn handled received bytes or finished a response."""
        if self.cycle is not before and self.cycle is not None:  # a request's headers are complete
            self._start(BODY if self.conn.their_state is h11.SEND_BODY else HANDLER)
        elif self._phase == BODY and self.conn.their_state is not h11.SEND_BODY:
            self._start(HANDLER)  # the body is complete

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse (it calls this in its `except h11.RemoteProtocolError`),
        in the API's JSON error shape, with h11's reason and status hint (431 for headers too large)."""
        exc = sys.exc_info()[1]
        status, why = 400, msg
        if isinstance(exc, h11.RemoteProtocolError):
            status = exc.error_status_hint
            reason = re.sub(r"bytearray\(b('.*?')\)", r"\1", str(exc))[:200]  # h11 shows the bytes' repr
            why = ("request line and headers too large" if status == 431 else f"invalid HTTP request: {reason}")
        body = json.dumps({"detail": why}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close"), (b"x-content-type-options", b"nosniff")]
        phrase = HTTPStatus(status).phrase.encode() if status in HTTPStatus._value2member_map_ else b""
        try:
            for event in (h11.Response(status_code=status, headers=headers, reason=phrase), h11.Data(data=body),
                          h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # a response was already under way: the connection is only closed
            pass
        self.transport.close()

    # --- uvicorn's hooks -------------------------------------------------------------------------

    def connection_made(self, transport) -> None:  # noqa: ANN001 - asyncio.Transport
        super().connection_made(transport)
        self._timer = None
        self._start(HEADERS)

    def data_received(self, data: bytes) -> None:
        if self._phase == HANDLER and self.transport.is_closing():
            return
        now = self.loop.time()
        if self._phase == BODY:
            self._received += len(data)
            self._last = now
        elif self._phase == HEADERS:
            self._sent_any = True
        before = self.cycle
        super().data_received(data)
        self._after_events(before)

    def on_response_complete(self) -> None:
        before = self.cycle
        if self.conn.their_state is h11.DONE:
            self._start(HEADERS)  # the next request's headers (the keep-alive timeout closes an idle connection)
        super().on_response_complete()
        self._after_events(before)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._phase = HANDLER
        super().connection_lost(exc)


def guarded_protocol(limits: ReadLimits, max_connections: int = 0) -> type[H11Protocol]:
    """The h11 protocol class with `limits` and the connection cap (0: none), for uvicorn.Config(http=...);
    uvicorn's own `limit_concurrency` stays unset."""
    return type("GuardedH11Protocol", (_GuardedH11,), {"limits": limits, "max_connections": max_connections})
