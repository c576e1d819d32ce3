"""`zoomer-ar worker`: claims queued jobs from the store and runs them outside the request path.

One job at a time per worker process: claim (queue.claim), start a heartbeat thread that extends
the lease every lease/3 seconds, run the job, then write its artifacts and the `done` state in one
transaction (queue.complete). Job kinds:

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

Test hook: `ZOOMER_SERVICE_TEST_DELAY_S=<seconds>` makes a worker wait that long (heartbeating)
after claiming a job, before running it; the test suite uses it to kill a worker mid-job.
"""

from __future__ import annotations

import logging
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
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from ..errors import ZoomerError
from ..store.db import disk_full_reason
from . import queue as Q
from .client_paths import ClientPaths
from .config import Settings
from .job_errors import disk_full_error
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


class _Heartbeat(threading.Thread):
    def __init__(self, engine: Engine, claim: Q.Claim, lease_s: float):
        super().__init__(name=f"heartbeat-{claim.job_id[:8]}", daemon=True)
        self.engine, self.claim, self.lease_s = engine, claim, lease_s
        self.stop = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:
        interval = max(0.2, self.lease_s / 3.0)
        while not self.stop.wait(interval):
            try:
                if not Q.heartbeat(self.engine, self.claim, self.lease_s):
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


def _delay_for_tests(hb: _Heartbeat) -> None:
    raw = os.environ.get(TEST_DELAY_ENV)
    if not raw:
        return
    deadline = time.monotonic() + float(raw)
    while time.monotonic() < deadline and not hb.lost.is_set():
        time.sleep(0.05)


def _read_artifacts(folder: Path, written: dict[str, Path]) -> dict[str, tuple[str, bytes]]:
    return {name: (MEDIA.get(name, "application/octet-stream"), Path(p).read_bytes())
            for name, p in written.items() if Path(p).is_file()}


def run_analyze(claim: Q.Claim, settings: Settings, engine: Engine) -> tuple[dict, dict, str | None, int | None]:
    """The analysis pipeline on an uploaded job: (summary, artifacts, content hash, store analysis id)."""
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
        self._sweep_tmp()

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
        """Run one claimed job; returns its final state ('done', 'failed' or 'lost')."""
        log.info("job %s (%s %s): claimed by %s, attempt %d", c.job_id, c.kind, c.name, self.id, c.attempt)
        hb = _Heartbeat(self.engine, c, self.settings.lease_s)
        hb.start()
        t0 = time.perf_counter()
        try:
            _delay_for_tests(hb)
            if hb.lost.is_set():
                return "lost"
            if c.kind == "analyze":
                summary, artifacts, chash, analysis_id = run_analyze(c, self.settings, self.engine)
            elif c.kind == "review":
                (summary, artifacts), chash, analysis_id = run_review(c, self.settings), None, None
            else:
                raise ZoomerError(f"unknown job kind {c.kind!r}")
            summary["seconds"] = round(time.perf_counter() - t0, 3)
            summary["worker"] = self.id
            ok = Q.complete(self.engine, c, result=summary, artifacts=artifacts, content_hash=chash,
                            analysis_id=analysis_id)
            state = "done" if ok else "lost"
        except Q.LeaseLost:  # another worker holds the job now (its recording, if any, was rolled back)
            state = "lost"
        except Exception as exc:  # noqa: BLE001 - the job fails with the reason; the worker goes on
            state = self._fail(c, exc)
        finally:
            hb.stop.set()
            hb.join(timeout=5)
        if state == "unmarked":
            log.info("job %s: failed in %.2f s; marked failed once the store takes writes again", c.job_id,
                     time.perf_counter() - t0)
            self.done += 1
            return state
        if state == "done" and c.input_dir:  # the uploads are no longer needed (failed jobs keep them)
            folder = Path(c.input_dir)
            shutil.rmtree(folder.parent if folder.parent.name == c.job_id else folder, ignore_errors=True)
        log.info("job %s: %s in %.2f s", c.job_id, state if state != "lost" else "lease lost, result dropped",
                 time.perf_counter() - t0)
        self.done += 1
        return state

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
