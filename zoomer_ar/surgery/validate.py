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
from .io import TOO_DEEP

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


def event_problems(ph: Any, name: Any, ts: Any, dur: Any, pid: Any, tid: Any, id_: Any) -> list[str]:
    """Why a viewer cannot place this event (empty: it can). One rule set for `trace check` and for
    the commands that must write only placeable events (slice, split drop the others)."""
    if not isinstance(ph, str) or not ph:
        return ["no `ph`"]
    if ph == "M":
        return [] if isinstance(name, str) and _ident(pid) else ["metadata event without name or pid"]
    out: list[str] = []
    if not _num(ts):
        out.append("`ts` missing or not a number")
    if ph in _TIMED:
        if not _ident(pid) or not _ident(tid):
            out.append("`pid`/`tid` missing")
        if ph == "X" and not _num(dur):
            out.append("`dur` missing or not a number")
        if ph in _FLOWS and id_ is None:
            out.append("flow event without `id`")
    return out


def placeable(e: Any) -> bool:
    """event_problems(e) is empty, for a record with ph, name, ts, dur, pid, tid and id fields."""
    if e.ph == "M":
        return isinstance(e.name, str) and _ident(e.pid)
    return not event_problems(e.ph, e.name, e.ts, e.dur, e.pid, e.tid, e.id)


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
            for pr in event_problems(e.ph, e.name, e.ts, e.dur, e.pid, e.tid, e.id):
                where = f"event {base + k}" + (f" ({e.ph})" if e.ph in _TIMED else "")
                problems.append(f"{where}: {pr}")
            if len(problems) >= limit:
                del problems[limit:]
                return

    try:
        res = scan(path, consume, hash=False)
    except StreamError as exc:
        return count[0], [f"not a readable trace: {exc}"]
    except msgspec.MsgspecError as exc:
        return count[0], [f"events are not JSON objects: {exc}"]
    except RecursionError:  # msgspec's answer to nesting deeper than Python's recursion limit
        return count[0], [f"not a readable trace: {TOO_DEEP}"]
    if not res.bare and not res.head:
        problems.append("no traceEvents list")
    return count[0], problems
