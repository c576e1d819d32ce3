"""`trace check`, `trace compress` and `trace repair`: the events checked, the bytes copied (compressed, or
with the profiler's unescaped names re-escaped)."""

from __future__ import annotations
import threading
from collections.abc import Iterable
from pathlib import Path
import msgspec
from ..errors import InputError
from ..load.reader import DEFAULT_MAX_BYTES, read_trace_bytes
from ..load.repair import StreamRepair, repair
from ..stream.source import ChunkReader, StreamError
from ..threads import start as start_thread
from . import guard
from .io import _Sink, compression_for, copying_into
from .slices import read_slices
from .copying import Stats, human_bytes
from .validate import NO_EVENTS, ONLY_METADATA


def check_events(src: Path) -> int:
    """A pass that holds every event of src to `trace check`'s rules (types included), and src to
    holding an event on a timeline: InputError naming the file and the first event refused, or saying
    that it holds no event or only metadata (`analyze` refuses both; so does `trace check`). For the
    commands that copy a file's bytes as they are (compress, sample, repair): what they write is then
    a valid trace. Returns the number of events."""
    count = [0]
    timed = [False]

    def tally(batch) -> None:
        count[0] += batch.n
        if not timed[0]:
            timed[0] = batch.any_timed()

    read_slices(src, tally, check="all")
    refuse_no_events(src, count[0], timed[0])
    return count[0]


def refuse_no_events(src: Path, events: int, timed: bool) -> None:
    """InputError where a trace holds no event (`"traceEvents": []`) or only metadata events: `analyze`
    refuses it, and so do filter, slice, split and merge; a copy of it would pass for a usable trace."""
    if not events:
        raise InputError(str(src), f"{NO_EVENTS}; nothing written")
    if not timed:
        raise InputError(str(src), f"{ONLY_METADATA}; nothing written")


def compress_trace(src: Path, dst: Path, *, compression: str | None = None, level: int | None = None) -> Stats:
    """Re-encode a trace file as gzip, zstd or plain JSON (from dst's suffix unless given), streaming.

    The bytes are copied as they are (a round trip gives the same JSON), but only after a first pass
    has read the events as the other commands do: the output is promised to be a valid trace, and a
    JSON file without traceEvents, NaN literals or a cut-off array would otherwise pass through."""
    comp = compression_for(dst, compression)
    guard.require_file(src)
    guard.check_file_output(dst, [src])
    guard.check_suffix(dst, comp)
    guard.check_level(comp, level, dst)
    copy = _BackgroundCopy(src, dst, comp, level)  # compresses while the events are checked
    try:
        check_events(src)
        sink = copy.result()
    except BaseException:  # the check failed, or Ctrl-C, SIGTERM: no output left behind
        copy.cancel()
        raise
    st = Stats()
    st.outputs.append(str(dst))
    st.bytes_out = dst.stat().st_size
    st.note = f"from {human_bytes(sink.bytes_in)} of JSON, {comp}"
    return st


_JSON_CHECK = msgspec.json.Decoder(msgspec.Raw)  # JSON syntax only: the document stays raw bytes


def repair_trace(src: Path, dst: Path, *, compression: str | None = None, level: int | None = None) -> Stats:
    """Write a copy of src that other tools open, where the profiler wrote it as invalid JSON: the event
    names (and old `Call stack` args) it did not escape are re-escaped (zoomer_ar/load/repair.py), every
    other byte is kept. A file that is valid JSON already is copied as it is (a note says so); invalid JSON
    of any other kind is refused.

    The copy streams (load.repair.StreamRepair: memory bounded by two lines, whatever the file's size) and
    is checked as every command's output is before it takes dst's place (_Sink.commit's check), so a
    failed repair leaves an existing dst as it was. Names holding a raw line break are found only at the decoder's error offset, in
    the whole document: where the streamed copy does not check, a file within ZOOMER_MAX_TRACE_BYTES is
    repaired that way instead."""
    comp = compression_for(dst, compression)
    guard.require_file(src)
    guard.check_file_output(dst, [src])
    guard.check_suffix(dst, comp)
    guard.check_level(comp, level, dst)
    if _valid_trace(src):  # StreamRepair reads names line by line: on valid JSON it has nothing to do, and on
        sink = _Sink(dst, comp, level)  # a one-line file it took two events for one name ("a", "pid": ... "b")
        with copying_into(sink, src):
            for data, _ in ChunkReader(src, hash=False):
                sink.write(data)
        return _repaired(src, dst, comp, 0)
    fix = StreamRepair()
    try:
        _write_checked(dst, comp, level, (data for data, _ in ChunkReader(src, hash=False, repair=fix)))
    except (StreamError, InputError) as exc:
        if src.stat().st_size <= DEFAULT_MAX_BYTES:
            return _repair_whole(src, dst, comp, level)  # explains the refusal, or repairs at the decoder's offsets
        reason = exc.reason if isinstance(exc, InputError) else str(exc)
        raise InputError(str(src), f"not valid JSON, and not the profiler's unescaped names ({reason})") from None
    return _repaired(src, dst, comp, fix.fixed)


def _valid_trace(src: Path) -> bool:
    """Whether src passes check_events (valid JSON, a valid trace): repair copies it as it is."""
    try:
        check_events(src)
    except InputError:
        return False
    return True


def _repair_whole(src: Path, dst: Path, comp: str, level: int | None) -> Stats:
    """repair_trace on the whole document in memory (load.repair.repair: also the names with a raw line
    break, at the decoder's error offsets)."""
    data = read_trace_bytes(src)
    try:
        _JSON_CHECK.decode(data)
        fixed = 0
    except msgspec.DecodeError as exc:
        got = repair(data, _JSON_CHECK.decode, exc)
        if isinstance(got, BaseException):
            raise InputError(str(src), f"not valid JSON, and not the profiler's unescaped names ({got})") from None
        data, fixed = got.data, got.fixed
    view = memoryview(data)
    try:
        _write_checked(dst, comp, level, (view[i : i + (1 << 22)] for i in range(0, len(view), 1 << 22)))
    except InputError as exc:
        what = "repaired, but still not a valid trace" if fixed else "valid JSON, but not a valid trace"
        raise InputError(str(src), f"{what}: {exc.reason}") from None
    return _repaired(src, dst, comp, fixed)


def _write_checked(dst: Path, comp: str, level: int | None, chunks: Iterable) -> None:
    """The chunks written to dst (compressed as asked), held to check_events' rules before the file
    takes dst's place: on any failure dst is as it was."""
    sink = _Sink(dst, comp, level)
    try:
        for data in chunks:
            sink.write(data)
    except BaseException:
        sink.abort()
        raise
    sink.commit(check=check_events)  # the promise of every command: a valid trace


def _repaired(src: Path, dst: Path, comp: str, fixed: int) -> Stats:
    """The figures of a repair written to dst."""
    st = Stats()
    if not fixed:
        st.notes.append(f"{src} is valid JSON: nothing to repair, copied as it is")
    st.outputs.append(str(dst))
    st.bytes_out = dst.stat().st_size
    st.note = f"{fixed:,} event name{'' if fixed == 1 else 's'} re-escaped, {comp}"
    return st


class _BackgroundCopy:
    """compress_trace's copy of the bytes into the output, in a thread started before the check pass
    (reading, inflating and deflating run without the interpreter lock: the check and the copy take
    the time of the longer one, not of both). The output is committed only once the check passed:
    `result()` then returns the sink to commit, or raises what the copy raised, as a copy made after
    the check would have (OutputError naming the output, InputError naming the input); `cancel()`
    (the check failed) stops the copy and removes its temporary file and the folders it made."""

    def __init__(self, src: Path, dst: Path, comp: str, level: int | None) -> None:
        self.src, self.dst, self.comp, self.level = src, dst, comp, level
        self.sink: _Sink | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zoomer-ar-copy", daemon=True)
        start_thread(self._thread)

    def _run(self) -> None:
        src = self.src
        try:
            sink = self.sink = _Sink(self.dst, self.comp, self.level)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            self.error = exc
            return
        try:
            first = True
            for data, _ in ChunkReader(src, hash=False):
                if self._stop.is_set():
                    return
                if first:
                    head = data.lstrip()[:1]
                    if head not in (b"{", b"["):
                        raise InputError(str(src), "not a JSON trace")
                    first = False
                sink.write(data)
            if first:
                raise InputError(str(src), "empty file")
        except StreamError as exc:  # as copying_into says it
            sink.abort()
            self.error = InputError(str(src), str(exc))
        except OSError as exc:
            sink.abort()
            self.error = InputError(str(src), f"cannot read: {exc.strerror or exc}")
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            sink.abort()
            self.error = exc

    def cancel(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.sink is not None:
            self.sink.abort()

    def result(self) -> _Sink:
        self._thread.join()
        if self.error is not None:
            raise self.error
        sink = self.sink
        assert sink is not None
        try:
            sink.commit()
        except BaseException:
            sink.abort()
            raise
        return sink
