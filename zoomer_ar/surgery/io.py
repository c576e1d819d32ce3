"""Streaming trace input and output for trace surgery (and the annotated trace).

Input: `read_events(path, on_slice)` hands over each slice of events twice, as the original JSON
bytes of every event (`msgspec.Raw`, copied to the output verbatim) and as light typed records
(`Lite`: ph, name, cat, ts, dur, pid, tid, id) to decide on; the bytes around the events array
(`head`, `tail`) come with it, so top-level keys survive untouched. Nothing holds more than a
slice of events: multi-GB files are fine.

Output: `TraceWriter` writes `head`, the events (raw bytes or Python objects), then `tail`,
to a plain, gzip or zstd file (from the suffix: .gz, .zst; zstd needs the optional `zstandard`
package), into a temporary file renamed into place at the end. An output that cannot be written
(full disk, no permission) is OutputError naming the output and the OS reason, and its temporary
file is removed: no partial output is left behind.
"""

from __future__ import annotations

import gzip
import os
import queue
import re
import threading
from contextlib import contextmanager
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from ..errors import InputError, OutputError
from ..load.schema import Number
from ..stream.scan import ScanResult, scan
from ..stream.source import BadJSON, StreamError, zstandard
from ..threads import start as start_thread
from .validate import NO_NAME


class Lite(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: Number = 0
    dur: Number = 0
    pid: Any = 0
    tid: Any = 0
    id: Any = None  # noqa: A003 - the Chrome field name


class Placed(Lite, gc=False):
    """Lite that tells a missing `ph`, `ts`, `dur`, `pid` or `tid` (None) from a zero, for the
    commands that cut by time (slice, split) and those that hold events to `trace check`'s rules
    (read_events(check="all")): an event without them cannot be placed on a timeline, and copying
    it would make an output that `trace check` and the viewers refuse."""

    ph: Any = None
    name: str = NO_NAME  # a missing name told from "" (a metadata event needs one)
    ts: Number | None = None
    dur: Number | None = None
    pid: Any = None
    tid: Any = None


class _Corr(msgspec.Struct, gc=False):
    correlation: Any = None


class Launched(Placed, gc=False):
    """Placed with the event's `args.correlation`: slice and split keep the GPU side of the steps
    they cut by the correlation of the runtime call that launched it (cut.launches)."""

    args: _Corr | None = None


from ..load.job import TOO_DEEP  # noqa: E402 - one wording for both readers
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[type, msgspec.json.Decoder] = {}
_AT_EVENT = re.compile(r"`\$\[(\d+)\]")

SliceFn = Callable[[list[msgspec.Raw], list[Any]], None]


def _decoder(record: type) -> msgspec.json.Decoder:
    """One cached `list[record]` decoder per record type."""
    dec = _DECODERS.get(record)
    if dec is None:
        dec = _DECODERS[record] = msgspec.json.Decoder(list[record])
    return dec


def _wrong_type(path: Path, exc: msgspec.ValidationError, before: int) -> InputError:
    """A field of the wrong type, located by its index in the file (msgspec counts in the slice)."""
    msg = _AT_EVENT.sub(lambda m: f"`event {before + int(m.group(1))}", str(exc))
    return InputError(str(path), f"an event field has the wrong type ({msg})")


def read_events(path: Path, on_slice: SliceFn, *, on_head: Callable[[ScanResult], None] | None = None,
                slice_bytes: int = 1 << 20, record: type = Lite, check: str = "none") -> ScanResult:
    """Stream the events of a trace file; InputError when it is not a readable trace.

    Each slice is copied out of the scanner's buffer before it is decoded: msgspec.Raw values point
    into the buffer they come from, and while any of them is alive the scanner cannot release its
    view. An exception raised with the Raw values still referenced (a field of the wrong type, a
    full disk while writing) then surfaced as `BufferError: memoryview has 1 exported buffer`
    instead of itself. The copy costs one memcpy of a 1 MB slice, small next to decoding it.
    `record` (a Lite subclass) chooses the typed view of the events (Placed: missing fields as None).

    `check`: "types" refuses (InputError naming the file and the event) a field of a type the
    analyzer's loader refuses (validate.refuse_wrong_types, as `merge` and `trace check` do); "all"
    also an event `trace check` refuses (no `ph`, `ts`, `pid`/`tid`, ...: validate.event_problems;
    needs a Placed record); "none" (the default) checks nothing. The commands that copy events
    verbatim check, so that their outputs are always valid traces.
    """
    from .validate import refuse_unplaceable, refuse_wrong_types

    if check == "all" and not issubclass(record, Placed):
        record = Placed
    lite_decoder = _decoder(record)
    seen = [0]
    last_error = [""]  # the decoder's last complaint: says why no cut worked (invalid UTF-8, NaN, ...)

    def consume(view) -> None:
        data = bytes(view)  # nothing below refers to the scanner's buffer
        try:
            if check != "none":  # first: a DecodeError here is a wrong cut, as below
                refuse_wrong_types(path, data, seen[0])
            lite = lite_decoder.decode(data)
        except msgspec.ValidationError as exc:  # JSON that parses, with a bad field: not a wrong cut
            raise _wrong_type(path, exc, seen[0]) from None
        except msgspec.DecodeError as exc:  # maybe a wrong cut: the scanner tries another one
            last_error[0] = str(exc)
            raise
        except RecursionError:  # msgspec refuses nesting deeper than Python's recursion limit this way
            raise InputError(str(path), TOO_DEEP) from None
        if check == "all":
            refuse_unplaceable(path, lite, seen[0])
        raws = _RAWS.decode(data)
        seen[0] += len(lite)
        on_slice(raws, lite)

    try:
        return scan(path, consume, slice_bytes=slice_bytes, hash=False, on_head=on_head)
    except BadJSON as exc:  # worded as `analyze` words it
        raise InputError(str(path), str(exc)) from None
    except StreamError as exc:
        why = f" (last JSON error: {last_error[0]})" if last_error[0] else ""
        raise InputError(str(path), f"cannot stream this trace: {exc}{why}") from None
    except RecursionError:  # nesting in the keys around the events array
        raise InputError(str(path), TOO_DEEP) from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror or exc}") from None


def compression_for(path: Path, explicit: str | None = None) -> str:
    if explicit:
        return explicit
    name = path.name.lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith(".zst") or name.endswith(".zstd"):
        return "zstd"
    return "none"


def cannot_write(path: Path, exc: OSError) -> OutputError:
    """An output that cannot be written (full disk, no permission, ...): exit 2, one line naming
    the output and the OS reason. Not an OSError, so that readers do not take it for a read failure."""
    return OutputError(str(path), exc.strerror or str(exc))


class WriteQueue:
    """A thread that does the writes of compressed outputs, in the order they were asked for:
    zlib and zstd compress without the interpreter lock, so the compression of the output runs
    beside the decoding of the input (two cores: a gzip output costs little more than a plain one).

    Errors keep the order of a write done at once: a write that fails stops the writes after it
    (`failed`: the sink and the OSError); the next write, the commit, and a command that fails
    for another reason (`settle`) raise the OutputError it makes, naming that output, as the
    write itself used to. At most `depth` writes wait (memory: a few slices)."""

    def __init__(self, depth: int = 8) -> None:
        self._q: queue.Queue = queue.Queue(depth)
        self.failed: tuple[_Sink, BaseException] | None = None
        self._halt = False
        self._thread = threading.Thread(target=self._run, name="zoomer-ar-writer", daemon=True)
        start_thread(self._thread)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                if self.failed is None and not self._halt:
                    sink, data = item
                    try:
                        sink.fh.write(data)
                    except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                        self.failed = (sink, exc)
            finally:
                self._q.task_done()

    def put(self, sink: _Sink, data) -> None:
        self.raise_failed()
        self._q.put((sink, data))

    def sync(self) -> None:
        """Wait until the writes asked for are done."""
        self._q.join()

    def raise_failed(self) -> None:
        """Raise what the first failed write makes (OutputError naming its output), after removing
        that output's temporary file, as a write done at once does."""
        if self.failed is None:
            return
        sink, exc = self.failed
        sink.abort()
        if isinstance(exc, OSError):
            raise cannot_write(sink.path, exc) from None
        raise exc

    def settle(self, exc: BaseException) -> None:
        """A command failed with `exc`: when a write asked for before it failed, raise that write's
        error instead (the command would have stopped there). Interruptions (Ctrl-C, SIGTERM) are
        not waited for."""
        if isinstance(exc, (KeyboardInterrupt, SystemExit, OutputError)):
            return
        self.sync()
        self.raise_failed()

    def halt(self) -> None:
        """Drop the writes not done yet and wait for the one under way (the outputs are discarded)."""
        self._halt = True
        self.sync()

    def close(self) -> None:
        self.halt()
        self._q.put(None)
        self._thread.join()


@contextmanager
def write_queue(enabled: bool = True) -> Iterator[WriteQueue | None]:
    """A WriteQueue for the outputs of one command (None when not `enabled`), closed at the end."""
    if not enabled:
        yield None
        return
    q = WriteQueue()
    try:
        yield q
    finally:
        q.close()


class _Sink:
    """A binary file, optionally compressed, written to a temporary name and renamed on success.
    Any OSError while writing, closing or renaming removes the temporary file and becomes
    OutputError naming the output. With a WriteQueue, the writes are done by its thread (same
    bytes, same errors)."""

    def __init__(self, path: Path, compression: str = "none", level: int | None = None,
                 writes: WriteQueue | None = None) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self.bytes_in = 0
        self.writes = writes
        self._made: list[Path] = []  # folders this sink created for its output (removed on abort)
        self._raw = None
        try:
            self._made = _make_parents(path.parent)
            self._raw = self.tmp.open("wb")
        except OSError as exc:
            self._remove_made()
            raise cannot_write(path, exc) from None
        self.fh: Any = self._raw
        try:
            self.fh = self._codec(compression, level)
        except OSError as exc:  # gzip writes its header at once
            self.abort()
            raise cannot_write(path, exc) from None
        except BaseException:
            self.abort()
            raise

    def _codec(self, compression: str, level: int | None) -> Any:
        """The writer that compresses into the temporary file."""
        if compression == "gzip":  # the header names the output, not the temporary file
            return gzip.GzipFile(filename=self.path.name, fileobj=self._raw, mode="wb",
                                 compresslevel=6 if level is None else level, mtime=0)
        if compression == "zstd":
            if zstandard is None:
                raise InputError(str(self.path), "zstd output needs the optional `zstandard` package "
                                                 "(pip install zstandard)")
            return zstandard.ZstdCompressor(level=3 if level is None else level).stream_writer(self._raw, closefd=False)
        if compression == "none":
            return self._raw
        raise ValueError(f"unknown compression {compression!r}")

    def write(self, data) -> None:
        self.bytes_in += len(data)
        if self.writes is not None:
            self.writes.put(self, data)
            return
        try:
            self.fh.write(data)
        except OSError as exc:
            self.abort()
            raise cannot_write(self.path, exc) from None

    def _close(self) -> None:
        if self._raw is None:
            return
        if self.fh is not self._raw:
            self.fh.close()
        self._raw.close()

    def commit(self, check: Callable[[Path], None] | None = None) -> None:
        """Close the temporary file and rename it to the output. `check(tmp)`, when given, reads the
        closed file first: what it raises removes the file and leaves an existing output as it was."""
        if self.writes is not None:
            self.writes.sync()
            self.writes.raise_failed()
        try:
            self._close()  # flushes: a full disk may show only here
            if check is not None:
                try:
                    check(self.tmp)
                except BaseException:
                    self.abort()
                    raise
            existed = self.path.exists()
            os.replace(self.tmp, self.path)
        except OSError as exc:
            self.abort()
            raise cannot_write(self.path, exc) from None
        if existed:
            REPLACED.append(str(self.path))
        self._made = []

    def abort(self) -> None:
        """Close (errors ignored: after a full disk, closing flushes into it again) and remove the
        temporary file and the folders created for it. Safe to call more than once."""
        if self.writes is not None:
            self.writes.halt()  # its thread no longer touches the file
        try:
            self._close()
        except Exception:  # noqa: BLE001 - the file is being discarded whatever closing it says
            pass
        finally:
            self.tmp.unlink(missing_ok=True)
            self._remove_made()

    def _remove_made(self) -> None:
        """Remove the folders this sink created, deepest first, where they are empty (another
        output written there meanwhile keeps them)."""
        for d in self._made:
            try:
                d.rmdir()
            except FileNotFoundError:  # mkdir failed before it
                continue
            except OSError:
                break
        self._made = []


#: Outputs that replaced an existing file, in the order written: the CLI says so in a note
#: (`take_replaced`). Outputs are replaced without asking, as `cp` does.
REPLACED: list[str] = []


def take_replaced() -> list[str]:
    """The outputs that replaced an existing file since the last call (and forget them)."""
    out = list(REPLACED)
    REPLACED.clear()
    return out


def replaced_note() -> str | None:
    """'replaced the existing file(s) ...' for the outputs that replaced a file since the last call
    (take_replaced), or None."""
    replaced = take_replaced()
    if not replaced:
        return None
    more = f" (+{len(replaced) - 3} more)" if len(replaced) > 3 else ""
    return f"replaced the existing {'file' if len(replaced) == 1 else 'files'} {', '.join(replaced[:3])}{more}"


def _make_parents(folder: Path) -> list[Path]:
    """mkdir -p; the folders it created, deepest first."""
    made: list[Path] = []
    d = folder
    while not d.exists() and d != d.parent:
        made.append(d)
        d = d.parent
    if made:
        folder.mkdir(parents=True, exist_ok=True)
    return made


def copy_file(src: Path, dst: Path, chunk: int = 1 << 20) -> None:
    """Copy the bytes of src to dst through a temporary file (no partial dst on a full disk);
    InputError naming src when it cannot be read, OutputError naming dst when dst cannot be written."""
    sink = _Sink(dst)
    with copying_into(sink, src):
        with src.open("rb") as fh:
            while data := fh.read(chunk):
                sink.write(data)


@contextmanager
def copying_into(sink: _Sink, src: Path) -> Iterator[_Sink]:
    """Commit ``sink`` when the block copied ``src`` into it whole; else remove the partial output.
    The sink's own failures are OutputError; an OSError or a stream error of the block is the
    input's: InputError naming src."""
    try:
        yield sink
        sink.commit()
    except StreamError as exc:
        sink.abort()
        raise InputError(str(src), str(exc)) from None
    except OSError as exc:  # the sink's own errors are OutputError: this one is the input's
        sink.abort()
        raise InputError(str(src), f"cannot read: {exc.strerror or exc}") from None
    except BaseException:
        sink.abort()
        raise


DEFAULT_HEAD = b'{"traceEvents":'
DEFAULT_TAIL = b"}"


class TraceWriter:
    """Write a valid trace: head, `[`, events separated by commas, `]`, tail."""

    def __init__(self, path: Path, *, head: bytes | None = None, tail: bytes | None = None,
                 compression: str | None = None, level: int | None = None, writes: WriteQueue | None = None) -> None:
        self.path = Path(path)
        self.head = head
        self.tail = tail
        comp = compression_for(self.path, compression)
        self._sink = _Sink(self.path, comp, level, writes if comp != "none" else None)
        self._started = False
        self._first = True
        self.events = 0

    def set_head(self, res: ScanResult) -> None:
        """Take the head from a scanned input (a bare array becomes {"traceEvents": [...]})."""
        self.head = DEFAULT_HEAD if (res.bare or not res.head) else res.head

    @staticmethod
    def tail_of(res: ScanResult) -> bytes:
        return DEFAULT_TAIL if (res.bare or not res.head) else (res.tail or DEFAULT_TAIL)

    def _start(self) -> None:
        if not self._started:
            self._sink.write((self.head or DEFAULT_HEAD) + b"[")
            self._started = True

    def write_raw(self, raws: Iterable) -> None:
        """Events as JSON bytes (msgspec.Raw or bytes), copied verbatim."""
        if not isinstance(raws, list):
            raws = list(raws)
        if not raws:
            return
        self._start()
        self._sink.write(b",".join(raws) if self._first else b",".join([b"", *raws]))  # "," + body, one copy
        self._first = False
        self.events += len(raws)

    def write_joined(self, body: bytes, events: int) -> None:
        """`events` events already joined by `,` (no leading comma), copied verbatim: write_raw
        without the join's copy of the body (partition_fast.gather joins them in C)."""
        if not body:
            return
        self._start()
        if not self._first:
            self._sink.write(b",")
        self._sink.write(body)
        self._first = False
        self.events += events

    def write_objects(self, events: Iterable[Any]) -> None:
        """Events as Python objects (dicts, msgspec structs), encoded as JSON: the list is encoded
        at once (msgspec writes a list as its items' encodings joined by `,`, no blanks)."""
        if not isinstance(events, list):
            events = list(events)
        if not events:
            return
        self._start()
        body = _ENCODER.encode(events)[1:-1]
        self._sink.write(body if self._first else b"," + body)
        self._first = False
        self.events += len(events)

    def close(self, tail: bytes | None = None) -> Path:
        self._start()
        if tail is not None:
            self.tail = tail
        t = self.tail if self.tail is not None else DEFAULT_TAIL
        self._sink.write(b"]" + (t if t.strip() else DEFAULT_TAIL))
        self._sink.commit()
        return self.path

    def abort(self) -> None:
        self._sink.abort()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def decode_top(head: bytes, tail: bytes) -> dict[str, Any]:
    """The top-level keys around the events array, as a dict (for outputs that change them)."""
    out: dict[str, Any] = {}
    if head:
        try:
            out.update(msgspec.json.decode(head + b"null}"))
        except msgspec.DecodeError:
            pass
    if tail and tail.strip() not in (b"", b"}"):
        try:
            out.update(msgspec.json.decode(b'{"traceEvents":null' + tail))
        except msgspec.DecodeError:
            pass
    out.pop("traceEvents", None)
    return out


def encode_head(top: dict[str, Any]) -> tuple[bytes, bytes]:
    """head and tail bytes for a document with these top-level keys and traceEvents last."""
    body = _ENCODER.encode(top)
    if body == b"{}":
        return DEFAULT_HEAD, DEFAULT_TAIL
    return body[:-1] + b',"traceEvents":', b"}"
