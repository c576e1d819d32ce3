"""Compact columns: the part of a rank's events that the features read, built slice by slice.

`CompactBuilder.add(view)` decodes one slice of events (the existing msgspec schema, so the same
values and the same refusals as the in-memory loader), classifies every event by category and
name, and turns only the events the features use into columns; the rest is dropped with the
slice. `finish()` returns a RankTrace that `zoomer_ar.features` reads as it reads a whole trace:
the features are computed by the same code on a smaller trace, so the results are equal by
construction (tests/huge proves it on the corpus and on generated traces).

What is kept, and why (every rule below is a superset of what a feature selects; an extra real
event never changes a feature, a missing one would):

- every GPU / accelerator event (kernel, memcpy, memset, mtia), every `Trace` span, metadata;
- events named like the annotations the features look for (ProfilerStep#, DataLoader __next__,
  Optimizer.step#, Optimizer.zero_grad#, `[memory]`), in any category;
- cpu ops whose names a feature tests (item, copies, factories, GEMM/conv/layer/add/zero_ ops,
  autograd backward ops) and `aten::copy_` ops that cast to or from half/bfloat16/float8;
- runtime calls that launch, copy, set, synchronise, allocate or begin/end a stream capture; any other
  runtime call is dropped but its correlation id is remembered: if a GPU event turns out to carry it, the rank is
  read again keeping those calls (NeedAnotherPass);
- `aten::` ops that overlap an Optimizer.step# window already seen on their thread (the
  optimizer's per-parameter and foreach counts). Ops dropped before a window was seen are
  summarised per slice and thread (first start, last end); if a later window overlaps such a
  summary, the rank is read again with every window known from the start;
- every cpu op and user annotation until the first GPU/accelerator event (a rank without any
  device event splits its time into phases over all host ops);
- Python frames: only those the features count (`_single_tensor_`) and the first one (whether
  stacks were recorded); `frames.py` adds the frames around evidence events in a second pass;
- the dropped complete events with the earliest start and the latest end (the rank's window,
  `wall_ms` and the evidence times are relative to it).

Whole-trace facts that do not need the events are accumulated as numbers: event count, every
category and name (first-seen order, as the in-memory columns), the nanosecond-timestamp test
(the median of all complete-event starts), whether any event carries an `External id`.
"""

from __future__ import annotations

from itertools import compress, islice, repeat
from operator import attrgetter, ne
from typing import Any

import numpy as np

from ..load.columns import (
    decode_json_texts, INT_NONE, PH_CODES, PH_COMPLETE, PH_INSTANT, PH_META, RankTrace, _float_column, _int_column,
)
from ..load import fastcols
from ..load.schema import NAN
from .classify import (
    C_ACCEL, C_CPUOP, C_GPU, C_GPUANN, C_PY, C_RUNTIME, C_TRACE, C_USER, KEEP_CATS, KEEP_NAMES, LOW_PRECISION, N_ATEN,
    N_COPY_, N_LIGHT, N_OPT, N_RT, cat_flags, name_flags,
)
from .event_slices import ColumnSlice, EventSlice, decode_slice
from ..program_match import PYTHON, RAW_KINDS, category_kind, is_module_frame
from .heap import trim_heap
from .nscount import NsCounter
from ..load.narrow import as_constant, concat_parts, narrow, narrow_column
from .parts import BLOCK_CODES, BLOCK_IDS, SPARSE_COLS, ColumnParts, codes_into, f32_if_exact, int_of, take_list

HOST_BUDGET = 1 << 18  # host ops kept before the first device event (then: a second pass if none comes)
END_ULPS = 4  # latest-end candidates kept within this many float steps (ns traces round twice)

_CAT, _NAME, _PH, _PID, _TID, _ARGS = (attrgetter(f) for f in ("cat", "name", "ph", "pid", "tid", "args"))
_KIND = attrgetter("cat", "name", "ph")
_DENSE_GETTERS = tuple(attrgetter(f) for f in ("correlation", "stream", "device", "external_id"))
_RARE = attrgetter("device_id", "external_id_2021", "nbytes", "mem_bytes", "total_allocated")
_RARE_DEFAULT = (INT_NONE, INT_NONE, NAN, NAN, NAN)  # the schema's shared default objects
_SPARSE = attrgetter("input_dims", "input_type", "call_stack")
_SPARSE_NONE = (None, None, None)


class NeedAnotherPass(Exception):
    """The single pass dropped events that turned out to matter; read the rank again with `hints`."""

    def __init__(self, hints: dict[str, Any], why: str) -> None:
        super().__init__(why)
        self.hints = hints



def _no_kind(_name: str) -> int:
    return 0


class CompactBuilder:
    # what the builders of one file's ranks share (stream/split.py): the code tables the compiled reader
    # writes to, the thread and process names (as one trace's, in file order) and caches of decoded texts
    SHARED = ("cat_index", "name_index", "pid_index", "tid_index", "thread_names", "process_names", "_raw_cache",
              "_sp_vals", "_strings")

    def __init__(self, rank: int, path: str, hints: dict[str, Any] | None = None,
                 shared: CompactBuilder | None = None) -> None:
        self.rank, self.path = rank, path
        hints = hints or {}
        self.n_events = 0
        self.slice_no = 0
        self.cat_index: dict[str, int] = {}
        self.name_index: dict[str, int] = {}
        self.pid_index: dict[Any, int] = {}
        self.tid_index: dict[Any, int] = {}
        self.kind_index: dict[tuple, int] = {}
        self._k_cat = np.zeros(0, dtype=np.int32)
        self._k_name = np.zeros(0, dtype=np.int32)
        self._k_ph = np.zeros(0, dtype=np.uint8)
        self._k_cf = np.zeros(0, dtype=np.uint8)
        self._k_nf = np.zeros(0, dtype=np.uint8)
        self._cf_tab = np.zeros(0, dtype=np.uint8)  # the compiled reader's path: flags by code
        # the names that identify the program (program_match.py), of every row read, kept or not: kinds by
        # category code, and the kinds each name code was seen with
        self._pk_tab = np.zeros(0, dtype=np.uint8)
        self._pk_seen = np.zeros(0, dtype=np.uint8)
        self._nf_tab = np.zeros(0, dtype=np.uint8)
        self._cat_flag_cache: dict[str, int] = {}
        self._name_flag_cache: dict[str, int] = {}
        self.main = ColumnParts(ordinals=False)
        self.extra = ColumnParts(ordinals=True)  # Python frames and window extremes, kept in file order among themselves
        self.seen_device = False
        self.host_mode = bool(hints.get("host_mode"))  # keep every host op (a rank without device events)
        self.host_kept = 0
        self.host_incomplete = False
        self.seen_python = False
        self.any_ext = False  # an event carries "External id" (then 2021 "external id" is ignored)
        self.n_useful = 0
        self.ns = NsCounter()
        self.min_ts_all = np.inf
        self.t0_best = np.inf  # dropped complete non-Trace events: earliest start ...
        self.t0_row: tuple[int, dict] | None = None
        self.t1_best = -np.inf  # ... and latest end (candidates within END_ULPS float steps)
        self.t1_rows: list[tuple[float, int, dict]] = []
        # optimizer windows: tid code -> list of (ts, end, slice no), and the union per tid
        self.windows: dict[int, list[tuple[float, float, int]]] = {}
        self._unions: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.dropped_aten: list[tuple[int, int, float, float]] = []  # (slice no, tid code, min ts, max end)
        self.deferred_corr: list[np.ndarray] = []  # correlation ids of dropped runtime calls
        self.keep_corr: np.ndarray | None = None
        self._raw_cache: dict[bytes, Any] = {}
        self._sp_vals: dict[str, list] = {}
        self._name_list: list[str] = []
        self._strings: dict[str, str] = {}
        self.thread_names: dict[int, str] = {}
        self.process_names: dict[int, str] = {}
        if shared is not None:
            for attr in self.SHARED:
                setattr(self, attr, getattr(shared, attr))
        self.windows_known = "windows" in hints  # a later pass: every window was known from the start
        for tid, spans in (hints.get("windows") or {}).items():
            code = self.tid_index.setdefault(tid, len(self.tid_index))
            for ts, end in spans:
                self.windows.setdefault(code, []).append((ts, end, -1))
        for code in self.windows:
            self._update_union(code)
        if hints.get("keep_corr") is not None:
            self.keep_corr = np.unique(np.asarray(hints["keep_corr"], dtype=np.int64))

    # ---------------------------------------------------------------------------------------------
    def _kinds(self, events: list) -> np.ndarray:
        """Code of each event's (cat, name, ph); per-kind tables give the codes and flags.

        New kinds are registered in event order, so names and categories get first-seen codes."""
        index = self.kind_index
        n = len(events)
        try:
            return np.fromiter(map(index.__getitem__, map(_KIND, events)), dtype=np.int32, count=n)
        except KeyError:
            pass
        keys = list(map(_KIND, events))
        new = [k for k in dict.fromkeys(keys) if k not in index]
        cats, names, phs, cfs, nfs = [], [], [], [], []
        for key in new:
            cat, name, ph = key
            index[key] = len(index)
            c = self.cat_index.setdefault(cat, len(self.cat_index))
            cats.append(c)
            names.append(self.name_index.setdefault(name, len(self.name_index)))
            phs.append(PH_CODES.get(ph, 0))
            cfs.append(self._cat_flag_of(cat))
            nfs.append(self._name_flag_of(name))
        self._k_cat = np.concatenate([self._k_cat, np.asarray(cats, dtype=np.int32)])
        self._k_name = np.concatenate([self._k_name, np.asarray(names, dtype=np.int32)])
        self._k_ph = np.concatenate([self._k_ph, np.asarray(phs, dtype=np.uint8)])
        self._k_cf = np.concatenate([self._k_cf, np.asarray(cfs, dtype=np.uint8)])
        self._k_nf = np.concatenate([self._k_nf, np.asarray(nfs, dtype=np.uint8)])
        return np.fromiter(map(index.__getitem__, keys), dtype=np.int32, count=n)

    def _cat_flag_of(self, cat: str) -> int:
        f = self._cat_flag_cache.get(cat)
        if f is None:
            f = self._cat_flag_cache[cat] = cat_flags(cat)
        return f

    def _name_flag_of(self, name: str) -> int:
        f = self._name_flag_cache.get(name)
        if f is None:
            f = self._name_flag_cache[name] = name_flags(name)
        return f

    @property
    def _cat_flags(self) -> np.ndarray:
        """Flags per category code."""
        return np.asarray([self._cat_flag_cache.get(c, 0) for c in self.cat_index], dtype=np.uint8)

    def add(self, view) -> None:
        """Take one slice (a JSON array of whole events). Decoding comes first: a slice that does
        not decode raises msgspec.DecodeError before any state changes (scan.py's contract)."""
        events, flow = decode_slice(view)
        self.add_events(events, flow)

    def add_events(self, events: list, flow: np.ndarray) -> None:
        """Take decoded events (decode_slice), `flow` marking the flow arrows among them."""
        try:
            n = len(events)
            base = self.n_events
            self.n_events += n
            if flow.any():  # flow arrows (a third of Kineto events): counted, never used by a feature
                pos = np.flatnonzero(~flow)
                events = take_list(events, pos.tolist())
                ords = pos + base
            else:
                ords = np.arange(base, base + n, dtype=np.int64)
            if events:
                self._add(EventSlice(self, events, ords))
        finally:
            del events

    def add_columns(self, n: int, cols: dict[str, bytes], sparse: dict[str, tuple]) -> None:
        """Take the columns of one run of events from the compiled reader (`parser()`)."""
        base = self.n_events
        self.n_events += n
        if n:
            self._add(ColumnSlice(self, n, base, cols, sparse))

    def parser(self):
        """A compiled event reader that codes names, categories, pids and tids into this builder's
        tables (load/_fastjson.c); feed its columns to add_columns."""
        return fastcols.raw_parser(self.name_index, self.cat_index, self.pid_index, self.tid_index)

    def _flag_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Flags per category code and per name code, extended to every code registered so far."""
        return self._extended("_cf_tab", self.cat_index, self._cat_flag_of), \
            self._extended("_nf_tab", self.name_index, self._name_flag_of)

    def _extended(self, attr: str, index: dict, flag_of) -> np.ndarray:
        """The uint8 table `attr` (a value per code of `index`), extended with flag_of of the codes registered since."""
        tab = getattr(self, attr)
        if tab.size < len(index):
            new = list(islice(reversed(index), len(index) - tab.size))[::-1]
            tab = np.concatenate([tab, np.asarray([flag_of(v) for v in new], dtype=np.uint8)])
            setattr(self, attr, tab)
        return tab

    def _note_program_names(self, cc: np.ndarray, nc: np.ndarray) -> None:
        """Record the kinds (program_match.category_kind) each name of a slice's rows was seen with."""
        kinds = self._extended("_pk_tab", self.cat_index, category_kind)[cc]
        rows = np.flatnonzero(kinds)
        if not rows.size:
            return
        seen = self._extended("_pk_seen", self.name_index, _no_kind)
        kinds, names = kinds[rows], nc[rows]
        for bit in RAW_KINDS.values():
            of = names[(kinds & bit) != 0]
            if of.size:
                seen[np.unique(of)] |= bit

    def seen_names(self) -> dict[str, frozenset[str]]:
        """The names of the rows read, by kind, as program_match.raw_names gives them."""
        names = list(self.name_index)
        out = {}
        for kind, bit in RAW_KINDS.items():
            got = [names[i] for i in np.flatnonzero(self._pk_seen & bit).tolist()]
            out[kind] = frozenset(n for n in got if is_module_frame(n)) if bit == PYTHON else frozenset(got)
        return out

    def _add(self, S: EventSlice | ColumnSlice) -> None:
        self.slice_no += 1
        self._note_program_names(S.cc, S.nc)
        sn = self.slice_no
        ph, cf, nf, ts, dur, ords = S.ph, S.cf, S.nf, S.ts, S.dur, S.ords
        x = ph == PH_COMPLETE
        self.n_useful += int(np.count_nonzero(x | (ph == PH_INSTANT)))

        keep = ((cf & KEEP_CATS) != 0) | ((nf & KEEP_NAMES) != 0) | (ph == PH_META)
        rt = (cf & C_RUNTIME) != 0
        if self.keep_corr is not None:
            keep |= rt & ((nf & N_RT) != 0)
            rest = np.flatnonzero(rt & ~keep)
            if rest.size:
                corr = S.corr(rest)
                keep[rest[np.isin(corr, self.keep_corr)]] = True
        else:
            keep |= rt & ((nf & N_RT) != 0)
        if self.host_mode:
            keep |= ((cf & (C_CPUOP | C_USER)) != 0) & x
        elif not self.seen_device:
            host = ((cf & (C_CPUOP | C_USER)) != 0) & x
            if self.host_kept < HOST_BUDGET:
                keep |= host
                self.host_kept += int(np.count_nonzero(host))
            elif host.any():
                self.host_incomplete = True
        if not self.seen_device and (((cf & (C_GPU | C_ACCEL)) != 0) & x).any():
            self.seen_device = True
        py = (cf & C_PY) != 0
        if not self.seen_python:
            first_py = np.flatnonzero(py & x)
            if first_py.size:
                keep[first_py[0]] = True
                self.seen_python = True
        # aten::copy_ that casts to or from a low-precision type
        cp = np.flatnonzero(((nf & N_COPY_) != 0) & ~keep)
        if cp.size:
            for i in cp.tolist():
                v = S.input_type(i)
                if isinstance(v, list) and any(isinstance(s, str) and s.startswith(LOW_PRECISION) for s in v[:2]):
                    keep[i] = True
        # optimizer windows, then the aten ops that may lie inside one
        opt = np.flatnonzero(((nf & N_OPT) != 0) & x & ((cf & C_GPUANN) == 0))
        if opt.size:
            tids = S.tid(opt)
            for i, code in zip(opt.tolist(), tids.tolist()):
                self.windows.setdefault(code, []).append((float(ts[i]), float(ts[i] + dur[i]), sn))
            for code in set(tids.tolist()):
                self._update_union(code)
        cand = np.flatnonzero(((nf & N_ATEN) != 0) & ((cf & C_CPUOP) != 0) & x & ~keep)
        if cand.size:
            ctid = S.tid(cand)
            c_ts, c_end = ts[cand], ts[cand] + dur[cand]
            inside = np.zeros(cand.size, dtype=bool)
            for code, (us, ue) in self._unions.items():
                sel = ctid == code
                if sel.any():
                    k = np.searchsorted(ue, c_ts[sel], side="left")  # first window ending at or after the start
                    kk = np.minimum(k, ue.size - 1)
                    inside[sel] = (k < ue.size) & (us[kk] <= c_end[sel])
            keep[cand[inside]] = True
            out = ~inside
            if out.any():
                for code in np.unique(ctid[out]).tolist():
                    sel = out & (ctid == code)
                    self.dropped_aten.append((sn, code, float(c_ts[sel].min()), float(c_end[sel].max())))
        # dropped runtime calls: remember their correlation ids
        if self.keep_corr is None:
            rest = np.flatnonzero(rt & ~keep)
            if rest.size:
                corr = S.corr(rest)
                corr = corr[corr != INT_NONE]
                if corr.size:
                    self.deferred_corr.append(narrow(corr))
        # whole-trace numbers
        xs = ts[x]
        if xs.size:
            self.ns.add(xs)
            self.min_ts_all = min(self.min_ts_all, float(xs.min()))
        if not self.any_ext:
            self.any_ext = S.any_ext()
        # the rank's window: earliest start and latest end among dropped complete non-Trace events
        dx = np.flatnonzero(x & ~keep & ((cf & C_TRACE) == 0))
        if dx.size:
            d_ts = ts[dx]
            j = int(np.argmin(d_ts))
            if d_ts[j] < self.t0_best:
                self.t0_best = float(d_ts[j])
                i = int(dx[j])
                self.t0_row = (int(ords[i]), S.rows([i])[0])
            d_end = d_ts + dur[dx]
            top = float(d_end.max())
            if top >= _floor(self.t1_best):
                self.t1_best = max(self.t1_best, top)
                floor = _floor(self.t1_best)
                near = np.flatnonzero(d_end >= floor)
                near = near[np.argsort(-d_end[near], kind="stable")][:8].tolist()
                rows = S.rows([int(dx[j]) for j in near])[0]
                self.t1_rows = [r for r in self.t1_rows if r[0] >= floor]
                for pos, j in enumerate(near):
                    self.t1_rows.append((float(d_end[j]), int(ords[dx[j]]), _take(rows, pos)))
        # kept events -> columns (Python frames apart, in `extra`)
        kept = np.flatnonzero(keep)
        if kept.size:
            kpy = py[kept]
            if kpy.any():
                self._append(self.extra, *S.rows(kept[kpy].tolist()))
                kept = kept[~kpy]
            if kept.size:
                light = ((cf[kept] & (C_CPUOP | C_USER)) != 0) & ((nf[kept] & N_LIGHT) != 0)
                self._append(self.main, *S.rows(kept.tolist(), light))

    def _update_union(self, code: int) -> None:
        spans = self.windows[code]
        s = np.array([a for a, _, _ in spans])
        e = np.array([b for _, b, _ in spans])
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        run = np.maximum.accumulate(e)
        new = np.ones(s.size, dtype=bool)
        new[1:] = s[1:] > run[:-1]
        ids = np.cumsum(new) - 1
        us = s[new]
        ue = np.zeros(us.size)
        np.maximum.at(ue, ids, run)
        self._unions[code] = (us, ue)

    # ---------------------------------------------------------------------------------------------
    def _rows(self, events: list, idx: list[int], cc, ph, ts, dur, ords: np.ndarray, nc=None, light=None):
        """Columns of events[idx] (dict of arrays) and their sparse values (relative positions).

        Values convert as load.columns.build_columns converts them (same helpers, same order of
        fallbacks), a few fields at a time where numpy can take them at C speed. Rows marked
        `light` (kept only for their name, times and thread: see LIGHT_NAMES) get the argument
        columns' defaults without reading their arguments."""
        k = len(idx)
        evs = take_list(events, idx)
        ia = np.asarray(idx, dtype=np.int64)
        nc_sel = codes_into(self.name_index, list(map(_NAME, evs))) if nc is None else nc[ia]
        cols = {
            "ts": ts[ia], "dur": dur[ia], "ph": ph[ia], "cat": cc[ia].astype(np.int16), "name": nc_sel,
            "pid": codes_into(self.pid_index, list(map(_PID, evs))),
            "tid": codes_into(self.tid_index, list(map(_TID, evs))),
            "ordinal": ords[ia],
        }
        sparse: dict[str, dict[int, Any]] = {"input_dims": {}, "input_type": {}, "call_stack": {}}
        if light is not None and light.any():
            full = np.flatnonzero(~light)
            defaults = {"correlation": np.full(k, INT_NONE, dtype=np.int8), "stream": np.full(k, INT_NONE, dtype=np.int8),
                        "device": np.full(k, INT_NONE, dtype=np.int8), "ext": np.full(k, INT_NONE, dtype=np.int8),
                        "ext21": np.full(k, INT_NONE, dtype=np.int8), "nbytes": np.full(k, np.nan, dtype=np.float32),
                        "total_allocated": np.full(k, np.nan)}
            if full.size:
                sub, sub_sparse = self._arg_columns(take_list(evs, full.tolist()), cols["ph"][full], cols["tid"][full],
                                                    cols["pid"][full])
                for f, a in sub.items():
                    d = defaults[f]
                    d = d.astype(np.result_type(d, a), copy=False)
                    d[full] = a
                    defaults[f] = d
                back = full.tolist()
                for f, m in sub_sparse.items():
                    sparse[f] = {back[pos]: v for pos, v in m.items()}
            cols.update(defaults)
            return cols, sparse
        sub, sparse = self._arg_columns(evs, cols["ph"], cols["tid"], cols["pid"])
        cols.update(sub)
        return cols, sparse

    def _arg_columns(self, evs: list, ph_sel: np.ndarray, tid_sel: np.ndarray, pid_sel: np.ndarray):
        k = len(evs)
        args = list(map(_ARGS, evs))
        corr, stream, device, ext = (int_of(g, args) for g in _DENSE_GETTERS)
        rare = list(map(_RARE, args))
        if rare.count(_RARE_DEFAULT) == k:
            nbytes = np.full(k, np.nan)
            total = np.full(k, np.nan)
            ext21 = np.full(k, INT_NONE, dtype=np.int8)
        else:
            missing = device == INT_NONE
            if missing.any():
                device = np.where(missing, _int_column([a.device_id for a in args]), device)
            nbytes = _float_column([a.nbytes for a in args])
            nan = np.isnan(nbytes)
            if nan.any():
                nbytes = np.where(nan, _float_column([a.mem_bytes for a in args]), nbytes)
            total = _float_column([a.total_allocated for a in args])
            e21 = [a.external_id_2021 for a in args]
            ext21 = (np.full(k, INT_NONE, dtype=np.int8) if e21.count(INT_NONE) == k else narrow(_int_column(e21)))
        if not self.any_ext and (ext != INT_NONE).any():
            self.any_ext = True
        cols = {"correlation": narrow(corr), "stream": narrow(stream), "device": narrow(device), "ext": narrow(ext),
                "ext21": ext21, "nbytes": f32_if_exact(nbytes), "total_allocated": total}
        sparse: dict[str, dict[int, Any]] = {"input_dims": {}, "input_type": {}, "call_stack": {}}
        carriers = list(compress(range(k), map(ne, map(_SPARSE, args), repeat(_SPARSE_NONE))))
        for pos in carriers:
            a = args[pos]
            if a.input_dims is not None:
                v = self._decode_raw(a.input_dims)
                if v is not None:
                    sparse["input_dims"][pos] = v
            if a.input_type is not None:
                v = self._decode_raw(a.input_type)
                if v is not None:
                    sparse["input_type"][pos] = v
            if a.call_stack is not None:
                sparse["call_stack"][pos] = self._strings.setdefault(a.call_stack, a.call_stack)
        if (ph_sel == PH_META).any():
            for pos in np.flatnonzero(ph_sel == PH_META).tolist():
                a, e = args[pos], evs[pos]
                if a.name is not None:
                    if e.name == "thread_name":
                        self.thread_names[int(tid_sel[pos])] = str(a.name)
                    elif e.name == "process_name":
                        self.process_names[int(pid_sel[pos])] = str(a.name)
        return cols, sparse

    def _sparse_values(self, f: str, uniques: list[bytes]) -> list:
        """Decoded values of the compiled reader's distinct texts of field f (decoded once each)."""
        vals = self._sp_vals.setdefault(f, [])
        if len(vals) < len(uniques):
            new = decode_json_texts(uniques[len(vals):])
            if f == "call_stack":
                new = [v if v is None else self._strings.setdefault(v, v) for v in new]
            vals.extend(new)
        return vals

    def _name_list_at(self, code: int) -> str:
        if code >= len(self._name_list):
            self._name_list = list(self.name_index)
        return self._name_list[code]

    def _decode_raw(self, raw) -> Any:
        key = bytes(raw)
        try:
            return self._raw_cache[key]
        except KeyError:
            v = self._raw_cache[key] = decode_json_texts([key])[0]
            return v

    @staticmethod
    def _append(block: ColumnParts, cols: dict, sparse: dict) -> None:
        off = block.n
        block.append(cols)
        for f in ("input_dims", "input_type", "call_stack"):
            if sparse[f]:
                getattr(block, f).update((off + k, v) for k, v in sparse[f].items())

    # ---------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise NeedAnotherPass when the single pass dropped events that matter."""
        if not self.seen_device and self.host_incomplete and not self.host_mode:
            raise NeedAnotherPass(dict(self.hints(), host_mode=True), "no device events: every host op is needed")
        if self.keep_corr is None and self.deferred_corr:
            gpu_corr = self._gpu_correlations()
            hits = 0
            if gpu_corr.size:  # piece by piece: the dropped calls' ids are never joined (memory at the rank's peak)
                last = gpu_corr.size - 1
                for late in self.deferred_corr:
                    at = np.searchsorted(gpu_corr, late)
                    np.minimum(at, last, out=at)
                    hits += int(np.count_nonzero(gpu_corr[at] == late))
            if hits:
                raise NeedAnotherPass(self.hints(keep_corr=gpu_corr),
                                      f"{hits} runtime calls launch GPU work under a name not recognised")
        if self.dropped_aten and not self.windows_known:
            seen: dict[int, list[tuple[float, float, int]]] = {}
            for code, spans in self.windows.items():
                seen[code] = [s for s in spans if s[2] > 0]
            for sn, code, lo, hi in self.dropped_aten:
                for ws, we, wsn in seen.get(code, ()):
                    if wsn > sn and lo <= we and hi >= ws:
                        raise NeedAnotherPass(self.hints(), "an optimizer window came after ops it may hold")

    def hints(self, keep_corr: np.ndarray | None = None) -> dict[str, Any]:
        tids = list(self.tid_index)
        windows = {tids[code]: [(a, b) for a, b, _ in spans] for code, spans in self.windows.items()}
        out: dict[str, Any] = {"windows": windows, "host_mode": self.host_mode}
        if keep_corr is not None:
            out["keep_corr"] = keep_corr
        elif self.keep_corr is not None:
            out["keep_corr"] = self.keep_corr
        return out

    def _gpu_correlations(self) -> np.ndarray:
        codes = np.flatnonzero(self._cat_flags & (C_GPU | C_ACCEL))
        kept = self.main.blocks + self.main.parts  # every kept row: the parts are only those since the last block
        if not codes.size or not kept:
            return np.empty(0, dtype=np.int64)
        vals = []
        for p in kept:
            sel = np.isin(p["cat"], codes)
            if sel.any():
                vals.append(p["correlation"][sel])  # the parts' own (narrow) integer type
        if not vals:
            return np.empty(0, dtype=np.int64)
        v = np.concatenate(vals)
        v.sort()
        lo, hi = np.searchsorted(v, INT_NONE, side="left"), np.searchsorted(v, INT_NONE, side="right")
        return np.concatenate([v[:lo], v[hi:]]) if hi > lo else v  # sorted, without INT_NONE

    # ---------------------------------------------------------------------------------------------
    def finish(self) -> RankTrace:
        """The compact RankTrace (call check() first)."""
        extra_rows: dict[int, tuple[dict, dict]] = {}
        if self.t0_row is not None:
            extra_rows[self.t0_row[0]] = (self.t0_row[1], {})
        floor = _floor(self.t1_best)
        for end, ordinal, cols in self.t1_rows:
            if end >= floor:
                extra_rows[ordinal] = (cols, {})
        extra = self.extra
        if extra_rows:
            for ordinal in sorted(extra_rows):
                self._append(extra, extra_rows[ordinal][0], {"input_dims": {}, "input_type": {}, "call_stack": {}})
        return self._build()

    def _build(self) -> RankTrace:
        main, extra = self.main, self.extra
        # extra block in file order (ordinal), without duplicates
        order = np.empty(0, dtype=np.int64)
        self.extra_ordinals: list[int] = []
        if extra.n:
            ords = extra.column("ordinal")
            _, first = np.unique(ords, return_index=True)
            order = first[np.argsort(ords[first], kind="stable")]
            self.extra_ordinals = ords[order].tolist()
        self.main_n = main.n
        cols: dict[str, np.ndarray] = {}
        extra_cols = {f: as_constant(extra.column(f)[order]) if f in SPARSE_COLS else extra.column(f)[order]
                      for f in ColumnParts.FIELDS} if extra.n else {}
        extra.clear()
        for f in ColumnParts.FIELDS:
            if f == "ordinal":
                continue
            arrays = main.pop_column(f)
            if extra_cols:
                arrays.append(extra_cols.pop(f))
            if f in BLOCK_CODES or f in BLOCK_IDS:  # the parts not joined into a block yet: narrowed as the blocks
                arrays = [(narrow if f in BLOCK_CODES else narrow_column)(a) for a in arrays]
            cols[f] = concat_parts(arrays) if arrays else np.empty(0, dtype=np.int64)
            del arrays
            trim_heap()  # the blocks of this column are free: give them back before the next one
        main.clear()
        ext = cols.pop("ext")
        ext21 = cols.pop("ext21")
        external = ext if self.any_ext else ext21
        del ext, ext21
        n = int(cols["ts"].shape[0])
        empty_f, empty_i = np.empty(0, dtype=np.float64), np.empty(0, dtype=np.int64)
        trace = RankTrace(
            rank=self.rank, path=self.path, names=list(self.name_index), cats=list(self.cat_index),
            ts=cols["ts"] if n else empty_f, dur=cols["dur"] if n else empty_f,
            ph=cols["ph"].astype(np.uint8, copy=False), cat=narrow(cols["cat"]), name=narrow(cols["name"]),
            pid=narrow(cols["pid"]) if n else empty_i, tid=narrow(cols["tid"]) if n else empty_i,
            correlation=cols["correlation"] if n else empty_i, stream=cols["stream"] if n else empty_i,
            device=cols["device"] if n else empty_i, external_id=external if n else empty_i,
            nbytes=cols["nbytes"] if n else empty_f, total_allocated=cols["total_allocated"] if n else empty_f,
            pid_values=list(self.pid_index), tid_values=list(self.tid_index),
        )
        trace.input_dims = dict(main.input_dims)
        trace.input_type = dict(main.input_type)
        trace.call_stack = dict(main.call_stack)
        if extra.n:
            pos = {int(j): main.n + k for k, j in enumerate(order.tolist())}
            for f in ("input_dims", "input_type", "call_stack"):
                d = getattr(trace, f)
                d.update((pos[j], v) for j, v in getattr(extra, f).items() if j in pos)
        trace.thread_names = dict(self.thread_names)
        trace.process_names = dict(self.process_names)
        trace.seen_names = self.seen_names()
        trim_heap()
        return trace

    def merge_extra(self, trace: RankTrace, found: list, *, ns: bool) -> None:
        """Add events (ordinal, RawEvent) to the extra block of a finished trace, in file order."""
        found = sorted(found, key=lambda t: t[0])
        events = [e for _, e in found]
        n = len(events)
        cc = codes_into(self.cat_index, list(map(_CAT, events)))
        nc = codes_into(self.name_index, list(map(_NAME, events)))
        if len(self.cat_index) > len(trace.cats) or len(self.name_index) > len(trace.names):
            trace.cats, trace.names = list(self.cat_index), list(self.name_index)
        ph = np.fromiter(map(PH_CODES.get, map(_PH, events), repeat(0, n)), dtype=np.uint8, count=n)
        ts = _float_column([e.ts for e in events])
        dur = _float_column([e.dur for e in events])
        if ns:
            ts, dur = ts / 1000.0, dur / 1000.0
        if trace.ts_base:
            ts = ts - trace.ts_base  # as the trace's other times (load.job.rebase_times)
        cols, sparse = self._rows(events, list(range(n)), cc, ph, ts, dur, np.zeros(n, dtype=np.int64), nc=nc)
        ords = np.asarray(self.extra_ordinals + [o for o, _ in found], dtype=np.int64)
        perm = np.argsort(ords, kind="stable")
        m = self.main_n
        names = {"ts": "ts", "dur": "dur", "ph": "ph", "cat": "cat", "name": "name", "pid": "pid", "tid": "tid",
                 "correlation": "correlation", "stream": "stream", "device": "device", "external_id": "ext",
                 "nbytes": "nbytes", "total_allocated": "total_allocated"}
        for attr, key in names.items():
            old = getattr(trace, attr)
            new = cols["ext" if self.any_ext else "ext21"] if attr == "external_id" else cols[key]
            extra = np.concatenate([old[m:], new])[perm]  # in the wider of the two types
            col = np.concatenate([old[:m], extra])
            if attr in BLOCK_CODES:  # narrowed again, as _build keeps them
                col = narrow(col)
            elif attr in ("correlation", "stream", "device", "external_id"):
                col = narrow_column(col)
            elif attr in SPARSE_COLS:
                col = as_constant(col)
            setattr(trace, attr, col)
        inv = np.argsort(perm, kind="stable").tolist()
        pos = {j: m + k for j, k in enumerate(inv)}
        old_extra = len(self.extra_ordinals)
        for f in ("input_dims", "input_type", "call_stack"):
            d = getattr(trace, f)
            moved = {pos[k - m]: v for k, v in d.items() if k >= m}
            for k in [k for k in d if k >= m]:
                del d[k]
            d.update(moved)
            d.update((pos[old_extra + k], v) for k, v in sparse[f].items())
        trace.pid_values, trace.tid_values = list(self.pid_index), list(self.tid_index)
        self.extra_ordinals = ords[perm].tolist()

    # ---------------------------------------------------------------------------------------------
    def nanoseconds(self) -> bool:
        return self.ns.nanoseconds()



def _floor(best: float) -> float:
    """Lowest end still close enough to the latest end to be kept as a candidate."""
    return best - END_ULPS * float(np.spacing(abs(best))) if np.isfinite(best) else best


def _take(cols: dict[str, np.ndarray], pos: int) -> dict[str, np.ndarray]:
    return {k: v[pos : pos + 1] for k, v in cols.items()}
