"""SQLAlchemy 2 models of the store (the schema itself lives in the Alembic migrations beside this file).

jobs 1-n analyses n-1 traces; analyses 1-n findings; verdicts label a (trace, pattern); models are the
trained detectors an analysis may have used. `week` is the ISO week label `YYYY-Www` (sorts as text).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# BIGINT keys on PostgreSQL; INTEGER on SQLite, where only INTEGER PRIMARY KEY auto-increments.
BigId = BigInteger().with_variant(Integer(), "sqlite")
Json = JSON().with_variant(JSONB(), "postgresql")
PHASE_COLUMNS = ("dataloader", "forward", "backward", "optimizer", "communication", "idle")


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Job(Base):
    """A training job (stable name), who owns it and what it runs on."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    team: Mapped[str | None] = mapped_column(String(200), index=True)
    owner: Mapped[str | None] = mapped_column(String(200), index=True)
    gpu_type: Mapped[str | None] = mapped_column(String(200))
    gpu_count: Mapped[int | None] = mapped_column(Integer)
    gpu_hour_cost: Mapped[float | None] = mapped_column(Float, comment="USD per GPU-hour")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    analyses: Mapped[list[Analysis]] = relationship(back_populates="job")


class Trace(Base):
    """A profiled trace (one file or a rank set), identified by its content."""

    __tablename__ = "traces"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    content_hash: Mapped[str] = mapped_column(String(64), unique=True, comment="sha256 of the file, or of the sorted rank hashes")
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    n_ranks: Mapped[int] = mapped_column(Integer, default=1)
    world_size: Mapped[int] = mapped_column(Integer, default=1)
    rank_hashes: Mapped[list] = mapped_column(Json, default=list)
    path: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Model(Base):
    """A trained detector model (zoomer_ar.learn) that analyses may have used."""

    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_models_name_version"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(100))
    feature_schema_version: Mapped[str | None] = mapped_column(String(50))
    sha256: Mapped[str | None] = mapped_column(String(64))
    path: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict] = mapped_column(Json, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Analysis(Base):
    """One recorded analysis of a trace: a job run in a week, its GPU-hours, price and phase split."""

    __tablename__ = "analyses"
    __table_args__ = (
        Index("ix_analyses_week_job", "week", "job_id"),
        Index("ix_analyses_job_week", "job_id", "week"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    trace_id: Mapped[int] = mapped_column(ForeignKey("traces.id", ondelete="CASCADE"), unique=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    week: Mapped[str] = mapped_column(String(8), comment="ISO week YYYY-Www")
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), comment="when the job ran")
    tool_version: Mapped[str] = mapped_column(String(50))
    findings_schema_version: Mapped[str] = mapped_column(String(20))
    feature_schema_version: Mapped[str] = mapped_column(String(20))
    model_version: Mapped[str | None] = mapped_column(String(100))
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id", ondelete="SET NULL"))
    gpu_count: Mapped[int] = mapped_column(Integer, default=0)
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0, comment="the job's GPU-hours this run stands for")
    gpu_hours_source: Mapped[str] = mapped_column(String(20), default="profiled", comment="option | profiled")
    gpu_hour_cost: Mapped[float | None] = mapped_column(Float, comment="USD per GPU-hour at record time")
    usd: Mapped[float] = mapped_column(Float, default=0.0, comment="gpu_hours x gpu_hour_cost (0 while no price is known)")
    wall_ms: Mapped[float] = mapped_column(Float, default=0.0)
    step_ms: Mapped[float] = mapped_column(Float, default=0.0)
    profiler_steps: Mapped[int] = mapped_column(Integer, default=0)
    bottleneck: Mapped[str | None] = mapped_column(String(40))
    phase_basis: Mapped[str | None] = mapped_column(String(10))
    phase_dataloader_pct: Mapped[float | None] = mapped_column(Float)
    phase_forward_pct: Mapped[float | None] = mapped_column(Float)
    phase_backward_pct: Mapped[float | None] = mapped_column(Float)
    phase_optimizer_pct: Mapped[float | None] = mapped_column(Float)
    phase_communication_pct: Mapped[float | None] = mapped_column(Float)
    phase_idle_pct: Mapped[float | None] = mapped_column(Float)
    features: Mapped[dict] = mapped_column(Json, default=dict)
    notes: Mapped[list] = mapped_column(Json, default=list)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    job: Mapped[Job] = relationship(back_populates="analyses")
    trace: Mapped[Trace] = relationship()
    findings: Mapped[list[Finding]] = relationship(back_populates="analysis", order_by="Finding.ordinal")


class Finding(Base):
    """One finding of an analysis; job, week and dollars are copied from the analysis so the digest aggregates one table."""

    __tablename__ = "findings"
    __table_args__ = (
        UniqueConstraint("analysis_id", "ordinal", name="uq_findings_analysis_ordinal"),
        # covering: the digest aggregates waste per week/pattern/job from this index alone
        Index("ix_findings_week_pattern", "week", "pattern", "job_id", "wasted_gpu_hours", "wasted_usd",
              "counted_gpu_hours", "counted_usd"),
        Index("ix_findings_job_week_pattern", "job_id", "week", "pattern"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    analysis_id: Mapped[int] = mapped_column(ForeignKey("analyses.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    week: Mapped[str] = mapped_column(String(8))
    ordinal: Mapped[int] = mapped_column(Integer)
    pattern: Mapped[str] = mapped_column(String(64))
    title: Mapped[str] = mapped_column(Text, default="")
    severity: Mapped[str] = mapped_column(String(16))
    confidence: Mapped[float] = mapped_column(Float)
    ms_per_step: Mapped[float] = mapped_column(Float)
    pct_of_step: Mapped[float] = mapped_column(Float)
    gpu_hours_per_1000_steps: Mapped[float] = mapped_column(Float)
    wasted_gpu_hours: Mapped[float] = mapped_column(Float, comment="pct_of_step / 100 x the analysis' GPU-hours")
    wasted_usd: Mapped[float] = mapped_column(Float, default=0.0, comment="wasted_gpu_hours x the analysis' price")
    # what the analysis' combined total counts of it (zoomer_ar/detect/combine.py): the digest's totals
    counted_gpu_hours: Mapped[float] = mapped_column(
        Float, default=0.0, server_default="0",
        comment="wasted_gpu_hours x the finding's share in its analysis' combined total")
    counted_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0",
                                               comment="counted_gpu_hours x the analysis' price")
    detected_by: Mapped[str] = mapped_column(String(20), default="rules")
    figures: Mapped[dict | None] = mapped_column(Json)

    analysis: Mapped[Analysis] = relationship(back_populates="findings")


class Verdict(Base):
    """A label on a (trace, pattern): positive or negative, from a person or a labels file."""

    __tablename__ = "verdicts"
    __table_args__ = (UniqueConstraint("trace_id", "pattern", "author", name="uq_verdicts_trace_pattern_author"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    trace_id: Mapped[int] = mapped_column(ForeignKey("traces.id", ondelete="CASCADE"), index=True)
    finding_id: Mapped[int | None] = mapped_column(ForeignKey("findings.id", ondelete="SET NULL"))
    pattern: Mapped[str] = mapped_column(String(64))
    label: Mapped[str] = mapped_column(String(16), comment="positive | negative")
    author: Mapped[str] = mapped_column(String(200), default="")
    source: Mapped[str] = mapped_column(String(40), default="human")
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


from . import service_tables as _service_tables  # noqa: E402,F401 - registers the service tables on Base
