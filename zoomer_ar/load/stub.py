"""A rank read in another process, without its rows.

The streaming path reads a folder's rank files in worker processes (stream/load.py). Sending each
rank's compact columns back would make the main process hold every rank's rows at once: a job of 64
ranks of 2 GB would need 64 times one rank's memory. Instead each worker computes the rank's feature
summary (features.extract.summarise_rank) and sends a RankStub: what the job assembly reads of a rank
(its window and an events digest for load/folder.py, its path, metadata and notes for analyze), and
the summary. The job's memory is then bounded by the ranks read at once, not by their number.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .columns import RankTrace

DIGEST_ROWS = 1 << 20  # rows hashed at a time: no whole-trace temporaries


@dataclass
class RankStub:
    rank: int
    path: str
    metadata: dict[str, Any]
    time_unit_note: str
    ts_base: float
    rows: int
    window: tuple[float, float] | None  # (first start, last end) in its base: load.folder._window
    # events_digest: equal for two traces exactly when load.folder._same_events holds; None for the ranks of a
    # job of one file, which are never compared (a merged trace's ranks claim distinct ranks)
    digest: str | None
    summary: Any  # features.extract.RankSummary (the load stage does not import the features')
    # the names that identify the program (program_match.raw_names), set by the streaming path; None: unknown
    seen_names: dict[str, frozenset[str]] | None = None

    def __len__(self) -> int:
        return self.rows

    @classmethod
    def of(cls, trace: RankTrace, summary: Any, digest: bool = True) -> RankStub:
        from .folder import _window

        return cls(rank=trace.rank, path=trace.path, metadata=trace.metadata, time_unit_note=trace.time_unit_note,
                   ts_base=trace.ts_base, rows=len(trace), window=_window(trace),
                   digest=events_digest(trace) if digest else None, summary=summary)


def events_digest(trace: RankTrace | RankStub) -> str | None:
    """sha256 of what load.folder._same_events compares: the row count, time base, name and category
    tables, and the name, category, phase, start and duration of every row (as int64 / float64, NaN in
    one form, so that narrow columns of equal values hash alike)."""
    if isinstance(trace, RankStub):
        return trace.digest
    h = hashlib.sha256()
    h.update(repr((len(trace), float(trace.ts_base), trace.names, trace.cats)).encode("utf-8", "surrogatepass"))
    for a in range(0, len(trace), DIGEST_ROWS):
        b = a + DIGEST_ROWS
        for col, dtype in ((trace.name, np.int64), (trace.cat, np.int64), (trace.ph, np.int64),
                           (trace.ts, np.float64), (trace.dur, np.float64)):
            part = np.asarray(col[a:b], dtype=dtype)
            if dtype is np.float64:
                part = np.where(np.isnan(part), np.nan, part + 0.0)  # one NaN, and -0.0 as 0.0
            h.update(np.ascontiguousarray(part).tobytes())
    return h.hexdigest()
