"""`zoomer-ar digest`, `zoomer-ar history`, `zoomer-ar record` and `zoomer-ar db` (the store's commands)."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import InputError
from .options import _week, describe, job_options, record_options_from, team_name

DB_OPTION = click.option("--db", default=None, metavar="URL",
                         help="Store: SQLAlchemy URL or SQLite file (default: $ZOOMER_DB, else the user data folder).")


def _write_or_echo(text: str, out: Path | None) -> None:
    if out is None:
        click.echo(text, nl=False)
        return
    from ..render.report import atomic_write

    atomic_write(out, text)
    click.echo(f"wrote {out}", err=True)


@click.command()
@click.option("--week", default=None, callback=_week, metavar="YYYY-Www",
              help="ISO week, e.g. 2026-W48 (default: the latest week with recorded runs).")
@click.option("--team", default=None, callback=team_name, help="Only this team's jobs.")
@click.option("--format", "fmt", type=click.Choice(["md", "html", "json"]), default="md", show_default=True)
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write to this file.")
@click.option("--top", type=click.IntRange(min=1, max=1_000_000), default=10, show_default=True, help="Rows per table.")
@DB_OPTION
def digest(week: str | None, team: str | None, fmt: str, out: Path | None, top: int, db: str | None) -> None:
    """The week's top anti-patterns by wasted GPU-hours and dollars, trends, costliest jobs and owners, resolved patterns.

    Exit 2 for a --db file that does not exist, is not a SQLite database, or a --db that is not a URL."""
    from ..render.digest import render_digest
    from .digest import build_digest

    from .db import store_errors

    engine = _readable_store(db)
    with store_errors(engine):  # the server going away mid-query: one line, exit 1
        d = build_digest(engine, week=week, team=team, top=top)
    _write_or_echo(render_digest(d, fmt, top=top), out)


def _readable_store(db: str | None):
    """The store a read-only command (digest, history) opens: a --db that is not a database URL,
    a SQLite file that does not exist, or a file that is not a SQLite database is bad input (exit 2,
    one line naming it; db.NotAStoreError); reading must not create an empty store at a mistyped path,
    nor the store's tables in a database that holds none (an empty file, an empty PostgreSQL database,
    another application's database)."""
    from sqlalchemy.exc import DatabaseError

    from .db import current_revision, ensure_schema, get_engine, parse_url, store_error, store_name

    try:
        url = parse_url(db)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            path = Path(url.database)
            if not path.exists():
                raise InputError(db or str(path), "no store at this path (nothing has been recorded there)")
            if path.is_file() and path.stat().st_size == 0:
                raise InputError(db or str(path), "no store at this path (an empty file: nothing has been recorded there)")
        engine = get_engine(db, read_only=True)  # a store this user cannot write is still read
        try:
            revision = current_revision(engine)
        except DatabaseError as exc:
            raise store_error(engine, exc) from None
        if revision is None:
            raise InputError(store_name(engine), "no store here: the database holds no Zoomer AR tables (nothing has "
                                                 "been recorded there; `record` or `db upgrade` would create them)")
        ensure_schema(engine)
        return engine
    except ImportError as exc:  # a URL naming a database driver that is not installed
        raise InputError(db, f"not a usable store URL ({exc})") from None


@click.command()
@click.argument("job")
@click.option("--format", "fmt", type=click.Choice(["text", "md", "json"]), default="text", show_default=True)
@click.option("--limit", type=click.IntRange(min=1, max=1_000_000), default=52, show_default=True, help="Most recent runs shown.")
@DB_OPTION
def history(job: str, fmt: str, limit: int, db: str | None) -> None:
    """One job's recorded runs and findings over time.

    Exit 2 for a job never recorded, a --db file that does not exist or is not a SQLite database, or a --db
    that is not a URL."""
    from sqlalchemy import select

    from ..render.digest import render_history
    from .db import store_errors
    from .digest import by_text
    from .history import job_history
    from .orm import Job

    from .names import canonical

    job = canonical(job)
    engine = _readable_store(db)
    with store_errors(engine):  # the server going away mid-query: one line, exit 1
        with engine.connect() as c:  # an unknown name is bad input (exit 2), not a store failure (StoreError, exit 1)
            if c.execute(select(Job.id).where(Job.name == job)).first() is None:
                names = [n for (n,) in c.execute(select(Job.name).order_by(by_text(Job.name, engine)).limit(6))]
                more = ", ..." if len(names) > 5 else ""
                have = f"recorded jobs: {', '.join(names[:5])}{more}" if names else "no job recorded yet"
                raise InputError(None, f"no recorded job named {job!r} ({have})")
        runs = job_history(job, engine, limit=limit)
    click.echo(render_history(runs, fmt), nl=False)


@click.command()
@click.argument("findings", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@job_options
def record(findings: tuple[Path, ...], **store_opts) -> None:
    """Store findings.json files written by `zoomer-ar analyze` (same options as `analyze --record`)."""
    from ..findings_file import load_findings
    from .record import check_teams, record_analysis, unrecordable

    analyses = [load_findings(path) for path in findings]  # every file checked before any is recorded
    for path, analysis in zip(findings, analyses):
        problem = unrecordable(analysis, record_options_from(store_opts))
        if problem:
            raise InputError(str(path), f"cannot be recorded: {problem}")
    check_teams(analyses, record_options_from(store_opts), db=store_opts.get("db"))  # nor a job of another team
    for analysis in analyses:
        result = record_analysis(analysis, record_options_from(store_opts), db=store_opts.get("db"))
        click.echo(describe(result))


@click.group()
def db() -> None:
    """The store's database: migrations and location."""


@db.command("upgrade")
@DB_OPTION
def db_upgrade(db: str | None) -> None:
    """Apply the Alembic migrations (recording does this on first use).

    Exit 2 for a --db file that is not a SQLite database."""
    from sqlalchemy.exc import DatabaseError

    from .db import current_revision, get_engine, head_revision, redact, store_error, upgrade

    engine = get_engine(db)
    try:
        upgrade(engine)
    except DatabaseError as exc:
        raise store_error(engine, exc) from None
    click.echo(f"{redact(str(engine.url))}: at revision {current_revision(engine)} (head {head_revision()})")


@db.command("url")
@DB_OPTION
def db_url(db: str | None) -> None:
    """Print the store URL in use (password hidden)."""
    from .db import redact, resolve_url

    click.echo(redact(resolve_url(db)))


commands = [digest, history, record, db]
