"""Reading trace bytes from disk: plain or gzip, with size limits and a progress callback.

Everything that can go wrong with a file becomes an InputError with a one-line reason.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from ..errors import InputError
from .inflate import ERRORS as INFLATE_ERRORS
from .inflate import gzip_inflater

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_MISSING = "zstd-compressed trace: install the `zstandard` package to read it"  # both readers say it
CHUNK = 8 << 20

# In-memory analysis decodes the whole document at once; above this many (decompressed) bytes the
# file is refused with a pointer to the streaming path rather than exhausting the machine.
DEFAULT_MAX_BYTES = int(os.environ.get("ZOOMER_MAX_TRACE_BYTES", 6 << 30))

Progress = Callable[[int, int], None]

# Progress of the reads that no caller gave a callback (trace surgery, the annotated copy): a command
# opens a scope with reading_progress(factory), and every file read in it gets factory(path)'s bar
_BARS: ContextVar[Callable[[Path], Progress | None] | None] = ContextVar("zoomer_reading_progress", default=None)


@contextmanager
def reading_progress(factory: Callable[[Path], Progress | None] | None) -> Iterator[None]:
    """Within the block, reads of files without a progress callback report to factory(path)'s."""
    token = _BARS.set(factory)
    try:
        yield
    finally:
        _BARS.reset(token)
        if (close := getattr(factory, "close", None)) is not None:
            close()  # bars of reads that stopped short


def scoped_progress(path: Path) -> Progress | None:
    """The progress callback of a read of `path` in a reading_progress block, else None."""
    factory = _BARS.get()
    return factory(path) if factory is not None else None


class TraceTooBig(InputError):
    """The trace is above the in-memory limit (ZOOMER_MAX_TRACE_BYTES): not a verdict on its content."""

# A trace's identity (RankInfo.sha256, the store's content hash, provenance, relaunch specs) is the
# sha256 of the file as it is on disk, compressed or not: what `sha256sum FILE` prints. Hashing the
# compressed bytes also hashes a fraction of the bytes: a gzipped trace is many times smaller than
# the JSON it inflates to (see benchmarks/README.md for the load's CPU before and after).


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class HashingFile:
    """A binary file object whose `read` also feeds the bytes read to a hash (for readers that
    inflate the file: the hash is of the file, read once)."""

    def __init__(self, fh, h) -> None:
        self._fh, self._h = fh, h

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self._h.update(data)
        return data

    def tell(self) -> int:
        return self._fh.tell()


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


def read_trace_bytes(path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, progress: Progress | None = None) -> bytes:
    """Return the (decompressed) JSON bytes of a trace file."""
    try:
        st = path.stat()
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror or exc}") from None
    if not path.is_file():
        raise InputError(str(path), "not a regular file")
    size = st.st_size
    if size == 0:
        raise InputError(str(path), "empty file")
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise InputError(str(path), f"cannot open: {exc.strerror or exc}") from None
    with fh:
        head = fh.read(4)
        fh.seek(0)
        if head[:2] == GZIP_MAGIC:
            return _read_gzip(fh, path, size, max_bytes, progress)
        if head == ZSTD_MAGIC:  # read as zstd by the streaming reader; here when it gave up (or for the reason)
            return _read_zstd(fh, path, max_bytes)
        if size > max_bytes:
            raise TraceTooBig(
                str(path),
                f"trace is {_human(size)}, above the in-memory limit of {_human(max_bytes)} "
                "(set ZOOMER_MAX_TRACE_BYTES, or cut it with `zoomer-ar trace slice`)",
            )
        if progress is None:
            return fh.read()
        buf = bytearray()
        while chunk := fh.read(CHUNK):
            buf += chunk
            progress(len(buf), size)
        return bytes(buf)


def _read_zstd(fh, path: Path, max_bytes: int) -> bytes:
    """A zstd trace's JSON (the optional `zstandard` package), else InputError saying it is needed: the
    bytes used to go to the JSON decoder as they are (`not valid JSON (... byte 0)`)."""
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        raise InputError(str(path), ZSTD_MISSING) from None
    out = bytearray()
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True)
        while chunk := reader.read(CHUNK):
            out += chunk
            if len(out) > max_bytes:
                raise TraceTooBig(str(path), f"decompressed trace exceeds the in-memory limit of {_human(max_bytes)} "
                                             "(set ZOOMER_MAX_TRACE_BYTES, or cut it with `zoomer-ar trace slice`)")
    except zstandard.ZstdError as exc:
        raise InputError(str(path), f"corrupt zstd data ({exc})") from None
    return bytes(out)


def _read_gzip(fh, path: Path, size: int, max_bytes: int, progress: Progress | None) -> bytes:
    out = bytearray()
    d = gzip_inflater()
    pending = False  # the current gzip member has started but not ended
    read = 0
    try:
        while chunk := fh.read(CHUNK):
            read += len(chunk)
            while chunk:
                pending = True
                out += d.decompress(chunk, max(1, max_bytes + 1 - len(out)))
                if len(out) > max_bytes:
                    raise TraceTooBig(
                        str(path),
                        f"decompressed trace exceeds the in-memory limit of {_human(max_bytes)} "
                        "(set ZOOMER_MAX_TRACE_BYTES, or cut it with `zoomer-ar trace slice`)",
                    )
                if d.eof:  # end of one gzip member; concatenated members may follow
                    chunk = d.unused_data
                    d = gzip_inflater()
                    pending = False
                else:
                    chunk = d.unconsumed_tail
            if progress is not None:
                progress(read, size)
    except INFLATE_ERRORS as exc:
        raise InputError(str(path), f"corrupt gzip data ({exc})") from None
    if pending:
        raise InputError(str(path), "truncated gzip file (the compressed stream ends early)")
    if not out:
        raise InputError(str(path), "gzip file holds no data")
    return bytes(out)


STREAM_CHUNK = 1 << 20  # decompressed bytes per chunk when streaming


class StreamAbort(Exception):
    """The streaming reader gave up; the caller redoes the file with read_trace_bytes, which
    raises the InputError that explains why (or succeeds, for inputs streaming does not handle)."""


def iter_trace_chunks(path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, chunk: int = STREAM_CHUNK, file_hash=None):
    """Yield (decompressed bytes, file bytes read so far) for a plain or gzip trace, chunk by chunk;
    `file_hash` (a hashlib object), when given, is fed the file's bytes as they are read.

    Same limits as read_trace_bytes; any problem raises StreamAbort without detail.
    """
    try:
        size = path.stat().st_size
        fh = path.open("rb")
    except OSError:
        raise StreamAbort from None
    with fh:
        head = fh.read(2)
        fh.seek(0)
        if file_hash is not None:
            fh = HashingFile(fh, file_hash)
        if head != GZIP_MAGIC:
            if not path.is_file() or size == 0 or size > max_bytes:
                raise StreamAbort
            read = 0
            while data := fh.read(chunk):
                read += len(data)
                yield data, read
            return
        total = 0
        read = 0
        d = gzip_inflater()
        pending = False
        try:
            while raw := fh.read(max(1, chunk // 4)):
                read += len(raw)
                while True:
                    pending = True
                    out = d.decompress(raw, chunk)
                    total += len(out)
                    if total > max_bytes:
                        raise StreamAbort
                    if out:
                        yield out, read
                    if d.eof:  # end of one gzip member; concatenated members may follow
                        raw = d.unused_data
                        d = gzip_inflater()
                        pending = False
                        if not raw:
                            break
                        continue
                    raw = d.unconsumed_tail
                    if not raw and len(out) < chunk:  # input used up and no output held back
                        break
        except INFLATE_ERRORS:
            raise StreamAbort from None
        if pending or total == 0:
            raise StreamAbort
