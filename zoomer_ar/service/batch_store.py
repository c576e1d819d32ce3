"""The store a batch records into, and what happens when it is lost mid-batch.

A batch runs for minutes or hours; its store can go away meanwhile: a PostgreSQL server stopped or its database
dropped, a SQLite file another process keeps locked, deleted or replaced. The first such failure marks the store
lost (one line naming it, `lost`); the batch then records nothing more (no trace waits for a dead server or a
locked file again) but goes on analysing and writing the reports, and exits non-zero with that line.

A SQLite file deleted while the batch holds it open is no error to SQLite: the open connection writes on into the
deleted file, and every run would be reported recorded and be gone. The file's identity (device and inode) is
therefore checked before and after each recording.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store.db import StoreError


@dataclass
class BatchStore:
    engine: Any  # sqlalchemy Engine
    name: str  # as messages name it: the SQLite file, or the URL without its password
    path: Path | None = None  # the SQLite file
    identity: tuple[int, int] | None = None  # its (st_dev, st_ino) when the batch opened it
    lost: str | None = None  # the one line saying how the store was lost
    unrecorded: list[str] = field(default_factory=list)  # traces analysed after (or when) it was lost

    @classmethod
    def open(cls, db: str | None) -> BatchStore:
        from ..store.db import open_store, sqlite_path, store_name

        engine = open_store(db)
        path = sqlite_path(engine.url)
        return cls(engine=engine, name=store_name(engine), path=path, identity=_identity(path))

    def check(self) -> None:
        """StoreError when the SQLite file is no longer the one the batch opened (deleted, or replaced)."""
        if self.path is None or self.identity is None:
            return
        now = _identity(self.path)
        if now is None:
            raise StoreError(f"the store file {self.path} was deleted during the batch")
        if now != self.identity:
            raise StoreError(f"the store file {self.path} was replaced by another file during the batch")

    def lose(self, exc: StoreError) -> None:
        """Mark the store lost by `exc` (the first loss is the one said)."""
        if self.lost is None:
            text = str(exc)
            self.lost = text if self.name in text or (self.path is not None and str(self.path) in text) \
                else f"the store {self.name}: {text}"


def is_store_loss(exc: BaseException) -> bool:
    """A failure of the store itself (unreachable, gone, locked, damaged, its file deleted), not of one trace's
    recording: a job of another team (JobTeamConflict) or an analysis the store cannot hold (InputError) is the
    trace's own, and the next trace may be recorded."""
    from ..store.record import JobTeamConflict

    return isinstance(exc, StoreError) and not isinstance(exc, JobTeamConflict)


def _identity(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino
