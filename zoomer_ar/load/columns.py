"""Columnar, typed representation of one rank's trace (numpy arrays, not a dict per event)."""

from __future__ import annotations

import gc
import threading

from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, is_not, ne
from typing import Any

import msgspec
import numpy as np

from .narrow import as_constant, narrow, narrow_column
from .schema import NAN, RawEvent

INT_NONE = -1
_I64_MAX = 2**63 - 1

# Event phases we keep, as small codes.
PH_CODES = {"X": 1, "i": 2, "I": 2, "s": 3, "f": 4, "t": 4, "M": 5, "B": 6, "E": 7, "C": 8}
PH_COMPLETE, PH_INSTANT, PH_FLOW_START, PH_FLOW_END, PH_META = 1, 2, 3, 4, 5


@dataclass
class RankTrace:
    """One rank's events as columns. Times are microseconds (float64)."""

    rank: int
    path: str
    names: list[str]
    cats: list[str]
    ts: np.ndarray
    dur: np.ndarray
    ph: np.ndarray
    cat: np.ndarray
    name: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    correlation: np.ndarray
    stream: np.ndarray
    device: np.ndarray
    external_id: np.ndarray
    nbytes: np.ndarray
    total_allocated: np.ndarray
    # sparse columns: event index -> value (only the few events that carry them)
    input_dims: dict[int, Any] = field(default_factory=dict)
    input_type: dict[int, Any] = field(default_factory=dict)
    call_stack: dict[int, str] = field(default_factory=dict)
    collective: dict[int, str] = field(default_factory=dict)
    msg_nelems: dict[int, float] = field(default_factory=dict)
    python_id: dict[int, int] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    thread_names: dict[int, str] = field(default_factory=dict)
    process_names: dict[int, str] = field(default_factory=dict)
    pid_values: list[Any] = field(default_factory=list)
    tid_values: list[Any] = field(default_factory=list)
    time_unit_note: str = ""
    # microseconds subtracted from `ts` (load.job.rebase_times): absolute time = ts + ts_base
    ts_base: float = 0.0
    # where the rows are a streaming pass's subset (stream/compact.py): the names of every row it read, by kind
    # ("op", "kernel", "python"), for program_match.py; None: the rows are all the trace's
    seen_names: dict[str, frozenset[str]] | None = None

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    @property
    def end(self) -> "Ends":
        """End times: `trace.end[idx]` is `ts[idx] + dur[idx]` (no whole end column is kept)."""
        return Ends(self.ts, self.dur)

    def cat_code(self, *cats: str) -> list[int]:
        return [i for i, c in enumerate(self.cats) if c in cats]

    def mask_cat(self, *cats: str) -> np.ndarray:
        codes = self.cat_code(*cats)
        if not codes:
            return np.zeros(len(self), dtype=bool)
        return _code_mask(self.cat, codes, len(self.cats))

    def name_codes(self, predicate) -> np.ndarray:
        """Codes of the names that satisfy predicate; remembered for named (module-level) predicates,
        which several features ask about."""
        named = getattr(predicate, "__name__", "<lambda>") != "<lambda>"
        cache = self.__dict__.setdefault("_name_codes", {}) if named else None
        if cache is not None:
            hit = cache.get(predicate)
            if hit is not None and hit[0] == len(self.names):
                return hit[1]
        if named and "<locals>" not in getattr(predicate, "__qualname__", "<locals>"):
            codes = _matching(predicate, self.__dict__, self.names).astype(np.int32)
        else:
            codes = np.asarray([i for i, n in enumerate(self.names) if predicate(n)], dtype=np.int32)
        if cache is not None:
            codes.flags.writeable = False
            cache[predicate] = (len(self.names), codes)
        return codes

    def mask_names(self, predicate) -> np.ndarray:
        codes = self.name_codes(predicate)
        if codes.size == 0:
            return np.zeros(len(self), dtype=bool)
        return _code_mask(self.name, codes, len(self.names))

    def mask_name_in(self, names) -> np.ndarray:
        """Rows whose name is one of `names` (exact): a lookup per name, not a scan of all names."""
        index = self.__dict__.get("_name_index")
        if index is None or len(index) != len(self.names):
            index = self.__dict__["_name_index"] = {n: i for i, n in enumerate(self.names)}
        codes = [index[n] for n in ((names,) if isinstance(names, str) else names) if n in index]
        if not codes:
            return np.zeros(len(self), dtype=bool)
        return _code_mask(self.name, codes, len(self.names))

    def has_name_code(self, name_codes: np.ndarray, codes) -> np.ndarray:
        """np.isin(name_codes, codes) for values of the `name` column (e.g. `t.name[kern]`): a
        comparison per code, or one table lookup per row, instead of np.isin's sort."""
        codes = np.asarray(codes).ravel()
        if codes.size == 0:
            return np.zeros(np.shape(name_codes), dtype=bool)
        return _code_mask(name_codes, codes.tolist(), len(self.names))

    def name_of(self, i: int) -> str:
        return self.names[int(self.name[i])]

    def cat_of(self, i: int) -> str:
        return self.cats[int(self.cat[i])]


# Verdicts of module-level name predicates (pure functions of the name: features.names, phases),
# shared by every trace of the process: the ranks of a job repeat each other's names, and each
# verdict (often a regex search) is then computed once per name, not once per rank. Names get a
# process-wide id (`_NAME_IDS`); each trace maps its name table to those ids once, and a verdict
# table per predicate answers for every name of a trace in one numpy lookup.
_NAME_IDS: dict[str, int] = {}
_NAME_LIST: list[str] = []
_VERDICTS: dict[Any, np.ndarray] = {}
_VERDICTS_MAX = 1 << 18  # names remembered; beyond it the registry starts again
_REGISTRY_LOCK = threading.Lock()
# the registry's identity: a trace's cached id map is valid while it holds this very object (a new one when
# the registry starts again; a trace pickled to or from another process carries a copy, never this one)
_GENERATION = [object()]


def _name_ids(trace_dict: dict, names: list[str]) -> np.ndarray:
    """The process-wide ids of a trace's names (cached on the trace while its table and the
    registry stay as they are)."""
    with _REGISTRY_LOCK:  # ranks may be read by several threads (load.job)
        return _name_ids_locked(trace_dict, names)


def _name_ids_locked(trace_dict: dict, names: list[str]) -> np.ndarray:
    hit = trace_dict.get("_name_ids")
    if hit is not None and hit[0] == len(names) and hit[1] is _GENERATION[0]:
        return hit[2]
    if len(_NAME_IDS) + len(names) > _VERDICTS_MAX:
        _NAME_IDS.clear()
        _NAME_LIST.clear()
        _VERDICTS.clear()
        _GENERATION[0] = object()
    ids = _NAME_IDS
    out = np.empty(len(names), dtype=np.int64)
    for i, n in enumerate(names):
        g = ids.get(n)
        if g is None:
            g = ids[n] = len(_NAME_LIST)
            _NAME_LIST.append(n)
        out[i] = g
    trace_dict["_name_ids"] = (len(names), _GENERATION[0], out)
    return out


def _matching(predicate, trace_dict: dict, names: list[str]) -> np.ndarray:
    """Indices of the names that satisfy a module-level predicate, through _VERDICTS."""
    with _REGISTRY_LOCK:
        gids = _name_ids_locked(trace_dict, names)
        table = _VERDICTS.get(predicate)
        known = 0 if table is None else table.size
        if known < len(_NAME_LIST):
            fresh = np.fromiter((bool(predicate(n)) for n in _NAME_LIST[known:]), dtype=bool,
                                count=len(_NAME_LIST) - known)
            table = _VERDICTS[predicate] = fresh if table is None else np.concatenate([table, fresh])
    return np.flatnonzero(table.take(gids)) if gids.size else np.empty(0, dtype=np.int64)


class Ends:
    """End times (`ts + dur`) of the rows asked for, as `end[idx]` of a whole end column would give
    them (the same float sums), without keeping that column: 8 bytes a row on huge traces."""

    __slots__ = ("ts", "dur")

    def __init__(self, ts: np.ndarray, dur: np.ndarray) -> None:
        self.ts, self.dur = ts, dur

    def __getitem__(self, idx):
        return self.ts[idx] + self.dur[idx]


def row_positions(mask: np.ndarray) -> np.ndarray:
    """np.flatnonzero as int32 where the rows fit (below 2**31): half the memory of int64 positions,
    which over every GPU event or host op of a multi-GB trace are the largest temporaries of the
    feature code and of pruning."""
    idx = np.flatnonzero(mask)
    return idx.astype(np.int32) if mask.size < 2**31 else idx


def _code_mask(column: np.ndarray, codes, n_codes: int) -> np.ndarray:
    """column isin codes, for a coded column (every value in [0, n_codes)): one table lookup per
    row instead of np.isin's sort or search; one comparison per code where there are few (a
    comparison is cheaper than a lookup), and `take`, which is cheaper than `table[column]`."""
    codes = sorted({int(c) for c in codes})
    if len(codes) <= 3:
        out = column == codes[0]
        for c in codes[1:]:
            out |= column == c
        return out
    table = np.zeros(n_codes, dtype=bool)
    table[np.asarray(codes, dtype=np.int64)] = True
    return table.take(column)


def _int_or_none(v: Any) -> int:
    if v is None:
        return INT_NONE
    if isinstance(v, str):
        v = v.strip()
        return int(v) if v.lstrip("-").isdigit() and abs(int(v)) <= _I64_MAX else INT_NONE
    if isinstance(v, float):
        return int(v) if v == v and abs(v) <= _I64_MAX else INT_NONE
    return v if -_I64_MAX <= v <= _I64_MAX else INT_NONE


def _float_or_nan(v: Any) -> float:
    if v is None:
        return np.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return np.nan


def _int_column(values: tuple) -> np.ndarray:
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):  # strings, floats, None or huge ints: slow path
        return np.fromiter(map(_int_or_none, values), dtype=np.int64, count=len(values))


def _float_column(values: tuple) -> np.ndarray:
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return np.fromiter(map(_float_or_nan, values), dtype=np.float64, count=len(values))


def _device_column(args: list) -> np.ndarray:
    device = _int_column([a.device for a in args])
    missing = device == INT_NONE
    if missing.any():
        device_id = _int_column([a.device_id for a in args])
        device = np.where(missing, device_id, device)
    return device


def _codes(values: tuple) -> tuple[list[Any], np.ndarray]:
    """Categorical coding in first-seen order, at C speed (dict.fromkeys + map)."""
    uniques = list(dict.fromkeys(values))
    index = {v: i for i, v in enumerate(uniques)}
    return uniques, np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values))



def build_columns(events: list[RawEvent], rank: int, path: str) -> RankTrace:
    """Turn decoded events into columns: one list comprehension per field (C-speed attribute loads)."""
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived containers: generational GC passes dominate otherwise
    try:
        return _build_columns(events, rank, path)
    finally:
        if gc_was_enabled:
            gc.enable()


def _build_columns(events: list[RawEvent], rank: int, path: str) -> RankTrace:
    n = len(events)
    name = [e.name for e in events]
    ph = [e.ph for e in events]
    tid_raw = [e.tid for e in events]
    names, name_col = _codes(name)
    cats, cat_col = _codes([e.cat for e in events])
    pids, pid_col = _codes([e.pid for e in events])
    tids, tid_col = _codes(tid_raw)
    ph_col = np.fromiter(map(PH_CODES.get, ph, repeat(0, n)), dtype=np.uint8, count=n)
    args = [e.args for e in events]
    ext_col = _int_column([a.external_id for a in args])
    if (ext_col == INT_NONE).all():
        ext_col = _int_column([a.external_id_2021 for a in args])
    bytes_col = _float_column([a.nbytes for a in args])
    if np.isnan(bytes_col).any():
        mem_col = _float_column([a.mem_bytes for a in args])
        bytes_col = np.where(np.isnan(bytes_col), mem_col, bytes_col)
    trace = RankTrace(
        rank=rank, path=path, names=names, cats=cats,
        ts=_float_column([e.ts for e in events]), dur=_float_column([e.dur for e in events]),
        ph=ph_col, cat=narrow(cat_col), name=narrow(name_col), pid=narrow(pid_col), tid=narrow(tid_col),
        correlation=narrow_column(_int_column([a.correlation for a in args])),
        stream=narrow_column(_int_column([a.stream for a in args])),
        device=narrow_column(_device_column(args)),
        external_id=narrow_column(ext_col), nbytes=as_constant(bytes_col),
        total_allocated=as_constant(_float_column([a.total_allocated for a in args])),
        pid_values=pids, tid_values=tids,  # the dtypes of trace_from_columns
    )
    raw_cache: dict[bytes, Any] = {}
    trace.input_dims = _raw_sparse([a.input_dims for a in args], 0, raw_cache)
    trace.input_type = _raw_sparse([a.input_type for a in args], 0, raw_cache)
    trace.call_stack = {i: a.call_stack for i, a in enumerate(args) if a.call_stack is not None}
    trace.collective = {i: a.collective_name for i, a in enumerate(args) if a.collective_name is not None}
    trace.msg_nelems = {
        i: _float_or_nan(a.in_msg_nelems) for i, a in enumerate(args) if a.in_msg_nelems is not None
    }
    trace.python_id = {i: _int_or_none(a.python_id) for i, a in enumerate(args) if a.python_id is not None}
    for i, a in enumerate(args):
        if a.name is not None and ph[i] == "M":
            if name[i] == "thread_name":
                trace.thread_names[int(tid_col[i])] = str(a.name)
            elif name[i] == "process_name":
                trace.process_names[int(pid_col[i])] = str(a.name)
    return trace


# ------------------------------------------------------------------------------------------------
# Incremental building (streaming load): the same columns, built from consecutive slices of the
# events so that each slice's structs are still in cache when read, and freed right after.
# ------------------------------------------------------------------------------------------------

_EVENT_GETTERS = {f: attrgetter(f) for f in ("ph", "name", "cat", "ts", "dur", "pid", "tid", "args")}
_ARG_GETTERS = {
    f: attrgetter(f)
    for f in (
        "correlation", "stream", "device", "device_id", "external_id", "external_id_2021", "nbytes", "mem_bytes",
        "total_allocated", "input_dims", "input_type", "call_stack", "collective_name", "in_msg_nelems", "python_id",
        "name",
    )
}
# Integer columns convert at C speed unless a value is a string, float NaN, null or out of range;
# build_columns decides that for the whole trace at once. Slices that disagree are reported by
# ColumnBuilder.finish() so that the caller can redo the trace with build_columns.
_INT_FIELDS = ("correlation", "stream", "device", "device_id", "external_id", "external_id_2021")
_FLOAT_FIELDS = ("nbytes", "mem_bytes", "total_allocated")


def _int_from(getter, objs: list, default: int | None = None) -> tuple[np.ndarray, bool]:
    """getter over objs as an int64 column, and whether numpy converted every value (the fast path
    of `_int_column`; np.fromiter converts element by element exactly as np.array does)."""
    n = len(objs)
    if default is not None and not any(map(is_not, map(getter, objs), repeat(default))):
        return np.full(n, default, dtype=np.int64), True  # all the shared default object
    try:
        return np.fromiter(map(getter, objs), dtype=np.int64, count=n), True
    except (TypeError, ValueError, OverflowError):
        return np.fromiter(map(_int_or_none, map(getter, objs)), dtype=np.int64, count=n), False


def _float_from(getter, objs: list) -> np.ndarray:
    """getter over objs as a float64 column, as `_float_column` converts it."""
    try:
        return np.fromiter(map(getter, objs), dtype=np.float64, count=len(objs))
    except (TypeError, ValueError, OverflowError):  # e.g. None, which np.array turns into NaN
        return _float_column(list(map(getter, objs)))


def _any_set(getter, objs: list, default=None) -> bool:
    return any(map(is_not, map(getter, objs), repeat(default)))


def _code_into(index: dict, values: list) -> np.ndarray:
    """Categorical codes shared across slices, in first-seen order (as `_codes` over the whole)."""
    setdefault = index.setdefault
    for v in dict.fromkeys(values):
        setdefault(v, len(index))
    return np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values))


def _code_ints_into(index: dict, values: list) -> np.ndarray:
    """`_code_into` for columns of Python ints (pid, tid): one numpy pass instead of dict lookups.
    Other values (strings, bools, huge ints) take `_code_into`."""
    arr = np.array(values)
    if arr.dtype.kind != "i" or arr.ndim != 1:
        return _code_into(index, values)
    uniq, first, inverse = np.unique(arr, return_index=True, return_inverse=True)
    lut = np.empty(uniq.size, dtype=np.int32)
    setdefault = index.setdefault
    for j in np.argsort(first, kind="stable").tolist():  # first-seen order, as _code_into
        lut[j] = setdefault(int(uniq[j]), len(index))
    return lut[inverse]


def _raw_sparse(values: list, offset: int, cache: dict[bytes, Any]) -> dict[int, Any]:
    """{offset + i: decoded value} for the msgspec.Raw values that are not absent or JSON null.

    Equal JSON texts are decoded once and share the (read-only) value.
    """
    n = len(values)
    if values.count(None) == n:
        return {}
    idx = list(compress(range(n), map(is_not, values, repeat(None))))
    got = _decode_raws(list(map(values.__getitem__, idx)), cache)
    if None in got:  # JSON null: absent, as for a field that decodes to None
        return {offset + i: v for i, v in zip(idx, got) if v is not None}
    return dict(zip(map(offset.__add__, idx), got))


def decode_json_texts(texts: list[bytes]) -> list[Any]:
    """The values of JSON texts that a decoder cut out of a trace (so valid JSON), in one call. A
    text msgspec cannot turn into a value (a number out of range, e.g. `[[1e400]]` as a shape)
    gives None: the field is then absent, as for JSON null, rather than the whole trace failing."""
    try:
        return msgspec.json.decode(b"[" + b",".join(texts) + b"]")
    except msgspec.MsgspecError:
        out = []
        for t in texts:
            try:
                out.append(msgspec.json.decode(t))
            except msgspec.MsgspecError:
                out.append(None)
        return out


def _decode_raws(values: list, cache: dict[bytes, Any]) -> list[Any]:
    """Decoded msgspec.Raw values; each distinct JSON text is decoded once and the value shared."""
    keys = list(map(bytes, values))
    new = list(set(keys).difference(cache))
    if new:  # one decoder call for all new texts (they are valid JSON values, msgspec cut them out)
        cache.update(zip(new, decode_json_texts(new)))
    return list(map(cache.__getitem__, keys))


_SPARSE_FIELDS = ("input_dims", "input_type", "call_stack", "collective_name", "in_msg_nelems", "python_id")
_SPARSE = attrgetter(*_SPARSE_FIELDS)
_SPARSE_NONE = (None,) * len(_SPARSE_FIELDS)
_RARE_DENSE = attrgetter("device_id", "external_id_2021", "mem_bytes")
_RARE_DENSE_DEFAULTS = (INT_NONE, INT_NONE, NAN)


def _sparse(values: list, offset: int) -> dict[int, Any]:
    if values.count(None) == len(values):
        return {}
    return {offset + i: v for i, v in enumerate(values) if v is not None}


def trace_from_columns(rank: int, path: str, index: dict[str, dict], column, device: np.ndarray,
                       external_id: np.ndarray) -> RankTrace:
    """A RankTrace from the builders' coding tables (`index`: name, cat, pid, tid) and `column(k)`,
    which gives each remaining column once (ColumnBuilder and fastcols.FastBuilder).

    Integer columns (the codes of names, categories, pids and tids too) are kept in the smallest type
    that holds their values (int8 up), and a column of one value (`total_allocated` without [memory]
    events, ids a schema does not write) as a read-only broadcast (load/narrow.py): the streaming path
    keeps its columns the same way."""
    ids = narrow_column
    return RankTrace(
        rank=rank, path=path, names=list(index["name"]), cats=list(index["cat"]),
        ts=column("ts"), dur=column("dur"), ph=column("ph"), cat=narrow(column("cat")), name=narrow(column("name")),
        pid=narrow(column("pid")), tid=narrow(column("tid")), correlation=ids(column("correlation")),
        stream=ids(column("stream")), device=ids(device), external_id=ids(external_id),
        nbytes=as_constant(column("nbytes")), total_allocated=as_constant(column("total_allocated")),
        pid_values=list(index["pid"]), tid_values=list(index["tid"]),
    )


class ColumnBuilder:
    """Builds the RankTrace that `build_columns` would build, one slice of events at a time."""

    def __init__(self, rank: int, path: str) -> None:
        self.rank, self.path = rank, path
        self.n = 0
        self._index: dict[str, dict] = {"name": {}, "cat": {}, "pid": {}, "tid": {}}
        self._parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("ts", "dur", "ph", "cat", "name", "pid", "tid", "nbytes", "total_allocated")
            + _INT_FIELDS
        }
        self._modes: dict[str, set[bool]] = {k: set() for k in _INT_FIELDS}
        self._device_missing = False
        self.input_dims: dict[int, Any] = {}
        self.input_type: dict[int, Any] = {}
        self.call_stack: dict[int, str] = {}
        self.collective: dict[int, str] = {}
        self.msg_nelems: dict[int, float] = {}
        self.python_id: dict[int, int] = {}
        self.thread_names: dict[int, str] = {}
        self.process_names: dict[int, str] = {}
        self._strings: dict[str, str] = {}  # call stacks repeat: keep one copy of each
        self._raw: dict[bytes, Any] = {}  # input shapes and types repeat: decode each text once

    def add(self, events: list[RawEvent]) -> None:
        n = len(events)
        if not n:
            return
        off = self.n
        parts, index, modes = self._parts, self._index, self._modes
        g, a = _EVENT_GETTERS, _ARG_GETTERS
        name = list(map(g["name"], events))
        ph = list(map(g["ph"], events))
        parts["name"].append(_code_into(index["name"], name))
        parts["cat"].append(_code_into(index["cat"], list(map(g["cat"], events))))
        parts["pid"].append(pid_col := _code_ints_into(index["pid"], list(map(g["pid"], events))))
        parts["tid"].append(tid_col := _code_ints_into(index["tid"], list(map(g["tid"], events))))
        parts["ph"].append(np.fromiter(map(PH_CODES.get, ph, repeat(0, n)), dtype=np.uint8, count=n))
        parts["ts"].append(_float_from(g["ts"], events))
        parts["dur"].append(_float_from(g["dur"], events))
        args = list(map(g["args"], events))
        # fields that are usually at their default: one pass over all three, then field by field
        rare_dense = any(map(ne, map(_RARE_DENSE, args), repeat(_RARE_DENSE_DEFAULTS)))
        for f in _INT_FIELDS:
            if not rare_dense and f in ("device_id", "external_id_2021"):
                col, fast = np.full(n, INT_NONE, dtype=np.int64), True
            else:
                col, fast = _int_from(a[f], args, INT_NONE if f in ("device_id", "external_id_2021") else None)
            parts[f].append(col)
            modes[f].add(fast)
        if not self._device_missing and (parts["device"][-1] == INT_NONE).any():
            self._device_missing = True
        nbytes = _float_from(a["nbytes"], args)
        missing = np.isnan(nbytes)
        if rare_dense and missing.any() and _any_set(a["mem_bytes"], args, NAN):
            nbytes = np.where(missing, _float_from(a["mem_bytes"], args), nbytes)
        parts["nbytes"].append(nbytes)
        parts["total_allocated"].append(_float_from(a["total_allocated"], args))
        # sparse fields: the events that carry any of them, then the values of those events only
        carriers = list(compress(range(n), map(ne, map(_SPARSE, args), repeat(_SPARSE_NONE))))
        if carriers:
            if len(carriers) * 4 < n:
                columns = zip(*map(_SPARSE, map(args.__getitem__, carriers)))
                positions = [off + i for i in carriers]
            else:
                columns = (list(map(a[f], args)) for f in _SPARSE_FIELDS)
                positions = range(off, off + n)
            for f, values in zip(_SPARSE_FIELDS, columns):
                keep = list(map(is_not, values, repeat(None)))
                if not any(keep):
                    continue
                pos, vals = list(compress(positions, keep)), list(compress(values, keep))
                if f in ("input_dims", "input_type"):
                    vals = _decode_raws(vals, self._raw)
                    target = self.input_dims if f == "input_dims" else self.input_type
                    if None in vals:  # JSON null: absent, like a field that decodes to None
                        target.update((i, v) for i, v in zip(pos, vals) if v is not None)
                    else:
                        target.update(zip(pos, vals))
                elif f == "call_stack":
                    self.call_stack.update(zip(pos, map(self._strings.setdefault, vals, vals)))
                elif f == "collective_name":
                    self.collective.update(zip(pos, vals))
                elif f == "in_msg_nelems":
                    self.msg_nelems.update(zip(pos, map(_float_or_nan, vals)))
                else:
                    self.python_id.update(zip(pos, map(_int_or_none, vals)))
        if "M" in ph and _any_set(a["name"], args):  # process/thread names: metadata events only
            for i, v in _sparse(list(map(a["name"], args)), 0).items():
                if ph[i] == "M":
                    if name[i] == "thread_name":
                        self.thread_names[int(tid_col[i])] = str(v)
                    elif name[i] == "process_name":
                        self.process_names[int(pid_col[i])] = str(v)
        self.n += n

    def finish(self) -> RankTrace | None:
        """The RankTrace; None when slices converted an integer column differently (mixed value
        types across the trace): then only build_columns over all events gives the same result."""
        modes = self._modes
        for f in ("correlation", "stream", "device", "external_id"):
            if len(modes[f]) > 1:
                return None
        cat = lambda k: np.concatenate(self._parts.pop(k)) if self._parts[k] else np.empty(0)  # noqa: E731
        ext = cat("external_id")
        ext21 = self._parts.pop("external_id_2021")
        if (ext == INT_NONE).all():
            if len(modes["external_id_2021"]) > 1:
                return None
            ext = np.concatenate(ext21)
        del ext21
        device = cat("device")
        device_id = self._parts.pop("device_id")
        if self._device_missing:
            if len(modes["device_id"]) > 1:
                return None
            device = np.where(device == INT_NONE, np.concatenate(device_id), device)
        del device_id
        trace = trace_from_columns(self.rank, self.path, self._index, cat, device, ext)
        trace.input_dims, trace.input_type, trace.call_stack = self.input_dims, self.input_type, self.call_stack
        trace.collective, trace.msg_nelems, trace.python_id = self.collective, self.msg_nelems, self.python_id
        trace.thread_names, trace.process_names = self.thread_names, self.process_names
        return trace
