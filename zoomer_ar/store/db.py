"""Connecting to the store: URL resolution, engines tuned for concurrent recorders, retries, migrations.

- Embedded default: SQLite at `<user data folder>/zoomer-ar/zoomer.db` (Linux: $XDG_DATA_HOME or
  ~/.local/share; macOS: ~/Library/Application Support; Windows: %LOCALAPPDATA%).
- `--db` or `ZOOMER_DB`: a SQLAlchemy URL (`postgresql://user@host/db`, `sqlite:///path`) or a file path.

SQLite runs in WAL mode with a busy timeout; writers take the write lock up front
(`BEGIN IMMEDIATE`) so two recorders never deadlock on a read-to-write upgrade, and transient
"database is locked" errors are retried. PostgreSQL writers rely on unique constraints with
`ON CONFLICT` and retry serialization failures and deadlocks.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DatabaseError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session

from ..errors import InputError, ZoomerError

T = TypeVar("T")
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 60.0
PG_MIGRATION_LOCK = 7_264_913_001  # pg_advisory_xact_lock key: one migrator at a time
_TRANSIENT_PG_CODES = {"40001", "40P01", "55P03", "57P03", "08006", "08001", "53300"}

_engines: dict[str, Engine] = {}
_migrated: set[str] = set()
_lock = threading.Lock()


class StoreError(ZoomerError):
    """The store cannot be reached or used."""

    exit_code = 1


class NotAStoreError(InputError, StoreError):
    """`--db` names a file that is not a SQLite database (or a folder): bad input, exit 2, one line naming it."""

    exit_code = 2


class NewerStoreError(InputError, StoreError):
    """The store's schema is at a revision this version's migrations do not know (a newer zoomer-ar migrated
    it): it cannot be read or written as this version's schema, nor migrated back. Exit 2, one line."""

    exit_code = 2


class StoreFullError(StoreError):
    """The store could not be written for want of space: its disk (or, for SQLite, this process's file-size limit,
    RLIMIT_FSIZE) is full. `reason` says what the database reported, in a few words and no paths."""

    def __init__(self, message: str, reason: str):
        self.reason = reason
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.reason))


class BadStoreURLError(InputError, StoreError):
    """`--db` (or ZOOMER_DB) is not a URL SQLAlchemy can parse or has no dialect for: bad input, exit 2."""

    exit_code = 2


def parse_url(db: str | None = None):  # noqa: ANN201 - sqlalchemy URL
    """resolve_url(db) parsed; BadStoreURLError (one line naming it) when it cannot be."""
    from sqlalchemy.exc import ArgumentError

    raw = resolve_url(db)
    try:
        url = make_url(raw)
        dialect = url.get_dialect()  # an unknown dialect or driver name ("foo://", "sqlite+foo://")
    except ArgumentError as exc:
        raise BadStoreURLError(redact_raw(db or raw), f"not a usable store URL ({exc})") from None
    except ValueError as exc:  # a port that is not a number ("postgresql://h:x/db")
        raise BadStoreURLError(redact_raw(db or raw), f"not a usable store URL ({exc})") from None
    backend = url.get_backend_name()
    if backend not in SUPPORTED_BACKENDS:  # the schema and the writers' upserts are SQLite's and PostgreSQL's
        raise BadStoreURLError(redact_raw(db or raw), f"{backend} is not supported: the store runs on SQLite or "
                                                      "PostgreSQL (postgresql://user@host/db, sqlite:///path, or a file path)")
    if getattr(dialect, "is_async", False):
        raise BadStoreURLError(redact_raw(db or raw), f"the {url.get_driver_name()} driver is asynchronous; use "
                                                      "postgresql://user@host/db, which uses psycopg 3")
    return url


SUPPORTED_BACKENDS = ("sqlite", "postgresql")


def missing_driver_hint(url) -> str:  # noqa: ANN001 - sqlalchemy URL
    """What to install when the DB-API module of `url`'s driver is missing."""
    driver = url.get_driver_name()
    if driver == "psycopg":
        return "install psycopg[binary]"
    return f"install the {driver} driver, or use postgresql://user@host/db, which uses psycopg 3"


def redact_raw(text: str) -> str:
    """A URL that may not parse, with what follows "user:" up to "@" hidden (for messages)."""
    import re

    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", text)


SQLITE_MAGIC = b"SQLite format 3\x00"


def check_sqlite_file(path: str | Path) -> None:
    """NotAStoreError when `path` exists but cannot be a SQLite store (a folder, a device or FIFO, or a non-empty
    file without the SQLite header). A missing or empty file is fine: SQLite creates the database there."""
    p = Path(path)
    if p.is_dir():
        raise NotAStoreError(str(p), "is a folder, not a SQLite store file")
    if p.exists() and not p.is_file():  # reading a FIFO's header would wait for a writer for ever
        raise NotAStoreError(str(p), "is not a regular file (a device, a FIFO or a socket), not a SQLite store file")
    try:
        with open(p, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise NotAStoreError(str(p), f"cannot read the store file ({exc.strerror or exc})") from None
    if head and head != SQLITE_MAGIC:
        raise NotAStoreError(str(p), "not a SQLite database (the file exists but is not a Zoomer AR store)")


def user_data_dir() -> Path:
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "zoomer-ar"


def default_url() -> str:
    return "sqlite:///" + str(user_data_dir() / "zoomer.db")


def resolve_url(db: str | None = None) -> str:
    """`--db`, else ZOOMER_DB, else the embedded SQLite file; plain paths become SQLite URLs."""
    raw = db or os.environ.get("ZOOMER_DB") or default_url()
    if "://" not in raw:
        return "sqlite:///" + str(Path(raw).expanduser().resolve())
    if raw.startswith("postgres://"):
        raw = "postgresql://" + raw[len("postgres://"):]
    if raw.startswith("postgresql://"):
        raw = "postgresql+psycopg://" + raw[len("postgresql://"):]
    return raw


def redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only for messages
        return url


def read_only_sqlite_url(path: Path) -> str | None:
    """A URL opening the SQLite store at `path` read-only when this process cannot write it (a file or folder
    without write permission for this user, a read-only mount); None when it can. Opened the usual way, such a
    store could not even be read: the connection switches it to WAL and a WAL store needs its -shm file beside
    it. Without a folder to make that file in, and no -wal or -shm file of a writer there, the file is opened
    `immutable` (nothing can be writing it)."""
    from urllib.parse import quote

    folder = path.parent
    if os.access(path, os.W_OK) and os.access(folder, os.W_OK):
        return None
    params = "mode=ro"
    if not os.access(folder, os.W_OK) and not any(Path(f"{path}{x}").exists() for x in ("-wal", "-shm")):
        params += "&immutable=1"
    return f"sqlite:///file:{quote(str(path))}?{params}&uri=true"


def is_read_only(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite" and engine.url.query.get("mode") == "ro"


def _sqlite_setup(engine: Engine, *, wal: bool = True) -> None:
    """Pragmas on every connection; `wal`: switch the file to WAL (writers) rather than read it in the mode it
    is in (readers: reading changes no byte of the file, not even the journal mode in its header)."""
    wal = wal and not is_read_only(engine)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # noqa: ANN001
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see _on_begin)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        for attempt in range(50 if wal else 0):
            try:
                cur.execute("PRAGMA journal_mode = WAL")
                break
            except Exception as exc:  # noqa: BLE001 - another process is switching the file to WAL
                msg = str(exc).lower()
                if ("locked" not in msg and "busy" not in msg) or attempt == 49:
                    raise  # not a database, unreadable...: no point waiting
                time.sleep(0.05 * (attempt + 1))
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # noqa: ANN001
        if conn.get_execution_options().get("zoomer_write"):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")


def get_engine(db: str | None = None, *, read_only: bool = False) -> Engine:
    """One engine per URL per process. `read_only` (digest, history): a SQLite store is read in the journal mode
    it is in (not switched to WAL), and one this process cannot write is opened read-only (read_only_sqlite_url)
    rather than not at all."""
    url = resolve_url(db)
    u = parse_url(db)
    key = url
    if read_only and u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:" \
            and not u.query.get("uri") and Path(u.database).is_file():
        url = read_only_sqlite_url(Path(u.database)) or url
        key = f"{url} (reading)"
    with _lock:
        engine = _engines.get(key)
        if engine is not None:
            return engine
        if u.get_backend_name() == "sqlite":
            if u.database and u.database != ":memory:":
                check_sqlite_file(u.database)
                if not url.startswith("sqlite:///file:"):
                    Path(u.database).parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
            _sqlite_setup(engine, wal=not read_only)
        else:
            # psycopg logs a warning ("error ignored terminating <psycopg.Pipeline [BAD]>") when the server goes
            # away mid-statement; the error itself reaches the user as one line (store_error)
            logging.getLogger("psycopg").addHandler(logging.NullHandler())
            try:
                engine = create_engine(url, pool_pre_ping=True)
            except ModuleNotFoundError as exc:  # driver missing
                raise StoreError(f"cannot open {redact(url)}: {exc} ({missing_driver_hint(u)})") from None
        _engines[key] = engine
        return engine


def dispose_engine(db: str | None = None) -> None:
    """Close the engine for `db`, and those get_engine opened for reading the same SQLite file."""
    url = resolve_url(db)
    path = sqlite_path(make_url(url)) if url.startswith("sqlite") else None
    with _lock:
        keys = [k for k, e in _engines.items() if k == url or (path is not None and sqlite_path(e.url) == path)]
        engines = [_engines.pop(k) for k in keys]
        _migrated.difference_update(keys)
    for engine in engines:
        engine.dispose()


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: SQLite busy/locked, PostgreSQL serialization failure/deadlock/lock timeout, lost connection."""
    if isinstance(exc, IntegrityError):
        return True  # a concurrent writer inserted the same key: the retry finds it
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if code in _TRANSIENT_PG_CODES:
        return True
    msg = str(orig).lower()
    return isinstance(exc, OperationalError) and ("locked" in msg or "busy" in msg)


def with_retry(fn: Callable[[], T], *, attempts: int = 30, base_delay: float = 0.02) -> T:
    """Run a whole transaction function again on transient errors (exponential backoff with jitter).

    Retries stop once SQLITE_BUSY_TIMEOUT_S has passed: a SQLite attempt already waits that long for
    a lock, and a store another process keeps locked is one StoreError line after about that long,
    not 30 more waits of a minute each."""
    start = time.monotonic()
    for attempt in range(attempts):
        try:
            return fn()
        except (DBAPIError, IntegrityError) as exc:
            if not is_transient(exc):
                raise
            if attempt == attempts - 1 or time.monotonic() - start >= SQLITE_BUSY_TIMEOUT_S:
                msg = str(getattr(exc, "orig", None) or exc).strip().splitlines()
                if isinstance(exc, OperationalError) and msg and ("locked" in msg[0].lower() or "busy" in msg[0].lower()):
                    raise StoreError(f"the store is locked by another process ({msg[0]}; waited "
                                     f"{time.monotonic() - start:.0f} s): try again when it is done") from None
                raise
            time.sleep(min(1.0, base_delay * 2**attempt) * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")


@contextmanager
def write_session(engine: Engine) -> Iterator[Session]:
    """A session whose transaction holds the write lock from its start (SQLite), committed on success."""
    with Session(engine.execution_options(zoomer_write=True), expire_on_commit=False) as session:
        with session.begin():
            yield session


@contextmanager
def read_session(engine: Engine) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as session:
        yield session


def alembic_config(engine: Engine):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def _scripts():  # noqa: ANN202 - alembic ScriptDirectory
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return ScriptDirectory.from_config(cfg)


def head_revision() -> str:
    return _scripts().get_current_head()


def check_known_revision(engine: Engine, revision: str | None) -> None:
    """NewerStoreError when the store's `revision` is not one of this version's migrations (Alembic's own
    error, 'Can't locate revision identified by ...', was an internal error on every store command)."""
    from alembic.util import CommandError

    if revision is None:
        return
    try:
        _scripts().get_revision(revision)
    except CommandError:
        from .. import __version__

        raise NewerStoreError(store_name(engine), f"the store's schema is at revision {revision!r}, which zoomer-ar {__version__} "
                                     f"does not know (its latest is {head_revision()!r}): a newer zoomer-ar "
                                     "migrated it; use that version with this store") from None


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the Alembic migrations; concurrent callers are serialised (SQLite write lock, PostgreSQL advisory lock)."""
    from alembic import command

    check_known_revision(engine, current_revision(engine))
    cfg = alembic_config(engine)

    def _run() -> None:
        with engine.execution_options(zoomer_write=True).begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK})")
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)

    with_retry(_run)


def ensure_schema(engine: Engine) -> None:
    """Bring the database to the latest migration (once per process and URL)."""
    key = str(engine.url)
    if key in _migrated:
        return
    try:
        current = current_revision(engine)
        if current != head_revision():
            if is_read_only(engine):  # cannot be migrated here: said, rather than 'attempt to write a readonly database'
                check_known_revision(engine, current)
                raise StoreError(f"{store_name(engine)}: the store is read-only here and at schema revision "
                                 f"{current!r}, older than this version's {head_revision()!r}: run `zoomer-ar db "
                                 "upgrade --db ...` once where it can be written")
            upgrade(engine)
    except DatabaseError as exc:
        raise store_error(engine, exc) from None
    _migrated.add(key)


SQLITE_FULL = 13  # "database or disk is full": a write the disk refused (ENOSPC, or a short write)
SQLITE_IOERR_WRITE = 778  # "disk I/O error" of a write: EFBIG past RLIMIT_FSIZE, EDQUOT, or a failing disk
SQLITE_IOERR_SHMSIZE = 4874  # "disk I/O error" growing the -shm file of a WAL store (a full disk at open)
PG_DISK_FULL = "53100"
LOW_SPACE_BYTES = 1 << 20


def disk_full_reason(engine: Engine, exc: BaseException) -> str | None:
    """Why `exc`, a database error, is the store's disk being full, in a few words without paths; None when it is
    not. SQLite says "database or disk is full" only for ENOSPC: past a file-size limit (EFBIG) or a quota, and
    when the -shm file cannot grow, it says "disk I/O error", taken as a full disk only when this process has a
    file-size limit or the store's filesystem has under 1 MiB free (a failing disk says the same)."""
    if not isinstance(exc, DBAPIError) or exc.orig is None:
        return None
    orig = exc.orig
    if engine.dialect.name == "postgresql":
        code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
        return "the database server's disk is full" if code == PG_DISK_FULL else None
    code = getattr(orig, "sqlite_errorcode", None)
    if code == SQLITE_FULL:
        return "database or disk is full"
    if code not in (SQLITE_IOERR_WRITE, SQLITE_IOERR_SHMSIZE):
        return None
    if _file_size_limited():
        return "disk I/O error: a write passed the file-size limit of the process (RLIMIT_FSIZE)"
    path = sqlite_path(engine.url)
    free = _free_bytes(path.parent) if path is not None else None
    if free is not None and free < LOW_SPACE_BYTES:
        return f"disk I/O error with {free:,} bytes free on the store's disk"
    return None


def _file_size_limited() -> bool:
    try:
        import resource
    except ImportError:  # Windows
        return False
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    return soft != resource.RLIM_INFINITY


def _free_bytes(folder: Path) -> int | None:
    import shutil

    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def store_error(engine: Engine, exc: DatabaseError, doing: str = "open") -> StoreError:
    """One line for a database error while opening the store (or, `doing`, using it): a SQLite file that is
    not a database (or is corrupt) is bad input (NotAStoreError, exit 2); anything else (unreachable server,
    a server gone mid-run...) a StoreError."""
    orig = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc).splitlines()[0]
    full = disk_full_reason(engine, exc)
    if full is not None:
        return StoreFullError(f"cannot {doing} the store {_url_for_messages(engine)}: {full} (its disk, or its "
                              "storage limit, is full): nothing was recorded; free some space and try again", full)
    sqlite_bad = engine.dialect.name == "sqlite" and not isinstance(exc, OperationalError)
    if sqlite_bad or "not a database" in orig or "malformed" in orig:
        return NotAStoreError(store_name(engine), f"not a usable SQLite store ({orig})")
    path = sqlite_path(engine.url)
    if path is not None and not is_read_only(engine) and path.is_file() and read_only_sqlite_url(path) is not None:
        orig += " (the store is read-only here: this user cannot write the file or its folder)"
    elif path is not None and not path.exists() and path.parent.is_dir() and not os.access(path.parent, os.W_OK):
        orig += f" (no store there, and none can be made: this user cannot write {path.parent})"
    return StoreError(f"cannot {doing} the store {_url_for_messages(engine)}: {orig}")


def _url_for_messages(engine: Engine) -> str:
    path = sqlite_path(engine.url)
    return f"sqlite:///{path}" if path is not None else redact(str(engine.url))


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite store's URL (of a read-only URI too), None for PostgreSQL or an in-memory store."""
    from urllib.parse import unquote

    db = url.database if url.get_backend_name() == "sqlite" else None
    if not db or db == ":memory:":
        return None
    return Path(unquote(db[len("file:"):])) if url.query.get("uri") and db.startswith("file:") else Path(db)


def store_name(engine: Engine) -> str:
    """The store as messages name it: a SQLite store's file, else the URL with its password hidden."""
    path = sqlite_path(engine.url)
    return str(path) if path is not None else redact(str(engine.url))


@contextmanager
def store_errors(engine: Engine, doing: str = "read from") -> Iterator[None]:
    """Database errors while a command uses the store (digest, history, record) as one line (store_error): a
    server that went away mid-query is a StoreError (exit 1), a SQLite file found damaged while used (a page
    of a table, past the schema) NotAStoreError (exit 2). A unique violation the retries did not resolve is
    left as it is (not the store's fault)."""
    try:
        yield
    except IntegrityError:
        raise
    except DatabaseError as exc:
        raise store_error(engine, exc, doing) from None


def open_store(db: str | None = None, *, read_only: bool = False) -> Engine:
    """The engine for `db` (see resolve_url), migrated to the latest schema; `read_only`: see get_engine."""
    engine = get_engine(db, read_only=read_only)
    ensure_schema(engine)
    return engine
