"""Columns from the compiled event reader (`_fastjson.c`), as ColumnBuilder would build them.

The compiled reader is an optional accelerator: it parses the `traceEvents` array straight into
columns, without a Python object per event. Without a C compiler at install time (or with
ZOOMER_FAST_JSON=0) the loader uses msgspec and ColumnBuilder; where the reader meets an event
outside its subset (a value of an unusual type, a duplicate key, invalid JSON...) it raises
`Unsupported` and the loader redoes the file with msgspec. Both give the same RankTrace: the test
suite compares them column by column on every corpus trace.
"""

from __future__ import annotations

import os
from itertools import compress
from typing import Any

import msgspec
import numpy as np

from .columns import INT_NONE, PH_META, RankTrace, _float_or_nan, _int_or_none, decode_json_texts, trace_from_columns
from .narrow import as_constant, concat_parts, narrow, narrow_column

try:  # built by setup.py where a C compiler is available
    from . import _fastjson
except ImportError:  # pragma: no cover - depends on the installation
    _fastjson = None

Unsupported = _fastjson.Unsupported if _fastjson is not None else type("Unsupported", (ValueError,), {})

DTYPES = {  # column -> dtype of the compiled reader's output
    "ts": np.float64, "dur": np.float64, "ph": np.uint8, "cat": np.int32, "name": np.int32, "pid": np.int32,
    "tid": np.int32, "correlation": np.int64, "stream": np.int64, "device": np.int64, "device_id": np.int64,
    "external_id": np.int64, "external_id_2021": np.int64, "nbytes": np.float64, "total_allocated": np.float64,
}
NARROW_ROWS = 1 << 13  # rows of chunk parts narrowed together: 0.6 MB of wide id columns at most

_NARROW = {  # what a chunk's part of a column is kept as until finish() (trace_from_columns narrows the whole)
    **dict.fromkeys(("cat", "name", "pid", "tid"), narrow),
    **dict.fromkeys(("correlation", "stream", "device", "device_id", "external_id", "external_id_2021"), narrow_column),
    **dict.fromkeys(("nbytes", "total_allocated"), as_constant),
}
_SPARSE = ("input_dims", "input_type", "call_stack", "collective", "in_msg_nelems", "python_id", "meta_name")


def available() -> bool:
    """Whether the compiled reader is installed and not switched off (ZOOMER_FAST_JSON=0)."""
    return _fastjson is not None and os.environ.get("ZOOMER_FAST_JSON", "1").strip() not in ("0", "false", "no", "off")


def describe() -> str:
    """Which event reader and gzip library loads traces here (for --version and the benchmarks)."""
    from .inflate import IMPLEMENTATION

    if available():
        reader = "compiled event reader (zoomer_ar/load/_fastjson.c)"
    elif _fastjson is not None:
        reader = "msgspec + ColumnBuilder (ZOOMER_FAST_JSON=0)"
    else:
        reader = "msgspec + ColumnBuilder (the compiled reader is not built)"
    return f"{reader}; gzip: {IMPLEMENTATION}"


def feed_events(feed, buf: bytearray, next_chunk, after=None) -> bytearray:
    """Drive a compiled reader over the events array: `buf` starts with the array's `[`, then
    `next_chunk()` gives the following bytes (None at the end). `feed(view, start, final)` is the
    reader's feed; `after()` runs after each call (to take the columns). Returns the bytes read
    after the array's `]` (the top-level keys that follow it).

    Each chunk is parsed where it lies, not copied: only the event cut in two at a chunk's end is
    joined with the start of the next chunk (64 KB, more while that is not enough) and parsed from
    that small buffer; parsing then goes on in the chunk itself after the joined part. Copying
    every chunk into a buffer first added a copy of every byte to the parse."""
    cur, pos, final = buf, 1, False
    while True:
        pos, ended = feed(cur, pos, final)
        if after is not None:
            after()
        if ended:
            return bytearray(cur[pos:])
        if final:
            break
        chunk = next_chunk()
        tail = cur[pos:]
        if chunk is None:
            cur, pos, final = tail, 0, True
            continue
        if not tail:
            cur, pos = chunk, 0
            continue
        k = JOIN_BYTES
        while True:  # the event cut in two: the tail of the last chunk and the start of this one
            k = min(k, len(chunk))
            joined = bytes(tail) + chunk[:k]
            p2, ended = feed(joined, 0, False)
            if after is not None:
                after()
            if ended:
                return bytearray(joined[p2:]) + chunk[k:]
            if p2 >= len(tail):  # past the cut: go on in the chunk itself
                cur, pos = chunk, p2 - len(tail)
                break
            if k == len(chunk):  # an event longer than the chunk: carry it to the next one
                cur, pos = joined, p2
                break
            k *= 4
    if not ended:
        raise Unsupported("the events array is not closed")
    return bytearray(cur[pos:])


JOIN_BYTES = 1 << 16  # bytes of the next chunk joined with an event cut at a chunk's end


def raw_parser(name_index: dict, cat_index: dict, pid_index: dict, tid_index: dict):
    """The compiled reader itself, coding into the given tables (raises RuntimeError without it)."""
    if _fastjson is None:
        raise RuntimeError("the compiled event reader is not installed")
    return _fastjson.EventParser(name_index, cat_index, pid_index, tid_index, msgspec.json.decode)


class FastBuilder:
    """Feeds JSON bytes of the events array to the compiled reader and assembles a RankTrace."""

    def __init__(self, rank: int, path: str) -> None:
        if _fastjson is None:
            raise RuntimeError("the compiled event reader is not installed")
        self.rank, self.path = rank, path
        self._index: dict[str, dict] = {"name": {}, "cat": {}, "pid": {}, "tid": {}}
        idx = self._index
        self._parser = _fastjson.EventParser(idx["name"], idx["cat"], idx["pid"], idx["tid"], msgspec.json.decode)
        self._parts: dict[str, list[np.ndarray]] = {k: [] for k in DTYPES}
        self._wide: dict[str, list[np.ndarray]] = {k: [] for k in DTYPES}  # the parts since the last _narrow_wide
        self._wide_n = 0
        self._pos: dict[str, list[np.ndarray]] = {f: [] for f in _SPARSE}
        self._uid: dict[str, list[np.ndarray]] = {f: [] for f in _SPARSE}
        self._uniques: dict[str, list[bytes]] = {f: [] for f in _SPARSE}
        self.n = 0

    def feed(self, buf, start: int, final: bool) -> tuple[int, bool]:
        """Parse the whole events of buf[start:] (buf[start-1] was `[`, `,` or an event's end).

        Returns (where the first incomplete event starts, whether the array's `]` was read: then
        the position is just after it). Raises Unsupported. See feed_events."""
        pos, ended = self._parser.feed(buf, start, final)
        self._take()
        return pos, ended

    def _take(self) -> None:
        n, cols, sparse = self._parser.take()
        if not n:
            return
        self.n += n
        for k, dt in DTYPES.items():
            self._wide[k].append(np.frombuffer(cols[k], dtype=dt))
        self._wide_n += n
        if self._wide_n >= NARROW_ROWS:
            self._narrow_wide()
        for f in _SPARSE:
            pos, uid, uniques = sparse[f]
            if pos:
                self._pos[f].append(np.frombuffer(pos, dtype=np.int64))
                self._uid[f].append(np.frombuffer(uid, dtype=np.int32))
            self._uniques[f] = uniques

    def _narrow_wide(self, final: bool = False) -> None:
        """Move the chunks' parts read since the last call to the kept parts: the ids and byte counts
        joined and narrowed (load/narrow.py), as a block of at least NARROW_ROWS rows (numpy calls
        per block, not per chunk); at the end (final) as they are where they are the whole column,
        since trace_from_columns narrows it (a file read in one chunk is narrowed once), and
        narrowed too where they join narrowed blocks (no wide copy of the whole column then)."""
        for k, wide in self._wide.items():
            if k not in _NARROW or (final and not self._parts[k]):
                self._parts[k].extend(wide)
            elif wide:
                self._parts[k].append(_NARROW[k](np.concatenate(wide) if len(wide) > 1 else wide[0]))
            wide.clear()
        self._wide_n = 0

    def _sparse(self, f: str, convert) -> dict[int, Any]:
        if not self._pos[f]:
            return {}
        values = decode_json_texts(self._uniques[f])
        pos = np.concatenate(self._pos.pop(f)).tolist()
        uid = np.concatenate(self._uid.pop(f)).tolist()
        if None in values:  # a text that does not decode to a value: absent, as in ColumnBuilder
            keep = [values[u] is not None for u in uid]
            pos, uid = list(compress(pos, keep)), list(compress(uid, keep))
        if convert is not None:
            values = [None if v is None else convert(v) for v in values]
        return dict(zip(pos, map(values.__getitem__, uid)))

    def finish(self) -> RankTrace:
        self._narrow_wide(final=True)
        parts = self._parts

        def cat(k: str) -> np.ndarray:
            p = parts.pop(k)
            return concat_parts(p) if p else np.empty(0, dtype=DTYPES[k])

        ext = cat("external_id")
        ext21 = cat("external_id_2021")
        if (ext == INT_NONE).all():
            ext = ext21
        del ext21
        device = cat("device")
        device_id = cat("device_id")
        missing = device == INT_NONE
        if missing.any():
            device = np.where(missing, device_id, device)
        del device_id, missing
        trace = trace_from_columns(self.rank, self.path, self._index, cat, device, ext)
        trace.input_dims = self._sparse("input_dims", None)
        trace.input_type = self._sparse("input_type", None)
        trace.call_stack = self._sparse("call_stack", None)
        trace.collective = self._sparse("collective", None)
        trace.msg_nelems = self._sparse("in_msg_nelems", _float_or_nan)
        trace.python_id = self._sparse("python_id", _int_or_none)
        meta = self._sparse("meta_name", None)
        if meta:
            names = trace.names
            for i, v in meta.items():
                if trace.ph[i] != PH_META:
                    continue
                n = names[int(trace.name[i])]
                if n == "thread_name":
                    trace.thread_names[int(trace.tid[i])] = str(v)
                elif n == "process_name":
                    trace.process_names[int(trace.pid[i])] = str(v)
        return trace
