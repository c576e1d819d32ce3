"""Event boundaries in a buffer of the `traceEvents` array, for the slice-by-slice readers
(load/job.py's msgspec path and stream/scan.py).

A boundary is `}` whitespace `,` whitespace `{` between two events. Both readers cut the buffer at
the last boundary and let the decoder verify the cut (a cut inside a string does not decode).
Whitespace is skipped at C speed and a search that found nothing is not repeated over the same
bytes (`lo`): a hostile file with a long run of whitespace, or one huge event, used to cost a scan
of the whole buffer per chunk read: quadratic in the run's length (tests/test_cuts.py reads such a file).
"""

from __future__ import annotations

import re

WS = b" \t\r\n"
_WS_RUN = re.compile(rb"[ \t\r\n]*")
_RBRACE, _COMMA = 0x7D, 0x2C
_BACK_BLOCK = 1 << 16


def skip_ws(buf, j: int) -> int:
    """The first index >= j that is not JSON whitespace (len(buf) if none)."""
    return _WS_RUN.match(buf, j).end()


def skip_ws_back(buf, i: int, lo: int = 0) -> int:
    """The smallest k in [lo, i] such that buf[k:i] is all JSON whitespace."""
    k = i
    while k > lo:
        a = max(lo, k - _BACK_BLOCK)
        block = bytes(buf[a:k])
        kept = len(block.rstrip(WS))
        if kept:
            return a + kept
        k = a
    return k


def last_boundary(buf, end: int, lo: int = 1) -> tuple[int, int]:
    """The last boundary whose `}` lies in buf[1:end] and whose `{` lies at or after `lo`, as
    (index of the `}`, index of the `,`), or (-1, -1). Bytes before `lo` are those of an earlier
    search that found no boundary (or none that decoded): they are not searched again."""
    q = len(buf)
    lo = max(lo, 1)
    while True:
        q = buf.rfind(b"{", lo, q)
        if q < 0:
            return -1, -1
        c = skip_ws_back(buf, q, 1) - 1  # the byte before the whitespace ahead of the `{`
        if c >= 1 and buf[c] == _COMMA:
            p = skip_ws_back(buf, c, 1) - 1
            if 1 <= p < end and buf[p] == _RBRACE:
                return p, c
