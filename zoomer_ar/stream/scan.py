"""Cut the `traceEvents` array of a trace into slices of whole events, as the bytes stream in.

The scanner never holds more than about two slices of JSON. Each slice is handed to a consumer as
a JSON array (`[ev, ev, ...]`, a memoryview valid during the call only), which decodes it with its
own msgspec decoder. Cuts are made at an event boundary (`}` then `,` then `{`, whitespace
allowed): instead of tracking string and escape state byte by byte in Python, every cut is checked
by the decoder itself. A cut that falls inside a string leaves the slice with an unterminated
string, a cut inside a nested object leaves it unbalanced, and both fail to decode; the scanner
then tries an earlier boundary (or waits for more bytes). A slice that decodes is therefore
exactly a run of whole events, in file order.

The top-level keys around the array (`deviceProperties`, `distributedInfo`, ...) are read from the
bytes before and after it (`head`, `tail`), which surgery also copies verbatim. A bare Chrome
array (`[ev, ...]`) is accepted too. Anything unexpected raises StreamError: the caller falls back
to the whole-document loader, which explains bad input.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..load import fastcols
from ..load.cuts import last_boundary as _cut
from ..load.cuts import skip_ws as _skip_ws
from ..load.fastcols import feed_events
from ..load.name_end import NAME_START
from ..load.repair import StreamRepair, unescaped_name_at
from ..load.reader import scoped_progress
from .source import CHUNK, BadJSON, ChunkReader, Progress, StreamError, require_regular

SLICE = 1 << 20  # JSON bytes per slice handed to the consumer
MAX_HEAD = 256 << 20  # bytes before "traceEvents" that we accept to buffer
MAX_BUFFER = 512 << 20
MAX_TAIL = 64 << 20  # bytes after the events array, whitespace aside (a real trace's are a few kB)
TAIL_KEEP = 64 << 10  # bytes kept for the search of the array's end  # a single event (or a run without a valid cut) larger than this: give up
_KEY = b'"traceEvents"'
_END = re.compile(rb"\}[ \t\r\n]*\]")
_WS = b" \t\r\n"
_OPEN, _CLOSE, _COMMA, _LBRACE, _COLON = 0x5B, 0x5D, 0x2C, 0x7B, 0x3A


class TopLevel(msgspec.Struct, gc=False):
    """The keys of a trace document other than the events."""

    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[dict[str, Any]] | None = None
    schemaVersion: Any = None
    baseTimeNanoseconds: int | float | None = None
    displayTimeUnit: str | None = None
    traceEvents: msgspec.Raw | None = None


_TOP = msgspec.json.Decoder(TopLevel)
TOP_FIELDS = ("distributedInfo", "deviceProperties", "schemaVersion", "baseTimeNanoseconds", "displayTimeUnit")


@dataclass
class ScanResult:
    head: bytes = b""  # bytes before the events array's `[` (b"" for a bare array)
    tail: bytes = b""  # bytes after its `]`
    bare: bool = False  # the document is a bare array of events
    top: dict[str, Any] = field(default_factory=dict)  # TOP_FIELDS present in the document
    sha256: str = ""
    json_bytes: int = 0  # decompressed size
    slices: int = 0




Consumer = Callable[[memoryview], None]


def _emit(buf: bytearray, end: int, consume: Consumer) -> None:
    """Hand buf[0:end+1] to the consumer as a JSON array; buf[0] is overwritten with `[` and
    buf[end] must be `]`."""
    buf[0] = _OPEN
    with memoryview(buf) as mv:
        view = mv[: end + 1]
        try:
            consume(view)
        finally:
            view.release()


def _chunks(reader: ChunkReader, progress: Progress | None, size: int) -> Callable[[], bytes | None]:
    """next_chunk(): the reader's next chunk of JSON, None at the end (reports progress)."""
    it = iter(reader)

    def next_chunk() -> bytes | None:
        try:
            data, read = next(it)
        except StopIteration:
            return None
        if progress is not None:
            progress(read, size)
        return data

    return next_chunk


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def _ends_outside_string(buf: bytearray) -> bool:
    """Whether the end of buf lies outside a JSON string, for a buffer that starts outside one
    (the document's start, an event boundary, the bytes after the events array)."""
    end = 0
    for m in _STRING.finditer(buf):
        end = m.end()
    return buf.find(b'"', end) < 0


class _Appender:
    """more(): append the next chunk to buf; False at the end.

    A chunk of nothing but whitespace that lies outside any string (a trace padded with GBs of
    blanks, between events or after the array) is not kept: one blank stands for the run, which
    means the same in JSON. So the buffer stays small whatever the padding (it used to hold all of
    it: 4.4 GB of trailing whitespace kept 4.4 GB). Whitespace inside a string is kept as it is.
    `fed` counts the bytes that came, kept or not."""

    def __init__(self, next_chunk: Callable[[], bytes | None], buf: bytearray) -> None:
        self.next_chunk, self.buf = next_chunk, buf
        self.fed = 0
        self._outside = False  # the buffer is known to end outside a string (only blanks appended since)

    def reset(self) -> None:
        """The buffer was replaced (it starts outside a string)."""
        self._outside = False

    def __call__(self) -> bool:
        data = self.next_chunk()
        if data is None:
            return False
        self.fed += len(data)
        buf = self.buf
        if data and not data.strip(_WS):
            if self._outside or _ends_outside_string(buf):
                self._outside = True
                if not buf or buf[-1] not in _WS:
                    buf += data[:1]
                return True
        else:
            self._outside = False
        buf.extend(data)
        return True


def _open(path: Path, chunk: int, hash: bool, progress: Progress | None,  # noqa: A002
          repair: StreamRepair | None = None):
    """(reader, result, buffer, next_chunk, more) for one scan of path: next_chunk() returns the
    next chunk, more() appends it to the buffer. StreamError for anything but a regular file (a
    named pipe would block the reader for ever). `repair`: the bytes go through it (the profiler's
    unescaped names re-escaped, load/repair.py)."""
    require_regular(path)
    reader = ChunkReader(path, chunk=chunk, hash=hash, repair=repair)
    buf = bytearray()
    next_chunk = _chunks(reader, progress if progress is not None else scoped_progress(path), path.stat().st_size)
    return reader, ScanResult(), buf, next_chunk, _Appender(next_chunk, buf)


_BYTE = re.compile(r"\(byte (\d+)\)")
_NOT_OBJECT = re.compile(r"^Expected `object`, got `(\w+)` - at `\$\[(\d+)\]`$")


REPAIR_HINT = ("; an event name the profiler did not escape (pytorch/pytorch#146900): `zoomer-ar trace repair "
               "SRC OUT.json.gz` writes a copy that opens, and `zoomer-ar analyze` reads it as it is")


def bad_json(exc: Exception, base: int, bare: bool, data: bytes | bytearray | None = None) -> BadJSON:
    """The decoder's complaint about a slice that no cut made decode, in the in-memory loader's
    words: "not valid JSON (...)" with the byte offset in the document (`base`: the offset of the
    slice's first byte), or, for items that are not objects, what `analyze` says of them. Where the
    offset lies in an event name the profiler did not escape (`data`: the slice), the message says
    how to repair it."""
    msg = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        m = _NOT_OBJECT.match(msg)
        if m is not None:
            if bare:
                return BadJSON("not a Kineto trace: a JSON array whose items are not trace events")
            return BadJSON(f"malformed trace: Expected `object`, got `{m.group(1)}` - at `$.traceEvents[...]`")
        return BadJSON(f"not valid JSON ({msg.split(' - at ')[0]})")  # e.g. a number out of range
    hint = ""
    m = _BYTE.search(msg)
    if data is not None and m is not None and unescaped_name_at(data, int(m.group(1))):
        hint = REPAIR_HINT
    return BadJSON("not valid JSON (" + _BYTE.sub(lambda b: f"(byte {base + int(b.group(1))})", msg) + ")" + hint,
                   unescaped_name=bool(hint))


def _read_head(buf: bytearray, more: Callable[[], bool], res: ScanResult) -> None:
    """Read up to the events array: afterwards buf[0] is its `[`; res gets head, bare and top."""
    while True:
        if not more():
            raise StreamError("no events array")
        first = _skip_ws(buf, 0)
        if first < len(buf):
            break
    if buf[first] == _OPEN:
        res.bare = True
        del buf[:first]
    elif buf[first] == _LBRACE:
        k = -1
        searched = 0
        while True:
            if k < 0:
                k = buf.find(_KEY, max(0, searched - len(_KEY)))
                searched = len(buf)
            if k >= 0:
                j = _skip_ws(buf, k + len(_KEY))
                if j < len(buf):
                    if buf[j] != _COLON:
                        raise StreamError("unexpected bytes after the traceEvents key")
                    j = _skip_ws(buf, j + 1)
                    if j < len(buf):
                        if buf[j] != _OPEN:
                            raise StreamError("traceEvents is not an array")
                        break
            if len(buf) > MAX_HEAD:
                raise StreamError("no traceEvents key near the start of the document")
            if not more():
                raise StreamError("no traceEvents key")
        head = bytes(buf[:j])
        try:
            top = _TOP.decode(head[:k] + b'"traceEvents":null}')
        except msgspec.MsgspecError:
            raise StreamError("the keys before traceEvents do not decode") from None
        res.head = head
        res.top = {f: getattr(top, f) for f in TOP_FIELDS if getattr(top, f) is not None}
        del buf[:j]  # buf[0] is the array's `[`
    else:
        raise StreamError("not a JSON object or array")


def scan(path: Path, consume: Consumer, *, slice_bytes: int = SLICE, chunk: int = CHUNK,
         progress: Progress | None = None, hash: bool = True,  # noqa: A002
         on_head: Callable[[ScanResult], None] | None = None, repair: StreamRepair | None = None) -> ScanResult:
    """Stream the events of `path` to `consume`, slice by slice, in file order.

    `consume(view)` must decode the view first and raise msgspec.DecodeError (or ValidationError)
    before doing anything else when it does not decode: the scanner then cuts elsewhere.
    `on_head(result)` is called once the bytes before the events (`head`, `bare`, the top-level
    keys found so far) are known, before the first slice.
    """
    reader, res, buf, next_chunk, more = _open(path, chunk, hash, progress, repair)
    last: list = [None, 0]  # the decoder's last complaint since the last slice that decoded, and where

    def failed(exc: Exception) -> None:
        last[0], last[1] = exc, more.fed - len(buf)

    def not_found(what: str) -> StreamError:
        return bad_json(last[0], last[1], res.bare, buf) if last[0] is not None else StreamError(what)

    try:
        _read_head(buf, more, res)
        if on_head is not None:
            on_head(res)
        # ---- events, slice by slice
        j = _skip_ws(buf, 1)
        while j >= len(buf):
            if not more():
                raise StreamError("the events array is not closed")
            j = _skip_ws(buf, 1)
        empty = buf[j] == _CLOSE

        searched = [1]  # boundaries before this index were looked for already (load/cuts.py)

        def try_cut(limit: int) -> bool:
            """Emit the events before the last boundary below `limit` that decodes."""
            lo = searched[0]
            p, c = _cut(buf, limit, lo)
            for _ in range(4):
                if p <= 0:
                    break
                saved = buf[p + 1]
                buf[p + 1] = _CLOSE
                try:
                    _emit(buf, p + 1, consume)
                except msgspec.MsgspecError as exc:  # the cut fell inside a string or an object
                    failed(exc)
                    buf[p + 1] = saved
                    p, c = _cut(buf, p, lo)
                    continue
                buf[p + 1] = saved
                last[0] = None
                res.slices += 1
                del buf[:c]  # buf[0] is the `,` before the next event
                searched[0] = 1
                return True
            # a later boundary has its `{` at or after `limit` (one with its `}` before it was seen)
            searched[0] = max(lo, limit)
            return False

        eof = False
        target = slice_bytes
        while not empty:
            if not eof and len(buf) < target:
                eof = not more()
                continue
            if eof:  # cut down to a small remainder, in which the array's end is looked for
                if len(buf) > 2 * TAIL_KEEP and try_cut(len(buf) - TAIL_KEEP):
                    continue
                break
            if try_cut(len(buf)):
                target = slice_bytes
            else:  # no boundary that decodes yet: take more bytes first
                if len(buf) > MAX_BUFFER:
                    raise not_found(f"no decodable event boundary in {MAX_BUFFER >> 20} MB (an event that large, "
                                    "or that much data after the events array)")
                target = len(buf) + chunk
        # ---- the end: the last events, `]`, the keys after the array
        if empty:
            while more():
                _tail_bound(len(buf))
            k = _skip_ws(buf, 1)
            tail = bytes(buf[k + 1 :])
            res.tail = tail
            _read_tail(res, tail)
        else:
            for m in _END.finditer(buf, 1):
                q = m.end() - 1
                tail = bytes(buf[q + 1 :])
                if not _tail_ok(res, tail):
                    continue
                try:
                    _emit(buf, q, consume)
                except msgspec.MsgspecError as exc:
                    failed(exc)
                    continue
                _tail_bound(len(tail))
                res.slices += 1
                res.tail = tail
                _read_tail(res, tail)
                break
            else:
                # no `}` `]` ends the array: items that are not objects (`[1, 2, 3]`)? Let the
                # consumer's decoder say what they are (the last few `]` only: this is a refusal)
                for q in [m.start() for m in re.finditer(rb"\]", buf)][::-1][:16]:
                    tail = bytes(buf[q + 1 :])
                    if q < 1 or not _tail_ok(res, tail):
                        continue
                    try:
                        _emit(buf, q, consume)
                    except msgspec.MsgspecError as exc:
                        failed(exc)
                        continue
                    raise BadJSON("not a Kineto trace: a JSON array whose items are not trace events" if res.bare
                                  else "malformed trace: the items of traceEvents are not event objects")
                raise not_found("the end of the events array was not found")
    finally:
        reader.close()
    res.sha256 = reader.sha256 or ""
    res.json_bytes = reader.total
    return res


def scan_columns(path: Path, parser, consume: Callable[[int, dict, dict], None], *, chunk: int = CHUNK,
                 progress: Progress | None = None, hash: bool = True,  # noqa: A002
                 repair: StreamRepair | None = None,
                 on_head: Callable[[ScanResult], None] | None = None) -> ScanResult:
    """scan() for the compiled event reader (load/_fastjson.c), which tracks JSON itself: each
    chunk is fed to `parser` and the columns of its whole events go to `consume(n, columns,
    sparse)`; the reader finds the array's end. Raises fastcols.Unsupported where an event is
    outside the reader's subset (the caller redoes the pass with scan()). `on_head` as scan()'s."""
    reader, res, buf, next_chunk, more = _open(path, chunk, hash, progress, repair)

    try:
        _read_head(buf, more, res)
        if on_head is not None:
            on_head(res)

        def after() -> None:
            n, cols, sparse = parser.take()
            if n:
                consume(n, cols, sparse)
                res.slices += 1

        def feed(view, start: int, final: bool):
            try:
                return parser.feed(view, start, final)
            except fastcols.Unsupported as exc:
                if repair is None and _unescaped_event(view, exc):  # say so now: no msgspec pass to find it
                    raise BadJSON("not valid JSON (an event name the profiler did not escape)" + REPAIR_HINT,
                                  unescaped_name=True) from None
                raise

        rest = feed_events(feed, buf, next_chunk, after)
        del buf[:]
        buf += rest
        more.reset()
        _tail_bound(len(buf))
        while more():  # blank padding is not kept (_Appender)
            _tail_bound(len(buf))
        res.tail = bytes(buf)
        _read_tail(res, res.tail)
    finally:
        reader.close()
    res.sha256 = reader.sha256 or ""
    res.json_bytes = reader.total
    return res


_EVENT_AT = re.compile(r"event at byte (\d+)")
_NAMES_LOOKED_AT = 4


def _unescaped_event(view, exc: Exception) -> bool:
    """Is the event the compiled reader stopped at (its message gives where the event starts) one whose
    name the profiler did not escape (load/repair.py)? Each of its first names is looked at (a thread's name is
    the second, in its args), the key as any writer spaces it (NAME_START: `"name": "`, or `"name":"`)."""
    m = _EVENT_AT.search(str(exc))
    if m is None:
        return False
    start = int(m.group(1))
    keys = NAME_START.finditer(bytes(view[start : start + (1 << 16)]))
    return any(unescaped_name_at(view, start + key.end()) for key, _ in zip(keys, range(_NAMES_LOOKED_AT)))


def _tail_bound(n: int) -> None:
    """The bytes after the events array are kept to read the keys there: refuse more than
    MAX_TAIL of them that are not whitespace (whitespace is not kept, see _Appender)."""
    if n > MAX_TAIL:
        raise StreamError(f"more than {MAX_TAIL >> 20} MB of data after the events array (only the top-level keys "
                          "and whitespace may follow it)")


def _tail_ok(res: ScanResult, tail: bytes) -> bool:
    if res.bare:
        return not tail.strip(_WS)
    try:
        doc = _TOP.decode(b'{"traceEvents":null' + tail)
    except msgspec.MsgspecError:
        return False
    return doc.traceEvents is None


def _read_tail(res: ScanResult, tail: bytes) -> None:
    if res.bare:
        if tail.strip(_WS):
            raise StreamError("bytes after the events array")
        return
    if _KEY in tail:
        raise StreamError("traceEvents appears twice")
    try:
        doc = _TOP.decode(b'{"traceEvents":null' + tail)
    except msgspec.MsgspecError:
        raise StreamError("the keys after traceEvents do not decode") from None
    for f in TOP_FIELDS:
        v = getattr(doc, f)
        if v is None:
            continue
        if f in res.top:
            raise StreamError(f"top-level key {f} appears twice")
        res.top[f] = v
