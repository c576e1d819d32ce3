"""Repair the one kind of invalid JSON that PyTorch's profiler itself writes.

Kineto's Chrome-trace writer puts event names (and `args."Call stack"`) between quotes without
escaping them. With `with_stack=True` a Python frame's name is "<co_filename>(<line>): <co_name>",
and those strings can hold quotes, backslashes (Windows paths) and control characters - or, for
transient code objects (torch.compile, exec'd code), whatever the freed memory held, such as the
triple quote that opens a docstring. One such name makes the whole file invalid JSON, and every JSON reader
(json, HTA, Perfetto, TensorBoard) refuses all of it. Known upstream as pytorch/pytorch#146900,
#113001, #130622, #136180 and pytorch/kineto#336, #1459; torch 2.13's `export_chrome_trace` of a
torch.compile'd program still does it.

The writer's layout makes the damage local: a name is written as `"name": "<raw text>",` followed
by `"pid":` (on the same line, or - since 2025 - on the next one; a thread's name in its metadata event's
args by the end of that object on the next line; in torch's EventList export, `{"name": "<raw text>",
"ph": ...}` on one line, by `"ph":`), and a call stack as `"Call stack": "<raw text>"` on one line. Each name is read on its own (load/name_end.py: it ends at
the first quote after which the bytes read as JSON again, whatever else its line holds - other events,
on a line that holds them all; a name that cannot be told apart from the events around it is not
guessed at, the file is refused). `repair` re-escapes each such value that is not a valid JSON string
(its raw bytes taken as UTF-8, invalid sequences replaced); anything else is left byte for byte, and a
value that needs no repair is never touched. Where a name holds a raw line break (the one-line pass
cannot see it), the decoder's error offset points at it and the value around that offset is repaired
by the same rules, a few times at most. The caller decodes the result again: a file broken in any other
way stays refused with the decoder's own message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import NamedTuple

from .name_end import NAME_START, NAMES, OK, VALID, AmbiguousName, Reading, ends, key_at, name_end

# a call stack (record_shapes/with_stack on old Kineto): one line, no quote inside
_CALL_STACK = re.compile(rb'"Call stack": "([^\n"]*)"')
_BYTE = re.compile(r"\(byte (\d+)\)")
AT_ERRORS = 8  # repairs at decoder error offsets, after the one pass over all names


def _valid(body: bytes) -> bool:
    return VALID.fullmatch(body) is not None and _utf8(body)


def _utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _escape(body: bytes) -> bytes:
    """The raw text as a JSON string body: quotes, backslashes and control characters escaped."""
    return json.dumps(body.decode("utf-8", errors="replace"), ensure_ascii=False)[1:-1].encode("utf-8")


def _splice(data: bytes, spans, end: int) -> tuple[bytes, int]:
    """data[:end] with each (a, b) span of `spans` (in order, not overlapping) re-escaped, and their count."""
    parts: list[bytes] = []
    last = fixed = 0
    for a, b in spans:
        parts += [data[last:a], _escape(data[a:b])]
        last = b
        fixed += 1
    if not fixed:
        return (data if end == len(data) else data[:end]), 0
    parts.append(data[last:end])
    return b"".join(parts), fixed


def _pass(data: bytes, pattern: re.Pattern, limit: int | None = None) -> tuple[bytes, int]:
    """data with the pattern's invalid values re-escaped (the call stacks: a value without a quote); with
    `limit`, data[:limit] (the matches whose value starts before it)."""
    end = len(data) if limit is None else limit

    def spans():
        for m in pattern.finditer(data):
            a, b = m.span(1)
            if a >= end:
                return
            if not _valid(m.group(1)):
                yield a, b

    return _splice(data, spans(), end)


def _names_pass(data: bytes, limit: int | None = None) -> tuple[bytes, int]:
    """data with the names the profiler did not escape re-escaped (each name read on its own: name_end);
    with `limit`, data[:limit] (the names that start before it: what follows one may lie beyond it).
    AmbiguousName where a name's end cannot be told apart from the members around it."""
    end = len(data) if limit is None else limit

    def spans():
        after = 0
        for m in NAMES.finditer(data):
            if m.start() < after:  # inside the text of a name read before
                continue
            a = m.start(1)
            if a >= end:
                return
            text = m.group(2)
            if text is not None:  # a valid text, then the usual members: nothing to repair unless not UTF-8
                if text.isascii() or _utf8(text):
                    continue
                b = m.end(2)
            else:
                got = name_end(data, a)
                if got is None:  # no end fits (a raw line break in it, or other invalid JSON): left for the decoder
                    continue
                b = after = got
                if _valid(data[a:b]):
                    continue
            yield a, b

    return _splice(data, spans(), end)


def passes(data: bytes, limit: int | None = None) -> tuple[bytes, int]:
    """The one-line repairs over data (names, then old call stacks): the bytes and the values re-escaped;
    with `limit`, data[:limit] (StreamRepair: a name's `"pid":` may lie beyond it)."""
    out, n1 = _names_pass(data, limit)
    out, n2 = _pass(out, _CALL_STACK)
    return out, n1 + n2


MAX_LINE = 64 << 20  # the streaming repair holds two lines at most: longer lines are not Kineto's layout


class StreamRepair:
    """repair()'s passes over one-line names and call stacks, on a stream of JSON bytes, in bounded
    memory: `feed(chunk)` returns the repaired bytes of the whole lines before the last one (a name's
    `"pid":` may be on the next line, so the last line waits for the next chunk), `finish()` the rest.
    The output is byte for byte what the passes give on the whole document (tests/test_repair.py cuts
    documents everywhere: a name's end is decided from its line and the next one); `fixed` counts the
    values re-escaped. Names with a raw line break - which only the whole-document repair finds, at the
    decoder's error offset - are not repaired here. A line longer than MAX_LINE raises ValueError (a
    document on one line is not Kineto's layout), a name that cannot be told apart AmbiguousName."""

    def __init__(self) -> None:
        self._carry = b""
        self.fixed = 0

    def _out(self, data: bytes, limit: int | None) -> bytes:
        out, fixed = passes(data, limit)
        self.fixed += fixed
        return out

    def feed(self, data: bytes) -> bytes:
        buf = self._carry + data if self._carry else bytes(data)
        last = buf.rfind(b"\n")
        cut = buf.rfind(b"\n", 0, last) + 1 if last > 0 else 0
        if cut <= 0:
            if len(buf) > 2 * MAX_LINE:
                raise ValueError(f"no line break in {len(buf) >> 20} MB: not the profiler's layout")
            self._carry = buf
            return b""
        self._carry = buf[cut:]
        return self._out(buf, cut)

    def finish(self) -> bytes:
        buf, self._carry = self._carry, b""
        return self._out(buf, None) if buf else b""


REACH = 1 << 16  # how far from the decoder's error offset a name's start and end are looked for


def _name_at(data: bytes | bytearray, at: int) -> tuple[int, int] | None:
    """(start, end) of the text of the event name that holds byte `at`, where it is one the profiler did not
    escape that the one-line pass leaves (a raw line break in it); None otherwise, and where its end cannot
    be told apart from the structure around it (name_end's rules: another event's start in it, or bytes
    after it that do not read as JSON)."""
    start = None
    for m in NAME_START.finditer(data, max(0, at - REACH), at + 1):
        if key_at(data, m.start()):
            start = m.end()
    if start is None:
        return None
    reading = Reading(data, start)
    try:
        for m in ends(data, start, at, min(len(data), at + REACH)):
            body = bytes(data[start : m.start()])
            if b'"ph":' in body or b"\n  {" in body or _valid(body) or reading.opens_another(m.start()):
                return None
            if reading.follows(m.start()) == OK:
                return start, m.start()
    except AmbiguousName:  # too long to tell apart
        return None
    return None


def unescaped_name_at(data: bytes | bytearray, at: int) -> bool:
    """Does byte `at` of `data` lie in an event name the profiler did not escape (what `repair` fixes)?"""
    return _name_at(data, at) is not None


def _offset(exc: BaseException) -> int | None:
    m = _BYTE.search(str(exc))
    return int(m.group(1)) if m else None


class Repaired(NamedTuple):
    doc: object  # what `decode` made of the repaired bytes
    data: bytes  # the repaired bytes
    fixed: int  # values re-escaped


def repair(data: bytes, decode: Callable[[bytes], object], error: BaseException) -> Repaired | BaseException:
    """The repaired document when re-escaping the profiler's unescaped names makes `data` decode;
    otherwise the last decode error (the first one when nothing could be repaired: a truncated file
    with a broken name says "truncated" once the name is repaired). `error` is what `decode(data)`
    raised; `decode` raises on bad JSON with the byte offset in its message (msgspec.DecodeError)."""
    try:
        data, fixed = passes(data)
    except AmbiguousName:
        return error
    for _ in range(AT_ERRORS + 1):
        if fixed:
            try:
                return Repaired(decode(data), data, fixed)
            except Exception as exc:  # noqa: BLE001 - any decode failure: look where it points
                error = exc
        at = _offset(error)
        if at is None:
            return error
        span = _name_at(data, at)
        if span is None:
            return error
        data = data[: span[0]] + _escape(data[span[0] : span[1]]) + data[span[1] :]
        fixed += 1
    return error
