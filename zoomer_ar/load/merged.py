"""A trace written by `zoomer-ar trace merge`, read back as the ranks it merges.

`trace merge` gives each rank its own tracks so that a viewer shows them side by side: rank r's
integer pid p becomes r * PID_STRIDE + p, a string pid becomes "rank<r>:<pid>", and ids that link
events (flow ids, correlation and External ids) are offset by r << ID_SHIFT, so links stay within a
rank; `distributedInfo.merged_ranks` lists the ranks. Analysed as one rank, such a file pools the
ranks' steps, GPU work and idle time (dlrm_8ranks merged: 8 steps of 2.6 ms and 76% busy, against
one 16 ms step and 46% busy per rank). So the loader splits it by pid into its ranks, which the
features then see as a rank folder's: each rank's own rows, its links intact (the offsets are the
same within a rank).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np

from ..models import RankInfo
from .columns import RankTrace

PID_STRIDE = 10_000_000  # rank r's integer pid p becomes r * PID_STRIDE + p
MARKER_PID = "zoomer"  # the track of `analyze --annotate`'s markers (annotate.py): no rank's events
ID_SHIFT = 40  # flow, correlation and External ids of rank r are offset by r << ID_SHIFT
_STR_PID = re.compile(r"rank(\d+):")
_SPARSE = ("input_dims", "input_type", "call_stack", "collective", "msg_nelems", "python_id")
_COLUMNS = ("ts", "dur", "ph", "cat", "name", "pid", "tid", "correlation", "stream", "device", "external_id",
            "nbytes", "total_allocated")


def merged_dist(dist: dict[str, Any] | None, ranks: list[int], world_size: int | None) -> dict[str, Any]:
    """The distributedInfo of a merged trace: one rank to other tools (HTA reads world_size 1), with
    the ranks it holds and the job's world size for this loader."""
    out = {k: v for k, v in (dist or {}).items() if k != "rank"}
    out["world_size"] = 1
    out["merged_ranks"] = list(ranks)
    if isinstance(world_size, int) and not isinstance(world_size, bool) and world_size > 0:
        out["merged_world_size"] = world_size
    return out


def merged_ranks(metadata: dict[str, Any] | None) -> list[int] | None:
    """The ranks a merged trace holds (distributedInfo.merged_ranks: two or more distinct ranks), else None."""
    ranks = ((metadata or {}).get("distributedInfo") or {}).get("merged_ranks")
    if (isinstance(ranks, list) and len(ranks) > 1 and len(set(ranks)) == len(ranks)
            and all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < (1 << 20) for r in ranks)):
        return ranks
    return None


def rank_of_pid(pid: Any, ranks: list[int] | set[int] | frozenset[int]) -> int | None:
    """The merged rank a pid belongs to (as `trace merge` wrote it), or None."""
    if isinstance(pid, int) and not isinstance(pid, bool) and pid >= 0:
        r = pid // PID_STRIDE
    elif isinstance(pid, str) and (m := _STR_PID.match(pid)):
        r = int(m.group(1))
    else:
        return None
    return r if r in ranks else None


class RankOwners:
    """The merged rank whose events carry a pid: rank_of_pid's, else the first rank listed (an event
    without a pid); None for the markers of an annotated trace (`analyze --annotate`), which span the
    ranks' windows and are no rank's events. Answers once per pid; the ranks are looked up in a set
    (a file may list up to 2^20 of them)."""

    def __init__(self, ranks: list[int]) -> None:
        self.ranks = list(ranks)
        self._set = frozenset(ranks)
        self._of: dict[Any, int | None] = {}

    def __call__(self, pid: Any) -> int | None:
        try:
            return self._of[pid]
        except KeyError:
            pass
        except TypeError:  # an unhashable pid (the decoders give ints and strings): the first rank's
            return self.ranks[0]
        r = None if pid == MARKER_PID else rank_of_pid(pid, self._set)
        if r is None and pid != MARKER_PID:
            r = self.ranks[0]
        self._of[pid] = r
        return r


def owner_of(pid: Any, ranks: list[int]) -> int | None:
    """RankOwners(ranks)(pid), for one pid."""
    return RankOwners(ranks)(pid)


def split_merged(trace: RankTrace, info: RankInfo) -> list[tuple[RankTrace, RankInfo]] | None:
    """The ranks of a merged trace, each with its own rows (owner_of each row's pid; None for any
    other trace)."""
    ranks = merged_ranks(trace.metadata)
    if ranks is None:
        return None
    owner = RankOwners(ranks)
    of_code = np.asarray([-1 if (r := owner(v)) is None else r for v in trace.pid_values] or [-1], dtype=np.int64)
    row_rank = of_code[np.asarray(trace.pid, dtype=np.int64)] if len(trace) else np.empty(0, dtype=np.int64)
    order = np.argsort(row_rank, kind="stable")  # each rank's rows together, in file order
    present, first, count = np.unique(row_rank[order], return_index=True, return_counts=True)
    rows_of = {int(r): order[a:a + n] for r, a, n in zip(present.tolist(), first.tolist(), count.tolist()) if r >= 0}
    out = []
    for r in ranks:  # in the order listed; ranks without events give none (the loop is over ranks present)
        rows = rows_of.get(r)
        if rows is None:
            continue
        part = _rows_of(trace, rows)
        part.rank = r
        dist, world = rank_distributed_info(trace.metadata.get("distributedInfo") or {}, r)
        part.metadata = {**trace.metadata, "distributedInfo": dist, "merged_from": list(ranks)}
        out.append((part, info.model_copy(update={"rank": r, "rank_source": "distributedInfo",
                                                  "n_events": int(rows.size), "world_size": world})))
    return out or None


def rank_distributed_info(dist: dict[str, Any], rank: int) -> tuple[dict[str, Any], int | None]:
    """A merged trace's distributedInfo as rank `rank`'s own, and the job's world size (the merged
    world size recorded by `trace merge`, else None: the ranks it holds)."""
    world = dist.get("merged_world_size")
    world = world if isinstance(world, int) and not isinstance(world, bool) and world > 0 else None
    own = {k: v for k, v in dist.items() if k not in ("merged_ranks", "merged_world_size", "rank", "world_size")}
    return {**own, "rank": rank, "world_size": world}, world


def _rows_of(t: RankTrace, rows: np.ndarray) -> RankTrace:
    cols = {}
    for f in _COLUMNS:
        a = getattr(t, f)
        cols[f] = np.broadcast_to(a[:1], (rows.size,)) if a.ndim == 1 and a.strides == (0,) and a.size else a[rows]
    sparse = {}
    for f in _SPARSE:
        d = getattr(t, f)
        if d:
            keys = np.fromiter(d.keys(), dtype=np.int64, count=len(d))
            pos = np.searchsorted(rows, keys)
            hit = (pos < rows.size) & (rows[np.minimum(pos, rows.size - 1)] == keys)
            sparse[f] = {p: v for p, v, h in zip(pos.tolist(), d.values(), hit.tolist()) if h}
        else:
            sparse[f] = {}
    return replace(t, **cols, **sparse, metadata=dict(t.metadata), thread_names=dict(t.thread_names),
                   process_names=dict(t.process_names))
