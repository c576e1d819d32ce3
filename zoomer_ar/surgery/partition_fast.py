"""partition_trace's fast path: the same cut, from a compiled scanner's columns instead of msgspec.

partition.py's original passes decode every slice of the trace three times with msgspec and build
their columns with a Python call per field (52-66 MB/s of JSON per CPU-second). Here a compiled
scanner (`_partscan.c`) reads each chunk of the events array and gives, per event, where its JSON
lies in the chunk and the few fields the cut decides on (phase, start, duration, category code,
pid/tid/name presence, `args.correlation`, a flow's `id`, a ProfilerStep number); the decisions are
numpy expressions over those columns, with the rules of slices.fast_timeline,
slices.fast_correlations, cut.survey and partition._copy.

Two passes instead of three, and only the first parses every event:

- The survey: the steps, the time span and unit, and per batch (the events of one chunk) a
  summary (_Batches: its byte range, its launches' ids, its events' starts, ...) and its launches'
  (_LaunchChunks: their smallest and largest start and id; the launches themselves while they fit
  in LAUNCH_RECORDS_BYTES). Once the cut times are known, a batch whose launches lie in one window
  gives that window's range of ids at once; the few whose launches straddle a cut are read again
  (their byte range only, for an uncompressed trace). The file's sha256 comes from this pass's
  reader thread.
- The copy: a batch whose own events all go to one window (no metadata, `Trace` span or
  unplaceable event in it, the same bytes between each two events: nearly every batch) is copied
  as it lies, the bytes between its events made a bare `,` (`},\n  {` -> `},{`, checked to occur
  exactly between its events); any other batch is parsed again and its events copied one by one
  (`gather`, in C). Either way each window gets its events joined by `,`, as TraceWriter.write_raw
  joins them.

The scanner reads a subset of JSON whose meaning is plain (see _partscan.c); outside it (and for
anything this path does not read itself: an unreadable file, bytes that are not what the survey
read) it raises Fallback, before any output is committed, and partition_trace cuts the trace the
original way, which says what it says of it. One difference: for `target_bytes`, K counts the
events array's bytes, `[` to `]`, where the original summed its slices (a byte more for each MB
slice): K differs only for a size within that many bytes of a multiple of target_bytes.
tests/huge/test_partition.py compares both paths' files byte for byte.
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from ..errors import InputError
from ..stream.nscount import NsCounter
from ..stream.scan import ScanResult, _open, _read_head, _read_tail, _tail_bound
from ..stream.source import ChunkReader, StreamError, compression_of
from .copying import abort_outputs, output_folder
from .cut import _STEP_RE, Survey
from .io import TraceWriter, write_queue
from .partition import (LaunchSpans, NotPartitionable, Partition, Ranges, _close_windows, _cuts, _drop_empty,
                        _refuse_merged)
from .slices import LAUNCH_RECORDS_BYTES

try:  # built by setup.py where a C compiler is available
    from . import _partscan
except ImportError:  # pragma: no cover - depends on the installation
    _partscan = None

#: Switch for the tests, which compare this path's outputs with the original code's.
FAST = True
CHUNK = 1 << 20  # decompressed bytes per read (the reader's default: a chunk and its copies stay in cache)

_NOPH, _META, _X, _FLOW = 1, 2, 3, 4  # slices._PH_CODE (0: a phase with no rule but `ts`; 5: other timed)
_F_PID, _F_TID, _F_NAME, _F_ID = 1, 2, 4, 8
_STEP_CATS = ("user_annotation", "gpu_user_annotation", "Operator", "cpu_op", "")
_DEVICE_WORDS = ("kernel", "memcpy", "memset")
_LAUNCH_WORDS = ("runtime", "driver")


class Fallback(Exception):
    """The fast path cannot cut this trace (outside the scanner's subset, or unreadable): the
    original code does."""


def available() -> bool:
    """Whether the compiled scanner is built and not switched off (FAST, ZOOMER_FAST_JSON=0)."""
    return FAST and _partscan is not None and \
        os.environ.get("ZOOMER_FAST_JSON", "1").strip() not in ("0", "false", "no", "off")


# ------------------------------------------------------------------------------------------------
# a batch of events: the scanner's columns
# ------------------------------------------------------------------------------------------------


class _Cats:
    """What the cut needs to know of each category, by the scanner's code (+1: code -1 is a
    missing `cat`, read as "" as the surgery records read it)."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []  # the scanner appends each new category's JSON token
        self._names: list[str] = [""]
        self.launcher = self.trace = self.fwdbwd = self.device = self.step = self.gpu_step = np.zeros(1, bool)
        self._update()

    def _update(self) -> None:
        for tok in self.raw[len(self._names) - 1 :]:
            self._names.append(msgspec.json.decode(tok))
        low = [c.lower() for c in self._names]
        self.launcher = np.array([any(w in c for w in _LAUNCH_WORDS) for c in low], dtype=bool)
        self.device = np.array([any(w in c for w in _DEVICE_WORDS) and not any(w in c for w in _LAUNCH_WORDS)
                                for c in low], dtype=bool)
        self.trace = np.array([c == "Trace" for c in self._names], dtype=bool)
        self.fwdbwd = np.array([c == "fwdbwd" for c in self._names], dtype=bool)
        self.step = np.array([c in _STEP_CATS for c in self._names], dtype=bool)
        self.gpu_step = np.array([c == "gpu_user_annotation" for c in self._names], dtype=bool)

    def index(self, cat: np.ndarray) -> np.ndarray:
        if len(self.raw) + 1 != len(self._names):
            self._update()
        return cat.astype(np.int64) + 1


@dataclass
class _Batch:
    """The events the scanner read from one buffer, with their Timeline (slices.fast_timeline's
    rules) and correlations (slices.fast_correlations')."""

    buf: bytes
    base: int  # offset of buf[0] in the decompressed JSON
    start: np.ndarray
    end_off: np.ndarray
    code: np.ndarray
    cat: np.ndarray  # index into _Cats' arrays
    corr: np.ndarray
    fid: np.ndarray
    step: np.ndarray
    ok: np.ndarray
    meta: np.ndarray
    timed: np.ndarray
    x: np.ndarray
    ts: np.ndarray  # 0 where not timed
    end: np.ndarray  # ts + dur for complete events

    @property
    def n(self) -> int:
        return self.start.size

    def launches(self, cats: _Cats) -> np.ndarray:
        """The timed runtime calls with a correlation id."""
        return self.timed & cats.launcher[self.cat] & (self.corr >= 0)

    def keys(self, cats: _Cats) -> np.ndarray:
        """The id that ties an event to a launch (-1: none): a device event's correlation, a
        launch flow's id."""
        key = np.where(self.timed & ~cats.launcher[self.cat], self.corr, -1)
        flow = self.ok & (self.code == _FLOW) & ~cats.fwdbwd[self.cat]
        if flow.any():
            key[flow] = self.fid[flow]
        return key


def _batch(buf: bytes, base: int, cols: tuple, cats: _Cats) -> _Batch:
    n = cols[0]
    start = np.frombuffer(cols[1], dtype=np.int64, count=n)
    end_off = np.frombuffer(cols[2], dtype=np.int64, count=n)
    code = np.frombuffer(cols[3], dtype=np.uint8, count=n)
    flags = np.frombuffer(cols[4], dtype=np.uint8, count=n)
    ts = np.frombuffer(cols[5], dtype=np.float64, count=n)
    dur = np.frombuffer(cols[6], dtype=np.float64, count=n)
    cat = cats.index(np.frombuffer(cols[7], dtype=np.int32, count=n))
    corr = np.frombuffer(cols[8], dtype=np.int64, count=n)
    fid = np.frombuffer(cols[9], dtype=np.int64, count=n)
    step = np.frombuffer(cols[10], dtype=np.int64, count=n)
    meta_c = code == _META
    ok = ~np.isnan(ts) & (code != _NOPH)
    both = (flags & (_F_PID | _F_TID)) == (_F_PID | _F_TID)
    ok &= (code < _X) | both  # a timed phase needs pid and tid
    is_x = code == _X
    ok &= ~is_x | ~np.isnan(dur)
    ok &= (code != _FLOW) | ((flags & _F_ID) != 0)  # a flow a non-null id
    if meta_c.any():  # metadata: a pid and a name, no time
        ok = np.where(meta_c, (flags & (_F_PID | _F_NAME)) == (_F_PID | _F_NAME), ok)
    meta = ok & meta_c
    timed = ok & ~meta_c
    x = timed & is_x
    t = np.where(timed, ts, 0.0)
    d = np.where(x, dur, 0.0)
    return _Batch(buf, base, start, end_off, code, cat, corr, fid, step, ok, meta, timed, x, t, t + d)


# ------------------------------------------------------------------------------------------------
# one pass over the events array
# ------------------------------------------------------------------------------------------------


@dataclass
class _Pass:
    res: ScanResult
    array_bytes: int  # the events array's bytes, `[` to `]`


def _stream(path: Path, scanner, cats: _Cats, on_batch, *, hash: bool = False,  # noqa: A002
            on_head=None) -> _Pass:
    """Feed the events array of `path` to the scanner, chunk by chunk; `on_batch(batch)` for the
    events of each chunk (the chunk's bytes are the batch's `buf`). Fallback for anything the
    scanner or the reader refuses (the original code then says what is wrong)."""
    try:
        reader, res, buf, next_chunk, more = _open(path, CHUNK, hash, None)
    except (StreamError, OSError) as exc:
        raise Fallback(str(exc)) from None
    fail = (_partscan.Unsupported, StreamError, OSError, ValueError, RecursionError, MemoryError)
    blank = [False]
    read_chunk = more.next_chunk

    def head_chunk() -> bytes | None:  # a chunk of blanks is not kept (scan._Appender): offsets would shift
        data = read_chunk()
        if data and not data.strip(b" \t\r\n"):
            blank[0] = True
        return data

    more.next_chunk = head_chunk
    try:
        _read_head(buf, more, res)
        if blank[0]:
            raise Fallback("blank chunks before the events")
        if on_head is not None:
            on_head(res)
        cur = bytes(buf)
        cur_base = more.fed - len(buf)  # where the array's `[` lies
        array_start = cur_base
        pos, final = 1, False
        fed = more.fed
        while True:
            pos, ended, cols = scanner.feed(cur, pos, final)
            if cols[0]:
                on_batch(_batch(cur, cur_base, cols, cats))
            if ended:
                rest = cur[pos:]
                array_bytes = cur_base + pos - array_start
                break
            if final:
                raise Fallback("the events array is not closed")
            chunk = next_chunk()
            tail = cur[pos:]
            if chunk is None:
                cur, cur_base, pos, final = tail, cur_base + pos, 0, True
                continue
            cur, cur_base, pos, done = _join(scanner, cats, on_batch, tail, chunk, fed)
            fed += len(chunk)
            if done:
                rest = cur[pos:]
                array_bytes = cur_base + pos - array_start
                break
        del buf[:]
        buf += rest
        more.reset()
        _tail_bound(len(buf))
        while more():  # blank padding is not kept (stream/scan.py _Appender)
            _tail_bound(len(buf))
        res.tail = bytes(buf)
        _read_tail(res, res.tail)
    except fail as exc:
        raise Fallback(str(exc)) from None
    finally:
        reader.close()
    res.sha256 = reader.sha256 or ""
    res.json_bytes = reader.total
    return _Pass(res, array_bytes)


def _join(scanner, cats: _Cats, on_batch, tail: bytes, chunk: bytes, fed: int) -> tuple[bytes, int, int, bool]:
    """The event cut in two at a chunk's end, parsed from its start (`tail`) joined with the start
    of the next chunk (64 KB, more while that is not enough), so that the chunk itself is parsed
    where it lies (load/fastcols.feed_events' way: copying every chunk behind the tail cost a copy
    of every byte). `fed`: the chunk's offset. (buffer, its offset, position, the array ended)."""
    if not tail:
        return chunk, fed, 0, False
    k = 1 << 16
    while True:
        k = min(k, len(chunk))
        joined = tail + chunk[:k]
        p2, ended, cols = scanner.feed(joined, 0, False)
        if cols[0]:
            on_batch(_batch(joined, fed - len(tail), cols, cats))
        if ended:
            return joined + chunk[k:], fed - len(tail), p2, True
        if p2 >= len(tail):  # past the cut: go on in the chunk itself
            return chunk, fed, p2 - len(tail), False
        if k == len(chunk):  # an event longer than the chunk: carry it to the next one
            return joined, fed - len(tail), p2, False
        k *= 4


# ------------------------------------------------------------------------------------------------
# the first pass: the survey, and a summary of each chunk's launches
# ------------------------------------------------------------------------------------------------


class _LaunchChunks:
    """Per chunk with launches: their smallest and largest start and correlation id, and the byte
    range from the first launch's start to the last one's end; the launches themselves (start,
    id) while they fit in LAUNCH_RECORDS_BYTES."""

    def __init__(self) -> None:
        self.summary: list[tuple[float, float, int, int, int, int]] = []
        self.exact: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._bytes = 0

    def add(self, b: _Batch, launch: np.ndarray) -> None:
        idx = np.flatnonzero(launch)
        if not idx.size:
            return
        ts, corr = b.ts[idx], b.corr[idx]
        j = len(self.summary)
        self.summary.append((float(ts.min()), float(ts.max()), int(corr.min()), int(corr.max()),
                             b.base + int(b.start[idx[0]]), b.base + int(b.end_off[idx[-1]])))
        size = 16 * idx.size
        if self._bytes + size <= LAUNCH_RECORDS_BYTES:
            self.exact[j] = (ts, corr)
            self._bytes += size


class _Batches:
    """Per batch of the first pass (the events the scanner read from one buffer): where they lie
    (`a`..`b`: the first one's start to the last one's end, in the decompressed JSON), how many,
    and what decides their windows: `flags` (_EVERY: holds metadata or `Trace` spans; _DEVICE: a
    device event among its own ones), `unplaced`, `gap` (the bytes between its events where they
    are the same between each two, as an index into `gaps`; -1 where they differ), the range of the
    launch ids its own events name (`keys`), of the starts of those that name none and of all
    (`t`). About 100 bytes a batch (a batch is a MB of JSON)."""

    EVERY, DEVICE = 2, 4
    _W = 8  # ints a batch

    def __init__(self) -> None:
        self.ints = array("q")  # a, b, n, flags, unplaced, gap, key lo, key hi
        self.floats = array("d")  # t lo, t hi of the events without a key; of all own events
        self.gaps: list[bytes] = []
        self._gap_ids: dict[bytes, int] = {}

    def _gap(self, b: _Batch) -> int:
        """The index of the bytes between each two events of the batch (`,` where compact; `,\n  `
        as Kineto writes), -1 where they are not all the same."""
        if b.n < 2:
            gap = b","
        else:
            g = b.start[1:] - b.end_off[:-1]
            g0 = int(g[0])
            if g0 > 64 or not (g == g0).all():
                return -1
            data = np.frombuffer(b.buf, dtype=np.uint8)
            at = b.end_off[:-1, None] + np.arange(g0)
            gap = bytes(data[at[0]])
            if not (data[at] == data[at[0]]).all():
                return -1
        j = self._gap_ids.get(gap)
        if j is None:
            j = self._gap_ids[gap] = len(self.gaps)
            self.gaps.append(gap)
        return j

    def __len__(self) -> int:
        return len(self.ints) // self._W

    def add(self, b: _Batch, cats: _Cats) -> None:
        every = b.meta | (b.timed & cats.trace[b.cat])
        own = b.timed & ~every
        flags = self.EVERY if every.any() else 0
        if (cats.device[b.cat] & own).any():
            flags |= self.DEVICE
        key = b.keys(cats)
        keyed = own & (key >= 0)
        k = key[keyed]
        t = b.ts[own & ~keyed]
        ta = b.ts[own]
        self.ints.extend((b.base + int(b.start[0]), b.base + int(b.end_off[-1]), b.n, flags,
                          int(b.n - np.count_nonzero(b.ok)), self._gap(b), int(k.min()) if k.size else 1,
                          int(k.max()) if k.size else 0))
        self.floats.extend((float(t.min()) if t.size else np.inf, float(t.max()) if t.size else -np.inf,
                            float(ta.min()) if ta.size else np.inf, float(ta.max()) if ta.size else -np.inf))

    def row(self, j: int) -> tuple:
        return tuple(self.ints[self._W * j : self._W * j + self._W]) + tuple(self.floats[4 * j : 4 * j + 4])

    def window(self, j: int, bounds: np.ndarray, ranges: Ranges | None) -> int:
        """The window of every event of batch j, where they all go to one and the batch's bytes can
        be copied as they are; -1 where they must be read one by one (partition._copy's rules)."""
        _a, _b, _n, flags, unplaced, gap, k0, k1, t0, t1, ta0, ta1 = self.row(j)
        if flags & self.EVERY or unplaced or gap < 0:
            return -1
        if not bounds.size:
            return 0
        if ranges is None or not ranges.starts.size or k0 > k1:  # each by its start
            w0, w1 = np.searchsorted(bounds, [ta0, ta1], "right").tolist()
            return w0 if w0 == w1 else -1
        i0, i1 = (np.searchsorted(ranges.starts, [k0, k1], "right") - 1).tolist()
        if i0 != i1 or i0 < 0 or k1 > int(ranges.ends[i0]):  # not all in one window's launches
            return -1
        w = int(ranges.window[i0])
        if t0 <= t1:
            w0, w1 = np.searchsorted(bounds, [t0, t1], "right").tolist()
            if not w0 == w1 == w:
                return -1
        return w


def _survey(src: Path, scanner, cats: _Cats, chunks: _LaunchChunks,
            batches: _Batches) -> tuple[Survey, _Pass, int]:
    """cut.survey's answers (steps, span, time unit; t0 is not needed) from the scanner's columns,
    the launches' summary, the batches' summaries, and the number of events a viewer cannot place."""
    sv = Survey()
    counter = NsCounter()
    span = [np.inf, -np.inf]
    unplaced = [0]

    def on_batch(b: _Batch) -> None:
        sv.events += b.n
        unplaced[0] += int(b.n - np.count_nonzero(b.ok))
        nt = ~cats.trace[b.cat]
        timed = b.timed & nt
        if timed.any():
            span[0] = min(span[0], float(b.ts[timed].min()))
            span[1] = max(span[1], float(b.end[timed].max()))
        chunks.add(b, b.launches(cats))
        batches.add(b, cats)
        x = b.x
        if not x.any():
            return
        counter.add(b.ts[x])
        for i in np.flatnonzero(x & (b.step != -1) & cats.step[b.cat]).tolist():
            k = int(b.step[i])
            if k == -2:  # a name the scanner leaves to Python (escapes, non-ASCII digits)
                m = _STEP_RE.match(msgspec.json.decode(b.buf[b.start[i] : b.end_off[i]], type=_Named).name)
                if m is None:
                    continue
                k = int(m.group(1))
            ts, end = float(b.ts[i]), float(b.end[i])
            for table in (sv.steps,) if cats.gpu_step[b.cat[i]] else (sv.steps, sv.cpu_steps):
                w = table.setdefault(k, [np.inf, -np.inf])
                w[0] = min(w[0], ts)
                w[1] = max(w[1], end)

    p = _stream(src, scanner, cats, on_batch, hash=True)
    sv.span = (span[0], span[1]) if np.isfinite(span[0]) else None
    sv.ns = counter.nanoseconds()
    return sv, p, unplaced[0]


class _Named(msgspec.Struct, gc=False):
    name: str = ""


# ------------------------------------------------------------------------------------------------
# the launch ranges, from the summary and the chunks that straddle a cut
# ------------------------------------------------------------------------------------------------


def _ranges(src: Path, scanner, cats: _Cats, bounds: np.ndarray, chunks: _LaunchChunks) -> Ranges:
    """partition.launch_ranges from the survey's summary: the chunks whose launches all fall in one
    window count at once; the launches of those that straddle a cut are read again."""
    spans = LaunchSpans(bounds)
    again: list[int] = []
    for j, (t0, t1, c0, c1, _a, _b) in enumerate(chunks.summary):
        w0, w1 = np.searchsorted(bounds, [t0, t1], "right").tolist()
        if w0 == w1:
            spans.widen(w0, c0, c1)
        elif j in chunks.exact:
            ts, corr = chunks.exact[j]
            spans.add(corr, ts)
        else:
            again.append(j)
    for corr, ts in _read_again(src, scanner, cats, [chunks.summary[j] for j in again]):
        spans.add(corr, ts)
    return spans.ranges(src)


def _read_again(src: Path, scanner, cats: _Cats, wanted: list[tuple]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(ids, starts) of the launches of these chunks (survey summaries), read again: their byte
    ranges of an uncompressed trace, else a pass that keeps the events inside them. Fallback when
    what is read is not what the survey saw."""
    if not wanted:
        return []
    got: list[tuple[np.ndarray, np.ndarray]] = []

    def check(ts: np.ndarray, corr: np.ndarray, s: tuple) -> None:
        if not ts.size or (float(ts.min()), float(ts.max()), int(corr.min()), int(corr.max())) != s[:4]:
            raise Fallback("a chunk read again is not the one the survey read")
        got.append((corr, ts))

    try:
        plain = compression_of(src) == "none"
    except StreamError as exc:
        raise Fallback(str(exc)) from None
    if plain:
        try:
            with src.open("rb") as fh:
                for s in wanted:
                    a, b = s[4], s[5]
                    fh.seek(a)
                    data = fh.read(b - a) + b"]"
                    scanner.reset()
                    try:
                        _pos, ended, cols = scanner.feed(data, 0, True)
                    except (_partscan.Unsupported, ValueError) as exc:
                        raise Fallback(str(exc)) from None
                    if not ended:
                        raise Fallback("a chunk read again does not end where the survey's did")
                    bt = _batch(data, a, cols, cats)
                    launch = bt.launches(cats)
                    check(bt.ts[launch], bt.corr[launch], s)
        except OSError as exc:
            raise Fallback(str(exc)) from None
        return got
    spans = np.array([[s[4], s[5]] for s in wanted], dtype=np.int64)  # sorted: in file order
    parts: list[list] = [[] for _ in wanted]

    def on_batch(b: _Batch) -> None:
        launch = b.launches(cats)
        if not launch.any():
            return
        pos = b.base + b.start
        j = np.searchsorted(spans[:, 0], pos, "right") - 1
        inside = launch & (j >= 0) & (pos < spans[np.maximum(j, 0), 1])
        for jj in np.unique(j[inside]).tolist():
            m = inside & (j == jj)
            parts[jj].append((b.ts[m], b.corr[m]))

    scanner.reset()
    _stream(src, scanner, cats, on_batch)
    for s, ps in zip(wanted, parts):
        ts = np.concatenate([p[0] for p in ps]) if ps else np.empty(0)
        corr = np.concatenate([p[1] for p in ps]) if ps else np.empty(0, dtype=np.int64)
        check(ts, corr, s)
    return got


# ------------------------------------------------------------------------------------------------
# the cut
# ------------------------------------------------------------------------------------------------


def partition(src: Path, dst_dir: Path, windows: int | None, target_bytes: int | None,
              compression: str | None) -> Partition:
    """partition_trace's cut (arguments already checked, the head's keys already refused where
    they name several ranks). Fallback where this path cannot read the trace: nothing is written
    then."""
    cats = _Cats()
    scanner = _partscan.Scanner(cats.raw)
    chunks = _LaunchChunks()
    batches = _Batches()
    sv, first, unplaced = _survey(src, scanner, cats, chunks, batches)
    if sv.span is None:
        raise InputError(str(src), "trace has no timed events ('traceEvents' holds none a viewer can place)")
    if windows is not None:
        k = windows
    else:
        k = max(1, -(-first.array_bytes // target_bytes))  # type: ignore[operator]
    if sv.steps:
        k = min(k, len(sv.steps))
    bounds_l, steps = _cuts(src, sv, k)
    bounds = np.array(bounds_l, dtype=np.float64)
    ranges = _ranges(src, scanner, cats, bounds, chunks) if k > 1 else None
    part = Partition(files=[], bounds=bounds_l, steps=steps, events_in=0, sha256=first.res.sha256, json_bytes=0,
                     counts=[0] * k, ns=sv.ns)
    if ranges is not None and not ranges.starts.size and any(
            batches.ints[_Batches._W * j + 3] & _Batches.DEVICE for j in range(len(batches))):
        raise NotPartitionable(f"{src}: it has device events (kernels, copies) but no runtime call with a "
                               "correlation id: a device event's window cannot be told from its launch")
    _refuse_merged(src, first.res.top)  # distributedInfo may follow the events
    _copy(src, dst_dir, part, bounds, ranges, scanner, cats, compression, first.res, batches)
    if (part.events_in, part.unplaced) != (sv.events, unplaced):  # pragma: no cover - _copy checks each batch
        raise Fallback("the copy pass read other events than the survey")
    part.json_bytes = first.res.json_bytes
    return part


class _Spans:
    """The bytes a..b of the decompressed JSON, for increasing, disjoint ranges, from the reader's
    chunks (at most a chunk and a batch held)."""

    def __init__(self, chunks) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self._base = 0  # offset of _buf[0]

    def get(self, a: int, b: int) -> bytes:
        while self._base + len(self._buf) < b:
            try:
                data, _read = next(self._chunks)
            except StopIteration:
                raise Fallback("the trace ends before the events the survey read") from None
            self._buf += data
        if a < self._base:
            raise Fallback("batches out of order")  # pragma: no cover - the survey's batches do not overlap
        with memoryview(self._buf) as mv:
            out = bytes(mv[a - self._base : b - self._base])
        del self._buf[: b - self._base]
        self._base = b
        return out


def _copy(src: Path, dst_dir: Path, part: Partition, bounds: np.ndarray, ranges: Ranges | None, scanner,
          cats: _Cats, compression: str | None, res: ScanResult, batches: _Batches) -> None:
    """The copy pass (partition._copy's): each event into its window's file, metadata and `Trace`
    spans into all. A batch whose events all go to one window (nearly all of them) is copied as
    it lies; the others are read again by the scanner and their events copied one by one.
    Fallback, before any file is committed, where the bytes are not those the survey read."""
    k = bounds.size + 1
    base = src.name.split(".json")[0]
    suffix = {"gzip": ".json.gz", "zstd": ".json.zst"}.get(compression or "none", ".json")
    width = len(str(k - 1))
    writers: list[TraceWriter] = []
    counts = np.zeros(k, dtype=np.int64)

    def one_by_one(b: _Batch) -> None:
        part.unplaced += int(b.n - np.count_nonzero(b.ok))
        everywhere = b.meta | (b.timed & cats.trace[b.cat])
        own = b.timed & ~everywhere
        if k == 1:
            win = np.zeros(b.n, dtype=np.int64)
        else:
            win = np.searchsorted(bounds, b.ts, "right")
            if ranges.starts.size:  # type: ignore[union-attr]
                idx, w = ranges.windows_of(b.keys(cats))  # type: ignore[union-attr]
                win[idx] = w
        win = np.where(own, win, -1)
        mine = np.bincount(win[own], minlength=k)
        counts[:] += mine
        win[everywhere] = -2
        shared = int(np.count_nonzero(everywhere))
        part.shared += shared
        for j, data in enumerate(_partscan.gather(b.buf, b.start, b.end_off, win, k)):
            writers[j].write_joined(data, int(mine[j]) + shared)

    with output_folder(dst_dir), write_queue(compression in ("gzip", "zstd")) as writes:
        try:
            for j in range(k):
                writers.append(TraceWriter(dst_dir / f"{base}.window_{j:0{width}d}{suffix}",
                                           compression=compression or "none", writes=writes))
                writers[-1].set_head(res)
            reader = ChunkReader(src, chunk=CHUNK, hash=False)
            try:
                spans = _Spans(iter(reader))
                for j in range(len(batches)):
                    a, b, n = batches.ints[_Batches._W * j : _Batches._W * j + 3]
                    data = spans.get(a, b)
                    if data[:1] != b"{" or data[-1:] != b"}":
                        raise Fallback("the events are not where the survey read them")
                    part.events_in += n
                    w = batches.window(j, bounds, ranges)
                    if w >= 0 and n > 1:
                        gap = batches.gaps[batches.ints[_Batches._W * j + 5]]
                        if gap != b",":  # `},\n  {` -> `},{`: where each is one of the n-1 between events
                            body = _partscan.compact(data, b"}" + gap + b"{", n - 1)
                            if body is None:
                                w = -1
                            else:
                                data = body
                    if w >= 0:
                        writers[w].write_joined(data, n)
                        counts[w] += n
                        continue
                    data += b"]"
                    scanner.reset()
                    _pos, ended, cols = scanner.feed(data, 0, True)
                    if not ended or cols[0] != n:
                        raise Fallback("a batch read again is not the one the survey read")
                    one_by_one(_batch(data, a, cols, cats))
            except (_partscan.Unsupported, StreamError, OSError, ValueError) as exc:
                raise Fallback(str(exc)) from None
            finally:
                reader.close()
            if (part.events_in, part.unplaced) != (sum(batches.ints[2 :: _Batches._W]),
                                                   sum(batches.ints[4 :: _Batches._W])):
                raise Fallback("the copy pass read other events than the survey")  # pragma: no cover
            part.counts = counts.tolist()
            _close_windows(writers, part.counts, TraceWriter.tail_of(res))
        except BaseException as exc:
            abort_outputs(writes, exc, writers)
            raise
    _drop_empty(part, writers, base, suffix)
