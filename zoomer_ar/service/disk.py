"""A full disk while an upload is stored: HTTP 507 with the reason, never a 500 or a 400 that blames the upload.

The upload's bytes go to `<data>/jobs/<id>/upload/` as they arrive and archives are extracted into
`<data>/jobs/<id>/input/`; when the filesystem refuses a write for want of space (ENOSPC), a disk
quota (EDQUOT) or a file-size limit on the server process (EFBIG, RLIMIT_FSIZE), the upload is
refused with `DiskFull` and the caller removes what it wrote. A job whose upload fits but whose row the
store cannot take (a SQLite store on the same full disk: "database or disk is full") is refused the same
way (`store_full`), the store's transaction rolled back.
"""

from __future__ import annotations

import errno

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class DiskFull(Exception):
    """The server could not store an upload for want of disk space (HTTP 507); the message says so in one line."""


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def os_reason(exc: OSError) -> str:
    """`exc`'s reason without its paths ("No space left on device"): an OSError's message names the file."""
    return exc.strerror or errno.errorcode.get(exc.errno or 0, "no space left")


def disk_full(what: str, exc: OSError) -> DiskFull:
    """The DiskFull for `exc` (never the server's paths: an OSError's message names them)."""
    reason = os_reason(exc)
    return DiskFull(f"the server cannot store the {what}: {reason} (its disk, or its storage limit, is full); "
                    "nothing of the upload was kept, try again later")


def store_full(doing: str, reason: str) -> DiskFull:
    """The DiskFull of a store write refused for want of space (`reason`: store.db.disk_full_reason, no paths)."""
    return DiskFull(f"the server cannot {doing}: its store could not be written ({reason}; its disk, or its storage "
                    "limit, is full); nothing was kept, try again later")


__all__ = ["DISK_FULL_ERRNOS", "DiskFull", "disk_full", "is_disk_full", "os_reason", "store_full"]
