"""Rank folders for the trace commands: which files are traces of which rank (a probe of each file's
first events), `trace sample` and `trace filter` of a job folder."""

from __future__ import annotations
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
import msgspec
from ..errors import InputError
from ..load.job import rank_files as folder_rank_files
from ..load.folder import same_rank_clash
from ..load.job import no_traces_reason, rank_from_name
from ..load.merged import merged_ranks
from ..stream.scan import ScanResult, scan
from ..stream.source import StreamError, is_trace_file
from . import guard
from .io import TOO_DEEP, copy_file, decode_top
from .copying import Stats, output_folder
from .filtering import compile_pattern, filter_trace
from .recode import check_events, compress_trace
from .twins import without_twins


def peek_top(path: Path) -> dict[str, Any]:
    """The top-level keys before the events array (distributedInfo, deviceProperties, ...)."""
    return probe_trace(path)[0] or {}


def _no_bar(done: int, total: int) -> None:
    return None


def probe_trace(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(top-level keys, "") when `path` is a trace (a `traceEvents` array or a bare array of
    events, with an event object that has a string `ph` among its first events), else (None, why
    not). Reads only up to the first slice of events (64 kB), so it is cheap on any size: job
    commands use it to skip stray JSON files the way `analyze` does instead of failing late (`[1,2`
    used to pass for a rank: any `[` did)."""
    out: dict[str, Any] = {}
    why = guard.unreadable(path)  # said as such, not "not a trace (cannot read: [Errno 13] ... 'path')"
    if why is not None:
        return None, why
    if path.is_file() and path.stat().st_size == 0:
        return None, "not a trace (empty file)"

    class _Stop(Exception):
        pass

    def on_head(res: ScanResult) -> None:
        out.update(decode_top(res.head, b""))

    def first_events(view) -> None:  # a trace's array holds event objects with a `ph`
        items = _PROBE.decode(view)  # first: a DecodeError here makes the scanner cut elsewhere
        found, raw = False, None
        for raw in items[:64]:
            try:
                found = isinstance(_PH.decode(raw).ph, str)
            except msgspec.ValidationError:  # not an object
                continue
            if found:
                break
        del items, raw  # the Raw values hold the scanner's buffer: release them before leaving
        raise _Stop if found else _NotEvents

    try:
        scan(path, first_events, hash=False, on_head=on_head, slice_bytes=_PROBE_BYTES, chunk=_PROBE_BYTES,
             progress=_no_bar)  # 64 kB of the file: no bar
    except _Stop:
        return out, ""
    except _NotEvents:
        return None, "not a trace (the events array holds no event objects with a `ph`)"
    except StreamError as exc:
        return None, f"not a trace ({exc})"
    except RecursionError:  # msgspec's answer to keys nested deeper than Python's recursion limit
        return None, f"not a trace ({TOO_DEEP})"
    except OSError as exc:
        return None, f"cannot read ({exc.strerror or exc})"
    return None, "not a trace (no events: 'traceEvents' is empty)"


class _NotEvents(Exception):
    pass


class _Ph(msgspec.Struct):
    ph: Any = None


_PROBE = msgspec.json.Decoder(list[msgspec.Raw])
_PH = msgspec.json.Decoder(_Ph)
_PROBE_BYTES = 64 << 10


def _rank_of(top: dict[str, Any]) -> int | None:
    dist = top.get("distributedInfo")
    r = dist.get("rank") if isinstance(dist, dict) else None
    return r if isinstance(r, int) and not isinstance(r, bool) else None


@dataclass
class JobFiles:
    """The usable rank files of a job (rank order) and a "path: reason" line per skipped file."""

    files: list[tuple[int, Path]]
    skipped: list[str]
    tops: dict[Path, dict[str, Any]]
    clash: str | None = None  # two files claim one rank (numbered by order): why they are not two ranks


def rank_files(candidates: list[Path], where: str | None = None) -> JobFiles:
    """Rank the candidates that are traces: distributedInfo.rank, else the file name, else the order
    (as the loader assigns them). Files that are not traces are skipped, and so is a file that holds
    the same trace as another (twins.without_twins); if none is left, InputError naming them (`where`:
    the folder)."""
    usable: list[Path] = []
    tops: dict[Path, dict[str, Any]] = {}
    skipped: list[str] = []
    for f in candidates:
        top, why = probe_trace(f)
        if top is None:
            skipped.append(f"{f}: {why}")
        else:
            usable.append(f)
            tops[f] = top
    if not usable:
        reasons = "; ".join(skipped[:3]) + (f"; +{len(skipped) - 3} more" if len(skipped) > 3 else "")
        if where is None and len(skipped) == 1:
            raise InputError(None, skipped[0])
        raise InputError(where, f"no usable trace ({reasons})")
    by_dist = [_rank_of(tops[f]) for f in usable]
    if None in by_dist or len(set(by_dist)) != len(by_dist):  # a trace beside its copy: read once, as analyze does
        usable, twins = without_twins(usable, tops, by_dist)
        skipped += twins
        by_dist = [_rank_of(tops[f]) for f in usable]
    ranks = by_dist
    clash = None
    if None in ranks or len(set(ranks)) != len(ranks):
        ranks = by_name = [rank_from_name(f) for f in usable]
        if None in ranks or len(set(ranks)) != len(ranks):
            ranks = list(range(len(usable)))
            clash = same_rank_clash(usable, by_dist, by_name)
    return JobFiles(sorted(zip(ranks, usable)), skipped, tops, clash)  # type: ignore[arg-type]


def job_folder(src: Path) -> JobFiles:
    """The rank files of a job folder (see rank_files); InputError when it holds none."""
    if not src.is_dir():
        raise InputError(str(src), "not a folder of per-rank trace files")
    files = folder_rank_files(src, is_trace_file)
    if not files:
        raise InputError(str(src), no_traces_reason(src, is_trace_file))
    return rank_files(files, str(src))


def refuse_merged(job: JobFiles, why: str) -> None:
    """InputError for a `trace merge` output among a job's files where the command takes each file for
    one rank (load/merged.py: such a file holds several; it counted as one rank, its ranks pooled)."""
    for _, f in job.files:
        if held := merged_ranks(job.tops[f]):
            raise InputError(str(f), f"a trace merging {len(held)} ranks (zoomer-ar trace merge), not one rank's: {why}")


def refuse_same_rank(job: JobFiles, where: Path | None, why: str) -> None:
    """InputError where the job's files claim one rank (JobFiles.clash) and the command takes each file for
    one rank: numbered by their order, `trace split`'s per-step files became a job of as many ranks (a
    merged trace that `analyze` read as such, where it refuses the folder)."""
    if job.clash is not None:
        raise InputError(str(where) if where is not None else None, f"not one job: {job.clash}; {why}")


def job_files(src: Path) -> list[tuple[int, Path]]:
    """(rank, file) of the traces of a job folder, in rank order (files that are not traces left out)."""
    return job_folder(src).files


def _wanted(src: Path, have: list[int], ranks: Iterable[int]) -> list[int]:
    """The requested ranks, all present in the job (InputError naming the missing ones)."""
    want = sorted(set(ranks))
    missing = [r for r in want if r not in have]
    if missing:
        raise InputError(str(src), f"ranks {missing} not in this job (ranks present: {_span(have)})")
    return want


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}..{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) else str(ranks)


def choose_ranks(ranks: list[int], k: int, *, seed: int | None = None) -> list[int]:
    """k ranks: evenly spaced from first to last (always both), or a random sample with `seed`."""
    if k >= len(ranks):
        return list(ranks)
    if k <= 0:
        return []
    if seed is not None:
        return sorted(random.Random(seed).sample(ranks, k))
    if k == 1:
        return [ranks[0]]
    pos = sorted({round(i * (len(ranks) - 1) / (k - 1)) for i in range(k)})
    return [ranks[p] for p in pos]


def sample_job(src: Path, dst: Path, k: int | None = None, *, ranks: Iterable[int] | None = None,
               seed: int | None = None, compression: str | None = None) -> Stats:
    """Copy k ranks of a job folder (or the given ranks) into dst; gzip/zstd/plain per `compression`
    (default: as they are). Each chosen rank file is first read through (check_events): one that
    `trace check` would refuse is skipped with a note, as an unusable rank. -k above the number of
    ranks copies them all, with a note; -k or --seed together with --ranks is refused."""
    if ranks is None:
        if k is None:
            raise InputError(None, "give -k N or --ranks")
        guard.at_least_one(k, "-k")
    else:
        ranks = list(ranks)
        if k is not None or seed is not None:
            raise InputError(None, f"--ranks chooses the ranks: give it without {'-k' if k is not None else '--seed'}")
        if not ranks:
            raise InputError(None, "--ranks names no rank")
    _check_folder_output(src, dst)
    job = job_folder(src)
    refuse_merged(job, "sample the rank files it came from")
    refuse_same_rank(job, src, "sample the ranks of one run")
    files = job.files
    have = [r for r, _ in files]
    want = _wanted(src, have, ranks) if ranks is not None else choose_ranks(have, k or 1, seed=seed)
    st = Stats(bytes_out=0, skipped=list(job.skipped))
    if ranks is None and k is not None and k > len(have):
        st.notes.append(f"-k {k}: the job has {len(have)} rank{'' if len(have) == 1 else 's'}; copying all of them")
    by_rank = dict(files)
    spare = None if ranks is not None else _Spares(have, want, seed)  # -k: an unreadable pick is replaced
    copied: list[int] = []
    lost: list[int] = []
    with output_folder(dst):
        todo = list(want)
        while todo:
            r = todo.pop(0)
            if _sample_one(st, by_rank[r], dst, compression):
                copied.append(r)
                continue
            lost.append(r)
            alt = spare.instead_of(r) if spare is not None else None
            if alt is not None:
                st.notes.append(f"rank {r} is unreadable: rank {alt} sampled in its place")
                todo.append(alt)
        _none_left(src, len(copied), st)
    if spare is not None and len(copied) < len(want):
        st.warnings.append(f"-k {k}: {len(copied)} of the {len(want)} ranks asked for copied: the job's other "
                           f"ranks are unreadable (skipped above)")
    copied.sort()
    lost.sort()
    st.note = f"ranks {copied} of {len(have)}" + (f" ({'rank' if len(lost) == 1 else 'ranks'} {', '.join(map(str, lost))} skipped)" if lost else "")
    return st


class _Spares:
    """The ranks `sample -k` may take in place of a chosen rank that turns out unreadable: the nearest
    rank not yet tried (evenly spaced picks stay spread), or, with --seed, one drawn at random."""

    def __init__(self, have: list[int], chosen: list[int], seed: int | None) -> None:
        self.have = have
        self.left = [r for r in have if r not in set(chosen)]
        self.rng = random.Random(seed) if seed is not None else None

    def instead_of(self, rank: int) -> int | None:
        if not self.left:
            return None
        if self.rng is not None:
            alt = self.rng.choice(self.left)
        else:
            at = self.have.index(rank)
            alt = min(self.left, key=lambda r: (abs(self.have.index(r) - at), r))
        self.left.remove(alt)
        return alt


def _sample_one(st: Stats, f: Path, dst: Path, compression: str | None) -> bool:
    """Copy (or re-compress) one rank file of sample_job into dst; False when it was skipped."""
    name = f.name
    if not compression:
        def copy() -> Stats:
            check_events(f)
            copy_file(f, dst / name)
            return Stats(outputs=[str(dst / name)], bytes_out=(dst / name).stat().st_size)

        return _skip_unreadable(st, f, copy)
    out = dst / named_for(name, compression)
    return _skip_unreadable(st, f, lambda: compress_trace(f, out, compression=compression))


def named_for(name: str, compression: str | None) -> str:
    """A rank file's name for an output of this compression (x.json.gz -> x.json.zst for zstd, x.json
    for none); None: the name as it is (the output is compressed as the name says)."""
    if not compression:
        return name
    low = name.lower()
    stem = name[: -len(".gz")] if low.endswith(".gz") else name[: -len(".zstd")] if low.endswith(".zstd") else \
        name[: -len(".zst")] if low.endswith(".zst") else name
    stem = stem if stem.lower().endswith(".json") else stem + ".json"
    return stem + {"gzip": ".gz", "zstd": ".zst", "none": ""}[compression]




def _check_folder_output(src: Path, dst: Path) -> None:
    """A job's output folder must be a folder outside the input job folder, new or without trace
    files (see guard)."""
    guard.refuse_file_as_dir(dst)
    guard.refuse_inside(dst, src, what="output folder")
    guard.refuse_holding_traces(dst, "rank files written")


def _skip_unreadable(st: Stats, f: Path, run) -> bool:
    """Run one rank file's operation; a rank that turns out unusable while it is read (nested too
    deeply, a field of the wrong type, truncated) is skipped with a note, as `analyze` skips it in
    a job folder, instead of failing the whole job. False when skipped. Errors about anything but
    this file (the output, the arguments) still stop the job."""
    try:
        st.add(run())
    except InputError as exc:
        if exc.path != str(f):
            raise
        st.skipped.append(f"{f}: {exc.reason}")
        return False
    return True


def _none_left(src: Path, done: int, st: Stats) -> None:
    """Every chosen rank was skipped while read: nothing usable was written (exit 2 naming them)."""
    if done == 0 and st.skipped:
        reasons = "; ".join(st.skipped[:3]) + (f"; +{len(st.skipped) - 3} more" if len(st.skipped) > 3 else "")
        raise InputError(str(src), f"no usable trace ({reasons})")


def filter_job(src: Path, dst: Path, *, ranks: Iterable[int] | None = None, **filters) -> Stats:
    """filter_trace on each chosen rank file of a job folder, into dst (same file names, with the
    suffix of `compression` when given: x.json -> x.json.gz for gzip); rank files unusable while
    read are skipped with a note (_skip_unreadable)."""
    _check_folder_output(src, dst)
    compile_pattern(filters.get("name"), "--name")  # before the output folder is made
    compile_pattern(filters.get("exclude_name"), "--exclude-name")
    if ranks is not None:
        ranks = list(ranks)
        if not ranks:
            raise InputError(None, "--ranks names no rank")
    job = job_folder(src)
    if ranks is not None:
        refuse_merged(job, "--ranks picks rank files: filter the rank files it came from")
        refuse_same_rank(job, src, "--ranks picks the ranks of one run: filter without --ranks")
    have = [r for r, _ in job.files]
    want = set(_wanted(src, have, ranks)) if ranks is not None else set(have)
    st = Stats(skipped=list(job.skipped))
    done = 0
    comp = filters.get("compression")
    with output_folder(dst):
        for r, f in job.files:
            if r in want:
                out = dst / named_for(f.name, comp)
                done += _skip_unreadable(st, f, lambda f=f, out=out: filter_trace(f, out, **filters))
        _none_left(src, done, st)
    return st
