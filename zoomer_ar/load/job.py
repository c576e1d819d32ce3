"""Load a trace file or a folder of per-rank trace files into one Job."""

from __future__ import annotations

import gc
import json
import hashlib
import queue
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import numpy.ma  # noqa: F401 - np.median imports it on first use; load it with the engine, not mid-analysis

from ..errors import InputError
from ..models import JobInfo, RankInfo, SkippedFile
from ..threads import start as start_thread
from . import fastcols
from .columns import PH_COMPLETE, PH_INSTANT, ColumnBuilder, RankTrace, build_columns
from .cuts import last_boundary as _cut
from .cuts import skip_ws as _skip_ws
from .folder import job_ranks, rank_from_name
from .reader import DEFAULT_MAX_BYTES, STREAM_CHUNK, Progress, file_sha256, iter_trace_chunks, read_trace_bytes
from .repair import Repaired
from .repair import repair as repair_kineto_names
from .schema import EVENTS_DECODER, TOP_DECODER, TRACE_DECODER, RawTrace
from .stub import RankStub

TRACE_SUFFIXES = (".json", ".json.gz", ".gz")
_GPU_CATS_2021 = {"Kernel", "Runtime", "Memcpy", "Memset", "Operator"}


@dataclass
class Job:
    """All ranks of one job, ready for feature extraction. A rank read and summarised in another process
    (the streaming path's analysis) is a RankStub: its feature summary without its rows."""

    info: JobInfo
    ranks: list[RankTrace | RankStub] = field(default_factory=list)


def recorded_job(trace_path: Path) -> dict:
    """The capture helper's job.json beside the trace (or in the rank folder), else {}."""
    folder = trace_path if trace_path.is_dir() else trace_path.parent
    try:
        doc = json.loads((folder / "job.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested deeper than json can read
        return {}
    return doc if isinstance(doc, dict) else {}


def missing_reason(p: Path) -> str:
    """Why a path that does not exist does not: a symbolic link to nothing (or a loop), or nothing."""
    return "a symbolic link that leads nowhere (dangling, or a loop)" if p.is_symlink() else "no such file or directory"


def _describe_non_trace(data: bytes) -> str | None:
    """A one-line reason why a JSON document is not a Kineto trace (only called on the error path)."""
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        return f"not valid JSON ({exc})"
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return None  # a trace whose events have wrong field types
    if isinstance(doc, list) and all(isinstance(e, dict) for e in doc[:100]) and doc:
        return None
    if isinstance(doc, dict):
        if "nodes" in doc and "traceEvents" not in doc:
            return "not a Kineto trace: this is a PyTorch execution trace (has 'nodes', no 'traceEvents')"
        if "traceEvents" not in doc:
            keys = ", ".join(list(doc)[:5]) or "none"
            return f"not a Kineto trace: no 'traceEvents' (top-level keys: {keys})"
        kind = "null" if doc["traceEvents"] is None else type(doc["traceEvents"]).__name__
        return f"not a Kineto trace: 'traceEvents' is {kind}, not a list of events"
    if isinstance(doc, list):
        if doc and isinstance(doc[0], list):
            return "not a Kineto trace: a JSON array of arrays (looks like a memory-timeline export)"
        return "not a Kineto trace: a JSON array whose items are not trace events"
    return f"not a Kineto trace: top-level JSON {type(doc).__name__}"


_PACKED = (  # (test on the decompressed bytes, what the file is, what to do)
    (lambda d: d[257:262] == b"ustar", "a tar archive", "extract it (tar xf) and analyse the folder of rank files"),
    (lambda d: d[:4] in (b"PK\x03\x04", b"PK\x05\x06"), "a zip archive",
     "extract it (unzip) and analyse the folder of rank files"),
    (lambda d: d[:6] == b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "extract it and analyse the folder of rank files"),
    (lambda d: d[:3] == b"BZh", "bzip2-compressed", "decompress it (bunzip2); traces are read as .json, .json.gz or .json.zst"),
    (lambda d: d[:6] == b"\xfd7zXZ\x00", "xz-compressed", "decompress it (unxz); traces are read as .json, .json.gz or .json.zst"),
)


def packed_reason(data: bytes) -> str | None:
    """Why a file is no trace when it is an archive or a compression the reader does not inflate."""
    for test, what, todo in _PACKED:
        if test(data):
            return f"{what}, not a trace: {todo}"
    return None


def _encoding_hint(data: bytes) -> str:
    """Why a file that may well be a trace does not parse: a byte-order mark or UTF-16 text."""
    if data.startswith(b"\xef\xbb\xbf"):
        return "; the file starts with a UTF-8 byte-order mark: save it without one"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(data) > 1 and data[1:2] == b"\0" and data[:1] in b"{["):
        return "; the file looks like UTF-16 text: JSON traces are UTF-8"
    return ""


def decode_trace(data: bytes, path: str, repaired: list[int] | None = None) -> RawTrace:
    """The whole document, decoded. Invalid JSON of the one kind the profiler itself writes (event names
    it did not escape: load/repair.py) is repaired, and the number of values repaired appended to
    `repaired`; any other invalid JSON is refused with the decoder's reason."""
    try:
        doc = TRACE_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        reason = _describe_non_trace(data)
        if reason is not None:
            raise InputError(path, reason) from None
        raise InputError(path, f"malformed trace: {exc}") from None
    except msgspec.DecodeError as exc:
        msg = str(exc)
        if "truncated" in msg.lower():
            raise InputError(path, f"truncated JSON ({msg})") from None
        fixed = _repair(data, exc)
        if isinstance(fixed, BaseException):
            last = str(fixed)
            if "truncated" in last.lower():  # a broken name repaired, and then the file ends early
                raise InputError(path, f"truncated JSON ({last})") from None
            raise InputError(path, packed_reason(data) or f"not valid JSON ({msg}){_encoding_hint(data)}") from None
        doc = fixed.doc
        if repaired is not None:
            repaired.append(fixed.fixed)
    if isinstance(doc, list):
        doc = RawTrace(traceEvents=doc)
    return doc


def _repair(data: bytes, exc: msgspec.DecodeError) -> Repaired | BaseException:
    try:
        return repair_kineto_names(data, TRACE_DECODER.decode, exc)
    except msgspec.ValidationError:  # valid JSON once repaired, but not a trace: refused as invalid JSON
        return exc


def _accelerator(trace: RankTrace, devices: list[str]) -> str:
    cats = set(trace.cats)
    if any(c.startswith("mtia") for c in cats):
        return "mtia"
    names_blob = " ".join(devices).lower()
    has_gpu_events = bool(cats & {"kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy", "Memset"})
    if "amd" in names_blob or "instinct" in names_blob or "radeon" in names_blob:
        return "amd"
    if any(n.startswith("hip") for n in trace.names[:5000]) and has_gpu_events:
        return "amd"
    if has_gpu_events or "nvidia" in names_blob or "tesla" in names_blob:
        return "nvidia"
    return "none"


def _schema(trace: RankTrace) -> str:
    cats = set(trace.cats)
    if cats & _GPU_CATS_2021:
        return "2021"
    if cats & {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "mtia_ccp_events", "mtia_runtime"}:
        return "current"
    if cats & {"cpu_op", "user_annotation", "python_function"}:
        return "cpu-only"
    return "unknown"


TOO_DEEP = "JSON nested too deeply to be a profiler trace"


def load_trace(
    path: Path, *, rank_hint: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES, progress: Progress | None = None
) -> tuple[RankTrace, RankInfo]:
    try:
        return _load_trace(path, rank_hint=rank_hint, max_bytes=max_bytes, progress=progress)
    except RecursionError:  # msgspec refuses nesting deeper than Python's recursion limit this way
        raise InputError(str(path), TOO_DEEP) from None


def _load_trace(
    path: Path, *, rank_hint: int | None, max_bytes: int, progress: Progress | None
) -> tuple[RankTrace, RankInfo]:
    streamed = stream_trace(path, max_bytes=max_bytes, progress=progress)
    repaired: list[int] = []  # values of the profiler's invalid JSON re-escaped (whole-document path only)
    if streamed is not None:
        sha, doc, trace = streamed
    else:  # the reference path: whole document at once (also the one that explains bad input)
        data = read_trace_bytes(path, max_bytes=max_bytes, progress=progress)
        sha = file_sha256(path)  # of the file as stored, as the streaming reader hashes it
        doc = decode_trace(data, str(path), repaired)
        del data
        events = doc.traceEvents
        if not events:
            raise InputError(str(path), "trace has no events ('traceEvents' is empty)")
        trace = build_columns(events, 0, str(path))
        del events, doc.traceEvents
    dist = doc.distributedInfo or {}
    rank, rank_source = rank_of_file(dist, path, rank_hint)
    trace.rank = rank
    useful = (trace.ph == PH_COMPLETE) | (trace.ph == PH_INSTANT)
    if not useful.any():
        raise InputError(str(path), "not a Kineto trace: no complete ('X') or instant events")
    # Nanosecond timestamps: epoch microseconds today are ~1.7e15; nanoseconds are ~1.7e18.
    xs = trace.ts[trace.ph == PH_COMPLETE]
    if xs.size and float(np.median(xs)) > 1e17:
        trace.ts = trace.ts / 1000.0
        trace.dur = trace.dur / 1000.0
        trace.time_unit_note = "timestamps were nanoseconds; converted to microseconds"
    devices = [str(d.get("name", "")) for d in (doc.deviceProperties or []) if isinstance(d, dict)]
    trace.metadata = {
        "distributedInfo": {k: v for k, v in dist.items() if k != "pg_config"},
        "devices": devices,
        "baseTimeNanoseconds": doc.baseTimeNanoseconds,
    }
    if repaired:
        trace.metadata["repaired_names"] = repaired[0]
    world = dist.get("world_size")
    info = RankInfo(
        path=str(path),
        rank=rank,
        rank_source=rank_source,
        sha256=sha,
        size_bytes=path.stat().st_size,
        n_events=len(trace),
        trace_schema=_schema(trace),
        devices=sorted(set(devices)),
        accelerator=_accelerator(trace, devices),
        world_size=int(world) if isinstance(world, int) else None,
        backend=str(dist["backend"]) if dist.get("backend") else None,
    )
    return trace, info


def rank_of_file(dist: dict, path: Path, rank_hint: int | None = None) -> tuple[int, str]:
    """(rank, where it comes from) of a trace file: distributedInfo.rank, else the rank the caller
    numbered it (rank_hint), else a rank-N file name, else 0."""
    if isinstance(dist.get("rank"), int):
        return int(dist["rank"]), "distributedInfo"
    if rank_hint is not None:
        return rank_hint, "file name"
    if (r := rank_from_name(path)) is not None:
        return r, "file name"
    return 0, "default"


def is_trace_file(p: Path) -> bool:
    n = p.name.lower()
    return p.is_file() and (n.endswith(".json") or n.endswith(".json.gz") or n.endswith(".gz"))


def rank_files(folder: Path, is_trace: Callable[[Path], bool] = is_trace_file) -> list[Path]:
    """The rank trace files of a job folder, sorted: its own files (not subfolders) that ``is_trace``
    accepts, not hidden, not the capture helper's job.json. Every reader of a rank folder (the
    loaders, surgery, the service's upload check) chooses its files here."""
    return sorted(f for f in folder.iterdir() if is_trace(f) and not f.name.startswith(".") and f.name != "job.json")


def no_traces_reason(folder: Path, is_trace: Callable[[Path], bool] = is_trace_file) -> str:
    """Why a folder is no job: it holds no trace files; where its subfolders do (a log folder of one
    subfolder per run, say), which, so that the user picks one."""
    reason = "folder holds no trace files (*.json, *.json.gz)"
    try:
        subs = sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    except OSError:
        return reason
    held = [(d.name, n) for d in subs[:1000] if (n := len(rank_files(d, is_trace)))]
    if not held:
        return reason
    shown = ", ".join(f"{name}: {n} file{'s' if n != 1 else ''}" for name, n in held[:4])
    more = f" and {len(held) - 4} more" if len(held) > 4 else ""
    return f"{reason}; its subfolders do ({shown}{more}): analyse one of them"


_NAME_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".trace.json.gz", ".trace.json", ".json.gz", ".json",
                  ".json.zst", ".gz")


def job_name_of(path: Path) -> str:
    """A job's name from its file or folder: the trace suffixes go, the rest of the name (its dots
    included: ``Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz``) stays."""
    name = path.name if path.name not in ("", "..") else path.resolve().name  # `.`, `..`: the folder's own name
    if path.is_dir():
        return name
    for suffix in _NAME_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def load_job(
    path: str | Path,
    *,
    name: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress_factory: Callable[[Path], Progress | None] | None = None,
) -> Job:
    """Load a single trace file, or a folder of per-rank files analysed as one job.

    In a folder, files that fail to load are skipped and reported; if none loads, InputError.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(str(p), missing_reason(p))
    if p.is_dir():
        files = rank_files(p)
        if not files:
            raise InputError(str(p), no_traces_reason(p))
    else:
        files = [p]
    ranks: list[RankTrace] = []
    infos: list[RankInfo] = []
    skipped: list[SkippedFile] = []
    for f in files:
        try:
            trace, info = load_trace(
                f, max_bytes=max_bytes, progress=progress_factory(f) if progress_factory else None
            )
        except InputError as exc:
            if not p.is_dir():
                raise
            skipped.append(SkippedFile(path=str(f), reason=exc.reason))
            continue
        ranks.append(trace)
        infos.append(info)
    return assemble_job(p, name, ranks, infos, skipped)


# ------------------------------------------------------------------------------------------------
# Streaming load: decompress, hash and decode slice by slice.
#
# A reader thread reads, decompresses and hashes the file (zlib and hashlib release the GIL)
# while this thread cuts the `traceEvents` array into slices of whole events, decodes each slice
# with msgspec and appends it to the columns. Only one slice of JSON and of decoded events is in
# memory at a time, and each slice is still in cache while its columns are built. Every cut is
# checked by the decoder itself: a cut inside a string leaves the slice unterminated and fails
# to decode, so the slices decode exactly as the whole array would. Anything unusual (a bare
# array, duplicate keys, bad JSON, a value that converts differently by slice) returns None and
# load_trace redoes the file with the whole-document path, which also gives the error messages.
# ------------------------------------------------------------------------------------------------

STREAM_SLICE = 1 << 20  # JSON bytes decoded at once
STREAM_READ = STREAM_CHUNK  # decompressed bytes handed over by the reader thread at once
_KEY = b'"traceEvents"'
_END = re.compile(rb"\}[ \t\r\n]*\]")
_OPEN, _CLOSE, _COMMA, _LBRACE = 0x5B, 0x5D, 0x2C, 0x7B
_TOP_FIELDS = ("distributedInfo", "deviceProperties", "schemaVersion", "baseTimeNanoseconds", "displayTimeUnit")


class _Abort(Exception):
    pass


class _Redo(Exception):
    """The compiled reader met an event outside its subset: redo the file with msgspec."""


def _produce(path: Path, max_bytes: int, out: queue.Queue, stop: threading.Event) -> None:
    h = hashlib.sha256()  # of the file as stored (reader.py: a trace's identity)
    item: tuple = (None, None)
    try:
        for data, read in iter_trace_chunks(path, max_bytes=max_bytes, chunk=STREAM_READ, file_hash=h):
            while not stop.is_set():
                try:
                    out.put((data, read), timeout=0.05)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        item = (None, h.hexdigest())
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which falls back
        item = (exc, None)
    while not stop.is_set():
        try:
            out.put(item, timeout=0.05)
            return
        except queue.Full:
            continue




def _add_slice(buf: bytearray, end: int, builder: ColumnBuilder) -> None:
    """Decode buf[0:end+1] as a JSON array of events into the columns; buf[0] is overwritten with
    `[`, buf[end] must be `]`. The events (and the msgspec.Raw values that point into buf) are
    dropped before the view of buf is released."""
    buf[0] = _OPEN
    with memoryview(buf) as mv:
        view = mv[: end + 1]
        try:
            events = EVENTS_DECODER.decode(view)
            builder.add(events)
            del events
        finally:
            view.release()


class _Consumer:
    def __init__(self, path: Path, chunks, progress: Progress | None, fast: bool = False) -> None:
        self.path = path
        self.chunks = chunks
        self.progress = progress
        self.size = path.stat().st_size
        self.fast = fast
        self.builder: ColumnBuilder | fastcols.FastBuilder = (
            fastcols.FastBuilder(0, str(path)) if fast else ColumnBuilder(0, str(path))
        )
        self.sha: str | None = None

    def _next(self) -> bytes | None:
        if self.sha is not None:
            return None  # the stream has ended (asking again would wait for ever)
        data, extra = self.chunks.get()
        if data is None:
            self.sha = extra
            return None
        if isinstance(data, BaseException):
            raise _Abort from data
        if self.progress is not None:
            self.progress(extra, self.size)
        return data

    def run(self) -> tuple[str, RawTrace, RankTrace]:
        buf = bytearray()
        # --- head: everything before the events array
        k = -1
        while True:
            data = self._next()
            if data is None:
                raise _Abort  # no "traceEvents" key (or a bare array): whole-document path
            buf += data
            first = _skip_ws(buf, 0)
            if first < len(buf) and buf[first] != _LBRACE:
                raise _Abort
            if k < 0:
                k = buf.find(_KEY, max(0, len(buf) - len(data) - len(_KEY)))
                if k < 0:
                    if len(buf) > (64 << 20):
                        raise _Abort
                    continue
            j = _skip_ws(buf, k + len(_KEY))
            if j >= len(buf):
                continue
            if buf[j] != 0x3A:  # ':'
                raise _Abort
            j = _skip_ws(buf, j + 1)
            if j >= len(buf):
                continue
            if buf[j] != _OPEN:
                raise _Abort
            try:
                head = TOP_DECODER.decode(bytes(buf[:k]) + b'"traceEvents":[]}')
            except msgspec.MsgspecError:
                raise _Abort from None
            del buf[:j]  # buf[0] is the array's `[`
            break
        if self.fast:
            return self._result(head, self._events_fast(buf))
        # --- events, slice by slice
        lo = 1  # boundaries before this index were searched already (cuts.py)
        while True:
            data = self._next()
            if data is None:
                break
            buf += data
            if len(buf) < STREAM_SLICE:
                continue
            p, c = _cut(buf, len(buf), lo)
            attempts = 0
            searched = len(buf)
            while p > 0:
                saved = buf[p + 1]
                buf[p + 1] = _CLOSE
                try:
                    _add_slice(buf, p + 1, self.builder)
                except msgspec.ValidationError:
                    raise _Abort from None
                except msgspec.DecodeError:  # the cut fell inside a string: try an earlier one
                    buf[p + 1] = saved
                    attempts += 1
                    if attempts > 3:
                        raise _Abort from None
                    p, c = _cut(buf, p, lo)
                    continue
                buf[p + 1] = saved
                del buf[:c]  # buf[0] is the `,` before the next event
                searched = 1
                break
            lo = searched  # no usable boundary: the next search starts after these bytes
            if len(buf) > (256 << 20):
                raise _Abort
        # --- the end: last events, `]`, the keys after the array, `}`. The array's `]` follows the
        # last event's `}`; the first such pair after which the rest decodes as the remaining keys.
        for m in _END.finditer(buf, 1):
            q = m.end() - 1
            tail = bytes(buf[q + 1 :])
            try:
                tail_doc = TOP_DECODER.decode(b'{"traceEvents":[]' + tail)
            except msgspec.MsgspecError:
                continue
            if _KEY in tail:
                raise _Abort
            try:
                _add_slice(buf, q, self.builder)
            except msgspec.MsgspecError:
                raise _Abort from None
            break
        else:
            raise _Abort
        del buf
        return self._result(head, tail_doc)

    def _events_fast(self, buf: bytearray) -> RawTrace:
        """The events through the compiled reader, which finds the array's end itself; then the
        keys after the array."""
        try:
            tail = fastcols.feed_events(self.builder.feed, buf, self._next)
        except fastcols.Unsupported:
            raise _Redo from None
        del buf
        while (data := self._next()) is not None:
            tail += data
            if len(tail) > (256 << 20):
                raise _Abort
        if _KEY in tail:
            raise _Abort
        try:
            tail_doc = TOP_DECODER.decode(b'{"traceEvents":[]' + bytes(tail))
        except msgspec.MsgspecError:
            raise _Abort from None
        return tail_doc

    def _result(self, head: RawTrace, tail_doc: RawTrace) -> tuple[str, RawTrace, RankTrace]:
        for f in _TOP_FIELDS:
            a, b = getattr(head, f), getattr(tail_doc, f)
            if a is not None and b is not None:
                raise _Abort  # the key twice: let the whole-document decoder decide
            if b is not None:
                setattr(head, f, b)
        if self.builder.n == 0 or self.sha is None:
            raise _Abort
        trace = self.builder.finish()
        if trace is None:
            raise _Abort
        return self.sha, head, trace


class _InlineChunks:
    """The reader thread's protocol (`get()` -> (chunk, bytes read) ... (None, sha256)), run in
    this thread: for small files a thread costs more than it overlaps."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self._sha = hashlib.sha256()  # of the file as stored
        self._chunks = iter_trace_chunks(path, max_bytes=max_bytes, chunk=STREAM_READ, file_hash=self._sha)

    def get(self) -> tuple:
        try:
            data, read = next(self._chunks)
        except StopIteration:
            return None, self._sha.hexdigest()
        except Exception as exc:  # noqa: BLE001 - the consumer falls back
            return exc, None
        return data, read


THREAD_MIN_FILE_BYTES = 1 << 20  # smaller files are read in the decoding thread


def stream_trace(
    path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, progress: Progress | None = None, fast: bool | None = None
) -> tuple[str, RawTrace, RankTrace] | None:
    """(sha256 of the file, top-level keys, columns), or None where the whole-document path must decide.

    `fast` (default: where installed) reads the events with the compiled reader; an event outside
    its subset sends the file through msgspec again."""
    if not isinstance(path, Path) or not path.is_file():
        return None
    if fast is None:
        fast = fastcols.available()
    threaded = path.stat().st_size >= THREAD_MIN_FILE_BYTES
    stop = threading.Event()
    if threaded:
        chunks = queue.Queue(maxsize=1)  # the reader outpaces the parser: one chunk ahead is enough (each held chunk is 1 MB of peak memory)
        reader = threading.Thread(target=_produce, args=(path, max_bytes, chunks, stop), daemon=True,
                                  name="zoomer-trace-reader")
    else:
        chunks = _InlineChunks(path, max_bytes)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived objects: generational GC passes would dominate
    if threaded:
        start_thread(reader)
    redo = False
    try:
        return _Consumer(path, chunks, progress, fast).run()
    except _Redo:
        redo = True
    except Exception:  # noqa: BLE001 - anything unexpected: the whole-document path decides
        return None
    finally:
        stop.set()
        if threaded:
            reader.join()
        if gc_was_enabled:
            gc.enable()
    return stream_trace(path, max_bytes=max_bytes, progress=None, fast=False) if redo else None


REBASE_MIN_US = float(1 << 20)  # timestamps below ~1 s are kept as they are


def rebase_times(ranks: list[RankTrace]) -> None:
    """Make each rank's timestamps relative to its own first whole microsecond, and remember that
    base in `RankTrace.ts_base` (absolute time = ts + ts_base).

    Kineto writes epoch microseconds (~1.7e15), where a float64 steps by 0.25 us: `ts + dur` of a
    0.1 us op equals its `ts`, and containment tests (an op inside an optimizer window) fail for
    short ops (tests/test_time_base.py). Subtracting a whole-microsecond base is exact (both are
    multiples of the coarser step), and the sums made afterwards are exact to about 1e-9 us.

    The base is the floor of the rank's earliest complete event's start (else its earliest
    instant's), which the streaming path keeps too. Each rank has its own: a rank's features are a
    function of that rank's trace alone, whichever ranks it is read with, so the streaming path can
    compute them in the process that read the rank (stream/load.py) and get the values a whole job
    read at once gets. Nothing compares raw `ts` across ranks (times across ranks are compared as
    ts + ts_base). A rank already rebased (the streaming path rebases each rank before pruning it)
    keeps its base."""
    for r in ranks:
        if r.ts_base != 0.0 or isinstance(r, RankStub):  # a stub was rebased where it was read
            continue
        first = None
        for ph in (PH_COMPLETE, PH_INSTANT):
            m = r.ph == ph
            m &= np.isfinite(r.ts)
            if m.any():
                first = float(r.ts.min(where=m, initial=np.inf))
                break
        if first is None or abs(first) < REBASE_MIN_US:
            continue
        base = float(np.floor(first))
        if r.ts.dtype == np.float64 and r.ts.flags.writeable:
            np.subtract(r.ts, base, out=r.ts)
        else:
            r.ts = np.asarray(r.ts, dtype=np.float64) - base
        r.ts_base = base


def assemble_job(
    p: Path, name: str | None, ranks: list[RankTrace], infos: list[RankInfo], skipped: list[SkippedFile]
) -> Job:
    """One Job from the loaded ranks of a file or folder (shared by the in-memory and streaming paths).

    In a folder, ranks must be distinct ranks of one run (load/folder.py: which files are the job's ranks)."""
    if not ranks:
        reasons = "; ".join(f"{Path(s.path).name}: {s.reason}" for s in skipped[:3])
        raise InputError(str(p), f"no usable trace in folder ({reasons})")
    ranks, infos = job_ranks(p, ranks, infos, skipped)
    order = sorted(range(len(ranks)), key=lambda i: ranks[i].rank)
    ranks = [ranks[i] for i in order]
    rebase_times(ranks)
    infos = [infos[i] for i in order]
    world = max([i.world_size or 0 for i in infos] + [len(ranks)])
    info = JobInfo(
        name=name or job_name_of(p),
        path=str(p),
        ranks=infos,
        skipped=skipped,
        world_size=world,
    )
    return Job(info=info, ranks=ranks)
