"""Structural check of a Chrome-format trace (what Perfetto and chrome://tracing need), streaming.

A valid trace is a JSON object with a `traceEvents` list (or a bare list of events); every event
is an object with a string `ph`; complete, begin/end, instant, counter and flow events carry a
numeric `ts` and a `pid` and `tid` (integer or string); complete events a numeric `dur`;
metadata events a `name` and a `pid`; flow events an `id`. Every event must also have the types
the analyzer's loader decodes (load/schema.py RawEvent: `name` a string, `pid` an integer or
string, `args.correlation` a scalar...), or `zoomer-ar analyze` refuses the file; the scanner
already holds the top-level keys to the loader's types. `check_trace` returns the problems
found (empty: valid), at most `limit` of them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from ..errors import InputError
from ..load.schema import EVENTS_DECODER, RawEvent
from ..load.job import TOO_DEEP
from ..stream.scan import scan
from ..stream.source import BadJSON, StreamError
from .guard import unreadable

_TIMED = set("XBEiICstfbneSTpFONDPR")
_FLOWS = set("stf")

#: Why a trace whose events are all metadata (process and thread names) is refused: `analyze` refuses
#: it (no event to analyse), so no `trace` command passes it or writes one.
ONLY_METADATA = "trace holds only metadata events (process and thread names), no event on a timeline"
#: Why a trace without any event (`"traceEvents": []`) is refused, in `analyze`'s words.
NO_EVENTS = "trace has no events ('traceEvents' is empty)"


class _Check(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None  # noqa: A003


_DECODER = msgspec.json.Decoder(list[_Check])
_EVENT = msgspec.json.Decoder(RawEvent)  # the loader's types, one event at a time
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_AT = re.compile(r"^(?P<why>.*) - at `\$(?:\[\d+\])?\.?(?P<field>[^`]*)`$", re.S)  # msgspec's "- at `$[3].name`"


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ident(v: Any) -> bool:
    return isinstance(v, (int, str)) and not isinstance(v, bool)


def _json_type(v: Any) -> str:
    """The JSON type of a decoded value, in msgspec's words (`int`, `float`, `array`, ...)."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float, str)):
        return type(v).__name__
    return {list: "array", dict: "object", type(None): "null"}.get(type(v), type(v).__name__)


def _wrong(field: str, want: str, v: Any) -> str:
    """The phrase msgspec (and so type_problems) uses for a value of the wrong type."""
    return f"`{field}` has the wrong type (Expected `{want}`, got `{_json_type(v)}`)"


class _Missing(str):
    """The type of NO_NAME."""


#: The `name` of a decoded record whose event has none: equal to "" for every string operation (a
#: --name pattern, a ProfilerStep test), told apart by identity (`e.name is NO_NAME`). A metadata
#: event needs a name (event_problems): slice and split leave a nameless one out, filter and compress
#: refuse it, as `trace check` does.
NO_NAME = _Missing("")


def name_of(e: Any) -> Any:
    """A record's name for event_problems: None where the event has none."""
    return None if e.name is NO_NAME else e.name


def event_problems(ph: Any, name: Any, ts: Any, dur: Any, pid: Any, tid: Any, id_: Any) -> list[str]:
    """Why a viewer cannot place this event (empty: it can). One rule set for `trace check` and for
    the commands that must write only placeable events (slice, split drop the others). A field
    that is there with the wrong type is said to be of the wrong type, not missing."""
    if ph is None or ph == "":
        return ["no `ph`"]
    if not isinstance(ph, str):
        return [_wrong("ph", "str", ph)]
    if ph == "M":
        if name is None or pid is None:
            return ["metadata event without name or pid"]
        if not isinstance(name, str):
            return [_wrong("name", "str", name)]
        return [] if _ident(pid) else [_wrong("pid", "int | str", pid)]
    out: list[str] = []
    if ts is None:
        out.append("`ts` missing")
    elif not _num(ts):
        out.append(_wrong("ts", "int | float", ts))
    if ph in _TIMED:
        if pid is None or tid is None:
            out.append("`pid`/`tid` missing")
        for field, v in (("pid", pid), ("tid", tid)):
            if v is not None and not _ident(v):
                out.append(_wrong(field, "int | str", v))
        if ph == "X":
            if dur is None:
                out.append("`dur` missing")
            elif not _num(dur):
                out.append(_wrong("dur", "int | float", dur))
        if ph in _FLOWS and id_ is None:
            out.append("flow event without `id`")
    return out


def refuse_unplaceable(path: Path, events: list, before: int) -> None:
    """InputError naming the file and the first of these events (records with ph, name, ts, dur, pid, tid
    and id; `before` events precede them in the file) that event_problems refuses."""
    for k, e in enumerate(events):
        problems = event_problems(e.ph, name_of(e), e.ts, e.dur, e.pid, e.tid, e.id)
        if problems:
            ph = f" ({e.ph})" if isinstance(e.ph, str) and e.ph else ""
            raise InputError(str(path), f"event {before + k}{ph}: {problems[0]} (`zoomer-ar trace check` "
                                        "lists every problem)")


def placeable(e: Any) -> bool:
    """event_problems(e) is empty, for a record with ph, name, ts, dur, pid, tid and id fields."""
    if e.ph == "M":
        return isinstance(e.name, str) and e.name is not NO_NAME and _ident(e.pid)
    return not event_problems(e.ph, name_of(e), e.ts, e.dur, e.pid, e.tid, e.id)


# ---- the loader's types (load/schema.py): what `zoomer-ar analyze` refuses -------------------------


def wrong_type(exc: msgspec.ValidationError) -> str:
    """msgspec's complaint as one phrase: "`name` has the wrong type (Expected `str`, got `array`)"."""
    m = _AT.match(str(exc))
    if m is None:
        return f"a field has the wrong type ({exc})"
    field = m.group("field")
    if field:
        return f"`{field}` has the wrong type ({m.group('why')})"
    return f"not a JSON object ({m.group('why')})" if "Expected `object`" in m.group("why") else \
        f"wrong type ({m.group('why')})"


def type_problems(data: bytes | memoryview, before: int = 0, limit: int = 1) -> list[tuple[int, str]]:
    """(index in the file, why) of the events of this JSON array (a slice of the events, `before`
    events precede it) whose fields the loader refuses, at most `limit`. One decode of the whole
    slice when all are fine, as nearly always; event by event only in a slice that is not."""
    try:
        EVENTS_DECODER.decode(data)
        return []
    except msgspec.ValidationError:
        pass
    out: list[tuple[int, str]] = []
    for k, raw in enumerate(_RAWS.decode(data)):
        try:
            _EVENT.decode(raw)
        except msgspec.ValidationError as exc:
            out.append((before + k, wrong_type(exc)))
            if len(out) >= limit:
                break
    return out


def refuse_wrong_types(path: Path, data: bytes | memoryview, before: int) -> None:
    """InputError naming the file and the first event of this slice the loader refuses."""
    bad = type_problems(data, before)
    if bad:
        i, why = bad[0]
        raise InputError(str(path), f"event {i}: {why}")


class _ValidSlice:
    """`valid(view)`: whether every event of this slice passes both event_problems and
    type_problems, by one strict decode (slices.VALID_CHECK: a record per phase with the fields it
    needs required, of the loader's types); `n` is then the number of events. False whenever the
    strict decode refuses the slice: the caller then reads it the original way, which says what is
    wrong (or that nothing is: the strict decode also refuses a phase it has no record for, or a
    cut inside a string)."""

    n = 0
    timed = False  # the slice holds an event other than metadata

    def __call__(self, view, *, look_for_timed: bool = False) -> bool:
        from . import slices

        if not slices.FAST_PATH:
            return False
        data = bytes(view)  # the records' Raw values (RawArgs) must not hold the scanner's buffer
        try:
            events = slices.VALID_CHECK.decode(data)
        except (msgspec.MsgspecError, RecursionError):
            return False
        self.n = len(events)
        self.timed = look_for_timed and not slices.all_metadata(events)
        return True


_valid_slice = _ValidSlice()


def check_trace(path: Path, limit: int = 20) -> tuple[int, list[str]]:
    """(number of events, problems)."""
    why = unreadable(path) or ("empty file" if path.is_file() and path.stat().st_size == 0 else None)
    if why is not None:
        return 0, [why]
    problems: list[str] = []
    count = [0]
    on_timeline = [False]  # an event other than metadata seen (looked for until one is)

    def consume(view) -> None:
        if _valid_slice(view, look_for_timed=not on_timeline[0]):  # nearly every slice: nothing to report
            count[0] += _valid_slice.n
            on_timeline[0] = on_timeline[0] or _valid_slice.timed
            return
        events = _DECODER.decode(view)
        base = count[0]
        count[0] += len(events)
        on_timeline[0] = on_timeline[0] or any(e.ph != "M" for e in events)
        if len(problems) >= limit:
            return
        found = [(base + k, pr) for k, e in enumerate(events)
                 for pr in event_problems(e.ph, e.name, e.ts, e.dur, e.pid, e.tid, e.id)]
        found += type_problems(view, base, limit - len(problems))  # decoded where it lies (no copy)
        found = list(dict.fromkeys(found))  # a wrong type both rules see is said once
        for i, pr in sorted(found, key=lambda f: f[0])[: limit - len(problems)]:
            ph = events[i - base].ph
            timed = isinstance(ph, str) and ph in _TIMED
            problems.append(f"event {i}" + (f" ({ph})" if timed else "") + f": {pr}")

    try:
        from . import slices

        res = scan(path, consume, hash=False, slice_bytes=slices.SLICE_BYTES)
    except BadJSON as exc:  # NaN, items that are not objects: as `analyze` says it
        return count[0], [str(exc)]
    except StreamError as exc:
        return count[0], [f"not a readable trace: {exc}"]
    except msgspec.MsgspecError as exc:
        return count[0], [f"events are not JSON objects: {exc}"]
    except RecursionError:  # msgspec's answer to nesting deeper than Python's recursion limit
        return count[0], [f"not a readable trace: {TOO_DEEP}"]
    if not res.bare and not res.head:
        problems.append("no traceEvents list")
    elif not count[0]:
        problems.append(NO_EVENTS)
    elif not on_timeline[0] and not problems:
        problems.append(ONLY_METADATA)
    return count[0], problems
