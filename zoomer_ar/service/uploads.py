"""Streamed multipart uploads: each file part goes straight to disk as it arrives; nothing is held whole in memory.

`MultipartReceiver` is fed the request body chunk by chunk (python-multipart's incremental
parser). File fields (`trace`, `ranks`, `source`) are written to `<job>/upload/<field>`; text fields
(the job metadata) are kept, up to 64 KiB each. The caller counts the body against the size cap.
`prepare_inputs` then turns the received files into the job's input folder: the trace moved into
`input/trace/`, the archives extracted (zoomer_ar.service.archives: every entry checked) into
`input/ranks/` and `input/source/`. A write the disk refuses for want of space raises DiskFull (HTTP 507).

Each upload keeps two names: the file on disk gets a safe one (`safe_filename`: ASCII letters, digits,
`._-`), while the job's parameters keep the name the client sent (`client_filename`: its last path
component, unprintable characters as `_`), which is what the job's name, its reports and the store
show (client_paths). A trace's content decides how it is read (gzip or not), never its name.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from .archives import ArchiveError, ArchiveLimits, safe_extract, single_root
from .disk import DiskFull, disk_full, is_disk_full
from .names import bad_chars

FILE_FIELDS = ("trace", "ranks", "source")
TEXT_FIELDS = ("name", "job", "owner", "gpus", "gpu_hours", "gpu_hour_cost", "week", "record")
MAX_TEXT = 64 << 10
TRACE_SUFFIXES = (".json", ".json.gz", ".gz")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class UploadError(ValueError):
    """The upload is malformed or incomplete (HTTP 400); the message says why."""


def safe_filename(name: str | None, default: str) -> str:
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = _UNSAFE.sub("_", base).lstrip(".")[:120]
    return base or default


def client_filename(name: str | None, default: str) -> str:
    """The upload's file name as the client sent it, for what the client is shown: its last path component
    (a browser may send `C:\\x\\t.json`), unprintable characters as '_', at most 200 characters; `default`
    when nothing is left."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    bad = set(bad_chars(base))
    base = "".join("_" if ch in bad else ch for ch in base).strip()[:200].strip()
    return default if base in ("", ".", "..") else base


@dataclass
class ReceivedFile:
    field: str
    filename: str
    path: Path
    size: int = 0


@dataclass
class _Part:
    name: str | None = None
    filename: str | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    text: bytearray | None = None
    fh: object | None = None
    file: ReceivedFile | None = None


class MultipartReceiver:
    def __init__(self, content_type: str, upload_dir: Path):
        ctype, params = parse_options_header(content_type)
        if ctype != b"multipart/form-data":
            raise UploadError("the body must be multipart/form-data")
        boundary = params.get(b"boundary")
        if not boundary:
            raise UploadError("multipart/form-data without a boundary")
        self.dir = upload_dir
        self.files: dict[str, ReceivedFile] = {}
        self.fields: dict[str, str] = {}
        self._part = _Part()
        self._hname = b""
        self._hvalue = b""
        self._ended = False
        try:
            self._parser = self._make_parser(boundary)
        except FormParserError as exc:  # e.g. a boundary over 256 bytes (RFC 2046 allows 70)
            raise UploadError(f"malformed multipart/form-data boundary: {exc}") from None

    def _make_parser(self, boundary: bytes) -> MultipartParser:
        return MultipartParser(boundary, {
            "on_part_begin": self._on_part_begin,
            "on_part_data": self._on_part_data,
            "on_part_end": self._on_part_end,
            "on_header_field": self._on_header_field,
            "on_header_value": self._on_header_value,
            "on_header_end": self._on_header_end,
            "on_headers_finished": self._on_headers_finished,
            "on_end": self._on_end,
        })

    # --- parser callbacks ---------------------------------------------------------------------

    def _on_part_begin(self) -> None:
        self._part = _Part()

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._hname += data[start:end]
        if len(self._hname) > 1024:
            raise UploadError("multipart header name too long")

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._hvalue += data[start:end]
        if len(self._hvalue) > 8192:
            raise UploadError("multipart header value too long")

    def _on_header_end(self) -> None:
        self._part.headers.append((self._hname.lower(), self._hvalue))
        self._hname, self._hvalue = b"", b""

    def _on_headers_finished(self) -> None:
        disp = next((v for k, v in self._part.headers if k == b"content-disposition"), None)
        if disp is None:
            raise UploadError("a multipart part has no Content-Disposition header")
        _kind, opts = parse_options_header(disp)
        raw_name = opts.get(b"name")
        if raw_name is None:
            raise UploadError("a multipart part has no field name")
        name = raw_name.decode("utf-8", "replace")
        if name not in FILE_FIELDS and name not in TEXT_FIELDS:
            raise UploadError(f"unknown form field {name!r} (files: {', '.join(FILE_FIELDS)}; "
                              f"fields: {', '.join(TEXT_FIELDS)})")
        if name in self.files or name in self.fields:
            raise UploadError(f"form field {name!r} given twice")
        self._part.name = name
        if name in FILE_FIELDS:
            fn = opts.get(b"filename")
            filename = fn.decode("utf-8", "replace") if fn is not None else name
            self.dir.mkdir(parents=True, exist_ok=True)
            rf = ReceivedFile(field=name, filename=filename, path=self.dir / name)
            self._part.file = rf
            self._part.fh = open(rf.path, "wb")  # noqa: SIM115 - closed in _on_part_end / close()
            self.files[name] = rf
        else:
            self._part.text = bytearray()

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        p = self._part
        if p.file is not None:
            p.fh.write(data[start:end])  # type: ignore[union-attr]
            p.file.size += end - start
        elif p.text is not None:
            if len(p.text) + (end - start) > MAX_TEXT:
                raise UploadError(f"form field {p.name!r} longer than {MAX_TEXT:,} bytes")
            p.text.extend(data[start:end])

    def _on_part_end(self) -> None:
        p = self._part
        if p.fh is not None:
            p.fh.close()  # type: ignore[union-attr]
            p.fh = None
        elif p.text is not None and p.name:
            try:
                self.fields[p.name] = p.text.decode("utf-8")
            except UnicodeDecodeError:
                raise UploadError(f"form field {p.name!r} is not UTF-8 text") from None

    def _on_end(self) -> None:
        self._ended = True

    # --- API ----------------------------------------------------------------------------------

    def feed(self, chunk: bytes) -> None:
        """UploadError for a malformed body; DiskFull when the disk refuses the file parts' bytes."""
        try:
            self._parser.write(chunk)
        except FormParserError as exc:
            raise UploadError(f"malformed multipart body: {exc}") from None
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full("upload", exc) from None
            raise

    def finish(self) -> tuple[dict[str, ReceivedFile], dict[str, str]]:
        try:
            self._parser.finalize()
        except FormParserError as exc:
            raise UploadError(f"malformed multipart body: {exc}") from None
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full("upload", exc) from None
            raise
        self.close()
        if not self._ended:
            raise UploadError("incomplete multipart body (no closing boundary)")
        return self.files, self.fields

    def close(self) -> None:
        """Close the part being written (an upload refused or abandoned: its files are removed, so an error
        flushing them, a full disk, is of no consequence)."""
        if self._part.fh is not None:
            try:
                self._part.fh.close()  # type: ignore[union-attr]
            except OSError:
                pass
            finally:
                self._part.fh = None


def _gzip_of_json(path: Path) -> bool:
    """A bare `.gz` counts as a trace only when it is gzip whose content starts like JSON (`{` or `[`):
    an `inner.tar.gz` (a nested archive) does not."""
    import gzip
    import zlib

    try:
        with gzip.open(path, "rb") as fh:
            head = fh.read(4096)
    except (OSError, EOFError, zlib.error):
        return False
    return head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"[")


def _single_trace(path: Path) -> bool:
    """Whether a rank-archive upload is a trace instead (JSON, or gzip of JSON, not a tar): what the client meant
    as the field 'trace'."""
    from .archives import detect_kind

    with open(path, "rb") as fh:
        head = fh.read(4096)
    if head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"["):
        return detect_kind(path) is None
    if head[:2] != b"\x1f\x8b" or not _gzip_of_json(path):
        return False
    import gzip

    with gzip.open(path, "rb") as fh:
        inner = fh.read(512)
    return inner[257:262] != b"ustar"  # a tar whose first entry's name starts with '{' is still a tar


def _readable(p: Path) -> bool:
    name = p.name.lower()
    return p.is_file() and (name.endswith((".json", ".json.gz")) or (name.endswith(".gz") and _gzip_of_json(p)))


def _has_trace_files(root: Path) -> bool:
    """Whether the folder the worker will load holds a file it reads as a rank trace.

    The loader's choice of files (zoomer_ar.load.job.rank_files), named `*.json` or `*.json.gz`,
    or `*.gz` when that is gzip of JSON (_gzip_of_json).
    """
    from ..load.job import rank_files

    return bool(rank_files(root, _readable))


def _no_trace_files(root: Path) -> str:
    """The 400 of a rank archive without rank files where the worker looks; where subfolders of that folder
    hold some (an archive of several runs), which, so that the client uploads them one by one."""
    from ..load.job import rank_files

    subs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    held = [(d.name, n) for d in subs[:1000] if (n := len(rank_files(d, _readable)))]
    if not held:
        return ("rank archive: no trace files in it (rank files *.json, *.json.gz, or *.gz holding JSON, at its top "
                "level or in its single top folder; nested archives are not opened)")
    shown = ", ".join(f"{name}: {n} file{'s' if n != 1 else ''}" for name, n in held[:4])
    more = f" and {len(held) - 4} more" if len(held) > 4 else ""
    return (f"rank archive: no trace files at its top level or in its single top folder, but its subfolders hold "
            f"some ({shown}{more}): one archive is one run; upload each of them as its own archive")


def _stem(filename: str) -> str:
    name = client_filename(filename, "job")
    for suffix in (".tar.gz", ".tgz", ".zip", ".tar", ".json.gz", ".json", ".gz"):
        if name.endswith(suffix):
            return name[: -len(suffix)] or "job"
    return name


def prepare_inputs(job_dir: Path, files: dict[str, ReceivedFile], limits: ArchiveLimits) -> dict:
    """Move/extract the received files into `job_dir/input`; returns the job parameters that locate them.

    Raises UploadError / ArchiveError (HTTP 400) with a message naming the field and the problem, DiskFull
    (HTTP 507) when the disk refuses a write; the caller removes `job_dir`.
    """
    try:
        return _prepare_inputs(job_dir, files, limits)
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full("upload", exc) from None
        raise


def _prepare_inputs(job_dir: Path, files: dict[str, ReceivedFile], limits: ArchiveLimits) -> dict:
    if "trace" in files and "ranks" in files:
        raise UploadError("send a trace file (field 'trace') or a rank archive (field 'ranks'), not both")
    if "trace" not in files and "ranks" not in files:
        raise UploadError("a trace file (field 'trace') or a rank archive (field 'ranks', .tar.gz or .zip) is required")
    for rf in files.values():
        if rf.size == 0:
            raise UploadError(f"{rf.field}: the uploaded file is empty")
    inp = job_dir / "input"
    inp.mkdir(parents=True, exist_ok=True)
    params: dict = {"uploads": {k: {"filename": client_filename(v.filename, k), "bytes": v.size}
                                for k, v in files.items()}}
    if "trace" in files:
        rf = files["trace"]
        name = safe_filename(rf.filename, "trace.json")
        if not name.endswith(TRACE_SUFFIXES):
            with open(rf.path, "rb") as fh:
                gz = fh.read(2) == b"\x1f\x8b"
            name = "trace.json.gz" if gz else "trace.json"
        (inp / "trace").mkdir()
        shutil.move(str(rf.path), inp / "trace" / name)
        # the job is named from the client's file name, as `analyze <file>` names it (the trace suffixes go);
        # a path under input/trace/ other than the file is never a folder (job_name_of looks)
        from ..load.job import job_name_of

        shown = params["uploads"]["trace"]["filename"]
        params.update(input="trace", path=f"trace/{name}", default_name=job_name_of(inp / "trace" / shown))
    else:
        rf = files["ranks"]
        dest = inp / "ranks"
        if _single_trace(rf.path):
            raise UploadError("rank archive: this is a single trace file (JSON), not an archive of rank files: "
                              "send it as the field 'trace'")
        safe_extract(rf.path, dest, limits, what="rank archive")
        root = single_root(dest)
        if not _has_trace_files(root):
            raise UploadError(_no_trace_files(root))
        params.update(input="ranks", path=root.relative_to(inp).as_posix(),
                      default_name=root.name if root != dest else _stem(rf.filename))
    if "source" in files:
        rf = files["source"]
        dest = inp / "source"
        safe_extract(rf.path, dest, limits, what="source archive")
        if not any(p.is_file() and p.suffix == ".py" for p in dest.rglob("*")):
            raise UploadError("source archive: no Python (.py) files in it")
        params["source"] = "source"
    shutil.rmtree(job_dir / "upload", ignore_errors=True)
    params["input_bytes"] = _folder_bytes(inp)  # what the job holds on disk until it is done (team quota)
    return params


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


__all__ = ["ArchiveError", "DiskFull", "MultipartReceiver", "ReceivedFile", "UploadError", "prepare_inputs", "safe_filename"]
