"""Where the streaming pass puts a file's events: one CompactBuilder, or one per rank of a merged trace.

A `zoomer-ar trace merge` output holds several ranks (load/merged.py); the in-memory loader splits
its rows by pid after reading it. The streaming pass keeps a subset of the events, chosen for the
events of one rank (the first host ops before any device event, the rank's window, optimizer windows
per thread, ...), so it splits first: each event goes, by its pid, to the builder of its rank, which
then sees exactly what it would see reading that rank's own file, in file order. The builders share
the code tables (the compiled reader codes names, categories, pids and tids once), thread and process
names and the caches of decoded texts, as the in-memory split's ranks share the merged trace's. The
file-wide decisions of the in-memory loader, made before it splits, are made here from all ranks'
counts: nanosecond timestamps and which external-id field the trace uses.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from ..load import fastcols
from ..load.columns import PH_COMPLETE
from ..load.merged import RankOwners, merged_ranks
from .compact import CompactBuilder, NeedAnotherPass
from .event_slices import decode_slice
from .nscount import NsCounter
from .parts import take_list


class _Pid(msgspec.Struct, gc=False):
    pid: Any = 0  # as load/schema.RawEvent's default


_PID_ONLY = msgspec.json.Decoder(list[_Pid])


class RankSink:
    """The builders of one streaming pass over a file: keyed None (the file as one rank) or by the
    merged ranks, once the top-level keys before the events say the file merges ranks (`on_head`), or
    from the start where an earlier pass found them after the events (`ranks`)."""

    def __init__(self, path: str, hints: dict[int | None, dict[str, Any]] | None = None,
                 ranks: list[int] | None = None) -> None:
        self.path = path
        self.hints = dict(hints or {})
        self.first = CompactBuilder(0, path, self.hints.get(None))
        self.ranks: list[int] | None = None
        self.builders: dict[int | None, CompactBuilder] = {None: self.first}
        self.n_events = 0  # events of the file, every rank's and none's (an annotated trace's markers)
        self._owner = np.empty(0, dtype=np.int64)  # pid code -> rank (-1: no rank's)
        self._ns_none = NsCounter()  # no rank's complete events: the in-memory test counts them too
        if ranks:
            self._split(ranks)

    # --- the pass
    def on_head(self, res) -> None:
        """The top-level keys before the events are known (scan.py): a merged trace is split from here."""
        if self.ranks is None and (ranks := merged_ranks(res.top)):
            self._split(ranks)

    def _split(self, ranks: list[int]) -> None:
        self.ranks = list(ranks)
        self._owners_of = RankOwners(ranks)
        self._order = {r: i for i, r in enumerate(ranks)}
        self.builders = {}  # made as their ranks' first events come (a file may list 2^20 ranks)

    def _builder(self, r: int) -> CompactBuilder:
        b = self.builders.get(r)
        if b is None:
            b = self.builders[r] = CompactBuilder(r, self.path, self.hints.get(r), shared=self.first)
        return b

    def parser(self):
        return self.first.parser()  # codes into the shared tables

    def add_columns(self, n: int, cols: dict[str, bytes], sparse: dict[str, tuple]) -> None:
        base = self.n_events
        self.n_events += n
        if self.ranks is None:
            self.first.add_columns(n, cols, sparse)
            return
        owner = self._owners()[np.frombuffer(cols["pid"], dtype=fastcols.DTYPES["pid"])]
        arrays = {k: np.frombuffer(v, dtype=fastcols.DTYPES[k]) for k, v in cols.items()}
        for r in np.unique(owner).tolist():
            if r < 0:  # no rank's events: counted in the file's, kept by none
                none = owner < 0
                self._ns_none.add(arrays["ts"][none][arrays["ph"][none] == PH_COMPLETE])
                continue
            b = self._builder(r)
            idx = np.flatnonzero(owner == r)
            sub = {k: a[idx] for k, a in arrays.items()}
            part: dict[str, tuple] = {}
            for f, (pos, uid, uniques) in sparse.items():
                if not pos:
                    part[f] = (pos, uid, uniques)
                    continue
                rel = np.frombuffer(pos, dtype=np.int64) - base
                hit = owner[rel] == r
                at = b.n_events + np.searchsorted(idx, rel[hit])  # positions among the rank's events
                part[f] = (at.astype(np.int64).tobytes(), np.frombuffer(uid, dtype=np.int32)[hit].tobytes(), uniques)
            b.add_columns(int(idx.size), sub, part)

    def add(self, view) -> None:
        if self.ranks is None:
            self.first.add(view)
            self.n_events = self.first.n_events
            return
        events, flow = decode_slice(view)  # first: a slice that does not decode changes nothing
        pids = [e.pid for e in _PID_ONLY.decode(view)]  # flow arrows decode without their pid
        self.n_events += len(events)
        owner = np.fromiter((self._owner_of(p) for p in pids), dtype=np.int64, count=len(pids))
        for r in np.unique(owner).tolist():
            idx = np.flatnonzero(owner == r)
            if r >= 0:
                self._builder(r).add_events(take_list(events, idx.tolist()), flow[idx])
            else:
                xs = [e.ts for e in take_list(events, idx.tolist()) if e.ph == "X"]
                self._ns_none.add(np.asarray(xs, dtype=np.float64))

    def _owners(self) -> np.ndarray:
        """Rank of each pid code registered so far (-1: no rank's events)."""
        pids = self.first.pid_index
        if self._owner.size < len(pids):
            new = list(pids)[self._owner.size:]
            self._owner = np.concatenate([self._owner, np.asarray([self._owner_of(p) for p in new], dtype=np.int64)])
        return self._owner

    def _owner_of(self, pid: Any) -> int:
        r = self._owners_of(pid)
        return -1 if r is None else r

    def owner(self, pid: Any) -> int | None:
        """The key of the builder whose events carry this pid (None: the file as one rank), -1 for none."""
        return None if self.ranks is None else self._owner_of(pid)

    # --- after the pass
    def items(self) -> list[tuple[int | None, CompactBuilder]]:
        """The builders that received events, in the order of the ranks merged."""
        if self.ranks is None:
            return [(None, self.first)] if self.first.n_events else []
        return sorted(((k, b) for k, b in self.builders.items() if b.n_events), key=lambda kb: self._order[kb[0]])

    def check(self) -> dict[int | None, dict[str, Any]] | None:
        """Each builder's hints for another pass where one needs it (NeedAnotherPass), else None."""
        again, why = {}, ""
        for key, b in self.items():
            try:
                b.check()
            except NeedAnotherPass as exc:
                again[key], why = exc.hints, str(exc)
        if not again:
            return None
        self.why = why
        return {**self.hints, **again}

    @property
    def n_useful(self) -> int:
        return sum(b.n_useful for _, b in self.items())

    def nanoseconds(self) -> bool:
        """The in-memory loader's test on the whole file's complete events (NsCounter, all ranks')."""
        if self.ranks is None:
            return self.first.nanoseconds()
        ns = NsCounter()
        for c in [b.ns for _, b in self.items()] + [self._ns_none]:
            ns.add_counts(c)
        return ns.nanoseconds()

    def settle(self) -> None:
        """File-wide choices before the builders finish: "External id" where any rank's event carries one."""
        if self.ranks is not None:
            any_ext = any(b.any_ext for _, b in self.items())
            for _, b in self.items():
                b.any_ext = any_ext


__all__ = ["RankSink"]
