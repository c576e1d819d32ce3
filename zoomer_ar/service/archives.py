"""Safe extraction of uploaded archives (.tar.gz / .tgz / .tar / .zip).

Every entry is checked before anything of it is written:

- its name: not absolute (`/x`, `C:\\x`, `\\\\host\\x`), no `..` component, no NUL nor other control
  character (a newline, a bidi override: the name reaches the reports), not too long, not twice in the archive
  (the second would silently replace the first);
- its type: regular files and folders only; symbolic links, hard links, devices and FIFOs are refused;
- decompression bombs: the total uncompressed size, the number of entries and the compression
  ratio (uncompressed bytes / archive bytes, for the whole archive and, in zips, per entry) are capped.

Tar archives are read as a stream (`r|*`), so a gzip bomb is stopped at the header that crosses the
cap, before its data is inflated; bytes written are counted against the cap as well. The metadata
headers that tarfile reads whole into memory before it yields the member they describe (GNU long
names and links, pax headers) are checked before they are read: at most 1 MiB each, 16 in a row,
1 MiB of global pax headers in all, their sizes counted against the caps; sparse members (whose
maps tarfile also reads whole) are refused. Zip archives
are checked on their central directory first (its entries counted one header at a time before
zipfile reads it whole, at most 64 MiB of it; declared sizes; `zipfile` never yields more than the
declared size), then extracted with the same counters. Encrypted zip entries are refused.
Extracted files get mode 0644 and folders 0755 whatever the archive says.
"""

from __future__ import annotations

import re
import shutil
import stat
import struct
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .disk import DiskFull, disk_full, is_disk_full
from .names import bad_chars

CHUNK = 1 << 20
MAX_NAME = 1024
MAX_TAR_META = 1 << 20  # one GNU long name / pax header (read whole into memory by tarfile)
MAX_TAR_META_CHAIN = 16  # metadata headers before one member (tarfile reads them recursively)
MAX_TAR_GLOBAL = 1 << 20  # all global pax headers of an archive (tarfile keeps them all)
MAX_ZIP_DIRECTORY = 64 << 20  # a zip's central directory (zipfile reads it whole and builds every entry)
_TAR_META = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
             tarfile.SOLARIS_XHDTYPE)
_DRIVE = re.compile(r"^[A-Za-z]:")


class ArchiveError(ValueError):
    """The archive is refused; the message says which entry and why."""


@dataclass(frozen=True)
class ArchiveLimits:
    max_bytes: int = 8 << 30  # total uncompressed size
    max_entries: int = 20_000
    max_ratio: float = 200.0  # uncompressed / compressed
    ratio_floor: int = 4 << 20  # ratios are only checked past this many uncompressed bytes


@dataclass
class ExtractStats:
    kind: str
    entries: int = 0
    files: int = 0
    bytes: int = 0


def detect_kind(path: Path) -> str | None:
    """'zip', 'tar' (any compression tarfile reads) or None, from the content (never the name)."""
    with open(path, "rb") as fh:
        head = fh.read(512)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head[:2] == b"\x1f\x8b" or head[:3] == b"BZh" or head[:6] == b"\xfd7zXZ\x00":
        return "tar"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return None


def check_name(name: str, what: str) -> PurePosixPath | None:
    """The entry's relative path, or None for the archive root itself; ArchiveError if unsafe."""
    if not name or "\x00" in name:
        raise ArchiveError(f"{what}: an entry has an empty or NUL-containing name")
    bad = bad_chars(name)
    if bad:  # a newline or a bidi override in a rank's name would reach the reports and the job's one-line error
        raise ArchiveError(f"{what}: entry {name!r} has control characters in its name "
                           f"({', '.join(repr(c) for c in bad)})")
    if len(name) > MAX_NAME:
        raise ArchiveError(f"{what}: entry name longer than {MAX_NAME} characters")
    norm = name.replace("\\", "/")
    if norm.startswith("/") or _DRIVE.match(norm):
        raise ArchiveError(f"{what}: entry {name!r} is an absolute path")
    parts = [p for p in norm.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"{what}: entry {name!r} escapes the archive root ('..')")
    if not parts:
        return None
    return PurePosixPath(*parts)


class _Budget:
    def __init__(self, limits: ArchiveLimits, archive_size: int, what: str):
        self.limits, self.archive_size, self.what = limits, max(1, archive_size), what
        self.entries = 0
        self.declared = 0
        self.written = 0

    def entry(self) -> None:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise ArchiveError(f"{self.what}: more than {self.limits.max_entries:,} entries")

    def declare(self, size: int, name: str) -> None:
        self.declared += max(0, size)
        self._check(self.declared, name)

    def write(self, n: int, name: str) -> None:
        self.written += n
        self._check(self.written, name)

    def _check(self, total: int, name: str) -> None:
        lim = self.limits
        if total > lim.max_bytes:
            raise ArchiveError(f"{self.what}: uncompressed size exceeds {lim.max_bytes:,} bytes (at entry {name!r}); "
                               "refused as a decompression bomb")
        if total > lim.ratio_floor and total / self.archive_size > lim.max_ratio:
            raise ArchiveError(f"{self.what}: compression ratio above {lim.max_ratio:g}:1 (at entry {name!r}); "
                               "refused as a decompression bomb")


def _target(dest: Path, rel: PurePosixPath, what: str) -> Path:
    out = dest.joinpath(*rel.parts)
    root = dest.resolve()
    try:
        resolved = out.resolve()
    except OSError as exc:
        raise _unwritable(what, rel.as_posix(), exc) from None
    if resolved != root and root not in resolved.parents:
        raise ArchiveError(f"{what}: entry {rel.as_posix()!r} resolves outside the archive root")
    return out


def _unwritable(what: str, name: str, exc: OSError) -> ArchiveError | DiskFull:
    """The server's filesystem refused an entry (a name too long for it...): the entry and the reason, never the
    server's path (an OSError's message names it). A full disk is the server's problem, not the archive's: DiskFull."""
    if is_disk_full(exc):
        return disk_full(what, exc)
    return ArchiveError(f"{what}: entry {name!r} cannot be written on the server "
                        f"({exc.strerror or type(exc).__name__})")


def _copy(src, out: Path, budget: _Budget, name: str, limit: int | None = None) -> int:
    n = 0
    try:
        if out.is_dir():
            raise ArchiveError(f"{budget.what}: entry {name!r} is both a folder and a file")
        if out.exists() or out.is_symlink():  # the second would replace the first: which of the two is meant?
            raise ArchiveError(f"{budget.what}: entry {name!r} is in the archive twice")
        fh = open(out, "wb")  # noqa: SIM115 - closed below; an OSError here is the entry's, not the archive's
    except OSError as exc:
        raise _unwritable(budget.what, name, exc) from None
    try:
        with fh:
            while True:
                chunk = src.read(CHUNK)
                if not chunk:
                    break
                n += len(chunk)
                if limit is not None and n > limit:
                    raise ArchiveError(f"{budget.what}: entry {name!r} holds more data than it declares")
                budget.write(len(chunk), name)
                fh.write(chunk)
    except OSError as exc:
        if is_disk_full(exc):  # a write, not the archive's read: the server's disk, not a bad archive
            raise disk_full(budget.what, exc) from None
        raise
    out.chmod(0o644)
    return n


def _mkdirs(dest: Path, rel: PurePosixPath, what: str) -> Path:
    d = _target(dest, rel, what)
    try:
        if d.exists() and not d.is_dir():
            raise ArchiveError(f"{what}: entry {rel.as_posix()!r} is both a file and a folder")
        d.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as exc:
        raise _unwritable(what, rel.as_posix(), exc) from None
    return d


def _checked_tarinfo(budget: _Budget) -> type[tarfile.TarInfo]:
    """A TarInfo class that checks each header before tarfile reads what it announces.

    tarfile reads a GNU long name or a pax header whole into memory (and then the next header,
    recursively) before it yields the member: a 1 MB .tar.gz announcing a 2 GiB long name made the
    server allocate 2 GiB, and 5,000 chained long names overflowed the stack (HTTP 500).
    """
    what = budget.what
    state = {"chain": 0, "global": 0}

    class CheckedTarInfo(tarfile.TarInfo):
        def _proc_member(self, tf):  # noqa: ANN001, ANN202 - tarfile's hook
            if self.type in _TAR_META:
                if self.size > MAX_TAR_META:
                    raise ArchiveError(f"{what}: a tar metadata header (long name or pax header) of {self.size:,} "
                                       f"bytes; at most {MAX_TAR_META:,} are read")
                state["chain"] += 1
                if state["chain"] > MAX_TAR_META_CHAIN:
                    raise ArchiveError(f"{what}: more than {MAX_TAR_META_CHAIN} tar metadata headers "
                                       "(long names, pax headers) in a row")
                if self.type == tarfile.XGLTYPE:
                    state["global"] += self.size
                    if state["global"] > MAX_TAR_GLOBAL:
                        raise ArchiveError(f"{what}: more than {MAX_TAR_GLOBAL:,} bytes of global pax headers")
                budget.declare(self.size, "(tar metadata header)")
            elif self.type == tarfile.GNUTYPE_SPARSE:
                raise ArchiveError(f"{what}: entry {self.name!r} is a sparse file; not allowed")
            else:
                state["chain"] = 0
            return super()._proc_member(tf)

        def _sparse(self, next_: tarfile.TarInfo) -> None:
            raise ArchiveError(f"{what}: entry {next_.name!r} is a sparse file; not allowed")

        def _proc_gnusparse_00(self, next_, *_args):  # noqa: ANN001, ANN202
            self._sparse(next_)

        def _proc_gnusparse_01(self, next_, *_args):  # noqa: ANN001, ANN202
            self._sparse(next_)

        def _proc_gnusparse_10(self, next_, *_args):  # noqa: ANN001, ANN202
            self._sparse(next_)

    return CheckedTarInfo


def _extract_tar(path: Path, dest: Path, limits: ArchiveLimits, what: str) -> ExtractStats:
    stats = ExtractStats(kind="tar")
    budget = _Budget(limits, path.stat().st_size, what)
    try:
        with tarfile.open(path, mode="r|*", tarinfo=_checked_tarinfo(budget)) as tf:
            for member in tf:
                budget.entry()
                rel = check_name(member.name, what)
                if member.issym() or member.islnk():
                    raise ArchiveError(f"{what}: entry {member.name!r} is a {'symbolic' if member.issym() else 'hard'} "
                                       "link; links are not allowed")
                if not (member.isfile() or member.isdir()):
                    raise ArchiveError(f"{what}: entry {member.name!r} is a special file (device, FIFO...); not allowed")
                if rel is None:
                    continue
                if member.isdir():
                    _mkdirs(dest, rel, what)
                    continue
                budget.declare(member.size, member.name)
                if rel.parent != PurePosixPath("."):
                    _mkdirs(dest, rel.parent, what)
                out = _target(dest, rel, what)
                src = tf.extractfile(member)
                if src is None:  # pragma: no cover - isfile() members always have data
                    continue
                stats.bytes += _copy(src, out, budget, member.name, limit=member.size)
                stats.files += 1
    except ArchiveError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ArchiveError(f"{what}: not a readable tar archive ({type(exc).__name__}: {exc})") from None
    stats.entries = budget.entries
    return stats


def _zip_is_link(info: zipfile.ZipInfo) -> bool:
    mode = info.external_attr >> 16
    return info.create_system == 3 and stat.S_ISLNK(mode)


def _zip_is_special(info: zipfile.ZipInfo) -> bool:
    kind = stat.S_IFMT(info.external_attr >> 16)
    if info.create_system != 3 or kind == 0:  # no file type recorded: a regular file (or a folder by its name)
        return False
    return kind not in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK)


def _check_zip_directory(path: Path, limits: ArchiveLimits, what: str) -> None:
    """Count the central directory's entries (reading one header at a time) before zipfile reads it.

    zipfile reads the whole central directory and builds an object per entry before the entry cap
    can be checked: 47 MB of minimal entries (the end record may declare just one) took 370 MB.
    Archives zipfile cannot read are left to it (it says why).
    """
    with open(path, "rb") as fp:
        end = zipfile._EndRecData(fp)  # noqa: SLF001 - zipfile's own reader of the end record
        if end is None:
            return
        size_cd, offset_cd = end[zipfile._ECD_SIZE], end[zipfile._ECD_OFFSET]  # noqa: SLF001
        if size_cd > MAX_ZIP_DIRECTORY:
            raise ArchiveError(f"{what}: zip central directory of {size_cd:,} bytes (at most {MAX_ZIP_DIRECTORY:,})")
        start = end[zipfile._ECD_LOCATION] - size_cd  # noqa: SLF001 - as zipfile locates it
        if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:  # noqa: SLF001
            start -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
        if start < 0 or offset_cd < 0:
            return
        fp.seek(start)
        entries = pos = 0
        while pos < size_cd:
            head = fp.read(zipfile.sizeCentralDir)
            if len(head) != zipfile.sizeCentralDir or head[:4] != zipfile.stringCentralDir:
                return
            more = sum(struct.unpack("<3H", head[28:34]))  # name, extra field, comment
            fp.seek(more, 1)
            pos += zipfile.sizeCentralDir + more
            entries += 1
            if entries > limits.max_entries:
                raise ArchiveError(f"{what}: more than {limits.max_entries:,} entries")


def _extract_zip(path: Path, dest: Path, limits: ArchiveLimits, what: str) -> ExtractStats:
    stats = ExtractStats(kind="zip")
    budget = _Budget(limits, path.stat().st_size, what)
    try:
        _check_zip_directory(path, limits, what)
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            checked: list[tuple[zipfile.ZipInfo, PurePosixPath | None]] = []
            # the whole central directory first: nothing is written from a refused archive
            for info in infos:
                budget.entry()
                rel = check_name(info.filename, what)
                if _zip_is_link(info):
                    raise ArchiveError(f"{what}: entry {info.filename!r} is a symbolic link; links are not allowed")
                if _zip_is_special(info):
                    raise ArchiveError(f"{what}: entry {info.filename!r} is a special file; not allowed")
                if info.flag_bits & 0x1:
                    raise ArchiveError(f"{what}: entry {info.filename!r} is encrypted")
                if not info.is_dir():
                    budget.declare(info.file_size, info.filename)
                    if (info.file_size > limits.ratio_floor
                            and info.file_size / max(1, info.compress_size) > limits.max_ratio):
                        raise ArchiveError(f"{what}: entry {info.filename!r} has a compression ratio above "
                                           f"{limits.max_ratio:g}:1; refused as a decompression bomb")
                checked.append((info, rel))
            for info, rel in checked:
                if rel is None:
                    continue
                if info.is_dir():
                    _mkdirs(dest, rel, what)
                    continue
                if rel.parent != PurePosixPath("."):
                    _mkdirs(dest, rel.parent, what)
                out = _target(dest, rel, what)
                with zf.open(info) as src:
                    stats.bytes += _copy(src, out, budget, info.filename, limit=info.file_size)
                stats.files += 1
    except ArchiveError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError) as exc:
        raise ArchiveError(f"{what}: not a readable zip archive ({type(exc).__name__}: {exc})") from None
    stats.entries = budget.entries
    return stats


def safe_extract(archive: Path, dest: Path, limits: ArchiveLimits | None = None, *, what: str = "archive") -> ExtractStats:
    """Extract `archive` into the (new or empty) folder `dest`; on refusal `dest` is removed and ArchiveError raised."""
    limits = limits or ArchiveLimits()
    kind = detect_kind(archive)
    if kind is None:
        raise ArchiveError(f"{what}: not a .tar.gz, .tgz, .tar or .zip archive")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "zip":
            return _extract_zip(archive, dest, limits, what)
        return _extract_tar(archive, dest, limits, what)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def single_root(folder: Path) -> Path:
    """The archive's only top-level folder when it has nothing else at the top, else `folder` itself."""
    entries = [p for p in folder.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return folder
