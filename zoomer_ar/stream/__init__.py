"""Streaming analysis of huge traces (docs/huge-traces.md).

Above a size threshold, `zoomer_ar.analyze.analyze_path` reads traces with `load_job_streaming`:
the bytes are decompressed and decoded slice by slice, only the events the features use are kept
in compact columns, and the same feature code runs on them, so results equal the in-memory path.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from .load import load_job_streaming, load_rank, stream_rank

DEFAULT_THRESHOLD = 512 << 20  # decompressed JSON bytes of a job


def threshold() -> int:
    """ZOOMER_STREAM_THRESHOLD (bytes; 0 streams everything), default 512 MiB."""
    try:
        return int(os.environ.get("ZOOMER_STREAM_THRESHOLD", DEFAULT_THRESHOLD))
    except ValueError:
        return DEFAULT_THRESHOLD


def json_size_estimate(path: Path) -> int:
    """Decompressed size of a trace file: the file size, or for gzip the size in the trailer
    (ISIZE, modulo 4 GiB: where it is below the file size it has wrapped; then 10x the file)."""
    try:
        if not path.is_file():
            return 0
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(4)
            if head[:2] == b"\x1f\x8b" and size >= 18:
                fh.seek(-4, os.SEEK_END)
                isize = struct.unpack("<I", fh.read(4))[0]
                return isize if isize >= size else size * 10
            if head == b"\x28\xb5\x2f\xfd":
                return size * 10
    except OSError:
        return 0
    return size


def job_size_estimate(path: str | Path) -> int:
    from ..load.job import rank_files
    from .source import is_trace_file

    p = Path(path)
    if p.is_dir():
        return sum(json_size_estimate(f) for f in rank_files(p, is_trace_file))
    return json_size_estimate(p) if p.is_file() else 0


def should_stream(path: str | Path, limit: int | None = None) -> bool:
    """Whether `analyze` takes the streaming path: ZOOMER_STREAM=1/0 forces it, else the job's
    (estimated) decompressed size is compared with the threshold."""
    forced = os.environ.get("ZOOMER_STREAM", "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return True
    if forced in ("0", "false", "no", "off"):
        return False
    limit = threshold() if limit is None else limit
    if _any_zstd(path):
        return True  # the in-memory loader reads plain and gzip JSON only
    return job_size_estimate(path) > limit


def _any_zstd(path: str | Path) -> bool:
    from ..load.job import rank_files
    from .source import is_trace_file

    p = Path(path)
    files = rank_files(p, is_trace_file) if p.is_dir() else [p]  # the files the loaders read
    for f in files:
        if not f.is_file():  # a named pipe would block the open: the loaders refuse it in one line
            continue
        try:
            with f.open("rb") as fh:
                if fh.read(4) == b"\x28\xb5\x2f\xfd":
                    return True
        except OSError:
            continue
    return False


__all__ = ["DEFAULT_THRESHOLD", "job_size_estimate", "load_job_streaming", "load_rank", "should_stream",
           "stream_rank", "threshold"]
