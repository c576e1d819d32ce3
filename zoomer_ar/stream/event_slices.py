"""One slice of events as the CompactBuilder reads it: decoded by msgspec (EventSlice, through a union
tagged by `ph`) or read by the compiled reader into columns (ColumnSlice)."""

from __future__ import annotations

from itertools import compress, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, Union

import msgspec
import numpy as np

from ..load import fastcols
from ..load.columns import INT_NONE, PH_CODES, PH_FLOW_END, PH_FLOW_START, PH_META, _int_column, _int_or_none
from ..load.schema import EVENTS_DECODER, NO_ARGS, Number, RawArgs
from ..load.narrow import narrow
from .parts import codes_into, f32_if_exact, take_list

if TYPE_CHECKING:
    from .compact import CompactBuilder

_PH, _TS, _DUR, _TID = (attrgetter(f) for f in ("ph", "ts", "dur", "tid"))
_CORR = attrgetter("args.correlation")

# Decoding: a union tagged by `ph`. Flow arrows (s/t/f) decode to empty structs (nothing of them is
# used), every other phase to the reference schema's fields (load/schema.py RawEvent, same types,
# so the same values and the same refusals). Phases outside the Chrome format, or an event
# without `ph`, fail validation: that slice is decoded with the reference schema instead.
_FULL_PHASES = "XiIMBECbneSTpFONDPRc"
_FLOW_PHASES = "stf"


def _event_class(ph: str, flow: bool) -> type:
    ns: dict[str, Any] = {"__annotations__": {"ph": ClassVar[str]}, "ph": ph}
    if not flow:
        fields = {"name": (str, ""), "cat": (str, ""), "ts": (Number, 0), "dur": (Number, 0), "pid": (int | str, 0),
                  "tid": (int | str, 0), "args": (RawArgs, NO_ARGS)}
        for f, (tp, default) in fields.items():
            ns["__annotations__"][f] = tp
            ns[f] = default
    return type(f"Event_{'flow_' if flow else ''}{ord(ph)}", (msgspec.Struct,), ns, tag_field="ph", tag=ph, gc=False)


_CLASSES = [_event_class(p, False) for p in _FULL_PHASES] + [_event_class(p, True) for p in _FLOW_PHASES]
_IS_FLOW = {c: c.ph in _FLOW_PHASES for c in _CLASSES}
TAGGED_DECODER = msgspec.json.Decoder(list[Union[tuple(_CLASSES)]])  # noqa: UP007


def decode_slice(view) -> tuple[list, np.ndarray]:
    """The events of a slice, and which of them are flow arrows (decoded to empty structs)."""
    try:
        events = TAGGED_DECODER.decode(view)
        flow = np.fromiter(map(_IS_FLOW.__getitem__, map(type, events)), dtype=bool, count=len(events))
    except msgspec.ValidationError:  # an event without `ph`, or an unusual one: the reference schema
        events = EVENTS_DECODER.decode(view)
        codes = np.fromiter(map(PH_CODES.get, map(_PH, events), repeat(0, len(events))), dtype=np.uint8,
                            count=len(events))
        flow = (codes == PH_FLOW_START) | (codes == PH_FLOW_END)
    return events, flow


class EventSlice:
    """One slice of msgspec-decoded events (flow events removed), as CompactBuilder._add reads it."""

    def __init__(self, b: CompactBuilder, events: list, ords: np.ndarray) -> None:
        self.b, self.events, self.ords = b, events, ords
        self.n = n = len(events)
        kc = b._kinds(events)
        self.cc, self.nc, self.ph, self.cf, self.nf = b._k_cat[kc], b._k_name[kc], b._k_ph[kc], b._k_cf[kc], b._k_nf[kc]
        self.ts = np.fromiter(map(_TS, events), dtype=np.float64, count=n)
        self.dur = np.fromiter(map(_DUR, events), dtype=np.float64, count=n)

    def corr(self, idx: np.ndarray) -> np.ndarray:
        return _int_column(list(map(_CORR, take_list(self.events, idx.tolist()))))

    def tid(self, idx: np.ndarray) -> np.ndarray:
        return codes_into(self.b.tid_index, list(map(_TID, take_list(self.events, idx.tolist()))))

    def input_type(self, i: int) -> Any:
        raw = self.events[i].args.input_type
        return None if raw is None else self.b._decode_raw(raw)

    def any_ext(self) -> bool:
        return any(_int_or_none(e.args.external_id) != INT_NONE for e in self.events if e.args.external_id != INT_NONE)

    def rows(self, idx: list[int], light: np.ndarray | None = None) -> tuple[dict, dict]:
        return self.b._rows(self.events, idx, self.cc, self.ph, self.ts, self.dur, self.ords, nc=self.nc, light=light)


class ColumnSlice:
    """One run of events as the compiled reader's columns (flow events kept, with no flags: no
    rule keeps them), read by CompactBuilder._add as an EventSlice. Values are the ones
    load.columns converts to (the reader's contract, tested on the corpus)."""

    _SPARSE = ("input_dims", "input_type", "call_stack", "meta_name")

    def __init__(self, b: CompactBuilder, n: int, base: int, cols: dict[str, bytes], sparse: dict[str, tuple]) -> None:
        self.b, self.n, self.base = b, n, base
        col = {k: np.frombuffer(v, dtype=fastcols.DTYPES[k]) for k, v in cols.items()}
        self.col = col
        self.cc, self.nc, self.ph, self.ts, self.dur = col["cat"], col["name"], col["ph"], col["ts"], col["dur"]
        cf_tab, nf_tab = b._flag_tables()
        self.cf, self.nf = cf_tab[self.cc], nf_tab[self.nc]
        flow = (self.ph == PH_FLOW_START) | (self.ph == PH_FLOW_END)
        if flow.any():  # flow arrows: counted, never kept
            self.cf[flow] = 0
            self.nf[flow] = 0
        self.flow = flow
        self.ords = np.arange(base, base + n, dtype=np.int64)
        # sparse fields: event (relative) -> value, as sorted positions and values
        self.sparse: dict[str, tuple[np.ndarray, list]] = {}
        for f in self._SPARSE:
            pos, uid, uniques = sparse[f]
            if not pos:
                continue
            vals = b._sparse_values(f, uniques)
            rel = np.frombuffer(pos, dtype=np.int64) - base
            got = list(map(vals.__getitem__, np.frombuffer(uid, dtype=np.int32).tolist()))
            if None in got:  # texts that decode to no value: absent (load.columns.decode_json_texts)
                keep = np.asarray([v is not None for v in got], dtype=bool)
                rel, got = rel[keep], list(compress(got, keep))
            self.sparse[f] = (rel, got)

    def corr(self, idx: np.ndarray) -> np.ndarray:
        return self.col["correlation"][idx]

    def tid(self, idx: np.ndarray) -> np.ndarray:
        return self.col["tid"][idx]

    def input_type(self, i: int) -> Any:
        got = self.sparse.get("input_type")
        if got is None:
            return None
        rel, vals = got
        k = int(np.searchsorted(rel, i))
        return vals[k] if k < rel.size and rel[k] == i else None

    def any_ext(self) -> bool:
        ext = self.col["external_id"]
        return bool(((ext != INT_NONE) & ~self.flow).any())

    def _sparse_rows(self, f: str, ia: np.ndarray) -> dict[int, Any]:
        """{row: value} of field f for the rows ia (sorted event positions)."""
        got = self.sparse.get(f)
        if got is None or not ia.size:
            return {}
        rel, vals = got
        k = np.searchsorted(ia, rel)
        k_ok = np.minimum(k, ia.size - 1)
        hit = (k < ia.size) & (ia[k_ok] == rel)
        if not hit.any():
            return {}
        return dict(zip(k[hit].tolist(), map(vals.__getitem__, np.flatnonzero(hit).tolist())))

    def rows(self, idx: list[int], light: np.ndarray | None = None) -> tuple[dict, dict]:
        """As CompactBuilder._rows: the columns of the rows idx and their sparse values; `light`
        rows get the argument columns' defaults."""
        b, c = self.b, self.col
        ia = np.asarray(idx, dtype=np.int64)
        k = ia.size
        cols = {"ts": self.ts[ia], "dur": self.dur[ia], "ph": self.ph[ia], "cat": self.cc[ia].astype(np.int16),
                "name": self.nc[ia], "pid": c["pid"][ia], "tid": c["tid"][ia], "ordinal": self.ords[ia]}
        full = ia if light is None or not light.any() else ia[~light]
        device = c["device"][full]
        missing = device == INT_NONE
        if missing.any():
            device = np.where(missing, c["device_id"][full], device)
        e21 = c["external_id_2021"][full]
        ext = c["external_id"][full]
        if not b.any_ext and (ext != INT_NONE).any():
            b.any_ext = True
        args = {"correlation": narrow(c["correlation"][full]), "stream": narrow(c["stream"][full]),
                "device": narrow(device), "ext": narrow(ext),
                "ext21": np.full(full.size, INT_NONE, dtype=np.int16) if (e21 == INT_NONE).all() else narrow(e21),
                "nbytes": f32_if_exact(c["nbytes"][full]), "total_allocated": c["total_allocated"][full]}
        if full.size == k:
            cols.update(args)
        else:  # light rows: defaults, as CompactBuilder._rows gives them
            defaults = {"correlation": np.full(k, INT_NONE, dtype=np.int16), "stream": np.full(k, INT_NONE, dtype=np.int16),
                        "device": np.full(k, INT_NONE, dtype=np.int16), "ext": np.full(k, INT_NONE, dtype=np.int16),
                        "ext21": np.full(k, INT_NONE, dtype=np.int16), "nbytes": np.full(k, np.nan, dtype=np.float32),
                        "total_allocated": np.full(k, np.nan)}
            where = np.flatnonzero(~light)
            for f, a in args.items():
                d = defaults[f]
                d = d.astype(np.result_type(d, a), copy=False)
                d[where] = a
                defaults[f] = d
            cols.update(defaults)
        sparse: dict[str, dict[int, Any]] = {}
        rows_of_full = None if full.size == k else np.flatnonzero(~light)
        for f in ("input_dims", "input_type", "call_stack"):
            got = self._sparse_rows(f, full)
            if rows_of_full is not None and got:
                back = rows_of_full.tolist()
                got = {back[r]: v for r, v in got.items()}
            sparse[f] = got
        meta = cols["ph"] == PH_META
        if light is not None:
            meta &= ~light  # as _rows: a light row's arguments are not read
        meta = np.flatnonzero(meta)
        if meta.size:
            names = self._sparse_rows("meta_name", ia)
            for r in meta.tolist():
                v = names.get(r)
                if v is None:
                    continue
                nm = b._name_list_at(int(cols["name"][r]))
                if nm == "thread_name":
                    b.thread_names[int(cols["tid"][r])] = str(v)
                elif nm == "process_name":
                    b.process_names[int(cols["pid"][r])] = str(v)
        return cols, sparse
