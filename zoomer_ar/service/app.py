"""The HTTP API (FastAPI). `create_app(settings)` builds it; `zoomer-ar serve` runs it on uvicorn.

Every /v1 route but the webhook and /v1/health needs `Authorization: Bearer <token>`; the token's
team scopes what a request sees (another team's job answers 404, as if it did not exist).
See docs/service.md; the schema is published in docs/openapi.json (`zoomer-ar openapi`).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Path as PathParam, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field, ValidationError, field_validator
from sqlalchemy.exc import DBAPIError

from .. import __version__
from ..store.db import disk_full_reason
from . import queue as Q
from .archives import ArchiveError
from .auth import Principal, authenticate
from .config import Settings
from .disk import DiskFull, store_full
from .housekeeping import sweep_forever
from .names import SEPARATORS, bad_chars
from .uploads import FILE_FIELDS, MultipartReceiver, UploadError, prepare_inputs
from .webhook import WebhookError, review_job, verify

JOB_ID = r"^[0-9a-f]{32}$"
WEBHOOK_MAX_BYTES = 25 << 20  # GitHub caps payloads at 25 MB
JSON_MAX_BYTES = 1 << 20  # bodies FastAPI reads whole (POST /v1/verdicts), read before the token is checked
STREAMED = ("/v1/jobs", "/v1/github/webhook")  # routes that read their body as a stream, under their own caps
AUTH_HEADERS = {"WWW-Authenticate": "Bearer"}
RETRY_AFTER = {"Retry-After": "30"}  # a team at its quota: its jobs take a while to finish


# --- models -------------------------------------------------------------------------------------------


class Error(BaseModel):
    detail: str = Field(description="What went wrong, in one line.")


class JobAccepted(BaseModel):
    id: str = Field(description="The job id (32 hex digits).")
    state: Literal["queued"] = "queued"
    status_url: str


class JobStatus(BaseModel):
    id: str
    kind: Literal["analyze", "review"]
    name: str
    team: str
    state: Literal["queued", "running", "done", "failed", "cancelled"]
    attempts: int = Field(description="How many times a worker claimed the job.")
    worker: str | None = Field(None, description="The worker that holds or held the job.")
    queued_at: float = Field(description="Epoch seconds (database clock).")
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    cancel_requested_at: float | None = Field(
        None, description="When the team asked to cancel the job (epoch seconds, database clock): a running job "
                          "with this set is being stopped by its worker and ends `cancelled`.")
    result: dict[str, Any] | None = Field(None, description="Summary of a finished job.")
    artifacts: list[str] = Field(default_factory=list, description="Files of a finished job.")
    links: dict[str, str] = Field(default_factory=dict)


class JobList(BaseModel):
    jobs: list[JobStatus]
    next: str | None = Field(None, description="The cursor of the next page (pass it as `before`); null on the last "
                                               "page.")
    next_url: str | None = Field(None, description="The next page's URL (same `state` and `limit`); null on the last "
                                                   "page.")


JobState = Literal["queued", "running", "done", "failed", "cancelled"]


def encode_cursor(queued_at: float, job_id: str) -> str:
    """The opaque paging cursor of GET /v1/jobs: the (queued_at, id) key of a page's last job, base64url. `repr`
    of a float reads back as the same float, so the key compares exactly with the stored one."""
    import base64

    return base64.urlsafe_b64encode(f"{queued_at!r} {job_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    """The key of `encode_cursor`; ValueError for anything else."""
    import base64
    import binascii
    import re

    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        at, job_id = raw.split(" ")
        when = float(at)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a cursor of this API (use the `next` of the previous page)") from None
    if not math.isfinite(when) or not re.fullmatch(JOB_ID, job_id):
        raise ValueError("not a cursor of this API (use the `next` of the previous page)")
    return when, job_id


class VerdictIn(BaseModel):
    job_id: str = Field(pattern=JOB_ID, description="A finished, recorded analysis job of your team.")
    pattern: str = Field(description="The anti-pattern id the verdict is about, e.g. dataloader-bound.")
    label: Literal["positive", "negative"]
    note: str | None = Field(None, max_length=2000)

    @field_validator("pattern")
    @classmethod
    def _known(cls, v: str) -> str:
        from ..models import PATTERN_IDS

        if v not in PATTERN_IDS:
            raise ValueError(f"unknown pattern {v!r}")
        return v


class VerdictOut(BaseModel):
    id: int
    job_id: str
    pattern: str
    label: str
    author: str


class WebhookOut(BaseModel):
    status: Literal["pong", "ignored", "queued", "duplicate"] = Field(
        description="duplicate: GitHub redelivered a delivery (same X-GitHub-Delivery) whose review job is "
                    "queued, running or done; `job_id` is that job")
    reason: str | None = None
    job_id: str | None = None


class Health(BaseModel):
    status: Literal["ok"]
    version: str


class JobMetadata(BaseModel):
    """The text fields of POST /v1/jobs.

    `job` (the store job, recorded as `<team>/<job>`) may not contain `/` or `\\` (so `<team>/<job>`
    names exactly one team's job) nor control characters; `name` and `owner` no control characters.
    """

    name: str | None = Field(None, min_length=1, max_length=200)
    job: str | None = Field(None, min_length=1, max_length=180)
    owner: str | None = Field(None, max_length=200)
    gpus: int | None = Field(None, ge=0, le=1_000_000)
    gpu_hours: float | None = Field(None, ge=0, le=1e12)
    gpu_hour_cost: float | None = Field(None, ge=0, le=1e6)
    week: str | None = None
    record: bool = True

    @field_validator("job")
    @classmethod
    def _job(cls, v: str | None) -> str | None:
        if v is None:
            return None
        bad = bad_chars(v, SEPARATORS)
        if bad:
            raise ValueError(f"job name may not contain {', '.join(repr(c) for c in bad)} "
                             "(no '/' or backslash: the store records it as <team>/<job>; no control characters)")
        if v != v.strip():
            raise ValueError("job name may not start or end with spaces")
        return v

    @field_validator("name", "owner")
    @classmethod
    def _printable(cls, v: str | None) -> str | None:
        bad = bad_chars(v) if v is not None else []
        if bad:
            raise ValueError(f"may not contain control characters ({', '.join(repr(c) for c in bad)})")
        return v

    @field_validator("week")
    @classmethod
    def _week(cls, v: str | None) -> str | None:
        if v is None:
            return None
        from ..store import weeks as W

        try:
            return W.parse_week(v)
        except W.WeekError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("gpu_hours", "gpu_hour_cost", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        # before the range checks: "nan" is not finite, not "greater than 1e12"
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            try:
                f = float(v)
            except (TypeError, ValueError):
                return v  # not a number: the float validator says so
            if not math.isfinite(f):
                raise ValueError("must be a finite number")
        return v


def _err(*codes: int, **described: str) -> dict[int | str, dict[str, Any]]:
    text = {400: "Bad request", 401: "Missing, unknown or revoked API token", 404: "Not found (or another team's)",
            409: "Not available in the job's current state", 413: "Upload too large", 415: "Unsupported media type",
            422: "Invalid parameters",
            429: "The team is at its limit of queued and running jobs, or of their disk space (the message says "
                 "which); try again later (Retry-After)",
            507: "The server's disk is full: the upload was not kept (nothing of it stays on disk); try again later"}
    return {c: {"model": Error, "description": described.get(f"e{c}", text.get(c, "Error"))} for c in codes}


UPLOAD_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "trace": {"type": "string", "format": "binary",
                  "description": "A Kineto trace (.json or .json.gz). Give this or `ranks`."},
        "ranks": {"type": "string", "format": "binary",
                  "description": "A rank archive (.tar.gz, .tgz or .zip) of per-rank trace files. Give this or `trace`."},
        "source": {"type": "string", "format": "binary",
                   "description": "Optional source archive (.tar.gz or .zip) of the training code: findings are "
                                  "mapped to its lines and patch.diff applies at its root (`patch -p1`)."},
        "name": {"type": "string", "maxLength": 200, "description": "Job name in the report (default: from the upload)."},
        "job": {"type": "string", "maxLength": 180,
                "description": "Job name in the store (recorded as <team>/<job>; default: the report name, with "
                               "'/', '\\' and control characters replaced by '_'). No '/', '\\' or control "
                               "characters."},
        "owner": {"type": "string", "maxLength": 200},
        "gpus": {"type": "integer", "minimum": 0, "maximum": 1000000},
        "gpu_hours": {"type": "number", "minimum": 0, "maximum": 1e12},
        "gpu_hour_cost": {"type": "number", "minimum": 0, "maximum": 1e6},
        "week": {"type": "string", "description": "ISO week YYYY-Www to record under."},
        "record": {"type": "boolean", "default": True, "description": "Record the analysis in the store (digest)."},
    },
}

ARTIFACTS: dict[str, tuple[str, str]] = {
    # route suffix: (artifact name, media type shown in the schema)
    "findings": ("findings.json", "application/json"),
    "report.html": ("report.html", "text/html"),
    "report.md": ("report.md", "text/markdown"),
    "patch.diff": ("patch.diff", "text/x-diff"),
    "relaunch.yaml": ("relaunch.yaml", "application/yaml"),
    "notebook.ipynb": ("optimize.ipynb", "application/x-ipynb+json"),
    "review.json": ("review.json", "application/json"),
    "review.md": ("review.md", "text/markdown"),
    "review.sarif": ("review.sarif", "application/sarif+json"),
}
NOT_PRODUCED = {
    "patch.diff": "no patch for this job: upload a source archive (field 'source'); a patch is made only when a "
                  "finding has a fixer that applies to the code",
}


# --- authentication -----------------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False, description="An API token from `zoomer-ar token create --team T`.")


def engine(request: Request):  # noqa: ANN201
    return request.app.state.engine


def require_principal(request: Request,
                      creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
    if creds is None or not creds.credentials:
        raise HTTPException(401, "missing API token: send Authorization: Bearer <token>", headers=AUTH_HEADERS)
    who = authenticate(request.app.state.engine, creds.credentials)
    if who is None:
        raise HTTPException(401, "invalid or revoked API token", headers=AUTH_HEADERS)
    return who


Who = Annotated[Principal, Depends(require_principal)]
JobId = Annotated[str, PathParam(pattern=JOB_ID, description="The job id returned by POST /v1/jobs.")]


# --- body cap -----------------------------------------------------------------------------------------


class BodyCap:
    """ASGI middleware: a request body over `limit` bytes answers 413, except on the STREAMED routes.

    FastAPI reads a JSON body whole into memory before it resolves any dependency (the token check
    included): without a cap, an unauthenticated POST /v1/verdicts of 400 MB took the server to
    1.3 GB. A declared Content-Length over the cap is refused before reading; otherwise the count
    stops reading at the cap.
    """

    def __init__(self, app, limit: int = JSON_MAX_BYTES) -> None:  # noqa: ANN001 - an ASGI app
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 - ASGI
        if scope["type"] != "http" or scope["path"] in STREAMED:
            await self.app(scope, receive, send)
            return
        too_large = HTTPException(413, f"request body larger than {self.limit:,} bytes")
        length = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            await JSONResponse({"detail": too_large.detail}, status_code=413)(scope, receive, send)
            return
        seen = 0

        async def counted():  # noqa: ANN202
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise too_large  # FastAPI re-raises it from the body read: a JSON 413
            return message

        await self.app(scope, counted, send)


class NoSniff:
    """ASGI middleware: every response says `X-Content-Type-Options: nosniff`, so a browser renders a
    download (report.md, a notebook, a trace) as the type it is served as, never as HTML it guessed
    from content (trace names are the user's text: a `<script>` in them)."""

    def __init__(self, app) -> None:  # noqa: ANN001 - an ASGI app
        self.app = app

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 - ASGI
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_nosniff(message) -> None:  # noqa: ANN001
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"x-content-type-options"]
                message = {**message, "headers": [*headers, (b"x-content-type-options", b"nosniff")]}
            await send(message)

        await self.app(scope, receive, send_nosniff)


class CutOffAtShutdown:
    """ASGI middleware: a request still running when the server stops (uvicorn cancels it past its 10 s of graceful
    shutdown: a long upload, say) is answered 503 in the API's error shape, with Retry-After, instead of uvicorn's
    plain-text 500 'Internal Server Error' and a stack trace in the log. Its handler has removed what it wrote."""

    def __init__(self, app) -> None:  # noqa: ANN001 - an ASGI app
        self.app = app

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 - ASGI
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_noting(message) -> None:  # noqa: ANN001
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_noting)
        except asyncio.CancelledError:
            import logging

            logging.getLogger("zoomer_ar.service").warning(
                "%s %s cut off: the server is stopping", scope.get("method"), scope.get("path"))
            if started:  # the answer was under way: the connection is closed on it
                raise
            await JSONResponse({"detail": "the server is stopping: this request was cut off before it finished "
                                          "(nothing of it was kept); send it again in a moment"},
                               status_code=503, headers={"Retry-After": "5", "Connection": "close"})(
                scope, receive, send)


# --- app ----------------------------------------------------------------------------------------------


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        from ..store.db import open_store

        app.state.engine = await run_in_threadpool(open_store, settings.db)
        settings.jobs_dir.mkdir(parents=True, exist_ok=True)
        # uploads of a server killed mid-upload, inputs left by killed workers: at start-up, then now and then
        sweeper = asyncio.create_task(sweep_forever(app.state.engine, settings.jobs_dir, settings.retention))
        try:
            yield
        finally:
            sweeper.cancel()
            with suppress(asyncio.CancelledError):
                await sweeper

    app = FastAPI(
        title="Zoomer AR service",
        version=__version__,
        description="Upload PyTorch profiler traces; get findings, reports, patches and relaunch specs. "
                    "Authenticate with `Authorization: Bearer <token>` (`zoomer-ar token create --team T`).",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.uploading = {}  # team id -> uploads of POST /v1/jobs still arriving (team quota)
    app.add_middleware(BodyCap)
    app.add_middleware(CutOffAtShutdown)
    app.add_middleware(NoSniff)  # the outermost: on every answer, CutOffAtShutdown's too

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        """Anything unforeseen: a JSON 500 like every other error answer (never a stack trace to the
        client; the server's log has it)."""
        import logging

        full = disk_full_reason(request.app.state.engine, exc) if isinstance(exc, DBAPIError) else None
        if full is not None:  # the store's disk is full: the request's transaction was rolled back
            logging.getLogger("zoomer_ar.service").warning("%s %s refused: the store's disk is full (%s)",
                                                            request.method, request.url.path, full)
            return JSONResponse({"detail": str(store_full("do this now", full))}, status_code=507)
        logging.getLogger("zoomer_ar.service").error("internal error on %s %s", request.method, request.url.path,
                                                      exc_info=exc)
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); the server's log has the details"},
                            status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        """A body that is not JSON is a malformed request (400, as documented), not invalid parameters (422)."""
        reason = _not_json(exc.errors())
        if reason is not None:
            return JSONResponse({"detail": reason}, status_code=400)
        # the API's error shape, one line (FastAPI's own 422 is a list of error objects under "detail")
        return JSONResponse({"detail": _invalid(exc.errors())}, status_code=422)

    def status(job, eng, names: list[str] | None = None) -> JobStatus:
        if names is None:
            names = Q.artifact_names(eng, job.id) if job.state == Q.DONE else []
        base = f"/v1/jobs/{job.id}"
        links = {"self": base}
        for route, (art, _mt) in ARTIFACTS.items():
            if art in names:
                links[route] = f"{base}/{route}"
        return JobStatus(
            id=job.id, kind=job.kind, name=job.name, team=_team_name(eng, job.team_id), state=job.state,
            attempts=job.attempts, worker=job.lease_owner, queued_at=job.queued_at, started_at=job.started_at,
            finished_at=job.finished_at, error=job.error, cancel_requested_at=job.cancel_requested_at,
            result=job.result, artifacts=names, links=links,
        )

    @app.get("/v1/health", response_model=Health, tags=["service"])
    def health() -> Health:
        """Liveness: no authentication."""
        return Health(status="ok", version=__version__)

    @app.post(
        "/v1/jobs", status_code=202, response_model=JobAccepted, tags=["jobs"],
        responses=_err(400, 401, 413, 415, 422, 429, 507, e400="Malformed upload or refused archive (the message says "
                                                             "which entry and why)"),
        openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": UPLOAD_SCHEMA}}}},
    )
    async def create_job(request: Request, who: Who) -> JSONResponse:
        """Upload a trace (or a rank archive) and optionally a source archive; the job is queued and its id returned at once.

        The body is streamed to disk as it arrives. Archives are checked entry by entry (no absolute
        paths, no `..`, no links or special files; caps on total uncompressed size, entry count and
        compression ratio).
        """
        ctype = request.headers.get("content-type", "")
        if not ctype.lower().startswith("multipart/form-data"):
            raise HTTPException(415, "send multipart/form-data (fields: trace or ranks, source, job metadata)")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.drain_bytes:
            raise HTTPException(413, f"upload too large: {int(length):,} bytes (limit {settings.max_upload_bytes:,})")
        quota = settings.team_quota
        uploading = request.app.state.uploading  # this server's uploads still arriving, per team
        others = uploading.get(who.team_id, 0)
        uploading[who.team_id] = others + 1  # counted before any await: concurrent uploads see each other
        try:
            # a team at its limit is refused before its body is read (it could not be queued anyway)
            Q.check_quota(await run_in_threadpool(Q.usage_of, engine(request), who.team_id), who.team, quota,
                          uploading=others)
            job_id = Q.new_job_id()
            job_dir = settings.jobs_dir / job_id
            receiver = MultipartReceiver(ctype, job_dir / "upload")
        except Q.QuotaExceeded as exc:
            _uploaded(uploading, who.team_id)
            raise HTTPException(429, str(exc), headers=RETRY_AFTER) from None
        except UploadError as exc:
            _uploaded(uploading, who.team_id)
            raise HTTPException(400, str(exc)) from None
        except BaseException:
            _uploaded(uploading, who.team_id)
            raise
        total, refusal = 0, None
        try:
            async for chunk in _stream(request):
                total += len(chunk)
                if refusal is not None:
                    if total > settings.drain_bytes:
                        break
                    continue  # read and drop the rest, so the client gets the answer cleanly
                if total > settings.max_upload_bytes:
                    refusal = HTTPException(413, f"upload too large: more than {settings.max_upload_bytes:,} bytes")
                else:
                    try:
                        receiver.feed(chunk)
                        continue
                    except UploadError as exc:
                        refusal = HTTPException(400, str(exc))
                    except DiskFull as exc:
                        refusal = _no_space(exc, job_dir)
                receiver.close()
            if refusal is not None:
                raise refusal
            try:
                files, fields = receiver.finish()
                meta = JobMetadata.model_validate({k: v for k, v in fields.items() if v != ""})
            except UploadError as exc:
                raise HTTPException(400, str(exc)) from None
            except DiskFull as exc:
                raise _no_space(exc, job_dir) from None
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(x) for x in first.get("loc", ())) or "metadata"
                raise HTTPException(422, f"{where}: {first.get('msg')}") from None
            try:
                params = await run_in_threadpool(prepare_inputs, job_dir, files, settings.archive)
            except (UploadError, ArchiveError) as exc:
                raise HTTPException(400, str(exc)) from None
            except DiskFull as exc:
                raise _no_space(exc, job_dir) from None
            name = meta.name or params.get("default_name") or _display_name(params)
            params.update(meta.model_dump(exclude={"name"}), name=meta.name or params.get("default_name"))
            try:
                await run_in_threadpool(Q.insert_job, engine(request), job_id=job_id, team_id=who.team_id,
                                        kind="analyze", name=name, params=params, input_dir=str(job_dir / "input"),
                                        max_attempts=settings.max_attempts, quota=quota)
            except Q.TooLargeForQuota as exc:
                raise HTTPException(413, str(exc)) from None
            except DBAPIError as exc:
                full = disk_full_reason(engine(request), exc)
                if full is None:
                    raise
                raise _no_space(store_full("queue the job", full), job_dir) from None
            except Q.QuotaExceeded as exc:
                raise HTTPException(429, str(exc), headers=RETRY_AFTER) from None
        except BaseException:
            receiver.close()
            shutil.rmtree(job_dir, ignore_errors=True)
            raise
        finally:
            _uploaded(uploading, who.team_id)
        return JSONResponse(JobAccepted(id=job_id, status_url=f"/v1/jobs/{job_id}").model_dump(), status_code=202,
                            headers={"Location": f"/v1/jobs/{job_id}"})

    @app.get("/v1/jobs", response_model=JobList, tags=["jobs"], responses=_err(401, 422))
    def list_jobs(request: Request, who: Who,
                  state: Annotated[JobState | None, Query()] = None,
                  limit: Annotated[int, Query(ge=1, le=500)] = 50,
                  before: Annotated[str | None, Query(max_length=200, description=(
                      "A page's `next` cursor: the jobs after that page (older). Keyset paging on (queued_at, id): "
                      "jobs queued while a client walks the pages never shift them (no job twice, none skipped)."))]
                  = None) -> JobList:
        """Your team's jobs, newest first, `limit` a page; `next` (the cursor for `before`) and `next_url` lead to
        the next page, null on the last."""
        try:
            key = decode_cursor(before) if before is not None else None
        except ValueError as exc:
            raise RequestValidationError([{"type": "value_error", "loc": ("query", "before"), "msg": str(exc),
                                           "input": before}]) from None
        eng = engine(request)
        jobs = Q.list_jobs(eng, who.team_id, limit=limit + 1, state=state, before=key)
        more, jobs = len(jobs) > limit, jobs[:limit]
        names = Q.artifact_names_many(eng, [j.id for j in jobs if j.state == Q.DONE])
        cursor = encode_cursor(jobs[-1].queued_at, jobs[-1].id) if more else None
        url = None
        if cursor is not None:
            from urllib.parse import urlencode

            url = "/v1/jobs?" + urlencode({k: v for k, v in (("state", state), ("limit", limit), ("before", cursor))
                                           if v is not None})
        return JobList(jobs=[status(j, eng, names.get(j.id, [])) for j in jobs], next=cursor, next_url=url)

    @app.get("/v1/jobs/{job_id}", response_model=JobStatus, tags=["jobs"], responses=_err(401, 404))
    def get_job(request: Request, who: Who, job_id: JobId) -> JobStatus:
        """A job's state, attempts, error or result summary, and the links to its files."""
        eng = engine(request)
        job = Q.get_job(eng, job_id, who.team_id)
        if job is None:
            raise HTTPException(404, f"job {job_id} not found")
        return status(job, eng)

    @app.post("/v1/jobs/{job_id}/cancel", response_model=JobStatus, tags=["jobs"],
              responses={202: {"model": JobStatus, "description": "The job is running: its worker stops it (within "
                                                                   "its --poll seconds) and it ends `cancelled`"},
                         **_err(401, 404, 409, e409="The job is done or failed: there is nothing to cancel")})
    def cancel_job(request: Request, who: Who, job_id: JobId) -> JSONResponse:
        """Cancel a queued or running job of your team. A queued job is cancelled at once (200, state `cancelled`:
        no worker claims it any more) and its uploads removed. A running job is stopped by its worker (202, state
        still `running` with `cancel_requested_at`; it ends `cancelled` within a second or so, with its analysis
        stopped, nothing of its results kept, the run it recorded undone and its uploads removed). A cancelled
        job answers 200 as it is. A cancelled job can be deleted (DELETE)."""
        eng = engine(request)
        try:
            job = Q.request_cancel(eng, job_id, who.team_id)
        except Q.NotCancellable as exc:
            raise HTTPException(409, str(exc)) from None
        if job is None:
            raise HTTPException(404, f"job {job_id} not found")
        if job.state == Q.CANCELLED:  # no worker holds it (any more): its uploads go now
            shutil.rmtree(settings.jobs_dir / job_id, ignore_errors=True)
        return JSONResponse(status(job, eng).model_dump(), status_code=202 if job.state == Q.RUNNING else 200)

    @app.delete("/v1/jobs/{job_id}", status_code=204, tags=["jobs"], response_class=Response,
                responses={204: {"description": "Deleted"}, **_err(
                    401, 404, 409, e409="The job is queued or running (cancel it first: POST "
                                        "/v1/jobs/{job_id}/cancel), or its recorded run is held by a running job "
                                        "(try again when that has finished)")})
    def delete_job(request: Request, who: Who, job_id: JobId) -> Response:
        """Delete a done, failed or cancelled job of your team: its row, its results and its uploads on disk. The run
        it recorded stays in the store (digest, history). A queued or running job is never deleted (409): cancel
        it first."""
        try:
            job = Q.delete_job(engine(request), job_id, who.team_id)
        except Q.NotDeletable as exc:
            raise HTTPException(409, str(exc)) from None
        if job is None:
            raise HTTPException(404, f"job {job_id} not found")
        shutil.rmtree(settings.jobs_dir / job_id, ignore_errors=True)
        return Response(status_code=204)

    def add_artifact_route(route: str, artifact: str, media: str) -> None:
        def download(request: Request, who: Who, job_id: JobId) -> Response:
            eng = engine(request)
            job = Q.get_job(eng, job_id, who.team_id)
            if job is None:
                raise HTTPException(404, f"job {job_id} not found")
            if job.state != Q.DONE:
                msg = f"job {job_id} is {job.state}" + (f": {job.error}" if job.error else "; try again when it is done")
                raise HTTPException(409, msg)
            got = Q.get_artifact(eng, job_id, artifact)
            if got is None:
                raise HTTPException(404, NOT_PRODUCED.get(route, f"this job has no {artifact}"))
            mt, data = got
            headers = {} if media.startswith(("application/json", "text/html")) else {
                "Content-Disposition": f'attachment; filename="{artifact}"'}
            return Response(content=data, media_type=mt, headers=headers)

        download.__name__ = "get_" + route.replace(".", "_")
        download.__doc__ = f"The finished job's {artifact}."
        schema: dict[str, Any] = {"type": "object"} if media.endswith("json") else {"type": "string"}
        app.add_api_route(
            f"/v1/jobs/{{job_id}}/{route}", download, methods=["GET"], tags=["results"], response_class=Response,
            responses={200: {"description": artifact, "content": {media: {"schema": schema}}}, **_err(401, 404, 409)},
        )

    for route, (artifact, media) in ARTIFACTS.items():
        add_artifact_route(route, artifact, media)

    @app.post("/v1/verdicts", status_code=201, response_model=VerdictOut, tags=["store"],
              responses=_err(400, 401, 404, 409, e400="The body is not JSON"))
    def post_verdict(request: Request, who: Who, body: VerdictIn) -> VerdictOut:
        """Label a finding of one of your jobs as a true (positive) or false (negative) detection."""
        from ..store.record import add_verdict

        eng = engine(request)
        job = Q.get_job(eng, body.job_id, who.team_id)
        if job is None:
            raise HTTPException(404, f"job {body.job_id} not found")
        if job.state != Q.DONE or job.kind != "analyze":
            raise HTTPException(409, f"job {body.job_id} has no recorded analysis (it is a {job.kind} job, "
                                     f"state {job.state})")
        if job.analysis_id is None:
            why = "; ".join((job.result or {}).get("notes") or []) or "uploaded with record=false"
            raise HTTPException(409, f"job {body.job_id} has no recorded analysis of your team ({why}): "
                                     "verdicts label only runs your team recorded")
        chash = Q.recorded_trace_of_team(eng, job.analysis_id, who.team)
        if chash is None:
            raise HTTPException(409, f"job {body.job_id} has no recorded analysis of your team (its run is no "
                                     "longer in the store, or belongs to another team)")
        from ..store.db import StoreError

        try:
            vid = add_verdict(chash, body.pattern, body.label, author=who.author, source="service",
                              note=body.note, db=eng)
        except StoreError:
            raise HTTPException(409, f"job {body.job_id} has no recorded analysis (its trace is no longer in the store)") from None
        return VerdictOut(id=vid, job_id=body.job_id, pattern=body.pattern, label=body.label, author=who.author)

    @app.get("/v1/digest", tags=["store"], responses={
        200: {"description": "The digest", "content": {"application/json": {"schema": {"type": "object"}},
                                                        "text/markdown": {"schema": {"type": "string"}},
                                                        "text/html": {"schema": {"type": "string"}}}},
        **_err(401)}, response_class=Response)
    def get_digest(request: Request, who: Who,
                   week: Annotated[str | None, Query(pattern=r"^\d{4}-?[Ww]\d{1,2}$", description="ISO week YYYY-Www")] = None,
                   format: Annotated[Literal["json", "md", "html"], Query()] = "json",  # noqa: A002
                   top: Annotated[int, Query(ge=1, le=100)] = 10) -> Response:
        """Your team's weekly digest: top anti-patterns by wasted GPU-hours and dollars, trends, costliest jobs."""
        from ..store import weeks as W
        from ..store.digest import build_digest

        try:
            wk = W.parse_week(week) if week else None
        except W.WeekError as exc:
            raise RequestValidationError([{"type": "value_error", "loc": ("query", "week"), "msg": str(exc),
                                           "input": week}]) from None
        d = build_digest(engine(request), week=wk, team=who.team, top=top)
        if format == "json":
            return Response(d.model_dump_json(), media_type="application/json")
        from ..render.digest import render_digest

        return Response(render_digest(d, format, top=top), media_type="text/markdown" if format == "md" else "text/html")

    @app.post(
        "/v1/github/webhook", response_model=WebhookOut, tags=["github"],
        responses={202: {"model": WebhookOut, "description": "A review job was queued"},
                   **_err(400, 401, 413, e401="Bad or missing X-Hub-Signature-256")},
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}},
    )
    async def github_webhook(
        request: Request,
        x_hub_signature_256: Annotated[str | None, Header(description="sha256=<HMAC-SHA256 of the body>")] = None,
        x_github_event: Annotated[str | None, Header()] = None,
    ) -> JSONResponse:
        """GitHub deliveries: verified with the webhook secret (HMAC-SHA256); pull-request events queue a `review` job."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > WEBHOOK_MAX_BYTES:  # refused before reading (it would stall or 413)
            raise HTTPException(413, f"payload larger than {WEBHOOK_MAX_BYTES:,} bytes (Content-Length: {int(length):,})")
        body = bytearray()
        async for chunk in _stream(request):
            body.extend(chunk)
            if len(body) > WEBHOOK_MAX_BYTES:
                raise HTTPException(413, f"payload larger than {WEBHOOK_MAX_BYTES:,} bytes")
        if not settings.webhook_secret:
            raise HTTPException(401, "webhook secret not configured on this server: every delivery is refused")
        if not verify(settings.webhook_secret, bytes(body), x_hub_signature_256):
            raise HTTPException(401, "bad or missing X-Hub-Signature-256 signature")
        try:
            what, details = review_job(settings, x_github_event, bytes(body))
        except WebhookError as exc:
            raise HTTPException(400, str(exc)) from None
        if what != "review":
            return JSONResponse(WebhookOut(status="pong" if what == "pong" else "ignored",
                                           reason=details.get("reason")).model_dump())
        from .auth import ensure_team

        from sqlalchemy.exc import IntegrityError

        eng = engine(request)
        team_id = await run_in_threadpool(ensure_team, eng, settings.webhook_team)
        delivery = (request.headers.get("x-github-delivery") or "").strip()[:200] or None
        job_id = _delivery_job_id(settings.webhook_team, delivery) if delivery else Q.new_job_id()

        def duplicate() -> JSONResponse:
            return JSONResponse(WebhookOut(status="duplicate", job_id=job_id, reason=(
                f"delivery {delivery} was received before: its review job stands")).model_dump())

        if delivery:  # GitHub redelivers a delivery with its X-GitHub-Delivery: one review (one post on the PR)
            seen = await run_in_threadpool(Q.get_job, eng, job_id, team_id)
            if seen is not None and seen.state not in (Q.FAILED, Q.CANCELLED):
                return duplicate()
            if seen is not None:
                job_id = Q.new_job_id()  # redelivering a delivery whose review failed (or was cancelled) runs it again
        name = f"{details['repository']}#{details['pr']}" if details.get("pr") else details["repository"]
        try:
            await run_in_threadpool(Q.insert_job, eng, job_id=job_id, team_id=team_id, kind="review", name=name,
                                    params={**details, "delivery": delivery}, input_dir=None,
                                    max_attempts=settings.max_attempts)
        except IntegrityError:  # the same delivery, received twice at once: the other request queued it
            return duplicate()
        return JSONResponse(WebhookOut(status="queued", job_id=job_id).model_dump(), status_code=202)

    app.openapi = _with_one_line_422(app.openapi)
    return app


def _with_one_line_422(build):  # noqa: ANN001, ANN202 - FastAPI's app.openapi
    """app.openapi, with FastAPI's 422 schema (a list of error objects) replaced by the API's `Error` (what
    _validation_error answers)."""
    def openapi() -> dict[str, Any]:
        doc = build()
        schemas = doc.get("components", {}).get("schemas", {})
        for ops in doc.get("paths", {}).values():
            for op in ops.values():
                answer = op.get("responses", {}).get("422")
                if answer and "HTTPValidationError" in json.dumps(answer):
                    op["responses"]["422"] = {"description": "Invalid parameters (the message says which, in one line)",
                                              "content": {"application/json": {"schema": {
                                                  "$ref": "#/components/schemas/Error"}}}}
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        return doc

    return openapi


def _invalid(errors) -> str:  # noqa: ANN001 - FastAPI's error list
    """FastAPI's validation errors in one line: `limit: Input should be less than or equal to 500`."""
    said = []
    for e in errors:
        loc = [str(x) for x in (e.get("loc") or ())]
        if loc and loc[0] in ("query", "path", "header", "body"):
            loc = loc[1:]
        msg = " ".join(str(e.get("msg") or "invalid").split())
        said.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
    if not said:
        return "invalid parameters"
    more = len(said) - 3
    return "; ".join(said[:3]) + (f" (and {more} more)" if more > 0 else "")


_team_cache: dict[tuple[int, int], str] = {}


def _team_name(eng, team_id: int) -> str:  # noqa: ANN001
    key = (id(eng), team_id)
    if key not in _team_cache:
        from sqlalchemy import select

        from ..store.db import read_session
        from ..store.service_tables import ServiceTeam

        with read_session(eng) as s:
            _team_cache[key] = s.execute(select(ServiceTeam.name).where(ServiceTeam.id == team_id)).scalar_one()
    return _team_cache[key]


def _delivery_job_id(team: str, delivery: str) -> str:
    """The review job id of a GitHub delivery (32 hex digits): a redelivery finds the job it queued."""
    import hashlib

    return hashlib.sha256(f"github-delivery\0{team}\0{delivery}".encode()).hexdigest()[:32]


def _no_space(exc: DiskFull, job_dir: Path) -> HTTPException:
    """The 507 of an upload the disk refused; what it wrote is removed at once (the space is wanted), and the
    operator reads one line in the server's log."""
    import logging

    shutil.rmtree(job_dir, ignore_errors=True)
    logging.getLogger("zoomer_ar.service").warning("upload %s refused: %s", job_dir.name, exc)
    return HTTPException(507, str(exc))


def _uploaded(uploading: dict[int, int], team_id: int) -> None:
    """One upload of the team is no longer arriving (queued, refused or abandoned)."""
    left = uploading.get(team_id, 1) - 1
    if left > 0:
        uploading[team_id] = left
    else:
        uploading.pop(team_id, None)


async def _stream(request: Request):  # noqa: ANN202 - an async iterator of bytes
    """The request body as it arrives; a client gone before its end (it disconnected, or the read timeout closed
    its connection: slow_clients) is a 400 no one receives, logged as one line instead of a 500's stack trace."""
    from starlette.requests import ClientDisconnect

    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        import logging

        logging.getLogger("zoomer_ar.service").info("%s %s: the client disconnected before the end of its body",
                                                     request.method, request.url.path)
        raise HTTPException(400, "the client disconnected before the end of the request body") from None


def _not_json(errors) -> str | None:  # noqa: ANN001 - FastAPI's error list
    """Why the request body is not JSON, when that is what the validation errors say; else None."""
    for e in errors:
        loc = tuple(e.get("loc") or ())
        if not loc or loc[0] != "body":
            continue
        if e.get("type") == "json_invalid":
            err = (e.get("ctx") or {}).get("error")
            return f"the body is not JSON ({err})" if err else "the body is not JSON"
        if loc == ("body",) and e.get("type") == "missing":
            return "the body is not JSON (it is empty): send a JSON object with Content-Type: application/json"
        if loc == ("body",) and isinstance(e.get("input"), (str, bytes)):
            return "the body is not JSON: send a JSON object with Content-Type: application/json"
    return None


def _display_name(params: dict) -> str:
    up = params.get("uploads", {})
    first = up.get("trace") or up.get("ranks") or {}
    return str(first.get("filename") or "job")


def openapi_json(settings: Settings | None = None) -> str:
    """The published schema (docs/openapi.json): stable key order, trailing newline."""
    app = create_app(settings or Settings(data_dir=Path("/nonexistent")))
    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


__all__ = ["FILE_FIELDS", "create_app", "openapi_json"]
