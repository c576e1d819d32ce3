"""Streaming analysis of huge traces (docs/huge-traces.md).

Above a size threshold, `zoomer_ar.analyze.analyze_path` reads traces with `load_job_streaming`:
the bytes are decompressed and decoded slice by slice, only the events the features use are kept
in compact columns, and the same feature code runs on them, so results equal the in-memory path.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from ..errors import InputError
from ..load.reader import GZIP_MAGIC, ZSTD_MAGIC
from .guard import check_setting


def load_job_streaming(path, **kw):
    """stream.load.load_job_streaming, after checking the settings it reads (a memory limit that is
    not a number of MB is refused with exit 2 before anything is read)."""
    from . import load as _load  # the streaming reader is imported when a trace is streamed, not by every analysis

    check_setting()
    return _load.load_job_streaming(path, **kw)


def __getattr__(name: str):
    if name in ("load_rank", "stream_rank", "stream_ranks"):
        from . import load as _load

        return getattr(_load, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DEFAULT_THRESHOLD = 512 << 20  # decompressed JSON bytes of a job
THRESHOLD_ENV = "ZOOMER_STREAM_THRESHOLD"
CHOICE_ENV = "ZOOMER_STREAM"
_STREAM_ON = ("1", "true", "yes", "on")
_STREAM_OFF = ("0", "false", "no", "off")


def _setting(env: str, default: float, parse, unit: str, zero: str, default_text: str) -> float:
    """A number from the environment variable `env` (`default` when unset or empty), 0 or more, read by
    `parse` (int or float); anything else (a word, a negative number, inf, 1e9 for a whole number) is an
    InputError (exit 2, one line) naming the variable and what it accepts: such values used to be ignored
    without a word, the default applying."""
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = -1
    if not (0 <= value < float("inf")):
        raise InputError(None, f"{env}={raw!r}: not a number of {unit} ({'a whole number, ' if parse is int else ''}0 or more; 0: {zero}; "
                               f"default {default_text})")
    return value


def threshold() -> int:
    """ZOOMER_STREAM_THRESHOLD (bytes; 0 streams everything), default 512 MiB. InputError (exit 2, one
    line) for any other value (a word, a negative number, 1e9), as guard.check_setting refuses a
    ZOOMER_MEMORY_LIMIT_MB that is not a number of MB."""
    return int(_setting(THRESHOLD_ENV, DEFAULT_THRESHOLD, int, "bytes", "stream every trace",
                        f"{DEFAULT_THRESHOLD}, 512 MiB"))


def forced_choice() -> bool | None:
    """ZOOMER_STREAM: True (1, true, yes, on) or False (0, false, no, off) forces the choice of path,
    None (unset or empty) leaves it to the size; InputError (exit 2, one line) for any other value,
    which used to be ignored without a word."""
    raw = os.environ.get(CHOICE_ENV, "").strip()
    value = raw.lower()
    if not value:
        return None
    if value in _STREAM_ON:
        return True
    if value in _STREAM_OFF:
        return False
    raise InputError(None, f"{CHOICE_ENV}={raw!r}: not a choice (accepted: {', '.join(_STREAM_ON)} to stream, "
                           f"{', '.join(_STREAM_OFF)} not to; unset: by size)")


WINDOW_ENV = "ZOOMER_WINDOW_BYTES"
DEFAULT_WINDOW_BYTES = 6 << 30  # the in-memory loader's limit (ZOOMER_MAX_TRACE_BYTES' default)
WINDOW_MEMORY_ENV = "ZOOMER_WINDOW_MEMORY_MB"
DEFAULT_WINDOW_MEMORY_MB = 768  # added by the read: with a fresh process's ~100 MB, under the 1 GB the issue allows


def window_bytes() -> int:
    """ZOOMER_WINDOW_BYTES: a rank file whose JSON is larger is analysed in windows of at most about half
    of it (stream/windowed.py); 0 turns windowing off. InputError (exit 2, one line) for a value that is not
    a whole number of bytes, 0 or more."""
    return int(_setting(WINDOW_ENV, DEFAULT_WINDOW_BYTES, int, "bytes",
                        "never cut a trace into windows", f"{DEFAULT_WINDOW_BYTES}, 6 GiB"))


def window_memory_mb() -> float | None:
    """ZOOMER_WINDOW_MEMORY_MB: the resident memory (MB) a rank's one-pass read may add to its process, past
    which it stops and the rank is read in windows instead; 0 (None): never. Default 768. InputError (exit 2, one line) for a value that
    is not a number of MB."""
    return _setting(WINDOW_MEMORY_ENV, float(DEFAULT_WINDOW_MEMORY_MB), float, "MB", "never switch to windows",
                    str(DEFAULT_WINDOW_MEMORY_MB)) or None


def check_stream_settings() -> None:
    """ZOOMER_STREAM and ZOOMER_STREAM_THRESHOLD checked (InputError on a value they do not accept), for
    `analyze` to call before any work whatever path it takes."""
    forced_choice()
    threshold()
    window_bytes()
    window_memory_mb()


def json_size_estimate(path: Path, cap: int | None = None) -> int:
    """Decompressed size of a trace file, for comparisons with `cap` (default: the streaming
    threshold): exact up to `cap`, and above `cap` whenever the real size is.

    A plain file is its size. A gzip file's trailer (ISIZE) holds the size modulo 4 GiB, and only
    of its last member: a 4.3 GB trace says 0.3 GB, so ISIZE is a lower bound only. Above `cap`
    it answers already; else the file is inflated, counting, until the count passes `cap` (at most
    `cap` bytes of inflation: a file that small is read fast, and a larger one stops there), and
    the answer is then the least size that agrees with ISIZE and the count. A trailer larger than
    deflate could inflate the file to is not one (a truncated file ends in compressed bytes): the
    file's own size then. zstd files: 10x the file (they are always streamed)."""
    cap = threshold() if cap is None else cap
    try:
        if not path.is_file():
            return 0
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(4)
            if head == ZSTD_MAGIC:
                return size * 10
            if head[:2] != GZIP_MAGIC or size < 18:
                return size
            fh.seek(-4, os.SEEK_END)
            isize = struct.unpack("<I", fh.read(4))[0]
    except OSError:
        return 0
    if isize > size * _MAX_DEFLATE_RATIO:
        return size  # no gzip trailer (a truncated or damaged file): the loaders refuse it, on either path
    if isize > cap:
        return isize  # the real size is at least ISIZE
    if not _may_have_wrapped(path, size):
        return isize  # (of the last member: a multi-member file says less, as it always did)
    count = _inflated_size(path, cap)
    if count is None:  # corrupt or truncated: the loaders say so
        return max(isize, size)
    if count <= cap:
        return count  # inflated to the end: exact
    wraps = -(-(count - isize) // (1 << 32))  # the least size >= count that ISIZE allows
    return isize + wraps * (1 << 32)


_MAX_DEFLATE_RATIO = 1032  # deflate inflates at most ~1032:1 (a 258-byte match per 2 bits)


def _may_have_wrapped(path: Path, size: int) -> bool:
    """Could the file's JSON exceed 4 GiB (ISIZE then wraps)? Not when even deflate's largest ratio keeps
    it under (a file below ~4.2 MB): only larger files are inflated to count (a file's ratio varies too
    much along it, headers against kernels, to judge from a prefix)."""
    return size * _MAX_DEFLATE_RATIO >= (1 << 32)


def _inflated_size(path: Path, cap: int) -> int | None:
    """Bytes a gzip file inflates to, counting no further than just past `cap`; None if corrupt."""
    from .source import StreamError, iter_chunks

    total = 0
    try:
        for data, _ in iter_chunks(path, 4 << 20):
            total += len(data)
            if total > cap:
                break
    except StreamError:
        return None
    return total


def job_size_estimate(path: str | Path, cap: int | None = None) -> int:
    """Decompressed size of a job (json_size_estimate per file), exact up to `cap` and above it
    whenever the real size is."""
    from ..load.job import rank_files
    from .source import is_trace_file

    cap = threshold() if cap is None else cap
    p = Path(path)
    if p.is_dir():
        total = 0
        for f in rank_files(p, is_trace_file):
            total += json_size_estimate(f, max(0, cap - total))
            if total > cap:
                break
        return total
    return json_size_estimate(p, cap) if p.is_file() else 0


def should_stream(path: str | Path, limit: int | None = None) -> bool:
    """Whether `analyze` takes the streaming path: ZOOMER_STREAM=1/0 forces it, else the job's
    (estimated) decompressed size is compared with the threshold."""
    forced = forced_choice()
    if forced is not None:
        return forced
    limit = threshold() if limit is None else limit
    if _any_zstd(path):
        return True  # the in-memory loader reads plain and gzip JSON only
    return job_size_estimate(path, limit) > limit


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
                if fh.read(4) == ZSTD_MAGIC:
                    return True
        except OSError:
            continue
    return False


__all__ = ["DEFAULT_THRESHOLD", "check_stream_settings", "forced_choice", "job_size_estimate", "json_size_estimate", "load_job_streaming", "load_rank", "should_stream",
           "stream_rank", "stream_ranks", "threshold", "window_bytes", "window_memory_mb"]
