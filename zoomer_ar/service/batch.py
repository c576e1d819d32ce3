"""`zoomer-ar batch`: analyse many traces on a Dask cluster (`distributed`) and record them in the store.

- Cluster: a `distributed.LocalCluster` by default (`--workers N` processes, at most one per PATH, one thread each, on
  127.0.0.1, no dashboard), or an existing cluster with `--scheduler tcp://HOST:PORT`. The traces'
  paths must be readable by the cluster's workers (shared storage) and `zoomer_ar` importable there.
- Each PATH (a trace file or a folder of per-rank files, as `analyze` takes) is one task:
  `analyze_path` on a worker, which returns the analysis as JSON. The client records the analyses
  in the store as they complete (one writer; the workers need no database access) and, with
  `--out`, writes each report folder: inside the recording's transaction, so a trace whose reports
  cannot be written is not recorded; each folder is staged beside its target and renamed into place (write_staged).
  An `--out` that cannot be written at all is refused before any work.
- Progress: a bar on stderr (when it is a terminal), and one line per trace as it finishes.
- Failures: a trace that cannot be analysed (bad input, internal error, or a worker lost while
  running it, after Dask's own retries) is reported with its reason; the others are done.
  A store lost mid-batch is said once and the batch goes on without it (batch_store.py).
  Exit status 0 when every trace was analysed (and recorded), 1 when some failed or the store was lost,
  2 when none could be analysed.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..children import no_cwd_imports


@dataclass
class TraceResult:
    path: str
    ok: bool
    seconds: float = 0.0
    error: str | None = None
    findings: int = 0
    patterns: list[str] = field(default_factory=list)
    bottleneck: str | None = None
    recorded: str | None = None  # "recorded" | "exists" | "refreshed"
    analysis_id: int | None = None
    worker: str | None = None
    out: str | None = None  # the report folder written (--out)
    unrecorded: str | None = None  # why an analysed trace was not recorded: the store was lost (batch_store)


@dataclass
class BatchResult:
    results: list[TraceResult]
    seconds: float
    workers: int
    scheduler: str
    store_lost: str | None = None  # the one line saying how the store was lost mid-batch (batch_store)

    @property
    def failed(self) -> list[TraceResult]:
        return [r for r in self.results if not r.ok]


def analyze_one(path: str, name: str | None = None) -> dict[str, Any]:
    """The task a Dask worker runs: never raises for a bad trace; returns the analysis JSON or the error."""
    t0 = time.perf_counter()
    where = f"{os.uname().nodename}:{os.getpid()}"
    try:
        from ..analyze import analyze_path

        analysis = analyze_path(path, name=name)
        return {"path": path, "ok": True, "analysis": analysis.model_dump_json(), "seconds": time.perf_counter() - t0,
                "worker": where}
    except Exception as exc:  # noqa: BLE001 - reported per trace
        from ..errors import ZoomerError

        msg = str(exc) if isinstance(exc, ZoomerError) else f"internal error: {type(exc).__name__}: {exc}"
        if not isinstance(exc, ZoomerError) and os.environ.get("ZOOMER_DEBUG"):
            msg += "\n" + traceback.format_exc()
        return {"path": path, "ok": False, "error": msg, "seconds": time.perf_counter() - t0, "worker": where}


def local_cluster(workers: int = 2, threads: int = 1):
    """A LocalCluster of `workers` processes on loopback, without the dashboard."""
    from distributed import LocalCluster

    # dashboard_address=None alone still starts the scheduler's HTTP server on the default port 8787, with a
    # 4-line "Port 8787 is already in use" warning on stderr when another cluster (another batch) holds it:
    # any free port on loopback instead, and no dashboard
    return LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True, host="127.0.0.1",
                        dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                        silence_logs=40)


#: seconds to wait for a first worker of an existing cluster (--scheduler)
WORKER_WAIT_S = 120.0


def _connect(client_cls, scheduler: str):  # noqa: ANN001, ANN202 - distributed's Client, imported by the caller
    """A client of the scheduler at ``scheduler``; a one-line error for an address Dask does not take (exit 2)
    or a scheduler that does not answer (exit 1, as an unreachable store)."""
    from ..errors import InputError, ZoomerError

    try:
        return client_cls(scheduler, timeout="30s")
    except ValueError as exc:
        raise InputError(None, f"--scheduler {scheduler}: not a Dask scheduler address ({exc})") from None
    except OSError as exc:
        raise ZoomerError(f"cannot reach the Dask scheduler {scheduler}: {exc}") from None


@no_cwd_imports()  # Dask's workers (and their restarts) are spawned while this runs: not from the current directory
def run_batch(
    paths: Iterable[str | Path],
    *,
    scheduler: str | None = None,
    workers: int = 2,
    db: str | None = None,
    record: bool = True,
    team: str | None = None,
    out_dir: Path | None = None,
    on_result: Callable[[TraceResult, int, int], None] | None = None,
    cluster=None,  # noqa: ANN001 - an existing distributed cluster object (benchmarks, tests)
) -> BatchResult:
    """Analyse `paths` on Dask (see the module docstring); `on_result(result, done, total)` after each."""
    from distributed import Client, as_completed

    items = [str(Path(p)) for p in paths]
    t0 = time.perf_counter()
    created: list[Path] = []
    if out_dir is not None:  # before any work: an --out that cannot be written is one line (exit 2), nothing recorded
        from ..analyze_cli import prepare_out_dir

        created = prepare_out_dir(Path(out_dir))
    own_cluster = None
    if scheduler:
        client = _connect(Client, scheduler)
    else:
        if cluster is None:
            own_cluster = cluster = local_cluster(max(1, min(workers, len(items))))  # no idle processes
        client = Client(cluster)
    store = None
    if record:
        from .batch_store import BatchStore

        store = BatchStore.open(db)
    results: list[TraceResult] = []
    try:
        if scheduler:
            try:
                client.wait_for_workers(1, timeout=WORKER_WAIT_S)
            except TimeoutError:
                from ..errors import ZoomerError

                raise ZoomerError(f"the Dask scheduler {scheduler} has no worker: none joined in "
                                  f"{WORKER_WAIT_S:g} s") from None
        n_workers = len(client.nthreads())  # after the wait: the workers that joined
        run_id = uuid.uuid4().hex[:12]  # task keys are global on a shared scheduler
        futures = {client.submit(analyze_one, p, pure=False, key=f"zoomer-analyze-{run_id}-{i}"): p
                   for i, p in enumerate(items)}
        for fut in as_completed(futures):
            path = futures[fut]
            try:
                out = fut.result()
            except Exception as exc:  # noqa: BLE001 - a worker died on it (KilledWorker) or the task was lost
                out = {"path": path, "ok": False, "error": f"{type(exc).__name__}: {exc}", "seconds": 0.0}
            finally:
                fut.release()
            r = TraceResult(path=path, ok=bool(out.get("ok")), seconds=float(out.get("seconds") or 0.0),
                            error=out.get("error"), worker=out.get("worker"))
            if r.ok:
                _record_and_write(r, out["analysis"], store=store, team=team, out_dir=out_dir)
            results.append(r)
            if on_result is not None:
                on_result(r, len(results), len(items))
    finally:
        client.close()
        if own_cluster is not None:
            own_cluster.close()
        if created:  # the --out folders this batch made, when no report went into them
            from ..analyze_cli import _remove_empty

            _remove_empty(created)
    order = {p: i for i, p in enumerate(items)}
    results.sort(key=lambda r: order.get(r.path, 0))
    return BatchResult(results=results, seconds=time.perf_counter() - t0, workers=n_workers,
                       scheduler=scheduler or "LocalCluster", store_lost=store.lost if store is not None else None)


def _record_and_write(r: TraceResult, analysis_json: str, *, store, team: str | None, out_dir: Path | None) -> None:  # noqa: ANN001
    """Record one analysed trace into `store` (a batch_store.BatchStore, None: --no-record) and write its reports
    under `out_dir`: the reports are written inside the recording's transaction, so a trace whose reports cannot be
    written (a full disk) is not recorded either. A failure marks `r` failed with its reason; a store lost now or
    before (batch_store) leaves `r` analysed, its reports written, and `r.unrecorded` saying why."""
    from ..models import Analysis

    stage = ["recording"]

    def write_reports(cost: dict[str, Any] | None) -> None:
        from ..analyze_cli import default_out_dir
        from ..render import write_outputs

        stage[0] = "writing the reports"
        if cost is not None:
            analysis.features["cost_attribution"] = cost
        # <job>, or <job>-2... when that folder holds another input's results (as analyze does)
        target = default_out_dir(analysis.job.name, Path(r.path), root=out_dir)
        write_staged(analysis, target, write_outputs)
        r.out = str(target)
        stage[0] = "recording"

    try:
        analysis = Analysis.model_validate_json(analysis_json)
        r.findings = len(analysis.findings)
        r.patterns = [f.pattern for f in analysis.findings]
        r.bottleneck = analysis.bottleneck.type
        if store is not None and store.lost is None:
            from ..store.record import RecordOptions, record_analysis
            from .batch_store import is_store_loss

            on_recorded = (lambda _session, rr: write_reports(rr.cost)) if out_dir is not None else None
            try:
                store.check()
                rr = record_analysis(analysis, RecordOptions(team=team), db=store.engine, on_recorded=on_recorded)
                store.check()  # a SQLite file deleted meanwhile took this run with it
            except Exception as exc:
                if not is_store_loss(exc):
                    raise
                store.lose(exc)
            else:
                r.recorded, r.analysis_id = rr.status, rr.analysis_id
                analysis.features["cost_attribution"] = rr.cost
        if store is not None and store.lost is not None:
            r.unrecorded = store.lost if not store.unrecorded else "the store was lost"
            store.unrecorded.append(r.path)
        if out_dir is not None and r.out is None:  # not recorded now (--no-record, or recorded before)
            write_reports(None)
    except Exception as exc:  # noqa: BLE001 - recording or writing failed for this trace
        from ..errors import ZoomerError

        why = str(exc) if isinstance(exc, ZoomerError) else f"{type(exc).__name__}: {exc}"
        r.ok, r.error, r.recorded, r.analysis_id = False, f"{stage[0]} failed: {why}", None, None


STAGING_PREFIX = ".zoomer-writing."


def write_staged(analysis, target: Path, write: Callable[[Any, Path], dict[str, Path]]) -> None:  # noqa: ANN001
    """``write(analysis, folder)`` into a hidden folder beside ``target``, then moved into place: a batch killed
    or failing mid-write leaves no half-written report folder that looks complete (a findings.json without its
    reports), only a hidden `.zoomer-writing.*` folder. A new ``target`` is the staged folder renamed; one that
    already holds this input's earlier reports gets each file renamed over its old one, findings.json last (as
    `analyze --out` does), so it holds the old reports or the new ones, never findings.json alone."""
    import shutil

    from ..analyze_cli import _move_into_place
    from ..errors import OutputError

    staging = target.parent / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
    try:
        staging.mkdir()  # the mode a plain folder gets under the user's umask (mkdtemp's 0700 would hide it)
    except OSError as exc:
        raise OutputError(str(target), f"cannot write the output folder ({exc.strerror or exc})") from None
    try:
        try:
            staged = write(analysis, staging)
        except OutputError as exc:  # named as the file it stands for, not its staged copy
            if Path(exc.path).parent == staging:
                raise OutputError(str(target / Path(exc.path).name), exc.reason) from None
            raise
        if not target.exists():
            try:
                os.rename(staging, target)
                return
            except OSError:  # made meanwhile (another batch into the same --out): the files one by one
                pass
        for name in sorted(staged, key=lambda n: n == "findings.json"):
            _move_into_place(staged[name], target / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def failure(r: TraceResult) -> str:
    """``PATH: reason`` for a failed trace, the path once (an input error's own message starts with it)."""
    error = r.error or "failed"
    return error if error.startswith(f"{r.path}: ") else f"{r.path}: {error}"


def describe(r: TraceResult) -> str:
    if not r.ok:
        return f"FAILED {failure(r)}"
    rec = f", {r.recorded}" if r.recorded else f", not recorded ({r.unrecorded})" if r.unrecorded else ""
    pats = f" ({', '.join(r.patterns)})" if r.patterns else ""
    out = f" -> {r.out}" if r.out else ""
    return f"ok     {r.path}: {r.findings} finding{'s' if r.findings != 1 else ''}{pats}, {r.bottleneck}{rec}, {r.seconds:.1f} s{out}"


def run_with_progress(paths: list[str], echo: Callable[[str], None], *, show_bar: bool | None = None, **kw) -> BatchResult:
    """run_batch with a rich progress bar on stderr and one line per trace."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=sys.stderr)
    show = console.is_terminal if show_bar is None else show_bar
    progress = Progress(TextColumn("[bold]batch[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, disable=not show, transient=True)
    with progress:
        task = progress.add_task("traces", total=len(paths))

        def on_result(r: TraceResult, done: int, total: int) -> None:
            progress.update(task, completed=done)
            line = f"[{done}/{total}] {describe(r)}"
            if show:
                progress.console.print(line, markup=False, highlight=False)
            else:
                echo(line)

        return run_batch(paths, on_result=on_result, **kw)
