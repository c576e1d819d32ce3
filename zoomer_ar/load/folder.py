"""Which files of a folder are one job's ranks.

A folder is analysed as one job: its trace files are the ranks of one run. Folders users hand over
often are not just that, and analysed as ranks they make up a job (an "imbalance" between five
models' traces, a "straggler" among the steps of `trace split`'s per-step files). In order:

- a `zoomer-ar trace merge` output is read back as the ranks it merges (load/merged.py);
- a file holding the same events as another (a trace beside its decompressed copy) is skipped;
- a profiler log folder holding several runs or profiling cycles (TensorBoard's handler writes every
  run's and every cycle's rank files side by side) keeps its latest run; earlier runs are skipped;
- ranks come from distributedInfo, else distinct rank-N file names, else the files' order; files that
  claim one rank and no other are refused (pieces or runs of one rank);
- ranks numbered by order (no rank information) must have been recorded together: a folder of
  separate runs' traces is refused.

Skipped files are reported with their reason (SkippedFile); refusals are InputError (exit 2).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..models import RankInfo, SkippedFile
from .columns import PH_COMPLETE, PH_INSTANT, RankTrace
from .merged import merged_ranks, split_merged
from .stub import RankStub, events_digest

_RANK_PATTERNS = (
    re.compile(r"rank[-_]?(\d+)", re.I),
    re.compile(r"worker[-_]?(\d+)", re.I),
    re.compile(r"(?:^|[-_.])r(\d+)(?:[-_.]|$)", re.I),
)


def rank_from_name(path: Path) -> int | None:
    """The rank a trace file's name gives (rank-3, worker3, _r3.), else None."""
    for pattern in _RANK_PATTERNS:
        m = pattern.search(path.name)
        if m:
            return int(m.group(1))
    return None


_HANDLER_NAME = re.compile(r"^.+\.\d{10,}\.pt\.trace\.json(\.gz)?$")  # tensorboard_trace_handler's <worker>.<ms>...
SAME_JOB_GAP_S = 0.1  # ranks of one job on hosts whose clocks disagree by less than this still overlap
EARLIER_RUN = "an earlier run"  # how a skipped file of an earlier run is told (analyze groups them in one note)
WINDOW_ROWS = 1 << 20  # rows per chunk: a streamed rank of millions of rows gets no whole-trace temporaries


class _Windows:
    """Each trace's window, absolute (us since the epoch, whatever base its times are kept in), read
    once per trace for the folder's checks."""

    def __init__(self) -> None:
        self._of: dict[int, tuple[float, float] | None] = {}

    def __call__(self, trace: RankTrace) -> tuple[float, float] | None:
        if id(trace) not in self._of:
            w = _window(trace)
            self._of[id(trace)] = None if w is None else (w[0] + trace.ts_base, w[1] + trace.ts_base)
        return self._of[id(trace)]


def _window(trace: RankTrace | RankStub) -> tuple[float, float] | None:
    """(first start, last end) of a rank's events, in its time base (us); None without any timed event."""
    if isinstance(trace, RankStub):
        return trace.window
    for ph in (PH_COMPLETE, PH_INSTANT):
        first, last = np.inf, -np.inf
        for a in range(0, len(trace), WINDOW_ROWS):
            ts = trace.ts[a:a + WINDOW_ROWS]
            m = (trace.ph[a:a + WINDOW_ROWS] == ph) & np.isfinite(ts)
            if m.any():
                ends = ts + np.nan_to_num(trace.dur[a:a + WINDOW_ROWS]) if ph == PH_COMPLETE else ts
                first = min(first, float(ts.min(where=m, initial=np.inf)))
                last = max(last, float(ends.max(where=m, initial=-np.inf)))
        if first <= last:
            return first, last
    return None


def _same_events(a: RankTrace | RankStub, b: RankTrace | RankStub) -> bool:
    if isinstance(a, RankStub) or isinstance(b, RankStub):  # ranks read in other processes: their digests
        da, db = events_digest(a), events_digest(b)
        return da is not None and da == db
    return (len(a) == len(b) and a.ts_base == b.ts_base and a.names == b.names and a.cats == b.cats
            and np.array_equal(a.name, b.name) and np.array_equal(a.cat, b.cat) and np.array_equal(a.ph, b.ph)
            and np.array_equal(a.ts, b.ts, equal_nan=True) and np.array_equal(a.dur, b.dur, equal_nan=True))


def _without_copies(ranks: list[RankTrace], infos: list[RankInfo], skipped: list[SkippedFile],
                    window: _Windows) -> tuple[list[RankTrace], list[RankInfo]]:
    """The ranks less any trace that holds the same events as an earlier file of the folder (a trace
    beside its decompressed copy, a file downloaded twice): such a copy is skipped and reported, not
    analysed as one more rank (the job's counts would double, and a rank compared with itself). Files
    that name two different ranks (distributedInfo, rank-N file names) stay ranks whatever they hold."""
    claims = [(i.rank if i.rank_source == "distributedInfo" else None, rank_from_name(Path(i.path))) for i in infos]

    def other_rank(a: int, b: int) -> bool:
        return any(x is not None and y is not None and x != y for x, y in zip(claims[a], claims[b]))

    seen: dict[tuple, list[int]] = {}
    keep: list[int] = []
    for i in sorted(range(len(ranks)), key=lambda i: claims[i] == (None, None)):  # a file naming its rank is kept
        trace = ranks[i]
        key = (len(trace), window(trace))
        same = next((j for j in seen.get(key, []) if not other_rank(i, j) and _same_events(ranks[j], trace)), None)
        if same is None:
            seen.setdefault(key, []).append(i)
            keep.append(i)
        else:
            skipped.append(SkippedFile(path=infos[i].path, reason=f"the same trace as {Path(infos[same].path).name}"))
    if len(keep) == len(ranks):
        return ranks, infos
    keep.sort()
    return [ranks[i] for i in keep], [infos[i] for i in keep]


def _merged_split(ranks: list[RankTrace], infos: list[RankInfo]) -> tuple[list[RankTrace], list[RankInfo]]:
    """A `zoomer-ar trace merge` output becomes the ranks it merges (load/merged.py). The streaming
    pass splits such a file while it reads it (stream/split.py): its ranks arrive here split."""
    if not any(merged_ranks(t.metadata) for t in ranks if not isinstance(t, RankStub)):  # stubs come split
        return ranks, infos
    out_r: list[RankTrace] = []
    out_i: list[RankInfo] = []
    for trace, info in zip(ranks, infos):
        for t, i in split_merged(trace, info) or [(trace, info)]:
            out_r.append(t)
            out_i.append(i)
    return out_r, out_i


def _latest_run(ranks: list[RankTrace], infos: list[RankInfo], skipped: list[SkippedFile],
                window: _Windows) -> tuple[list[RankTrace], list[RankInfo]]:
    """The latest run of a folder where the profiler wrote several: a TensorBoard log folder
    (torch.profiler.tensorboard_trace_handler writes <worker>.<ms>.pt.trace.json for every rank of every
    run and profiling cycle side by side), or any folder whose distributedInfo ranks repeat. The files
    of the latest run - windows within SAME_JOB_GAP_S of one another - are the job when they are one
    process's trace or distinct distributedInfo ranks; the earlier runs' files are skipped and
    reported. A folder whose distributedInfo ranks are all distinct is one job whatever its times
    (hosts' clocks differ), and traces named otherwise without repeated ranks (five models' traces, a
    before and an after) are left to _number_ranks and _same_time."""
    dist = [i.rank for i in infos if i.rank_source == "distributedInfo"]
    handler_log = all(_HANDLER_NAME.match(Path(i.path).name) for i in infos)
    if len(set(dist)) == len(dist) and not (handler_log and len(dist) < len(infos)):
        return ranks, infos
    spans = []
    for i, trace in enumerate(ranks):
        if (w := window(trace)) is None:
            return ranks, infos
        spans.append((*w, i))
    spans.sort()
    runs, end = [[spans[0]]], spans[0][1]
    for span in spans[1:]:
        if (span[0] - end) / 1e6 > SAME_JOB_GAP_S:
            runs.append([])
        runs[-1].append(span)
        end = max(end, span[1])
    latest = sorted(i for _, _, i in runs[-1])
    ranked = (all(infos[i].rank_source == "distributedInfo" for i in latest)
              and len({infos[i].rank for i in latest}) == len(latest))
    if len(runs) < 2 or not (ranked or (handler_log and len(latest) == 1)):
        return ranks, infos
    start = runs[-1][0][0]
    for run in runs[:-1]:
        run_end = max(e for _, e, _ in run)
        for _, _, i in run:
            skipped.append(SkippedFile(path=infos[i].path, reason=(
                f"{EARLIER_RUN}: its run ends {_duration((start - run_end) / 1e6)} before the latest one, whose "
                f"{len(latest)} rank file{'s' if len(latest) != 1 else ''} are analysed")))
    return [ranks[i] for i in latest], [infos[i] for i in latest]


def same_rank_clash(files: list[Path], by_dist: list[int | None], by_name: list[int | None]) -> str | None:
    """Why files that claim one rank (distributedInfo, else the file name) are not a job's ranks:
    "A and B are both rank R (source): ..."; None when no two claim the same rank."""
    for source, claims in (("distributedInfo", by_dist), ("file name", by_name)):
        first: dict[int, Path] = {}
        for f, r in zip(files, claims):
            if r is None:
                continue
            if r in first:
                return (f"{first[r].name} and {f.name} are both rank {r} ({source}): pieces or runs of one rank "
                        "(such as `zoomer-ar trace split`'s per-step files), not two ranks")
            first[r] = f
    return None


def _number_ranks(p: Path, ranks: list[RankTrace], infos: list[RankInfo]) -> bool:
    """Give a folder's traces distinct ranks: their own (distributedInfo, else the file name), else
    the files' distinct rank-N names, else their order. Two files that claim the same rank and no
    other (pieces or runs of one rank: `trace split`'s per-step files, two profiler cycles) are
    refused: they are not two ranks. True when the ranks come from the files."""
    if len({r.rank for r in ranks}) == len(ranks):
        return all(i.rank_source != "default" for i in infos)
    by_name = [rank_from_name(Path(i.path)) for i in infos]
    if None not in by_name and len(set(by_name)) == len(by_name):
        for trace, info, r in zip(ranks, infos, by_name):
            trace.rank, info.rank, info.rank_source = r, r, "file name"
        return True
    by_dist = [i.rank if i.rank_source == "distributedInfo" else None for i in infos]
    clash = same_rank_clash([Path(i.path) for i in infos], by_dist, by_name)
    if clash is not None:
        raise InputError(str(p), f"not one job: {clash}; analyse each file on its own, or the trace they were cut from")
    for i, (trace, info) in enumerate(zip(ranks, infos)):
        trace.rank, info.rank, info.rank_source = i, i, "default"
    return False


def _same_time(p: Path, ranks: list[RankTrace], infos: list[RankInfo], window: _Windows) -> None:
    """Refuse a folder whose traces name no distinct ranks and were not recorded at the same time.

    The ranks of one job run together: their profiled windows overlap (up to the hosts' clock skew).
    Traces of separate runs (a folder of different models, a before and an after, two cycles of one
    rank's profiler schedule) do not, and analysed as ranks they make up a job whose "imbalance"
    compares unrelated programs. A folder whose files carry distinct ranks (distributedInfo, or
    rank-N in the file names) is taken as one job whatever its times say."""
    spans = sorted(((*w, info) for trace, info in zip(ranks, infos) if (w := window(trace)) is not None),
                   key=lambda s: s[:2])
    if len(spans) < 2:
        return
    last_end, last_info = spans[0][1], spans[0][2]
    for start, end, info in spans[1:]:
        gap_s = (start - last_end) / 1e6
        if gap_s > SAME_JOB_GAP_S:
            raise InputError(str(p), (
                f"not one job: its {len(ranks)} traces were recorded at different times ({Path(last_info.path).name} "
                f"ends {_duration(gap_s)} before {Path(info.path).name} starts) and name no distinct ranks "
                "(distributedInfo, or rank-N in the file names); analyse each file on its own (`zoomer-ar batch "
                "FILE... --no-record` takes many), or two runs with `zoomer-ar compare`"))
        if end > last_end:
            last_end, last_info = end, info


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    if seconds >= 120:
        return f"{seconds / 60:.1f} minutes"
    return f"{seconds:.3g} s"


def job_ranks(p: Path, ranks: list[RankTrace], infos: list[RankInfo],
              skipped: list[SkippedFile]) -> tuple[list[RankTrace], list[RankInfo]]:
    """The job's ranks among a file's or folder's loaded traces, numbered (in their order); skipped
    files appended to `skipped`; InputError where they are not one job's ranks."""
    ranks, infos = _merged_split(ranks, infos)
    if len(ranks) < 2:
        return ranks, infos
    window = _Windows()
    ranks, infos = _without_copies(ranks, infos, skipped, window)
    ranks, infos = _latest_run(ranks, infos, skipped, window)
    if not _number_ranks(p, ranks, infos) and len(ranks) > 1:
        _same_time(p, ranks, infos, window)
    return ranks, infos
