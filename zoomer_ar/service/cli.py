"""`zoomer-ar serve`, `zoomer-ar worker`, `zoomer-ar token`, `zoomer-ar batch`, `zoomer-ar openapi`."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import click

from ..children import child_env
from ..store.options import team_name

DB_OPTION = click.option("--db", default=None, metavar="URL",
                         help="Store: SQLAlchemy URL or SQLite file (default: $ZOOMER_DB, else the user data folder).")
DATA_OPTION = click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
                           help="Folder for uploads, shared by the server and its workers "
                                "(default: $ZOOMER_SERVICE_DATA, else <user data folder>/zoomer-ar/service).")
GITHUB_API_OPTION = click.option("--github-api-url", default=None, metavar="URL",
                                 help="The GitHub API that webhook reviews are posted to, with GITHUB_TOKEN "
                                      "(default: $GITHUB_API_URL, else https://api.github.com).")
JOB_TIMEOUT_OPTION = click.option(
    "--job-timeout", "job_timeout_s", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
    help="Longest a job may run (from its claim): past it, its worker stops it and fails it \"timed out after N s\" "
         "(default: $ZOOMER_SERVICE_JOB_TIMEOUT_S, else 3600; 0: no limit).")
LEASE_OPTION = click.option("--lease", "lease_s", type=click.FloatRange(min=1.0), default=None,
                            help="Seconds a claimed job stays leased without a heartbeat (default: 30).")


def _require(*modules: str) -> None:
    """A one-line error naming the packages to install when the service's optional dependencies are missing."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pkgs = {"fastapi": "fastapi", "uvicorn": "uvicorn", "python_multipart": "python-multipart",
                "distributed": "dask[distributed]"}
        raise click.ClickException("the service needs " + ", ".join(pkgs.get(m, m) for m in missing)
                                   + ": pip install " + " ".join(repr(pkgs.get(m, m)) for m in missing))


def _logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _settings(**kw):
    from .config import Settings

    try:
        return Settings.from_env(**kw)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _is_sqlite(db: str | None) -> bool:
    from ..store.db import resolve_url

    return resolve_url(db).startswith("sqlite")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def _write_port_file(path: Path, port: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def _spawn_worker(settings, log_level: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "zoomer_ar.cli", "worker", "--data", str(settings.data_dir),
           "--lease", str(settings.lease_s), "--job-timeout", repr(settings.job_timeout_s),
           "--github-api-url", settings.github_api_url,
           "--parent-pid", str(os.getpid()), "--log-level", log_level]
    if settings.db:
        cmd += ["--db", settings.db]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=child_env())  # `-m`: not from the current directory


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port (0: any free port; see --port-file).")
@click.option("--port-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write the port listened on to this file once the socket is bound.")
@DB_OPTION
@DATA_OPTION
@click.option("--max-upload-mb", type=click.FloatRange(min=0.001), default=None, help="Request body cap (default 2048).")
@click.option("--read-timeout", "read_timeout_s", type=click.FloatRange(min=0.1), default=None,
              help="Seconds a client has to send a request's headers, and that its body may stall (default 30).")
@click.option("--min-body-rate", type=click.FloatRange(min=0), default=None, metavar="KIB_PER_S",
              help="Average KiB/s a request body must keep past the read timeout (default 1; 0: no minimum).")
@click.option("--max-archive-mb", type=click.FloatRange(min=0.001), default=None,
              help="Cap on an archive's uncompressed size (default 8192).")
@click.option("--max-archive-entries", type=click.IntRange(min=1), default=None, help="Cap on an archive's entries (default 20000).")
@click.option("--max-archive-ratio", type=click.FloatRange(min=1.0), default=None,
              help="Cap on an archive's compression ratio (default 200).")
@click.option("--max-team-jobs", type=click.IntRange(min=0), default=None,
              help="Queued and running jobs one team may have; more uploads answer 429 (default 50; 0: no limit).")
@click.option("--max-team-mb", type=click.FloatRange(min=0), default=None,
              help="MB of disk one team's queued and running jobs may take; more answer 429 (default 20480; 0: no limit).")
@click.option("--max-connections", type=click.IntRange(min=0), default=None,
              help="Connections served at once; a request on one more is answered 503 (default 1000; 0: no cap).")
@click.option("--failed-retention-days", type=click.FloatRange(min=0), default=None,
              help="Days a failed job's uploads are kept for inspection before they are removed "
                   "(default 7; 0: kept for ever).")
@LEASE_OPTION
@JOB_TIMEOUT_OPTION
@click.option("--max-attempts", type=click.IntRange(min=1), default=None,
              help="Claims per job before a job whose workers keep dying fails (default 3).")
@click.option("--embedded-workers", type=click.IntRange(min=0), default=None,
              help="Worker processes started with the server (default: 1 with SQLite, 0 with PostgreSQL).")
@click.option("--webhook-secret", default=None, help="GitHub webhook secret (default: $ZOOMER_WEBHOOK_SECRET).")
@click.option("--webhook-repo", "webhook_repos", multiple=True, metavar="OWNER/NAME=PATH",
              help="A repository the webhook reviews, and its local clone (repeatable; $ZOOMER_WEBHOOK_REPOS).")
@click.option("--webhook-team", default=None, help="Team that owns webhook review jobs (default: github).")
@click.option("--webhook-post/--no-webhook-post", default=None, help="Post reviews to the pull request (needs GITHUB_TOKEN).")
@GITHUB_API_OPTION
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True)
def serve(host, port, port_file, db, data_dir, max_upload_mb, read_timeout_s, min_body_rate, max_archive_mb,
          max_archive_entries, max_archive_ratio, max_team_jobs, max_team_mb, max_connections, failed_retention_days,
          lease_s, job_timeout_s, max_attempts, embedded_workers, webhook_secret, webhook_repos, webhook_team, webhook_post,
          github_api_url, log_level) -> None:
    """Run the HTTP API (FastAPI on uvicorn): uploads, job status and results, verdicts, digest, GitHub webhook."""
    _require("fastapi", "uvicorn", "python_multipart")
    import uvicorn

    from .app import create_app
    from .config import MB, parse_repos

    _logging(log_level)
    try:
        repos = parse_repos(list(webhook_repos)) if webhook_repos else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--webhook-repo") from None
    settings = _settings(
        db=db, data_dir=data_dir, max_upload_bytes=int(max_upload_mb * MB) if max_upload_mb else None,
        read_timeout_s=read_timeout_s, min_body_rate=min_body_rate * 1024 if min_body_rate is not None else None,
        max_bytes=int(max_archive_mb * MB) if max_archive_mb else None, max_entries=max_archive_entries,
        max_ratio=max_archive_ratio, max_team_jobs=max_team_jobs,
        max_team_bytes=int(max_team_mb * MB) if max_team_mb is not None else None,
        max_connections=max_connections,
        failed_retention_s=failed_retention_days * 86_400.0 if failed_retention_days is not None else None,
        lease_s=lease_s, job_timeout_s=job_timeout_s,
        max_attempts=max_attempts, webhook_secret=webhook_secret,
        webhook_repos=repos, webhook_team=webhook_team, webhook_post=webhook_post, github_api_url=github_api_url,
    )
    from ..store.db import open_store

    open_store(settings.db)  # migrate before workers start
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    if port_file is not None:  # before any worker starts: a port file that cannot be written stops here
        try:
            _write_port_file(port_file, bound)
        except OSError as exc:
            sock.close()
            where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(port_file) else ""
            raise click.BadParameter(f"cannot write {port_file}: {exc.strerror or exc}{where}",
                                     param_hint="--port-file") from None
    n = embedded_workers if embedded_workers is not None else (1 if _is_sqlite(settings.db) else 0)
    children = [_spawn_worker(settings, log_level) for _ in range(n)]
    click.echo(f"zoomer-ar serve: http://{host}:{bound} ({n} embedded worker{'s' if n != 1 else ''})", err=True)
    received: list[int] = []
    try:
        from .slow_clients import guarded_protocol

        config = uvicorn.Config(create_app(settings), log_level=log_level, timeout_graceful_shutdown=10,
                                server_header=False,
                                http=guarded_protocol(settings.read_limits, settings.max_connections))
        # uvicorn handles SIGTERM/SIGINT while it runs, then re-raises each under the handler it found: with the
        # default one, SIGTERM killed `serve` there and then, its workers neither stopped nor waited for
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _remember(received))
        uvicorn.Server(config).run(sockets=[sock])
    except _Hurry:
        pass
    finally:
        _stop_workers(children, hurry=lambda: len(received) > 1)
        for sig in (signal.SIGTERM, signal.SIGINT):  # from here a signal ends the process at once
            signal.signal(sig, signal.SIG_DFL)
        sock.close()
    if received:  # stopped by a signal: exit as uvicorn would have, once the workers have stopped
        signal.signal(received[0], signal.SIG_DFL)
        signal.raise_signal(received[0])


class _Hurry(Exception):
    """A second stop signal: the workers are killed rather than waited for."""


def _remember(received: list[int]):  # noqa: ANN202 - a signal handler
    def handler(sig: int, _frame) -> None:  # noqa: ANN001
        received.append(sig)
        if len(received) > 1:
            raise _Hurry

    return handler


def _stop_workers(children: list[subprocess.Popen], *, hurry, wait_s: float = 30.0) -> None:  # noqa: ANN001
    """SIGTERM the embedded workers (each finishes the job it holds) and wait for them, `wait_s` at most; those
    still running then, or all of them on a second stop signal (`hurry()`), are killed (a killed worker's job is
    claimed again once its lease expires)."""
    import time

    running = [child for child in children if child.poll() is None]
    for child in running:
        child.send_signal(signal.SIGTERM)
    if running:
        click.echo(f"zoomer-ar serve: stopping {len(running)} embedded worker{'s' if len(running) != 1 else ''}: "
                   f"each finishes its job ({wait_s:g} s at most; a second signal kills them)", err=True)
    deadline = time.monotonic() + wait_s
    try:
        for child in children:
            while not hurry() and child.poll() is None and time.monotonic() < deadline:
                try:
                    child.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
    except _Hurry:
        pass
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait()


@click.command()
@DB_OPTION
@DATA_OPTION
@LEASE_OPTION
@JOB_TIMEOUT_OPTION
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.05), default=None,
              help="Seconds between polls of an empty queue, and of a running job's cancel flag (default 1).")
@click.option("--max-jobs", type=click.IntRange(min=1), default=None, help="Exit after this many jobs.")
@click.option("--exit-when-idle", is_flag=True, help="Exit when the queue is empty.")
@click.option("--parent-pid", type=int, default=None, hidden=True, help="Exit when this process is no longer the parent.")
@GITHUB_API_OPTION
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True)
def worker(db, data_dir, lease_s, job_timeout_s, poll_s, max_jobs, exit_when_idle, parent_pid, github_api_url,
           log_level) -> None:
    """Run queued service jobs (analyses, reviews) from the store; run as many as you like with PostgreSQL."""
    from .worker import Worker

    _logging(log_level)
    settings = _settings(db=db, data_dir=data_dir, lease_s=lease_s, job_timeout_s=job_timeout_s, poll_s=poll_s,
                         github_api_url=github_api_url)
    w = Worker(settings)
    n = w.run(max_jobs=max_jobs, exit_when_idle=exit_when_idle, parent_pid=parent_pid)
    click.echo(f"zoomer-ar worker {w.id}: {n} job{'s' if n != 1 else ''} run", err=True)


@click.group()
def token() -> None:
    """API tokens of the service (one team each; stored hashed)."""


@token.command("create")
@click.option("--team", required=True, help="The team the token acts for (created if new).")
@click.option("--name", default="", help="A label for the token (who or what uses it).")
@DB_OPTION
def token_create(team: str, name: str, db: str | None) -> None:
    """Create a token and print it (shown only this once; the store keeps its sha256)."""
    from ..store.db import open_store
    from .auth import check_team_name, create_token

    try:
        team = check_team_name(team)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--team") from None
    if any(ch < " " or ch == "\x7f" for ch in name):  # `token list` prints one tab-separated line per token
        raise click.BadParameter(f"token name {name!r} holds a control character (a tab, a newline...)",
                                 param_hint="--name")
    tok, tid = create_token(open_store(db), team, name)
    click.echo(tok)
    click.echo(f"token #{tid} for team {team}: store it now, it is not shown again", err=True)


@token.command("list")
@click.option("--team", default=None, help="Only this team's tokens.")
@DB_OPTION
def token_list(team: str | None, db: str | None) -> None:
    """List tokens (id, team, name, prefix, revoked); never the tokens themselves."""
    from ..store.db import open_store
    from .auth import list_tokens

    for t in list_tokens(open_store(db), team):
        state = "revoked" if t["revoked"] else "active"
        click.echo(f"{t['id']}\t{t['team']}\t{t['name'] or '-'}\t{t['prefix']}...\t{state}")


@token.command("revoke")
@click.argument("token_id", type=int)
@DB_OPTION
def token_revoke(token_id: int, db: str | None) -> None:
    """Revoke a token by id (see `token list`). Exit 2 for an unknown or already revoked id."""
    from ..errors import InputError
    from ..store.db import open_store
    from .auth import revoke_token, token_state

    if not 0 <= token_id < 2**63:  # no store integer holds it (SQLite: OverflowError)
        raise InputError(None, f"no token #{token_id} (see `zoomer-ar token list`)")
    engine = open_store(db)
    if not revoke_token(engine, token_id):
        if token_state(engine, token_id) == "revoked":
            raise InputError(None, f"token #{token_id} is already revoked")
        raise InputError(None, f"no token #{token_id} (see `zoomer-ar token list`)")
    click.echo(f"revoked token #{token_id}")


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--scheduler", default=None, metavar="tcp://HOST:PORT",
              help="An existing Dask scheduler (default: a LocalCluster started here).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Worker processes of the LocalCluster, at most one per PATH (ignored with --scheduler).")
@click.option("--team", default=None, callback=team_name, help="Team recorded on the jobs.")
@click.option("--no-record", is_flag=True, help="Do not record the analyses in the store.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Also write each trace's findings.json/report.md/report.html under OUT/<job>/.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal).")
@DB_OPTION
def batch(paths, scheduler, workers, team, no_record, out_dir, progress, db) -> None:
    """Analyse many traces on Dask (a local cluster, or --scheduler) and record them in the store."""
    if no_record:  # as analyze refuses a store option without --record: before any work
        given = [name for name, value in (("--team", team), ("--db", db)) if value is not None]
        if given:
            raise click.UsageError(f"{given[0]} has no effect with --no-record (nothing is recorded)")
    _require("distributed")
    from .batch import failure, run_with_progress

    missing = [str(p) for p in paths if not p.exists()]
    for m in missing:
        click.echo(f"zoomer-ar batch: {m}: not found", err=True)
    todo, seen = [], {}
    for p in paths:  # the same trace named twice (a path and its symlink, `a b a`) is analysed once
        if not p.exists():
            continue
        real = os.path.realpath(p)
        if real in seen:
            click.echo(f"zoomer-ar batch: note: {p} is {seen[real]} again: analysed once", err=True)
            continue
        seen[real] = str(p)
        todo.append(str(p))
    if not todo:
        raise click.exceptions.Exit(2)
    result = run_with_progress(todo, lambda line: click.echo(line, err=True), show_bar=progress, scheduler=scheduler,
                               workers=workers, db=db, record=not no_record, team=team, out_dir=out_dir)
    failed = len(result.failed) + len(missing)
    ok = len(result.results) - len(result.failed)
    click.echo(f"batch: {ok} analysed, {failed} failed, in {result.seconds:.1f} s on {result.workers} "
               f"worker{'s' if result.workers != 1 else ''} ({result.scheduler})")
    for r in result.failed:
        click.echo(f"  failed: {failure(r)}")
    for m in missing:
        click.echo(f"  failed: {m}: not found")
    if result.store_lost:  # said once, with what was not recorded: the batch went on without the store
        n = sum(1 for r in result.results if r.unrecorded)
        click.echo(f"  store lost: {result.store_lost}; {n} analysed trace{'s' if n != 1 else ''} not recorded"
                   f"{' (their reports were written)' if out_dir is not None and n else ''}")
    if failed or result.store_lost:
        raise click.exceptions.Exit(2 if ok == 0 else 1)


@click.command()
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write here (default: stdout).")
def openapi(out: Path | None) -> None:
    """Print the service's OpenAPI schema (docs/openapi.json is this output)."""
    _require("fastapi", "python_multipart")
    from .app import openapi_json

    text = openapi_json()
    if out is None:
        click.echo(text, nl=False)
    else:
        from ..render.report import atomic_write

        atomic_write(out, text)
        click.echo(f"wrote {out}", err=True)


commands = [serve, worker, token, batch, openapi]
