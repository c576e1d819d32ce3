"""Decompressed bytes of a trace file, chunk by chunk, never the whole file at once.

Plain JSON, gzip (one or several members; zlib-ng where installed, see load/inflate.py) and zstd (only when the optional
`zstandard` package is installed). A reader thread reads, hashes (the file as stored) and decompresses (zlib, zstd and
hashlib release the GIL) while the caller decodes the previous chunk.
"""

from __future__ import annotations

import hashlib
import os
import queue
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from ..load.inflate import ERRORS as INFLATE_ERRORS
from ..load.inflate import gzip_inflater
from ..load.reader import GZIP_MAGIC, ZSTD_MAGIC, ZSTD_MISSING, HashingFile
from ..load.repair import StreamRepair
from ..threads import start as start_thread

CHUNK = 1 << 20  # decompressed bytes per chunk (small: the decoded slice stays in cache)

try:  # optional: zstd input and output
    import zstandard  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the environment
    zstandard = None


def is_trace_file(p: Path) -> bool:
    """load.job.is_trace_file, plus zstd files (.zst), which only the streaming reader reads."""
    n = p.name.lower()
    return p.is_file() and n.endswith((".json", ".json.gz", ".gz", ".zst", ".zstd"))


class StreamError(Exception):
    """The file cannot be streamed (unreadable, corrupt, truncated, not JSON of the expected shape).

    The caller falls back to the whole-document loader, whose InputError explains the problem."""


class BadJSON(StreamError):
    """The events array is not valid JSON (NaN literals, items that are not objects): the message
    says so in the in-memory loader's words ("not valid JSON (...)"), for the commands that do not
    fall back to it (trace surgery, `trace check`). `unescaped_name`: the decoder stopped inside an
    event name the profiler did not escape (load/repair.py can re-escape it)."""

    def __init__(self, message: str, *, unescaped_name: bool = False) -> None:
        super().__init__(message)
        self.unescaped_name = unescaped_name


def require_regular(path: Path) -> None:
    """StreamError unless path is a regular file (a symlink to one is): opening a named pipe would
    block until a writer comes, and a device never ends. The loaders say "not a regular file" too."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise StreamError(f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise StreamError("not a regular file")


def compression_of(path: Path) -> str:
    """'gzip', 'zstd' or 'none', from the file's first bytes."""
    require_regular(path)
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise StreamError(f"cannot read: {exc}") from None
    if head[:2] == GZIP_MAGIC:
        return "gzip"
    if head == ZSTD_MAGIC:
        return "zstd"
    return "none"


def iter_chunks(path: Path, chunk: int = CHUNK, file_hash=None) -> Iterator[tuple[bytes, int]]:
    """Yield (decompressed bytes, file bytes read so far); `file_hash` (a hashlib object), when
    given, is fed the file's bytes as they are read."""
    kind = compression_of(path)
    try:
        raw_fh = path.open("rb")
    except OSError as exc:
        raise StreamError(f"cannot open: {exc}") from None
    with raw_fh:
        fh = raw_fh if file_hash is None else HashingFile(raw_fh, file_hash)
        if kind == "none":
            read = 0
            while data := fh.read(chunk):
                read += len(data)
                yield data, read
            return
        if kind == "zstd":
            if zstandard is None:
                raise StreamError(ZSTD_MISSING)
            try:
                reader = zstandard.ZstdDecompressor().stream_reader(fh, read_size=chunk // 4, read_across_frames=True)
                while data := reader.read(chunk):
                    yield data, fh.tell()
            except zstandard.ZstdError as exc:
                raise StreamError(f"corrupt zstd data ({exc})") from None
            return
        d = gzip_inflater()
        pending = False
        total = 0
        read = 0
        try:
            while raw := fh.read(max(1, chunk // 8)):
                read += len(raw)
                while raw:
                    pending = True
                    out = d.decompress(raw, chunk)
                    if out:
                        total += len(out)
                        yield out, read
                    if d.eof:  # end of one gzip member; concatenated members may follow
                        raw = d.unused_data
                        d = gzip_inflater()
                        pending = False
                    else:
                        raw = d.unconsumed_tail
        except INFLATE_ERRORS as exc:
            raise StreamError(f"corrupt gzip data ({exc})") from None
        if pending or total == 0:
            raise StreamError("truncated gzip file")


class ChunkReader:
    """iter_chunks in a background thread, with the sha256 of the file (as stored: a trace's
    identity, load/reader.py).

    Iterate it for (data, file bytes read); `sha256` is set once the iteration has ended."""

    def __init__(self, path: Path, *, chunk: int = CHUNK, hash: bool = True, depth: int = 3,  # noqa: A002
                 repair: StreamRepair | None = None) -> None:
        self.path = path
        self.chunk = chunk
        self.hash = hash
        self.repair = repair  # re-escapes the profiler's unescaped names on the way (load/repair.py)
        self.sha256: str | None = None
        self.total = 0
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        h = hashlib.sha256() if self.hash else None
        item: tuple = (None, None)
        try:
            fix = self.repair
            read = 0
            for data, read in iter_chunks(self.path, self.chunk, file_hash=h):
                if fix is not None:
                    data = fix.feed(data)
                    if not data:
                        continue
                if not self._put((data, read)):
                    return
            if fix is not None and (rest := fix.finish()) and not self._put((rest, read)):
                return
            item = (None, h.hexdigest() if h is not None else "")
        except BaseException as exc:  # noqa: BLE001 - handed over to the consumer
            item = (exc, None)
        self._put(item)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        self._thread = threading.Thread(target=self._run, daemon=True, name="zoomer-stream-reader")
        start_thread(self._thread)
        try:
            while True:
                data, extra = self._q.get()
                if data is None:
                    self.sha256 = extra
                    return
                if isinstance(data, BaseException):
                    if isinstance(data, StreamError):
                        raise data
                    raise StreamError(f"read failed: {data}") from data
                self.total += len(data)
                yield data, extra
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


Progress = Callable[[int, int], None]
