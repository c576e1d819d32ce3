"""Windowed analysis of a rank file too big to hold its kept rows at once (docs/huge-traces.md).

The streaming reader keeps the rows the features use, about 100 MB per GB of a GPU-dense trace's JSON:
its memory grows with the trace. Above `ZOOMER_WINDOW_BYTES` of JSON (default 6 GiB, the in-memory
loader's own limit: every trace that loader can read still gets the one-pass analysis, whose results
equal it), or when a one-pass read adds more than `ZOOMER_WINDOW_MEMORY_MB` of memory, a rank file is cut into windows of
consecutive profiler steps on disk by passes whose memory does not grow with the file
(surgery/partition.py: every event in exactly one window, a kernel in its launch's), each window is read
and summarised on its own (features/windows.py), and the windows' summaries are merged into the rank's
(the features to 1e-9 relative; what can differ is listed in features/windows.py). Memory is then that
of one window, whatever the trace's size.

Only `analyze`'s path (summarised ranks) is windowed; a file the cut cannot take (a merged trace of
several ranks, correlation ids out of launch order) is read in one pass as before.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import struct
import tempfile
from pathlib import Path

from ..errors import InputError
from ..load.job import rank_of_file, rebase_times
from ..load.reader import GZIP_MAGIC, ZSTD_MAGIC, Progress
from ..load.stub import RankStub
from ..models import RankInfo
from ..program_match import raw_names, union_names
from ..sigterm import sigterm_unwinds
from .source import StreamError

def wanted(path: Path) -> int:
    """The JSON bytes of `path` when its size alone says it is to be analysed in windows, else 0. Only what
    costs nothing is read: a plain file's size, a zstd file's 10x, a gzip file's trailer (ISIZE, the size
    modulo 4 GiB: a lower bound). A file whose size this cannot tell (most gzip files above 4 GiB of JSON)
    starts in one pass and switches to windows when that pass outgrows ZOOMER_WINDOW_MEMORY_MB."""
    from . import window_bytes

    limit = window_bytes()
    if limit <= 0:
        return 0
    try:
        if not path.is_file():  # a named pipe would block the open: the reader refuses it in one line
            return 0
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(4)
            if head == ZSTD_MAGIC:
                size *= 10
            elif head[:2] == GZIP_MAGIC and size >= 18:
                fh.seek(-4, os.SEEK_END)
                size = struct.unpack("<I", fh.read(4))[0]
    except OSError:
        return 0
    return size if size > limit else 0


def switch_mb() -> float | None:
    """The memory a one-pass read may add before it gives way to windows (ZOOMER_WINDOW_MEMORY_MB); None
    where windowing is off (ZOOMER_WINDOW_BYTES=0 or ZOOMER_WINDOW_MEMORY_MB=0)."""
    from . import window_bytes, window_memory_mb

    return window_memory_mb() if window_bytes() > 0 else None


def _scratch(path: Path, json_size: int) -> tuple[Path, str]:
    """A temporary folder for the windows and their compression: plain JSON where the disk holds them
    twice over, else gzip (a tenth of the space, more CPU)."""
    tmp = Path(tempfile.mkdtemp(prefix="zoomer-windows-"))
    json_size = json_size or 20 * path.stat().st_size  # not known (a gzip file): a generous guess
    free = shutil.disk_usage(tmp).free
    return tmp, ("none" if free > 2 * json_size else "gzip")


def read_windowed(path: Path, json_size: int, *, windows: int | None = None, rank_hint: int | None = None,
                  progress: Progress | None = None, digest: bool = True,
                  **kw) -> list[tuple[RankStub, RankInfo]] | None:
    """The rank of `path` as a summarised RankStub, analysed in windows (`windows` of them, else windows of
    about half of ZOOMER_WINDOW_BYTES); None when the file cannot be cut (read it in one pass). `kw`:
    stream_ranks' settings for each window (memory limit, reader choice).
    SIGTERM unwinds it (sigterm.py: in a worker the pool stops, the default action would leave the windows,
    the trace's size on disk, in TMPDIR)."""
    with sigterm_unwinds():
        tmp, compression = _scratch(path, json_size)
        return _read_windows(path, tmp, compression, windows, rank_hint, progress, digest, kw)


def _read_windows(path: Path, tmp: Path, compression: str, windows: int | None, rank_hint: int | None,
                  progress: Progress | None, digest: bool, kw: dict) -> list[tuple[RankStub, RankInfo]] | None:
    from ..features.windows import merge_windows, summarise_window
    from ..surgery.partition import NotPartitionable, partition_trace
    from . import window_bytes
    from .load import stream_ranks

    try:
        try:
            part = partition_trace(path, tmp / "w", windows=windows,
                                   target_bytes=None if windows else max(1, window_bytes() // 2), compression=compression)
        except (NotPartitionable, InputError):
            return None  # the one-pass reader reads it, or says in one line why it cannot
        count = len(part.files)
        spilled: list[tuple[Path, float]] = []  # each window's summary on disk until the merge (about 1 MB each)
        first = last = None
        rows = 0
        names: list = []  # each window's names that identify the program (program_match.raw_names)
        for k, f in enumerate(part.files):
            try:
                [(trace, info)] = stream_ranks(f, rank_hint=rank_hint, progress=progress, hash_file=False, **kw)
            except StreamError:  # a window the streaming reader leaves to the in-memory one: the file in one pass
                return None
            rebase_times([trace])
            with (tmp / f"summary_{k}.pickle").open("wb") as fh:
                pickle.dump(summarise_window(trace, k, count), fh, protocol=pickle.HIGHEST_PROTOCOL)
            spilled.append((tmp / f"summary_{k}.pickle", float(trace.ts_base)))
            names.append(raw_names(trace))
            stub = RankStub.of(trace, None, digest=False)
            first = first or (stub, info)
            last = stub
            rows += len(trace)
            del trace
            f.unlink()  # the disk a window took is free before the next one is read
        assert first is not None and last is not None
        parts = []
        for where, ts_base in spilled:
            with where.open("rb") as fh:
                parts.append((pickle.load(fh), ts_base))  # written by this process a moment ago
        summary, base = merge_windows(parts)
        del parts
        stub0, info0 = first
        meta = dict(stub0.metadata)
        streamed = dict(meta.get("streamed") or {})
        streamed.update({"windows": count, "events": part.events_in, "json_bytes": part.json_bytes, "kept": rows,
                         "steps": [list(s) for s in part.steps]})
        meta["streamed"] = streamed
        rank, rank_source = rank_of_file(meta.get("distributedInfo") or {}, path, rank_hint)
        w0 = stub0.window[0] + stub0.ts_base - base if stub0.window else None
        w1 = last.window[1] + last.ts_base - base if last.window else None
        summary = summary.renumbered(rank)  # the windows' evidence named the rank their file names gave
        stub = RankStub(rank=rank, path=str(path), metadata=meta, time_unit_note=stub0.time_unit_note, ts_base=base,
                        rows=rows, window=(w0, w1) if w0 is not None and w1 is not None else None,
                        digest=_digest(part.sha256, count) if digest else None, summary=summary,
                        seen_names=union_names(names))
        info = info0.model_copy(update={"path": str(path), "rank": rank, "rank_source": rank_source,
                                        "sha256": part.sha256, "size_bytes": path.stat().st_size,
                                        "n_events": part.events_in})
        return [(stub, info)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _digest(sha256: str, windows: int) -> str:
    """A windowed rank's events digest (load/folder.py compares ranks by it): two copies of one file give the
    same, two different files do not (the file's own hash stands for its rows)."""
    return hashlib.sha256(f"windowed:{windows}:{sha256}".encode()).hexdigest()
