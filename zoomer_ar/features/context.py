"""What the per-rank feature parts share: the rank's output record (RankFeatures) and its working
state (RankContext: masks, the launch index, the synchronisation calls, the frame index, the evidence
builder). Each part (steps.py, gpu.py, idle.py, host.py, operators.py, memory.py) reads a
RankContext and writes its values and evidence into a RankFeatures; rank.py runs them in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..load.columns import INT_NONE, PH_COMPLETE, RankTrace, row_positions
from ..models import EvidenceEvent, TimelineBin
from . import intervals as iv
from . import names as N
from . import syncs as S
from .frames import FrameIndex

TOL_US = 50.0  # tolerance when relating host calls to GPU idle edges
EVIDENCE_PER_KIND = 5
TIMELINE_BINS = 120  # slices of the GPU's span in a report's timeline


@dataclass
class RankFeatures:
    rank: int
    v: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, list[EvidenceEvent]] = field(default_factory=dict)
    # what each evidence event was chosen by, where not its duration (us; e.g. a GEMM op's GPU time, a
    # collective's exposed time): the job's evidence keeps that order when it merges the ranks'
    evidence_keys: dict[int, float] = field(default_factory=dict)  # id(event) -> key
    # the rank's collectives by type, in order of start: type -> (starts, durations), us (arrays: a
    # summary of a rank with 10^5 collectives stays small)
    collectives: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    # each of those collectives' time not overlapped by the rank's compute kernels, us (same order): how much
    # of a wait inside it the rank spent with nothing else running on its GPU (straggler_exposed_wait)
    collectives_exposed: dict[str, np.ndarray] = field(default_factory=dict)
    t0: float = 0.0  # the rank's first complete event: evidence times (ts_ms) are relative to it
    _timeline_of: tuple[np.ndarray, np.ndarray, float] | None = None  # (union starts, ends, t0)
    _timeline: list[TimelineBin] | None = None  # the default timeline, once the union is dropped (pickled)

    def timeline(self, bins: int = TIMELINE_BINS) -> list[TimelineBin]:
        """GPU busy % in `bins` equal slices of the GPU's span, for the report; computed when asked
        (a job's report shows one rank's)."""
        if self._timeline is not None and bins == TIMELINE_BINS:
            return self._timeline
        if self._timeline_of is None:
            return []
        us, ue, t0 = self._timeline_of
        edges = np.linspace(float(us.min()), float(ue.max()), bins + 1)
        cov = iv.overlap_with(edges[:-1], edges[1:], (us, ue)) / np.maximum(np.diff(edges), 1e-9) * 100.0
        return [  # plain floats, validated by construction: model_construct skips pydantic's checks
            TimelineBin.model_construct(t_ms=round((a - t0) / 1000.0, 3), busy_pct=round(b, 2))
            for a, b in zip(edges[:-1].tolist(), cov.tolist())
        ]


    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a rank's features computed in the process that read it: stream/load.py) without the
        busy union, which grows with the trace (its default timeline goes instead), and with the
        evidence keys by position: an event's id() is another object's after unpickling."""
        self.detach()
        state = self.__dict__.copy()
        where = {id(e): (kind, i) for kind, evs in self.evidence.items() for i, e in enumerate(evs)}
        state["evidence_keys"] = [(where[k], key) for k, key in self.evidence_keys.items() if k in where]
        return state

    def detach(self) -> None:
        """Keep the default timeline and drop the busy union it is computed from (it grows with the trace):
        a summary kept while other ranks are read holds no per-event arrays."""
        if self._timeline_of is not None:
            self._timeline, self._timeline_of = self.timeline(), None

    def __setstate__(self, state: dict[str, Any]) -> None:
        keys = state.pop("evidence_keys")
        self.__dict__.update(state)
        self.evidence_keys = {id(self.evidence[kind][i]): key for (kind, i), key in keys}


def pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


class RankContext:
    """Shared per-rank state: masks, step windows, frame index, evidence builder."""

    def __init__(self, trace: RankTrace):
        self.t = trace
        self.x = trace.ph == PH_COMPLETE
        self.end = trace.end
        self.frames = FrameIndex(trace)
        host = trace.mask_cat(*N.HOST_CATS) & self.x
        gpu = trace.mask_cat(*N.GPU_CATS) & self.x
        allx = self.x & ~trace.mask_cat("Trace")
        self.t0 = float(trace.ts[allx].min()) if allx.any() else 0.0
        self.t1 = float(self.end[allx].max()) if allx.any() else 0.0
        self.host = host
        self.gpu = gpu
        self.gpu_cats = set(trace.cat_code(*N.GPU_CATS))
        self.launch_lookup: tuple[np.ndarray, np.ndarray] | None = None  # set by gpu_features: evidence frames from then on
        self._launches: tuple[np.ndarray, np.ndarray] | None = None
        self.ext_time: tuple[np.ndarray, np.ndarray] | None = None
        self._syncs: np.ndarray | None = None
        self.keys: dict[int, float] = {}  # RankFeatures.evidence_keys
        self.compiles: tuple[list[int], list[int]] = ([], [])  # torch.compile windows: (start-up, recompiles)
        # may the profile hold the program's start-up? Not when its first step is ProfilerStep#N, N >= 1: the
        # iterations before it (a schedule's wait and warm-up steps) ran unrecorded, and start-up with them
        self.from_start = True
        # (index, count) where this trace is one time window of a rank (features/windows.py): the parts then
        # record the extra state a merge of the windows needs (RankFeatures.v keys "_w_*"); None on the normal path
        self.window: tuple[int, int] | None = None

    @property
    def last_window(self) -> bool:
        """Not a window, or the rank's last one (where the rank's last step and the profiler's stop lie)."""
        return self.window is None or self.window[0] == self.window[1] - 1

    def sync_calls(self) -> np.ndarray:
        """Host synchronisation API calls, without the profiler's own stop synchronisation and
        those that are the mechanics of a host-to-device copy from pageable memory (see
        zoomer_ar/features/syncs.py); computed once per rank."""
        if self._syncs is None:
            t = self.t
            runtime = t.mask_cat(*N.RUNTIME_CATS) & self.x
            sync = np.flatnonzero(self.name_mask(N.SYNC_APIS, runtime))
            # the profiler's stop sync follows the rank's last step: not in a window before the last one
            stop = S.profiler_stop_syncs(self, sync) if self.last_window else sync[:0]
            drop = np.union1d(stop, S.pageable_copy_syncs(self, runtime, sync, TOL_US))
            self._syncs = np.setdiff1d(sync, drop, assume_unique=True)
        return self._syncs

    def launch_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(correlation ids sorted, their runtime rows) of the runtime calls that carry one; built once
        per rank (the step times and the idle-gap causes both look launches up by correlation)."""
        if self._launches is None:
            t = self.t
            rt = row_positions(t.mask_cat(*N.RUNTIME_CATS) & self.x)
            rt = rt[t.correlation[rt] != INT_NONE]
            order = np.argsort(t.correlation[rt], kind="stable").astype(rt.dtype)
            self._launches = (t.correlation[rt][order], rt[order])
        return self._launches

    def launcher(self, i: int) -> int | None:
        """The host runtime call that launched GPU event i (by correlation id)."""
        if self.launch_lookup is None or self.t.correlation[i] == INT_NONE:
            return None
        corr, idx = self.launch_lookup
        pos = int(np.searchsorted(corr, self.t.correlation[i]))
        if pos < corr.size and corr[pos] == self.t.correlation[i]:
            return int(idx[pos])
        return None

    def name_mask(self, pred, base: np.ndarray | None = None) -> np.ndarray:
        """Rows whose name satisfies pred (a function), or is one of pred (a str or a collection)."""
        m = self.t.mask_names(pred) if callable(pred) else self.t.mask_name_in(pred)
        return m & (self.x if base is None else base)

    def ev(self, i: int, detail: str = "", frames: bool = True) -> EvidenceEvent:
        t = self.t
        stream = int(t.stream[i]) if t.stream[i] != INT_NONE else None
        return EvidenceEvent.model_construct(  # typed here (str, int, rounded float): no validation pass
            name=t.name_of(i)[:300],
            rank=t.rank,
            ts_ms=round((float(t.ts[i]) - self.t0) / 1000.0, 4),
            dur_ms=round(float(t.dur[i]) / 1000.0, 4),
            stream=stream,
            category=t.cat_of(i),
            detail=detail,
            frames=self._frames(i) if frames else [],
        )

    def _frames(self, i: int):
        if int(self.t.cat[i]) in self.gpu_cats:
            j = self.launcher(i)
            return self.frames.frames_for(j) if j is not None else []
        return self.frames.frames_for(i)

    def worst(self, idx: np.ndarray, key: np.ndarray | None = None, k: int = EVIDENCE_PER_KIND, detail=None):
        if idx.size == 0:
            return []
        if key is None:
            top = idx[np.argsort(-self.t.dur[idx], kind="stable")[:k]]
            return [self.ev(int(i), detail(int(i)) if detail else "") for i in top]
        order = np.argsort(-key, kind="stable")[:k]
        out = []
        for j in order.tolist():
            e = self.ev(int(idx[j]), detail(int(idx[j])) if detail else "")
            self.keys[id(e)] = float(key[j])
            out.append(e)
        return out
