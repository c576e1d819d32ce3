"""Event boundaries for the slice-by-slice readers (zoomer_ar/load/cuts.py)."""

from __future__ import annotations

import gzip
import random
import re

from zoomer_ar.load.cuts import last_boundary, skip_ws, skip_ws_back
from zoomer_ar.load.job import load_trace

_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")


def _reference(buf: bytes, end: int, lo: int) -> tuple[int, int]:
    """The last `}` ws `,` ws `{` with the `}` in [1, end) and the `{` at or after lo."""
    best = (-1, -1)
    for m in _BOUNDARY.finditer(buf, 1):  # boundaries cannot overlap
        p, q = m.start(), m.end() - 1
        if p < end and q >= lo:
            best = (p, buf.index(b",", p))
    return best


def test_last_boundary_matches_the_definition_on_random_buffers():
    rng = random.Random(7)
    alphabet = [b"{", b"}", b",", b" ", b"\n", b"a", b'"', b"\t"]
    for _ in range(3000):
        buf = b"[" + b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        end = rng.randint(0, len(buf))
        lo = rng.randint(0, len(buf))
        assert last_boundary(bytearray(buf), end, lo) == _reference(buf, end, max(lo, 1)), (buf, end, lo)


def test_whitespace_skipping_both_ways():
    buf = bytearray(b"x" + b" \t\r\n" * 50_000 + b"y")
    assert skip_ws(buf, 1) == len(buf) - 1
    assert skip_ws_back(buf, len(buf) - 1) == 1
    assert skip_ws_back(buf, len(buf) - 1, lo=100) == 100


def test_a_long_whitespace_run_in_the_msgspec_path(tmp_path):
    """A duplicate key sends the file to the msgspec slice reader; 8 MB of whitespace between two
    events then used to be scanned again for every chunk read (quadratic)."""
    text = (b'{"traceEvents": [{"name":"y","ph":"X","pid":1,"tid":1,"ts":1,"dur":2,"ts":3},'
            + b" " * (8 << 20) + b'{"name":"x","ph":"X","pid":1,"tid":1,"ts":10,"dur":2}]}')
    path = tmp_path / "ws.json.gz"
    path.write_bytes(gzip.compress(text, 1))
    trace, info = load_trace(path)
    assert len(trace) == 2 and sorted(trace.names) == ["x", "y"]
    assert sorted(trace.ts.tolist()) == [3.0, 10.0]  # the duplicate key's last value, as msgspec reads it
