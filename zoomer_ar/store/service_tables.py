"""Tables of the analysis service (zoomer_ar.service): teams, API tokens, the job queue and job results.

- `service_teams`: a team (unique name). Jobs and tokens belong to one team; a token sees only its
  team's jobs. The team name is also what recorded analyses carry in `jobs.team`.
- `service_tokens`: API tokens, stored as the sha256 of the token (the token itself is shown once,
  when created); `prefix` (the first characters) identifies a token in listings.
- `service_jobs`: the queue. `state` is queued -> running -> done | failed, or cancelled (from queued at
  once; from running once its worker has stopped it, `cancel_requested_at` set meanwhile). A running job holds a
  lease (`lease_owner`, `lease_token`, `lease_expires_at`) that its worker's heartbeat extends;
  a job whose lease expired is claimed again (up to `max_attempts` claims). Times are seconds
  since the epoch on the database server's clock (one clock for every worker).
- `service_artifacts`: a finished job's files (findings.json, report.html, patch.diff, ...), written
  in the same transaction that moves the job to `done`.

Registered on `orm.Base` (orm.py imports this module), created by migration 0002_service;
`cancel_requested_at` and the state `cancelled` by 0004_service_cancel.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Text, func
from sqlalchemy.orm import Mapped, mapped_column

from .orm import Base, BigId, Json


class ServiceTeam(Base):
    __tablename__ = "service_teams"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ServiceToken(Base):
    __tablename__ = "service_tokens"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("service_teams.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, comment="sha256 hex of the token")
    prefix: Mapped[str] = mapped_column(String(16), comment="first characters of the token, for listings")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[float | None] = mapped_column(Float, comment="epoch seconds; revoked tokens are refused")


class ServiceJob(Base):
    __tablename__ = "service_jobs"
    __table_args__ = (
        Index("ix_service_jobs_state_queued", "state", "queued_at"),
        Index("ix_service_jobs_team_queued", "team_id", "queued_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("service_teams.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(20), comment="analyze | review")
    name: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16), comment="queued | running | done | failed | cancelled")
    params: Mapped[dict] = mapped_column(Json, default=dict)
    input_dir: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_token: Mapped[str | None] = mapped_column(String(32))
    lease_expires_at: Mapped[float | None] = mapped_column(Float)
    heartbeat_at: Mapped[float | None] = mapped_column(Float)
    queued_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    result: Mapped[dict | None] = mapped_column(Json)
    content_hash: Mapped[str | None] = mapped_column(String(64))
    analysis_id: Mapped[int | None] = mapped_column(ForeignKey("analyses.id", ondelete="SET NULL"))
    cancel_requested_at: Mapped[float | None] = mapped_column(
        Float, comment="epoch seconds; the team asked to cancel the job")


class ServiceArtifact(Base):
    __tablename__ = "service_artifacts"

    job_id: Mapped[str] = mapped_column(ForeignKey("service_jobs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    media_type: Mapped[str] = mapped_column(String(100))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    content: Mapped[bytes] = mapped_column(LargeBinary)
