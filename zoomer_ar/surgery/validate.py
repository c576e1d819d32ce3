"""Structural check of a Chrome-format trace (what Perfetto and chrome://tracing need), streaming.

A valid trace is a JSON object with a `traceEvents` list (or a bare list of events); every event
is an object with a string `ph`; complete, begin/end, instant, counter and flow events carry a
numeric `ts` and a `pid` and `tid` (integer or string); complete events a numeric `dur`;
metadata events a `name` and a `pid`; flow events an `id`. `check_trace` returns the problems
found (empty: valid), at most `limit` of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from ..stream.scan import scan
from ..stream.source import StreamError

_TIMED = set("XBEiICstfbneSTpFONDPR")
_FLOWS = set("stf")


class _Check(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None  # noqa: A003


_DECODER = msgspec.json.Decoder(list[_Check])


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ident(v: Any) -> bool:
    return isinstance(v, (int, str)) and not isinstance(v, bool)


def check_trace(path: Path, limit: int = 20) -> tuple[int, list[str]]:
    """(number of events, problems)."""
    problems: list[str] = []
    count = [0]

    def consume(view) -> None:
        events = _DECODER.decode(view)
        base = count[0]
        count[0] += len(events)
        if len(problems) >= limit:
            return
        for k, e in enumerate(events):
            where = f"event {base + k}"
            if not isinstance(e.ph, str) or not e.ph:
                problems.append(f"{where}: no `ph`")
            elif e.ph == "M":
                if not isinstance(e.name, str) or not _ident(e.pid):
                    problems.append(f"{where}: metadata event without name or pid")
            elif e.ph in _TIMED:
                if not _num(e.ts):
                    problems.append(f"{where} ({e.ph}): `ts` missing or not a number")
                if not _ident(e.pid) or not _ident(e.tid):
                    problems.append(f"{where} ({e.ph}): `pid`/`tid` missing")
                if e.ph == "X" and not _num(e.dur):
                    problems.append(f"{where} (X): `dur` missing or not a number")
                if e.ph in _FLOWS and e.id is None:
                    problems.append(f"{where} ({e.ph}): flow event without `id`")
            if len(problems) >= limit:
                return

    try:
        res = scan(path, consume, hash=False)
    except StreamError as exc:
        return count[0], [f"not a readable trace: {exc}"]
    except msgspec.MsgspecError as exc:
        return count[0], [f"events are not JSON objects: {exc}"]
    if not res.bare and not res.head:
        problems.append("no traceEvents list")
    return count[0], problems
