"""The capture helper's temporary files: written beside their destination under a hidden name that
says who writes them, held locked while in use, and swept by a later capture once their writer is gone.

A capture killed mid-export (SIGKILL, the OOM killer, a node lost) leaves its temporary behind: the
uncompressed export of a GPU trace runs to gigabytes. A temporary is named
``.{destination}.zoomer-{pid}@{host}.{random}{suffix}`` and its writer holds an exclusive ``flock``
on it from creation to removal (the kernel drops the lock when the process dies, however it dies).
:func:`remove_stale` removes this naming's temporaries, and the fixed names earlier versions used
(``.{destination}.{random}.json.tmp``, ``{destination}.tmp``), only when their writer is gone (nobody
holds the lock, and a writer named on this host is no longer running) and they are old: a minute
(:data:`DEAD_WRITER_AFTER_S`) when this host's process that wrote it is gone, else
:data:`STALE_AFTER_S` (another host's writer, or an earlier version's, is known by its lock alone).
A temporary whose writer cannot be told gone (the lock cannot be taken or tested, a process of that
id runs) is left as it is.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; an open file cannot be removed there anyway
    fcntl = None  # type: ignore[assignment]

__all__ = ["STALE_AFTER_S", "held_temp", "remove_stale", "writer_gone"]

#: a temporary younger than this is never swept, whatever its lock says (a writer of an earlier
#: version held none; a file system may not support locks across hosts)
STALE_AFTER_S = 6 * 3600
#: ... unless its name says this host's process wrote it and that process is gone (and the lock is free):
#: then a minute is old enough, so a run restarted after an OOM kill gets its room back at once
DEAD_WRITER_AFTER_S = 60

_SUFFIXES = (".json.tmp", ".gz.tmp")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64] or "host"


def _prefix(dst: Path) -> str:
    return f".{dst.name}.zoomer-{os.getpid()}@{_host()}."


def _create(dst: Path, suffix: str) -> tuple[int, Path]:
    """A new file beside dst, created with the mode a plain open() gives (0666 less the umask): it is
    renamed into the trace or job file, which others (a shared folder, the service) must read as
    before (tempfile.mkstemp's 0600 would carry over)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = dst.parent / f"{_prefix(dst)}{secrets.token_hex(4)}{suffix}"
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"{dst.parent}: no free temporary name for {dst.name}")  # pragma: no cover


@contextlib.contextmanager
def held_temp(dst: Path, suffix: str) -> Iterator[Path]:
    """A new empty temporary beside ``dst``, locked while the block runs and removed after it on
    every path (an exception, Ctrl-C)."""
    if suffix not in _SUFFIXES:
        raise ValueError(f"suffix must be one of {_SUFFIXES}, not {suffix!r}")
    fd, path = _create(dst, suffix)
    try:
        if fcntl is not None:
            with contextlib.suppress(OSError):  # a file system without locks: the name and the age still guard it
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)


def _temp_pattern(dst_name: str) -> re.Pattern[str]:
    d = re.escape(dst_name)
    return re.compile(
        rf"^(?:\.{d}\.zoomer-(?P<pid>\d+)@(?P<host>[A-Za-z0-9._-]+)\.[0-9a-f]{{8}}(?:\.json|\.gz)\.tmp"
        rf"|\.{d}\.[A-Za-z0-9_]{{8}}\.json\.tmp"  # earlier versions' export: .rank-0.pt.trace.json.gz.ab12cd34.json.tmp
        rf"|{d}\.tmp)$"  # earlier versions' gzip and job file: rank-0.pt.trace.json.gz.tmp, job.json.tmp
    )


def _pid_running(pid: int) -> bool:
    """Whether a process of that id runs here; True when it cannot be told. Windows has no signal 0
    (os.kill terminates the process there), so nothing is asked and every writer counts as running."""
    if os.name == "nt":  # pragma: no cover
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):  # another user's process (or a pid no kernel has): unknown
        return True
    return True


def writer_gone(path: Path, pid: int | None = None, host: str | None = None) -> bool:
    """True when no process holds ``path``'s lock and, when its name says it was written on this host
    by ``pid``, that process is no longer running. False whenever that cannot be told."""
    if pid is not None and host == _host() and (pid == os.getpid() or _pid_running(pid)):
        return False
    if fcntl is None:  # pragma: no cover - Windows: no lock to test, no pid to ask: kept
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the writer's own lock, held until it exits
    except OSError:
        return False  # held by its writer (EWOULDBLOCK), or locks cannot be tested here
    finally:
        os.close(fd)  # closing drops the lock taken just now
    return True


def remove_stale(folder: Path, dst_names: list[str], *, now: float | None = None,
                 stale_after_s: float = STALE_AFTER_S, dead_writer_after_s: float = DEAD_WRITER_AFTER_S) -> list[Path]:
    """Remove the temporaries in ``folder`` of the destinations ``dst_names`` (this naming and earlier
    versions') whose writer is gone, once older than ``stale_after_s`` (``dead_writer_after_s`` for one
    named for this host's process that no longer runs); returns those removed."""
    now = time.time() if now is None else now
    patterns = [_temp_pattern(n) for n in dst_names]
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = next((m for m in (p.match(entry.name) for p in patterns) if m), None)
        if match is None:
            continue
        pid = int(match["pid"]) if match["pid"] else None
        mine = pid is not None and match["host"] == _host()  # writer_gone asks whether that pid still runs
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
            if not entry.is_file(follow_symlinks=False) or age < (dead_writer_after_s if mine else stale_after_s):
                continue
        except OSError:
            continue
        path = Path(entry.path)
        if writer_gone(path, pid, match["host"]):
            try:
                path.unlink()
            except OSError:
                continue
            removed.append(path)
    return removed
