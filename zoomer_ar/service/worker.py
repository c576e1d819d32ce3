"""`zoomer-ar worker`: claims queued jobs from the store and runs them outside the request path.

One job at a time per worker process: claim (queue.claim), start a heartbeat thread that extends
the lease every lease/3 seconds, run the job in a child process (forked: the job's *analysis process*),
which writes its artifacts and the `done` state in one transaction (queue.complete). The worker
watches that process meanwhile and stops it (SIGKILL to its process group: the analysis and anything it
started, a `git fetch`) when

- the team asked to cancel the job (`POST /v1/jobs/{id}/cancel`; the worker reads the job's row every
  `--poll` seconds): the job ends `cancelled` (queue.finish_cancelled, its recorded run undone) and its
  uploads are removed;
- the job has run `--job-timeout` seconds (`ZOOMER_SERVICE_JOB_TIMEOUT_S`, default 3600; counted from the
  claim): the job fails with "timed out after N s" (job_errors.timed_out_error), its uploads kept as a
  failed job's are;
- its lease was lost (another worker took the job over): the result would be dropped anyway.

Either way the job's scratch folder (`<data>/tmp/<job>-...`, also the analysis process's TMPDIR) is
removed, so a stopped job leaves no files behind. An analysis process that dies by itself (killed by
the kernel's OOM killer, a crash) is a worker that died for that job: the job's lease runs out and it is
claimed again (`attempts`), then abandoned. The analysis process dies with its worker (PR_SET_PDEATHSIG,
else a watch on its parent), and ignores SIGINT: a Ctrl-C reaches the worker, which lets the job finish.
Job kinds:

- `analyze`: the uploaded trace or rank folder through the same pipeline as `zoomer-ar analyze`
  (sources mapped with the uploaded source archive, recorded in the store under the job's team,
  findings.json, report.md, report.html, patch.diff, relaunch.yaml, optimize.ipynb; the reports and the
  store name the uploads as the client sent them, never the server's folders: client_paths). A job that
  fails after recording has its run deleted again when it is marked failed (queue.fail), so a
  failed job never counts in the digest;
- `review`: `zoomer_ar.review.review` on a pull request (from the GitHub webhook): review.json,
  review.md, review.sarif, and optionally the review posted on GitHub.

Bad input (a trace that is not a trace) fails the job with the one-line reason; it is not retried.
A full disk (scratch files, the store) fails it with one line saying so, without server paths (job_errors).
A failure the store cannot take yet (its disk is full, or it is unreachable) is kept by the worker and
written before its next claim, once the store takes writes again (the job is not left to be claimed
again and failed as "abandoned", which would send the operator after a dying worker, not a full disk).
A worker killed mid-job leaves a lease that expires; another worker claims the job again.
SIGTERM/SIGINT: the worker finishes its current job, then exits.

Test hooks: `ZOOMER_SERVICE_TEST_DELAY_S=<seconds>` makes a worker wait that long (heartbeating, and
watching for a cancel and the time limit) after claiming a job, before it starts the job's analysis
process; the test suite uses it to kill a worker mid-job. `ZOOMER_SERVICE_TEST_ANALYSIS_DELAY_S=<seconds>`
makes the analysis process write a file into its scratch folder and wait that long before it analyses:
a job that stands for a long analysis, to cancel or time out.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from ..errors import ZoomerError
from ..store.db import disk_full_reason
from . import queue as Q
from .client_paths import ClientPaths
from .config import Settings
from .job_errors import disk_full_error, timed_out_error
from .names import store_job_name

log = logging.getLogger("zoomer_ar.service.worker")

MEDIA = {
    "findings.json": "application/json",
    "report.md": "text/markdown; charset=utf-8",
    "report.html": "text/html; charset=utf-8",
    "patch.diff": "text/x-diff; charset=utf-8",
    "relaunch.yaml": "application/yaml",
    "optimize.ipynb": "application/x-ipynb+json",
    "review.json": "application/json",
    "review.md": "text/markdown; charset=utf-8",
    "review.sarif": "application/sarif+json",
}
TEST_DELAY_ENV = "ZOOMER_SERVICE_TEST_DELAY_S"
ANALYSIS_DELAY_ENV = "ZOOMER_SERVICE_TEST_ANALYSIS_DELAY_S"
WAKE_S = 0.1  # how often the worker looks at its job's analysis process, its time limit and its lease


class _Heartbeat(threading.Thread):
    def __init__(self, engine: Engine, claim: Q.Claim, lease_s: float):
        super().__init__(name=f"heartbeat-{claim.job_id[:8]}", daemon=True)
        self.engine, self.claim, self.lease_s = engine, claim, lease_s
        self.stop = threading.Event()
        self.lost = threading.Event()
        # held around each beat and by the worker while it forks the job's analysis process: the child never
        # starts with a beat's database call (a SQLite or driver lock) half done in a thread it does not have
        self.fork_lock = threading.Lock()

    def run(self) -> None:
        interval = max(0.2, self.lease_s / 3.0)
        while not self.stop.wait(interval):
            try:
                with self.fork_lock:
                    held = Q.heartbeat(self.engine, self.claim, self.lease_s)
                if not held:
                    log.warning("job %s: lease lost (another worker took it over)", self.claim.job_id)
                    self.lost.set()
                    return
            except Exception as exc:  # noqa: BLE001 - a missed beat is retried; the lease has slack
                log.warning("job %s: heartbeat failed: %s", self.claim.job_id, store_problem(self.engine, exc))


def store_problem(engine: Engine, exc: Exception) -> str:
    """A store error for the worker's log, in one line (SQLAlchemy's messages add a line of "Background")."""
    full = disk_full_reason(engine, exc)
    if full is not None:
        return f"the store's disk is full: {full}"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _die_with_parent(parent_pid: int) -> None:
    """In the analysis process: die when the worker does (SIGKILL from the kernel: PR_SET_PDEATHSIG on Linux; else a
    thread that watches the parent), so that a killed worker leaves no job running on alone."""
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # 1: PR_SET_PDEATHSIG
            if os.getppid() != parent_pid:  # the worker died before the setting took
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


@dataclass
class _Watch:
    """What the worker watches while a job runs: its time limit (monotonic clock; None: none) and when it next
    reads the job's cancel flag."""

    deadline: float | None
    next_poll: float = 0.0


def _received(receive) -> tuple[str, str | None] | None:  # noqa: ANN001 - a multiprocessing Connection
    """The analysis process's report, when it sent one (None: it ended without)."""
    try:
        if receive.poll():
            got = receive.recv()
            return (str(got[0]), got[1]) if isinstance(got, tuple) and len(got) == 2 else None
    except (EOFError, OSError):
        pass
    return None


def _analysis_delay_for_tests(scratch: Path) -> None:
    """The test hook ZOOMER_SERVICE_TEST_ANALYSIS_DELAY_S (module docstring)."""
    raw = os.environ.get(ANALYSIS_DELAY_ENV)
    if raw:
        (scratch / "analysis-delay").write_text(f"{os.getpid()}\n")
        time.sleep(float(raw))


def _kill_group(proc: multiprocessing.process.BaseProcess) -> None:
    """SIGKILL the analysis process and its process group (what it started: git), and reap it."""
    if proc.pid is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # not (yet) a group of its own
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    proc.join(timeout=30)


def _read_artifacts(folder: Path, written: dict[str, Path]) -> dict[str, tuple[str, bytes]]:
    return {name: (MEDIA.get(name, "application/octet-stream"), Path(p).read_bytes())
            for name, p in written.items() if Path(p).is_file()}


def run_analyze(claim: Q.Claim, settings: Settings, engine: Engine,
                out_dir: Path | None = None) -> tuple[dict, dict, str | None, int | None]:
    """The analysis pipeline on an uploaded job: (summary, artifacts, content hash, store analysis id). The reports
    are written into `out_dir` (the job's scratch folder, which its worker removes), else into a temporary folder
    under `<data>/tmp`."""
    from ..analyze import analyze_path
    from ..analyze_cli import write_fix_outputs
    from ..render import write_outputs
    from ..store.cost import cost_attribution
    from ..store.record import JobTeamConflict, RecordOptions, content_hash, record_analysis

    p = claim.params
    root = Path(claim.input_dir or "")
    trace = root / p["path"]
    source = root / p["source"] if p.get("source") else None
    analysis = analyze_path(trace, name=p.get("name") or None)
    if source is not None:
        from ..sourcemap import map_sources

        analysis = map_sources(analysis, source)
    # what the client is shown and what the store records name its uploads, never the server's folders;
    # the relaunch spec (write_fix_outputs) still reads job.json beside the files themselves
    shown = ClientPaths(str(root), p).analysis(analysis)
    chash = content_hash(analysis)
    analysis_id = None
    notes: list[str] = []
    store_job = f"{claim.team}/{p.get('job') or store_job_name(analysis.job.name)}"
    cost = None
    if p.get("record", True):
        try:
            # the run is recorded first (the reports show its recorded cost); the same transaction marks this
            # job as its recorder, so that failing the job later deletes the run again (queue.fail)
            opts = RecordOptions(
                job=store_job, team=claim.team, owner=p.get("owner"), gpus=p.get("gpus"),
                gpu_hours=p.get("gpu_hours"), gpu_hour_cost=p.get("gpu_hour_cost"), week=p.get("week"),
            )
            for _ in range(5):
                rr = record_analysis(shown, opts, db=engine,
                                     on_recorded=lambda s, r: Q.mark_recorded(s, claim, r.analysis_id))
                # a run recorded before: hold on to it (its recorder may still fail); gone already: record again
                if rr.status == "recorded" or Q.link_recorded(engine, claim, rr.analysis_id, chash):
                    break
            else:
                raise ZoomerError(f"could not record {chash[:12]}: the run kept vanishing while being reused")
        except JobTeamConflict:
            rr = None
            notes.append(f"the store job {store_job} belongs to another team; this run is not recorded")
        if rr is not None and _team_of(engine, rr.job_id) == claim.team:
            cost, analysis_id = rr.cost, rr.analysis_id
            if rr.job != store_job:
                notes.append(f"this trace was already recorded as job {rr.job}; that run stands")
        elif rr is not None:
            notes.append("this trace was already recorded by another team; it is not recorded again")
    if cost is None:
        cost = cost_attribution(analysis.features, analysis.findings, gpus=p.get("gpus"), gpu_hours=p.get("gpu_hours"),
                                gpu_hour_cost=p.get("gpu_hour_cost"))
    analysis.features["cost_attribution"] = shown.features["cost_attribution"] = cost
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = dict(write_outputs(shown, out_dir))
        written.update(write_fix_outputs(analysis, out_dir, source, trace))
        artifacts = _read_artifacts(out_dir, written)
    else:
        tmp_root = settings.data_dir / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tmp_root, prefix=f"{claim.job_id}-") as tmp:
            out = Path(tmp)
            written = dict(write_outputs(shown, out))
            written.update(write_fix_outputs(analysis, out, source, trace))
            artifacts = _read_artifacts(out, written)
    summary = {
        "job": analysis.job.name,
        "store_job": store_job if analysis_id is not None else None,
        "analysis_id": analysis_id,
        "bottleneck": analysis.bottleneck.type,
        "findings": len(analysis.findings),
        "patterns": [f.pattern for f in analysis.findings],
        "patch": "patch.diff" in artifacts,
        "recorded": analysis_id is not None,
        "notes": notes,
    }
    return summary, artifacts, chash, analysis_id


def _team_of(engine: Engine, job_id: int) -> str | None:
    from sqlalchemy import select

    from ..store.db import read_session
    from ..store.orm import Job

    with read_session(engine) as s:
        return s.execute(select(Job.team).where(Job.id == job_id)).scalar_one_or_none()


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=300)


def _ensure_commits(repo: Path, shas: list[str], pr: int | None) -> None:
    """Fetch the pull request's commits into the local clone when they are missing: its pull/N/head ref,
    then the remote's branches, then the commits by id."""
    def missing() -> list[str]:
        return [s for s in shas if _git(repo, "cat-file", "-e", f"{s}^{{commit}}").returncode != 0]

    if not missing():
        return
    attempts = ([[f"+refs/pull/{pr}/head:refs/zoomer/pull/{pr}"]] if pr else []) + [[], missing()]
    for refs in attempts:
        _git(repo, "fetch", "--quiet", "origin", *refs)
        if not missing():
            return
    from ..errors import InputError

    raise InputError(str(repo), f"commit(s) {', '.join(s[:12] for s in missing())} not found (git fetch origin failed)")


def run_review(claim: Q.Claim, settings: Settings) -> tuple[dict, dict]:
    """`review` on a pull request's base and head commits in the configured local clone."""
    import json

    from ..review import review
    from ..review.render import render_markdown
    from ..review.sarif import to_sarif
    from ..review.github import pr_number

    p = claim.params
    repo = Path(p["repo_path"])
    pr = pr_number(p.get("pr"))  # None: the event named no usable pull request (nothing is posted)
    _ensure_commits(repo, [p["base_sha"], p["head_sha"]], pr)
    result = review(repo, base=p["base_sha"], head=p["head_sha"])
    artifacts = {
        "review.json": (MEDIA["review.json"], result.model_dump_json(indent=2).encode()),
        "review.md": (MEDIA["review.md"], render_markdown(result).encode()),
        "review.sarif": (MEDIA["review.sarif"], json.dumps(to_sarif(result), indent=2).encode()),
    }
    summary: dict[str, Any] = {
        "repository": p.get("repository"), "pr": pr, "base_sha": p["base_sha"], "head_sha": p["head_sha"],
        "findings": len(result.findings), "rules": sorted({f.rule_id for f in result.findings}),
        "files_reviewed": result.files_reviewed, "posted": False,
    }
    if p.get("post") and pr is None:
        summary["notes"] = ["not posted: the event carries no pull-request number"]
    elif p.get("post") and os.environ.get("GITHUB_TOKEN"):
        from ..review.github import GitHubTarget, post

        # the API the token goes to is this deployment's setting; a job's params (from a webhook payload, or
        # queued by an older server that took it from the payload's repository.url) never choose it
        target = GitHubTarget(api_url=settings.github_api_url, repository=p["repository"], pr=pr,
                              token=os.environ["GITHUB_TOKEN"])
        outcome = post(result, target)
        summary["posted"] = True
        summary["post"] = {k: v for k, v in vars(outcome).items() if isinstance(v, (int, str, bool, float, type(None)))}
    elif p.get("post"):
        summary["notes"] = ["not posted: GITHUB_TOKEN is not set in the worker's environment"]
    return summary, artifacts


class Worker:
    """Claims and runs jobs until stopped (see the module docstring)."""

    def __init__(self, settings: Settings, *, worker_id: str | None = None, engine: Engine | None = None):
        from ..store.db import open_store

        self.settings = settings
        self.engine = engine or open_store(settings.db)
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stop = threading.Event()
        self.done = 0
        self.unmarked: dict[str, tuple[Q.Claim, str]] = {}  # job id -> (claim, error): failures the store refused
        self._inherited_pool = None
        self._sweep_tmp()
        # imported once here, not in each job's analysis process: it is forked with them loaded
        from .. import analyze, analyze_cli, render  # noqa: F401

    def _sweep_tmp(self, older_than_s: float = 86_400.0) -> None:
        """Scratch folders left by workers killed mid-job (a day old: no live job is that slow to write reports)."""
        tmp = self.settings.data_dir / "tmp"
        if not tmp.is_dir():
            return
        cutoff = time.time() - older_than_s
        for p in tmp.iterdir():
            try:
                if p.stat().st_mtime < cutoff:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass

    def process(self, c: Q.Claim) -> str:
        """Run one claimed job; returns its final state: 'done', 'failed', 'cancelled', 'lost' (another worker
        holds it now), 'unmarked' (failed; marked so once the store takes writes) or 'died' (its analysis process
        died by itself: the job's lease runs out and it is claimed again)."""
        log.info("job %s (%s %s): claimed by %s, attempt %d", c.job_id, c.kind, c.name, self.id, c.attempt)
        hb = _Heartbeat(self.engine, c, self.settings.lease_s)
        hb.start()
        t0 = time.perf_counter()
        limit = self.settings.job_timeout_s
        watch = _Watch(deadline=time.monotonic() + limit if limit > 0 else None)
        scratch: Path | None = None
        try:
            outcome, msg = self._delay_for_tests(c, hb, watch), None
            if outcome is None:
                try:
                    tmp_root = self.settings.data_dir / "tmp"
                    tmp_root.mkdir(parents=True, exist_ok=True)
                    scratch = Path(tempfile.mkdtemp(dir=tmp_root, prefix=f"{c.job_id}-"))
                except OSError as exc:  # a full disk: said as such (job_errors), like the reports' own writes
                    outcome, msg = self._fail(c, exc), None
                else:
                    outcome, msg = self._run_child(c, hb, watch, scratch)
            state = self._conclude(c, outcome, msg)
        finally:
            hb.stop.set()
            hb.join(timeout=5)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        took = time.perf_counter() - t0
        if state == "unmarked":
            log.info("job %s: failed in %.2f s; marked failed once the store takes writes again", c.job_id, took)
            self.done += 1
            return state
        if state in ("done", "cancelled") and c.input_dir:  # the uploads are no longer needed (failed jobs keep them)
            folder = Path(c.input_dir)
            shutil.rmtree(folder.parent if folder.parent.name == c.job_id else folder, ignore_errors=True)
        said = {"lost": "lease lost, result dropped",
                "died": "its analysis process died; claimed again once its lease has expired"}.get(state, state)
        log.info("job %s: %s in %.2f s", c.job_id, said, took)
        self.done += 1
        return state

    def _stop_reason(self, c: Q.Claim, hb: _Heartbeat, watch: _Watch) -> str | None:
        """Why the job must stop now: 'lost', 'timeout', 'cancel'; None: it goes on. The cancel flag is read every
        `poll_s` seconds (a read of one row); a store that does not answer now is asked again next time."""
        if hb.lost.is_set():
            return "lost"
        now = time.monotonic()
        if watch.deadline is not None and now >= watch.deadline:
            return "timeout"
        if now >= watch.next_poll:
            watch.next_poll = now + self.settings.poll_s
            try:
                if Q.cancel_requested(self.engine, c):
                    return "cancel"
            except Exception as exc:  # noqa: BLE001 - the heartbeat reports a store gone for good
                log.debug("job %s: cannot read its cancel flag now: %s", c.job_id, store_problem(self.engine, exc))
        return None

    def _delay_for_tests(self, c: Q.Claim, hb: _Heartbeat, watch: _Watch) -> str | None:
        """The test hook ZOOMER_SERVICE_TEST_DELAY_S (module docstring): the claimed job waits, watched as it is
        while it runs; returns why it stopped waiting early, if it did."""
        raw = os.environ.get(TEST_DELAY_ENV)
        if not raw:
            return None
        until = time.monotonic() + float(raw)
        while time.monotonic() < until:
            why = self._stop_reason(c, hb, watch)
            if why is not None:
                return why
            time.sleep(0.05)
        return None

    def _run_child(self, c: Q.Claim, hb: _Heartbeat, watch: _Watch, scratch: Path) -> tuple[str, str | None]:
        """Run the job in its analysis process and watch it; returns (outcome, message): the child's own outcome
        ('done', 'failed', 'lost', or 'unmarked' with the failure to mark), else why it was stopped ('cancel',
        'timeout', 'lost') or 'died' with how."""
        ctx = multiprocessing.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=self._child_main, args=(c, scratch, send, os.getpid()),
                           name=f"zoomer-job-{c.job_id[:8]}", daemon=False)
        with hb.fork_lock:
            proc.start()
        send.close()
        with contextlib.suppress(OSError):  # the child does it too; whichever is first (it may have exited)
            os.setpgid(proc.pid, proc.pid)
        try:
            while True:
                ready = multiprocessing.connection.wait([receive, proc.sentinel], timeout=WAKE_S)
                if ready:
                    got = _received(receive)
                    proc.join(timeout=30)
                    if got is not None:
                        return got
                    how = f"signal {-proc.exitcode}" if (proc.exitcode or 0) < 0 else f"exit status {proc.exitcode}"
                    log.warning("job %s: its analysis process died (%s) before it reported", c.job_id, how)
                    return "died", how
                why = self._stop_reason(c, hb, watch)
                if why is not None:
                    _kill_group(proc)
                    got = _received(receive)  # it may have finished just before it was killed
                    if got is not None:
                        return got
                    log.info("job %s: analysis process stopped (%s)", c.job_id,
                             {"cancel": "cancelled", "timeout": "time limit"}.get(why, "lease lost"))
                    return why, None
        finally:
            if proc.is_alive():  # an exception here (KeyboardInterrupt...): the job does not run on alone
                _kill_group(proc)
            receive.close()

    def _child_main(self, c: Q.Claim, scratch: Path, send, parent_pid: int) -> None:  # noqa: ANN001 - a Connection
        """The job's analysis process: a process group of its own (stopped as one), SIGINT ignored (a terminal's
        Ctrl-C stops the worker, which lets the job finish), dies with its worker, fresh database connections (the
        worker's are its own), temporary files in the scratch folder its worker removes."""
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _die_with_parent(parent_pid)
        # the worker's pooled connections are the worker's: this process opens its own, and keeps the inherited ones
        # referenced until it ends (os._exit), since closing one here would close it for the worker too (a SQLite
        # file's locks and WAL, a PostgreSQL session's socket)
        self._inherited_pool = self.engine.pool
        self.engine.dispose(close=False)
        tempfile.tempdir = str(scratch)
        os.environ["TMPDIR"] = str(scratch)
        send.send(self._run_here(c, scratch))
        send.close()

    def _run_here(self, c: Q.Claim, scratch: Path) -> tuple[str, str | None]:
        """Run the job in this process (the analysis process) and store its outcome: ('done' | 'failed' | 'lost', None)
        or ('unmarked', the failure the store refused)."""
        t0 = time.perf_counter()
        try:
            _analysis_delay_for_tests(scratch)
            if c.kind == "analyze":
                summary, artifacts, chash, analysis_id = run_analyze(c, self.settings, self.engine, scratch / "out")
            elif c.kind == "review":
                (summary, artifacts), chash, analysis_id = run_review(c, self.settings), None, None
            else:
                raise ZoomerError(f"unknown job kind {c.kind!r}")
            summary["seconds"] = round(time.perf_counter() - t0, 3)
            summary["worker"] = self.id
            ok = Q.complete(self.engine, c, result=summary, artifacts=artifacts, content_hash=chash,
                            analysis_id=analysis_id)
            return ("done" if ok else "lost"), None
        except Q.LeaseLost:  # another worker holds the job now, or it is being cancelled (its recording rolled back)
            return "lost", None
        except Exception as exc:  # noqa: BLE001 - the job fails with the reason
            state = self._fail(c, exc)
            return state, self.unmarked.get(c.job_id, (c, None))[1] if state == "unmarked" else None

    def _conclude(self, c: Q.Claim, outcome: str, msg: str | None) -> str:
        """The job's final state from its outcome: a stopped job is marked cancelled or failed here; a job the
        analysis process could not finish ('lost': its lease, or a cancel that came first) is cancelled when
        that was asked for."""
        if outcome == "unmarked":
            if msg is not None:  # the analysis process's failure (one of this process's is in `unmarked` already)
                self.unmarked[c.job_id] = (c, msg)
            return "unmarked"
        if outcome == "timeout":
            log.warning("job %s: stopped at its time limit of %g s", c.job_id, self.settings.job_timeout_s)
            state = self._mark_failed(c, timed_out_error(self.settings.job_timeout_s))
            if state != "lost":
                return state
        if outcome in ("done", "failed"):
            return outcome
        if outcome == "died" and not self._cancel_asked(c):
            return "died"
        if outcome == "lost" and not self._cancel_asked(c):
            return "lost"
        try:
            return "cancelled" if Q.finish_cancelled(self.engine, c) else "lost"
        except Exception as exc:  # noqa: BLE001 - the job's next claim cancels it (queue.claim); housekeeping its files
            log.warning("job %s: cannot be marked cancelled now (%s); the next claim of it does that", c.job_id,
                        store_problem(self.engine, exc))
            return "lost"

    def _cancel_asked(self, c: Q.Claim) -> bool:
        try:
            return bool(Q.cancel_requested(self.engine, c))
        except Exception:  # noqa: BLE001 - unknown: the job's lease decides (a cancel is then done by the next claim)
            return False

    def _fail(self, c: Q.Claim, exc: Exception) -> str:
        """Fail the job with the reason of `exc` in one line: 'failed'; 'lost' when the lease was lost; 'unmarked'
        when the store cannot take even that (its disk is full, it is unreachable): the failure is kept in
        `unmarked` and written before the next claim (mark_unmarked)."""
        full = disk_full_error(exc, self.engine)
        if full is not None:  # the server's disk, not the job: no server paths, no stack trace
            log.warning("job %s: %s", c.job_id, full)
            msg = full
        elif isinstance(exc, ZoomerError):  # bad input: the reason, naming the uploads as the client named them
            msg = ClientPaths(c.input_dir, c.params).text(str(exc)) if c.input_dir else str(exc)
        else:
            log.error("job %s: internal error\n%s", c.job_id, "".join(traceback.format_exception(exc)))
            msg = f"internal error: {type(exc).__name__}: {exc}"
        return self._mark_failed(c, msg)

    def _mark_failed(self, c: Q.Claim, msg: str) -> str:
        """Mark the job failed with `msg` (see `_fail`)."""
        try:
            ok = Q.fail(self.engine, c, msg, result={"worker": self.id})
        except DBAPIError as fail_exc:
            log.warning("job %s: cannot be marked failed now (%s); it is, with its reason, once the store takes "
                        "writes again", c.job_id, store_problem(self.engine, fail_exc))
            self.unmarked[c.job_id] = (c, msg)
            return "unmarked"
        return "failed" if ok else "lost"

    def mark_unmarked(self) -> None:
        """Write the failures the store refused (`unmarked`), each under the lease it was claimed with: a job
        another worker claimed since (its lease ran out meanwhile) is that worker's, and its failure is dropped."""
        for job_id, (c, msg) in list(self.unmarked.items()):
            try:
                ok = Q.fail(self.engine, c, msg, result={"worker": self.id})
            except Exception as exc:  # noqa: BLE001 - the store still refuses: kept, tried again later
                log.warning("job %s: still cannot be marked failed (%s)", job_id, store_problem(self.engine, exc))
                return
            del self.unmarked[job_id]
            if not ok and self._cancel_asked(c):  # asked meanwhile: it ends cancelled, not failed
                ok = Q.finish_cancelled(self.engine, c)
                log.info("job %s: %s", job_id, "cancelled" if ok else "claimed again by another worker meanwhile")
                continue
            if ok:
                log.info("job %s: marked failed: %s", job_id, msg)
            else:
                log.info("job %s: claimed again by another worker meanwhile; its failure here is dropped", job_id)

    def run_once(self) -> str | None:
        c = Q.claim(self.engine, self.id, self.settings.lease_s)
        if c is None:
            return None
        return self.process(c)

    def run(self, *, max_jobs: int | None = None, exit_when_idle: bool = False, parent_pid: int | None = None) -> int:
        """Loop: claim, run, repeat; returns the number of jobs run."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop.set())
        log.info("worker %s: store %s, data %s", self.id, self.engine.url.render_as_string(hide_password=True),
                 self.settings.data_dir)
        errors = 0
        while not self.stop.is_set():
            if parent_pid is not None and os.getppid() != parent_pid:
                log.info("worker %s: parent %d exited; stopping", self.id, parent_pid)
                break
            if max_jobs is not None and self.done >= max_jobs:
                break
            backoff = min(30.0, self.settings.poll_s * 2 ** min(errors + 1, 5))
            self.mark_unmarked()  # before claiming: a claim could take one of these jobs again, or abandon it
            if self.unmarked:  # the store still refuses them: no new job until it takes them
                errors += 1
                self.stop.wait(backoff)
                continue
            try:
                state = self.run_once()
                errors = 0
            except Exception as exc:  # noqa: BLE001 - the store is unreachable: wait and retry
                errors += 1
                log.warning("worker %s: cannot claim (%s); retrying", self.id, store_problem(self.engine, exc))
                self.stop.wait(backoff)
                continue
            if state is None:
                if exit_when_idle:
                    break
                self.stop.wait(self.settings.poll_s)
        self.mark_unmarked()
        for job_id in self.unmarked:
            log.warning("job %s: stopping without marking it failed (the store refuses writes); it is claimed again "
                        "once its lease has expired", job_id)
        return self.done
