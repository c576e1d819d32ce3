"""The events of a trace, slice by slice, as typed columns: the fast reading path of trace surgery.

`read_slices(path, on_slice, check=...)` streams a trace as io.read_events does (same slices,
same errors), but hands each slice over as a `Batch`: the decoded records, the time columns of
the slice (`Timeline`: which events a viewer can place, their start and end) and, on demand, the
original JSON bytes of each event (`raws`) and other columns.

Most slices are read by one strict decode in C (msgspec): `VALID_*`, a record per phase (a union
tagged by `ph`) with the fields that phase needs required and every field of the loader's type, so
that a slice that decodes holds only events `trace check` passes; for slice and split, whose
slices may hold events a viewer cannot place (they leave them out), `FastLaunch` / `FastTyped`
next, with the fields optional (a missing one is a sentinel: NaN, None). The columns are built
with C-level passes (`map` over `attrgetter`) instead of per-event Python checks. A slice that
the strict decodes refuse (a field of the wrong type, an explicit `null`, a phase without a
record, a cut inside a string, an integer too large for a float...) is read again by the original
code (`slow` in read_slices: the decoders and checks of io.read_events; timeline.Timeline.of and
slow_correlations for its columns), which says what is wrong exactly as before. So the strict path
is only taken where it gives what the original code gives (tests/test_surgery_speed_equivalence.py
compares the two slice by slice on every corpus trace, and the commands' outputs either way).

A second or third pass over the same file (slice and split read it three times) can skip the
slices that cannot matter to it (`Plan`): the first pass records the byte length of every slice
it accepted and a summary of it (events, time range, launch ids); a later pass accepts exactly the
same cuts (the scanner is deterministic: a cut of another length is refused as a wrong cut) and
hands over a skipped slice without decoding it.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from itertools import compress, repeat
from operator import attrgetter, is_, is_not, ne
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np

from ..errors import InputError
from ..load.job import TOO_DEEP
from ..load.schema import NO_ARGS, Number, RawArgs
from ..stream.scan import ScanResult, scan
from ..stream.source import BadJSON, StreamError
from .io import Launched, Placed, _decoder, _wrong_type
from .timeline import Timeline, slow_correlations
from .validate import _FLOWS as _FLOW_PHASES
from .validate import _TIMED, NO_NAME, refuse_unplaceable, refuse_wrong_types

NAN = float("nan")
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])


class _FastArgs(msgspec.Struct, gc=False, frozen=True):
    correlation: Any = -1  # Launched's None: the same for ops (neither is a correlation id)


_NO_FAST_ARGS = _FastArgs()


class FastLaunch(msgspec.Struct, gc=False):
    """Launched with strict types: `ph`, `name`, `cat` strings, `ts` and `dur` numbers, `pid` and
    `tid` integers or strings (the loader's types); a missing `ph`, `pid`, `tid` is None, a missing
    `ts`, `dur` NaN (JSON has no NaN). Defaults are not checked by msgspec: an explicit `null`
    fails the decode and the slice takes the original path."""

    ph: str = None  # type: ignore[assignment]
    name: str = NO_NAME
    cat: str = ""
    ts: Number = NAN
    dur: Number = NAN
    pid: int | str = None  # type: ignore[assignment]
    tid: int | str = None  # type: ignore[assignment]
    id: Any = None  # noqa: A003
    args: _FastArgs = _NO_FAST_ARGS


class FastTyped(FastLaunch, gc=False):
    """FastLaunch whose `args` have the loader's types (load/schema.py RawArgs): a slice that
    decodes is one that validate.refuse_wrong_types passes."""

    args: RawArgs = NO_ARGS  # type: ignore[assignment]


# ---- whole slices that `trace check` passes, in one decode -----------------------------------------
#
# A tagged union on `ph` states the placement rules of validate.event_problems as types: one record
# per phase, with the fields that phase needs required (a complete event's `ts`, `dur`, `pid`,
# `tid`; a flow's non-null `id`; a metadata event's `pid`, and for `trace check` its `name`). A
# slice that decodes holds no event that the rules or the loader's types refuse; one that does not
# (a bad event, or just a phase outside _TIMED and `M`) is read the original way.

_ANY_BUT_NULL = int | float | str | bool | list | dict


def _tagged(ph: str, name_required: bool, loader_args: bool = True) -> type:
    required: list[tuple] = []
    args = ("args", RawArgs, NO_ARGS) if loader_args else ("args", _FastArgs, _NO_FAST_ARGS)
    optional: list[tuple] = [("cat", str, ""), ("id", Any, None), args]
    if ph == "M":
        required.append(("pid", int | str))
        required.append(("name", str))  # a metadata event without one is read the original way (not placeable)
        optional += [("ts", Number, NAN), ("dur", Number, NAN), ("tid", int | str, None)]
    else:
        required += [("ts", Number), ("pid", int | str), ("tid", int | str)]
        optional.append(("name", str, None if name_required else ""))
        if ph == "X":
            required.append(("dur", Number))
        else:
            optional.append(("dur", Number, NAN))
        if ph in _FLOW_PHASES:
            required.append(("id", _ANY_BUT_NULL))
            optional = [f for f in optional if f[0] != "id"]
    kind = "check" if name_required else "all" if loader_args else "placed"
    return msgspec.defstruct(f"Valid_{kind}_{ord(ph)}", required + optional, tag_field="ph", tag=ph, gc=False)


_PHASES = sorted(set(_TIMED) | {"M"})
_VALID_ALL = [_tagged(p, False) for p in _PHASES]
_VALID_CHECK = [_tagged(p, True) for p in _PHASES]
_VALID_PLACED = [_tagged(p, False, loader_args=False) for p in _PHASES]  # for Launched: no check of `args`
VALID_ALL = msgspec.json.Decoder(list[Union[tuple(_VALID_ALL)]])  # type: ignore[valid-type]
VALID_CHECK = msgspec.json.Decoder(list[Union[tuple(_VALID_CHECK)]])  # type: ignore[valid-type]
VALID_PLACED = msgspec.json.Decoder(list[Union[tuple(_VALID_PLACED)]])  # type: ignore[valid-type]
_TAG_PH: dict[type, str] = {c: p for cs in (_VALID_ALL, _VALID_CHECK, _VALID_PLACED) for c, p in zip(cs, _PHASES)}
_TAG_CODE: dict[type, int] = {}  # filled below, with _PH_CODE
_META_TAGS = frozenset(c for c, p in _TAG_PH.items() if p == "M")


def all_metadata(events: list) -> bool:
    """Every one of these strictly decoded (VALID_*) records is a metadata event (stops at the first
    that is not)."""
    return all(map(_META_TAGS.__contains__, map(type, events)))

FAST_LAUNCH = msgspec.json.Decoder(list[FastLaunch])
FAST_TYPED = msgspec.json.Decoder(list[FastTyped])

# ---- columns of strictly decoded events ---------------------------------------------------------

_NOPH, _META, _X, _FLOW, _TIMEDPH = 1, 2, 3, 4, 5  # 0: a phase without time rules (`ts` only)
_PH_CODE: dict[Any, int] = {None: _NOPH, "": _NOPH, "M": _META}
_PH_CODE.update({p: _TIMEDPH for p in _TIMED})
_PH_CODE.update({p: _FLOW for p in _FLOW_PHASES})
_PH_CODE["X"] = _X
_TAG_CODE.update({c: _PH_CODE[p] for c, p in _TAG_PH.items()})
_PH, _TS, _DUR, _NAME = attrgetter("ph"), attrgetter("ts"), attrgetter("dur"), attrgetter("name")
_PID, _TID, _ID = attrgetter("pid"), attrgetter("tid"), attrgetter("id")
_INT64_MAX = (1 << 63) - 1
_FAST_FAILS = (msgspec.MsgspecError, RecursionError, OverflowError, TypeError, ValueError)


def _present(values: list, n: int) -> np.ndarray:
    return np.fromiter(map(is_not, values, repeat(None)), dtype=bool, count=n)


def ph_codes(phs: list, n: int) -> np.ndarray:
    """The phase of each event as a small code (_PH_CODE; 0: a phase with no rule but `ts`)."""
    return np.fromiter(map(_PH_CODE.get, phs, repeat(0)), dtype=np.int8, count=n)


def fast_timeline(events: list, *, code: np.ndarray | None = None) -> Timeline:
    """Timeline.of for strictly decoded events (FastLaunch, FastTyped, the VALID_ALL records): the
    same arrays, from validate.event_problems' rules reduced to presence (the strict decode already
    refused every value of a wrong type). `code`: ph_codes of the events, if known. OverflowError
    for a number no float holds (the original code then says what it says of it)."""
    n = len(events)
    if code is None:
        code = ph_codes(list(map(_PH, events)), n)
    ts = np.fromiter(map(_TS, events), dtype=np.float64, count=n)
    dur = np.fromiter(map(_DUR, events), dtype=np.float64, count=n)
    meta_c = code == _META
    ok = ~np.isnan(ts)
    ok &= code != _NOPH
    pids = list(map(_PID, events))
    pid_missing = None in pids
    tids = list(map(_TID, events))
    tid_missing = None in tids
    if tid_missing or pid_missing:
        timed_c = code >= _X
        both = _present(pids, n) if pid_missing else np.ones(n, dtype=bool)
        if tid_missing:
            both &= _present(tids, n)
        ok &= ~timed_c | both
    is_x = code == _X
    ok &= ~is_x | ~np.isnan(dur)
    flow_c = code == _FLOW
    if flow_c.any() and None in list(map(_ID, compress(events, flow_c.tolist()))):
        ok &= ~flow_c | _present(list(map(_ID, events)), n)
    if meta_c.any():  # a metadata event needs a pid and a name (NO_NAME where it has none)
        named = np.fromiter(map(is_not, map(_NAME, events), repeat(NO_NAME)), dtype=bool, count=n)
        ok = np.where(meta_c, (_present(pids, n) if pid_missing else True) & named, ok)
    meta = ok & meta_c
    timed = ok & ~meta_c
    x = timed & is_x
    t = np.where(timed, ts, 0.0)
    d = np.where(x, dur, 0.0)
    return Timeline(ok, meta, t, t + d, x, d)


def tagged_timeline(events: list, code: np.ndarray) -> Timeline:
    """fast_timeline for the records of a tagged decode (VALID_ALL, VALID_PLACED): every event is
    placeable."""
    n = len(events)
    ts = np.fromiter(map(_TS, events), dtype=np.float64, count=n)
    meta = code == _META
    timed = ~meta
    x = code == _X
    t = np.where(timed, ts, 0.0)
    d = np.where(x, np.fromiter(map(_DUR, events), dtype=np.float64, count=n), 0.0) if x.any() else np.zeros(n)
    return Timeline(np.ones(n, dtype=bool), meta, t, t + d, x, d)


def _id_of(v: Any) -> int:
    return v if type(v) is int and 0 <= v <= _INT64_MAX else -1


def ids_of(values: list, n: int) -> np.ndarray:
    """[_id_of(v) for v in values] as int64: the value where it is an int in 0..2^63-1, else -1."""
    if all(map(is_, map(type, values), repeat(int))):
        try:
            a = np.fromiter(values, dtype=np.int64, count=n)
        except OverflowError:
            pass
        else:
            return np.where(a >= 0, a, -1)
    return np.fromiter(map(_id_of, values), dtype=np.int64, count=n)


_LAUNCH_CAT_WORDS = ("runtime", "driver")  # cuda_runtime, Runtime (2021), cuda_driver, mtia_runtime, hip...
_NOT_LAUNCH_FLOWS = ("fwdbwd",)  # flow arrows whose ids are not correlation ids


def launcher_of(cats: list, n: int, memo: dict) -> np.ndarray:
    """Events of a launching category (a runtime or driver call), by category (memo: cat -> bool)."""
    for cat in set(cats).difference(memo):
        low = cat.lower() if isinstance(cat, str) else ""
        memo[cat] = any(w in low for w in _LAUNCH_CAT_WORDS)
    return np.fromiter(map(memo.__getitem__, cats), dtype=bool, count=n)


def fast_correlations(b: Batch, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """cut._correlations for strictly decoded events (their `args` is never None)."""
    n, tl = b.n, b.tl
    launcher = launcher_of(b.column("cat"), n, memo)
    corr = b.correlation_ids()
    launch = tl.timed & launcher & (corr >= 0)
    key = np.where(tl.timed & ~launcher, corr, -1)
    flow_c = b.codes() == _FLOW
    if flow_c.any():
        flow = tl.ok & flow_c & np.fromiter(map(ne, b.column("cat"), repeat(_NOT_LAUNCH_FLOWS[0])), dtype=bool, count=n)
        if flow.any():
            key = key.copy()
            key[flow] = ids_of(list(map(_ID, compress(b.events, flow.tolist()))), int(flow.sum()))
    return launch, key


# ---- one slice ------------------------------------------------------------------------------------


class Batch:
    """One slice of events: `events` (strict records when `fast`, else the original Placed or
    Launched ones), `tl` their Timeline, `raws` the JSON bytes of each event (decoded on first use),
    `column(field)` a list of one field's values (the same values in both kinds of record for
    `ph`, `name`, `cat`)."""

    __slots__ = ("data", "events", "fast", "tagged", "n", "base", "_tl", "_raws", "_cols", "_corr", "_code",
                 "_not_trace", "_corr_ids")

    def __init__(self, data: bytes, events: list, fast: bool, base: int, tl: Timeline | None = None,
                 tagged: bool = False) -> None:
        self.data, self.events, self.fast, self.base, self.tagged = data, events, fast, base, tagged
        self.n = len(events)
        self._tl = tl
        self._raws: list | None = None
        self._cols: dict[str, list] = {}
        self._corr: tuple | None = None
        self._code: np.ndarray | None = None
        self._not_trace: np.ndarray | None = None
        self._corr_ids: np.ndarray | None = None

    def correlation_ids(self) -> np.ndarray:
        """`args.correlation` of each event as an id (timeline._id_of: -1 where not an int in
        0..2^63-1), for strictly decoded records (their `args` is never None)."""
        if self._corr_ids is None:
            self._corr_ids = ids_of(self.column("args.correlation"), self.n)
        return self._corr_ids

    def codes(self) -> np.ndarray:
        """ph_codes of the events."""
        if self._code is None:
            if self.tagged and "ph" not in self._cols:
                self._code = np.fromiter(map(_TAG_CODE.__getitem__, map(type, self.events)), dtype=np.int8,
                                         count=self.n)
            else:
                self._code = ph_codes(self.column("ph"), self.n)
        return self._code

    def any_timed(self) -> bool:
        """Whether the slice holds an event other than metadata."""
        return bool((self.codes() != _META).any())

    @property
    def tl(self) -> Timeline:
        if self._tl is None:
            if self.tagged:
                self._tl = tagged_timeline(self.events, self.codes())
            else:
                self._tl = fast_timeline(self.events, code=self.codes()) if self.fast else Timeline.of(self.events)
        return self._tl

    @property
    def raws(self) -> list:
        if self._raws is None:
            self._raws = _RAWS.decode(self.data)
        return self._raws

    def column(self, name: str) -> list:
        col = self._cols.get(name)
        if col is None:
            if name == "ph" and self.tagged:  # the record's type tells the phase
                col = list(map(_TAG_PH.__getitem__, map(type, self.events)))
            else:
                col = list(map(attrgetter(name), self.events))
            self._cols[name] = col
        return col

    def not_trace_span(self) -> np.ndarray:
        """Events other than the profiler's `Trace` spans (cut._not_trace_span)."""
        if self._not_trace is None:
            self._not_trace = np.fromiter(map(ne, self.column("cat"), repeat("Trace")), dtype=bool, count=self.n)
        return self._not_trace

    def correlations(self, memo: dict) -> tuple[np.ndarray, np.ndarray]:
        """(launch, key) of cut._correlations (for Launched or strict records)."""
        if self._corr is None:
            self._corr = fast_correlations(self, memo) if self.fast else slow_correlations(self.events, self.tl, memo)
        return self._corr

    def launch_ids(self, memo: dict) -> tuple[np.ndarray, np.ndarray]:
        """(index, correlation id) of the launches among the events (runtime calls with a
        correlation id, cut._correlations): what the launch passes (cut.launches,
        partition.launch_ranges) read of a slice."""
        launch, _ = self.correlations(memo)
        idx = np.flatnonzero(launch)
        if not idx.size:
            return idx, np.empty(0, dtype=np.int64)
        if self.fast:
            return idx, self.correlation_ids()[idx]
        corr = np.fromiter((self.events[i].args.correlation for i in idx.tolist()), dtype=np.int64, count=idx.size)
        return idx, corr

    def selected(self, keep: np.ndarray) -> list:
        """The raws of the events `keep` marks, in order."""
        if keep.all():
            return self.raws
        return list(compress(self.raws, keep.tolist()))


# ---- a plan of the slices, for the passes after the first -------------------------------------


#: Bytes of launch records (slices.Plan) a first pass keeps, at most: 25 bytes a launch, so about
#: 330,000 runtime calls (a trace of about 0.4 GB of this kind); the slices after are read again.
LAUNCH_RECORDS_BYTES = 8 << 20


class Plan:
    """What a first pass saw of each slice, for the later passes over the same file: the byte length
    of the slice (the scanner's cut, replayed), the number of events and of unplaceable ones, and a
    summary to decide that a slice cannot matter (`slow`: read by the original path, never skipped;
    `meta`: holds metadata events; the range of the timed events' starts and ends, of the launches'
    (runtime calls with a correlation id) and of the ids that tie events to launches).

    It also keeps the launches themselves (correlation id, start, end, and whether a complete event
    of non-zero length), for cut.launches, up to LAUNCH_RECORDS_BYTES: `recorded[k]` says that
    the launches of slice k are all in `records` (so that the launches pass need not read it)."""

    def __init__(self, record_launches: bool = True, launches: bool = True) -> None:
        self.lengths = array("q")
        self.counts = array("q")
        self.unplaced = array("q")
        self.slow = array("b")
        self.meta = array("b")
        self.t = array("d")  # lo, hi per slice (inf, -inf: none)
        self.launch = array("d")
        self.keys = array("q")  # lo, hi per slice (1, 0: none)
        self.recorded = array("b")
        self.records: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # corr, ts, end, x with length
        self._record = record_launches
        self._record_bytes = 0
        self._launches = launches  # False: a time cut, no launches are looked for (no ranges kept)

    def __len__(self) -> int:
        return len(self.counts)

    def add(self, length: int, b: Batch, memo: dict) -> None:
        """Summarise a slice of the first pass (survey: FastTyped or Placed records)."""
        self.lengths.append(length)
        self.counts.append(b.n)
        tl = b.tl
        self.unplaced.append(tl.unplaced)
        self.slow.append(0 if b.fast else 1)
        self.meta.append(1 if tl.meta.any() else 0)
        timed = tl.timed
        if timed.any():
            self.t.extend((float(tl.ts[timed].min()), float(tl.end[timed].max())))
        else:
            self.t.extend((np.inf, -np.inf))
        if not self._launches:
            self.launch.extend((np.inf, -np.inf))
            self.keys.extend((1, 0))
            self.recorded.append(1)
            return
        if not b.fast:  # never skipped: nothing more to know
            self.launch.extend((np.inf, -np.inf))
            self.keys.extend((1, 0))
            self.recorded.append(0)
            return
        launch, key = b.correlations(memo)
        if launch.any():
            self.launch.extend((float(tl.ts[launch].min()), float(tl.end[launch].max())))
            idx = np.flatnonzero(launch)
            size = 25 * idx.size
            if self._record and self._record_bytes + size <= LAUNCH_RECORDS_BYTES:
                corr = b.correlation_ids()[idx]
                self.records.append((corr, tl.ts[idx], tl.end[idx], (tl.x & (tl.dur != 0))[idx]))
                self._record_bytes += size
                self.recorded.append(1)
            else:
                self._record = False  # the later slices are read again (in file order: simpler to reason about)
                self.recorded.append(0)
        else:
            self.launch.extend((np.inf, -np.inf))
            self.recorded.append(1)
        has = key >= 0
        if has.any():
            k = key[has]
            self.keys.extend((int(k.min()), int(k.max())))
        else:
            self.keys.extend((1, 0))

    def any_launch_in(self, k: int, wins: np.ndarray) -> bool:
        lo, hi = self.launch[2 * k], self.launch[2 * k + 1]
        return lo <= hi and bool(((wins[:, 0] <= hi) & (wins[:, 1] >= lo)).any())

    def any_time_in(self, k: int, wins: np.ndarray) -> bool:
        lo, hi = self.t[2 * k], self.t[2 * k + 1]
        return lo <= hi and bool(((wins[:, 0] <= hi) & (wins[:, 1] >= lo)).any())

    def any_key_in(self, k: int, corr: np.ndarray) -> bool:
        """Whether a key of slice k may be one of `corr` (sorted)."""
        lo, hi = self.keys[2 * k], self.keys[2 * k + 1]
        if lo > hi or not corr.size:
            return False
        i = int(np.searchsorted(corr, lo, "left"))
        return i < corr.size and int(corr[i]) <= hi


#: Bytes of JSON a slice holds (as io.read_events); tests make it small to have many slices.
SLICE_BYTES = 1 << 20
#: Switches for the tests (tests/test_surgery_speed_equivalence.py), which compare the outputs with
#: the fast reading off (every slice read by the original code) and without skipping slices.
FAST_PATH = True
TAGGED_PATH = True  # the first strict decode (every event placeable); FAST_PATH alone: the second one
SKIP_SLICES = True


class _Off(msgspec.MsgspecError):
    """FAST_PATH is off: the slice takes the original path."""


class _WrongCut(msgspec.DecodeError):
    """A cut that the first pass did not accept (the scanner then cuts elsewhere, as for a cut
    inside a string)."""


# ---- reading --------------------------------------------------------------------------------------


def read_slices(path: Path, on_slice: Callable[[Batch], None], *, check: str = "none",
                on_head: Callable[[ScanResult], None] | None = None, slice_bytes: int | None = None,
                record: Plan | None = None, replay: Plan | None = None,
                skip: Callable[[int], bool] | None = None, on_skip: Callable[[int], None] | None = None,
                memo: dict | None = None) -> ScanResult:
    """io.read_events with `Batch`es: the same slices, the same errors (InputError naming the file).

    `check`: "none" reads Launched records (no check); "types" Placed records held to the loader's
    types (validate.refuse_wrong_types); "all" Placed records held to `trace check`'s rules too.
    `record`: a Plan the slices are summarised into (a first pass: check "types"). `replay`: the
    Plan of a first pass over the same file: the same cuts are made, and the slices `skip(k)` says
    are not decoded (`on_skip(k)` instead of on_slice)."""
    slow_record = Launched if check == "none" else Placed
    slow_decoder = _decoder(slow_record)
    tagged_decoder = VALID_PLACED if check == "none" else VALID_ALL
    fast_decoder = FAST_LAUNCH if check == "none" else FAST_TYPED
    seen = [0]
    taken = [0]  # slices accepted so far
    last_error = [""]
    memo = {} if memo is None else memo

    def slow(data: bytes) -> list:
        """io.read_events' own reading of a slice (its errors, in its order)."""
        try:
            if check != "none":
                refuse_wrong_types(path, data, seen[0])
            lite = slow_decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise _wrong_type(path, exc, seen[0]) from None
        except msgspec.DecodeError as exc:
            last_error[0] = str(exc)
            raise
        except RecursionError:
            raise InputError(str(path), TOO_DEEP) from None
        if check == "all":
            refuse_unplaceable(path, lite, seen[0])
        return lite

    def consume(view) -> None:
        k = taken[0]
        if replay is not None and k < len(replay):
            if len(view) != replay.lengths[k]:
                raise _WrongCut("not the cut of the first pass")
            if skip is not None and SKIP_SLICES and skip(k):
                taken[0] += 1
                seen[0] += replay.counts[k]
                if on_skip is not None:
                    on_skip(k)
                return
        data = bytes(view)  # nothing below refers to the scanner's buffer
        batch = None
        try:  # every event placeable (nearly every slice)
            if not (FAST_PATH and TAGGED_PATH):
                raise _Off
            batch = Batch(data, tagged_decoder.decode(data), True, seen[0], tagged=True)
            if check != "all":  # (filter and the checks need no times)
                batch._tl = tagged_timeline(batch.events, batch.codes())
        except _FAST_FAILS:
            batch = None
        if batch is None and check != "all" and FAST_PATH:  # events a viewer cannot place: slice, split leave them out
            try:
                batch = Batch(data, fast_decoder.decode(data), True, seen[0])
                batch._tl = fast_timeline(batch.events, code=batch.codes())
            except _FAST_FAILS:
                batch = None
        if batch is None:
            batch = Batch(data, slow(data), False, seen[0])
        taken[0] += 1
        seen[0] += batch.n
        if record is not None:
            record.add(len(view), batch, memo)
        on_slice(batch)

    try:
        return scan(path, consume, slice_bytes=SLICE_BYTES if slice_bytes is None else slice_bytes, hash=False,
                    on_head=on_head)
    except BadJSON as exc:
        raise InputError(str(path), str(exc)) from None
    except StreamError as exc:
        why = f" (last JSON error: {last_error[0]})" if last_error[0] else ""
        raise InputError(str(path), f"cannot stream this trace: {exc}{why}") from None
    except RecursionError:
        raise InputError(str(path), TOO_DEEP) from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror or exc}") from None
