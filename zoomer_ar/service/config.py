"""Service settings: command-line options of `zoomer-ar serve` / `zoomer-ar worker`, else environment variables.

| Setting | Option | Environment | Default |
|---|---|---|---|
| store | `--db` | `ZOOMER_DB` | the embedded SQLite file (docs/store.md) |
| data folder (uploads) | `--data` | `ZOOMER_SERVICE_DATA` | `<user data folder>/zoomer-ar/service` |
| request body cap | `--max-upload-mb` | `ZOOMER_SERVICE_MAX_UPLOAD_MB` | 2048 |
| archive uncompressed cap | `--max-archive-mb` | `ZOOMER_SERVICE_MAX_ARCHIVE_MB` | 8192 |
| archive entries cap | `--max-archive-entries` | `ZOOMER_SERVICE_MAX_ARCHIVE_ENTRIES` | 20000 |
| archive ratio cap | `--max-archive-ratio` | `ZOOMER_SERVICE_MAX_ARCHIVE_RATIO` | 200 |
| read timeout (headers; a stalled body) | `--read-timeout` | `ZOOMER_SERVICE_READ_TIMEOUT_S` | 30 s |
| minimum body rate past the read timeout | `--min-body-rate` (KiB/s, 0: none) | `ZOOMER_SERVICE_MIN_BODY_RATE_KIB` | 1 KiB/s |
| queued + running jobs per team (0: no limit) | `--max-team-jobs` | `ZOOMER_SERVICE_MAX_TEAM_JOBS` | 50 |
| disk taken by a team's queued + running jobs' inputs (0: no limit) | `--max-team-mb` | `ZOOMER_SERVICE_MAX_TEAM_MB` | 20480 |
| connections at once (one more is answered 503; 0: no cap) | `--max-connections` | `ZOOMER_SERVICE_MAX_CONNECTIONS` | 1000 |
| days a failed job's uploads are kept (0: for ever) | `--failed-retention-days` | `ZOOMER_SERVICE_FAILED_RETENTION_DAYS` | 7 |
| lease | `--lease` | `ZOOMER_SERVICE_LEASE_S` | 30 s (heartbeat every third of it) |
| claims per job | `--max-attempts` | `ZOOMER_SERVICE_MAX_ATTEMPTS` | 3 |
| time limit per job (a worker stops it and fails it "timed out after N s"; 0: none) | `--job-timeout` | `ZOOMER_SERVICE_JOB_TIMEOUT_S` | 3600 s |
| webhook secret | `--webhook-secret` | `ZOOMER_WEBHOOK_SECRET` | none (webhook refuses everything) |
| webhook repositories | `--webhook-repo owner/name=PATH` | `ZOOMER_WEBHOOK_REPOS` (comma-separated) | none |
| webhook team | `--webhook-team` | `ZOOMER_WEBHOOK_TEAM` | `github` |
| post reviews to GitHub | `--webhook-post` | `ZOOMER_WEBHOOK_POST=1` (+ `GITHUB_TOKEN`) | off |
| GitHub API (where reviews are posted, with GITHUB_TOKEN) | `--github-api-url` | `GITHUB_API_URL` | `https://api.github.com` |

The time limit per job is generous on purpose: it is there to stop a job that hangs (a stuck `git fetch`, a
store or network filesystem that stopped answering), never a legitimate analysis. The largest trace the
loader takes (6 GiB decompressed, ZOOMER_MAX_TRACE_BYTES) reads at about 200 MB/s per core
(docs/huge-traces.md): about half a minute, so an hour leaves a margin of 100x; a deployment that wants hung
jobs stopped sooner sets it lower.

The GitHub API is the server's setting, never the webhook payload's (`repository.url`): a delivery
must not choose the host that receives the token.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from .archives import ArchiveLimits

MB = 1 << 20


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


DEFAULT_GITHUB_API_URL = "https://api.github.com"


def check_api_url(url: str) -> str:
    """An http(s) URL with a host, without its trailing slash; ValueError otherwise."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query and not parts.fragment
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"--github-api-url (or GITHUB_API_URL) {url!r}: expected http(s)://host[/path]")
    return url.strip().rstrip("/")


def default_data_dir() -> Path:
    from ..store.db import user_data_dir

    return user_data_dir() / "service"


def parse_repos(items: list[str] | tuple[str, ...] | str | None) -> dict[str, Path]:
    """`owner/name=PATH` items (a list, or one comma-separated string) -> {owner/name: PATH}."""
    if not items:
        return {}
    if isinstance(items, str):
        items = [x for x in items.split(",") if x.strip()]
    out: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.strip().partition("=")
        if not sep or "/" not in name or not path:
            raise ValueError(f"webhook repository {item!r}: expected owner/name=PATH")
        out[name.strip().lower()] = Path(path).expanduser()
    return out


@dataclass
class Settings:
    db: str | None = None
    data_dir: Path = field(default_factory=default_data_dir)
    max_upload_bytes: int = 2048 * MB
    read_timeout_s: float = 30.0
    min_body_rate: float = 1024.0  # bytes/s
    archive: ArchiveLimits = field(default_factory=ArchiveLimits)
    max_team_jobs: int = 50
    max_team_bytes: int = 20480 * MB
    max_connections: int = 1000  # 0: no cap
    failed_retention_s: float = 7 * 86_400.0  # 0: failed jobs' uploads are kept for ever
    lease_s: float = 30.0
    max_attempts: int = 3
    job_timeout_s: float = 3600.0  # 0: no limit
    poll_s: float = 1.0
    webhook_secret: str | None = None
    webhook_repos: dict[str, Path] = field(default_factory=dict)
    webhook_team: str = "github"
    webhook_post: bool = False
    github_api_url: str = DEFAULT_GITHUB_API_URL

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def drain_bytes(self) -> int:
        """How much of an oversized body is read (and dropped) so the client gets its 413 cleanly."""
        return self.max_upload_bytes + 64 * MB

    @classmethod
    def from_env(cls, **overrides) -> Settings:
        e = os.environ
        s = cls(
            db=e.get("ZOOMER_DB") or None,
            data_dir=Path(e["ZOOMER_SERVICE_DATA"]).expanduser() if e.get("ZOOMER_SERVICE_DATA") else default_data_dir(),
            max_upload_bytes=int(_env_float("ZOOMER_SERVICE_MAX_UPLOAD_MB", 2048) * MB),
            read_timeout_s=_env_float("ZOOMER_SERVICE_READ_TIMEOUT_S", 30.0),
            min_body_rate=_env_float("ZOOMER_SERVICE_MIN_BODY_RATE_KIB", 1.0) * 1024,
            archive=ArchiveLimits(
                max_bytes=int(_env_float("ZOOMER_SERVICE_MAX_ARCHIVE_MB", 8192) * MB),
                max_entries=int(_env_float("ZOOMER_SERVICE_MAX_ARCHIVE_ENTRIES", 20_000)),
                max_ratio=_env_float("ZOOMER_SERVICE_MAX_ARCHIVE_RATIO", 200.0),
            ),
            max_team_jobs=int(_env_float("ZOOMER_SERVICE_MAX_TEAM_JOBS", 50)),
            max_team_bytes=int(_env_float("ZOOMER_SERVICE_MAX_TEAM_MB", 20480) * MB),
            max_connections=int(_env_float("ZOOMER_SERVICE_MAX_CONNECTIONS", 1000)),
            failed_retention_s=_env_float("ZOOMER_SERVICE_FAILED_RETENTION_DAYS", 7.0) * 86_400.0,
            lease_s=_env_float("ZOOMER_SERVICE_LEASE_S", 30.0),
            max_attempts=int(_env_float("ZOOMER_SERVICE_MAX_ATTEMPTS", 3)),
            job_timeout_s=_env_float("ZOOMER_SERVICE_JOB_TIMEOUT_S", 3600.0),
            webhook_secret=e.get("ZOOMER_WEBHOOK_SECRET") or None,
            webhook_repos=parse_repos(e.get("ZOOMER_WEBHOOK_REPOS")),
            webhook_team=e.get("ZOOMER_WEBHOOK_TEAM") or "github",
            webhook_post=e.get("ZOOMER_WEBHOOK_POST", "") not in ("", "0", "false", "no"),
            github_api_url=e.get("GITHUB_API_URL") or DEFAULT_GITHUB_API_URL,
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        archive = {k: given.pop(k) for k in ("max_bytes", "max_entries", "max_ratio") if k in given}
        if archive:
            given["archive"] = replace(s.archive, **archive)
        s = replace(s, **given)
        from .auth import check_team_name

        try:
            s.webhook_team = check_team_name(s.webhook_team)
        except ValueError as exc:
            raise ValueError(f"webhook team: {exc}") from None
        s.github_api_url = check_api_url(s.github_api_url)
        if not (math.isfinite(s.read_timeout_s) and s.read_timeout_s > 0):
            raise ValueError(f"read timeout (--read-timeout / ZOOMER_SERVICE_READ_TIMEOUT_S) {s.read_timeout_s!r}: "
                             "expected a number of seconds above 0")
        if not (math.isfinite(s.min_body_rate) and s.min_body_rate >= 0):
            raise ValueError("minimum body rate (--min-body-rate / ZOOMER_SERVICE_MIN_BODY_RATE_KIB) "
                             f"{s.min_body_rate / 1024!r}: expected KiB/s, 0 or more")
        if s.max_team_jobs < 0 or s.max_team_bytes < 0:
            raise ValueError("team limits (--max-team-jobs, --max-team-mb; ZOOMER_SERVICE_MAX_TEAM_JOBS, "
                             "ZOOMER_SERVICE_MAX_TEAM_MB) must be 0 (no limit) or more")
        if s.max_connections < 0:
            raise ValueError(f"connection cap (--max-connections / ZOOMER_SERVICE_MAX_CONNECTIONS) {s.max_connections}: "
                             "expected 0 (no cap) or more")
        if not (math.isfinite(s.job_timeout_s) and s.job_timeout_s >= 0):
            raise ValueError(f"time limit per job (--job-timeout / ZOOMER_SERVICE_JOB_TIMEOUT_S) {s.job_timeout_s!r}: "
                             "expected seconds, 0 (no limit) or more")
        if not (math.isfinite(s.failed_retention_s) and s.failed_retention_s >= 0):
            raise ValueError("failed jobs' retention (--failed-retention-days / ZOOMER_SERVICE_FAILED_RETENTION_DAYS) "
                             f"{s.failed_retention_s / 86_400.0!r}: expected days, 0 (for ever) or more")
        return s

    @property
    def team_quota(self):  # noqa: ANN201 - queue.TeamQuota
        from .queue import TeamQuota

        return TeamQuota(max_jobs=self.max_team_jobs, max_bytes=self.max_team_bytes)

    @property
    def retention(self):  # noqa: ANN201 - housekeeping.Retention
        from .housekeeping import Retention

        # an upload still arriving writes at least once a read timeout (else it is cut off and removes its folder)
        return Retention(stale_upload_s=2 * self.read_timeout_s, failed_s=self.failed_retention_s)

    @property
    def read_limits(self):  # noqa: ANN201 - slow_clients.ReadLimits (uvicorn is imported only by `serve`)
        from .slow_clients import ReadLimits

        return ReadLimits(timeout_s=self.read_timeout_s, min_rate=self.min_body_rate)
