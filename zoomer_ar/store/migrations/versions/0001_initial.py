"""Initial store schema: jobs, traces, models, analyses, findings, verdicts.

Revision ID: 0001_initial
Revises:
Create Date: 2026-05-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _created() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("team", sa.String(200)),
        sa.Column("owner", sa.String(200)),
        sa.Column("gpu_type", sa.String(200)),
        sa.Column("gpu_count", sa.Integer()),
        sa.Column("gpu_hour_cost", sa.Float(), comment="USD per GPU-hour"),
        _created(),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.UniqueConstraint("name", name="uq_jobs_name"),
    )
    op.create_index("ix_jobs_team", "jobs", ["team"])
    op.create_index("ix_jobs_owner", "jobs", ["owner"])

    op.create_table(
        "traces",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("content_hash", sa.String(64), nullable=False,
                  comment="sha256 of the file, or of the sorted rank hashes"),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("n_ranks", sa.Integer(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("rank_hashes", Json, nullable=False),
        sa.Column("path", sa.Text()),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        _created(),
        sa.UniqueConstraint("content_hash", name="uq_traces_content_hash"),
    )

    op.create_table(
        "models",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("version", sa.String(100), nullable=False),
        sa.Column("feature_schema_version", sa.String(50)),
        sa.Column("sha256", sa.String(64)),
        sa.Column("path", sa.Text()),
        sa.Column("metrics", Json, nullable=False),
        _created(),
        sa.UniqueConstraint("name", "version", name="uq_models_name_version"),
    )

    op.create_table(
        "analyses",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("trace_id", BigId, sa.ForeignKey("traces.id", ondelete="CASCADE", name="fk_analyses_trace_id_traces"), nullable=False),
        sa.Column("job_id", BigId, sa.ForeignKey("jobs.id", ondelete="CASCADE", name="fk_analyses_job_id_jobs"), nullable=False),
        sa.Column("week", sa.String(8), nullable=False, comment="ISO week YYYY-Www"),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, comment="when the job ran"),
        sa.Column("tool_version", sa.String(50), nullable=False),
        sa.Column("findings_schema_version", sa.String(20), nullable=False),
        sa.Column("feature_schema_version", sa.String(20), nullable=False),
        sa.Column("model_version", sa.String(100)),
        sa.Column("model_id", BigId, sa.ForeignKey("models.id", ondelete="SET NULL", name="fk_analyses_model_id_models")),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("gpu_hours", sa.Float(), nullable=False, comment="the job's GPU-hours this run stands for"),
        sa.Column("gpu_hours_source", sa.String(20), nullable=False, comment="option | profiled"),
        sa.Column("gpu_hour_cost", sa.Float(), comment="USD per GPU-hour at record time"),
        sa.Column("usd", sa.Float(), nullable=False, comment="gpu_hours x gpu_hour_cost (0 while no price is known)"),
        sa.Column("wall_ms", sa.Float(), nullable=False),
        sa.Column("step_ms", sa.Float(), nullable=False),
        sa.Column("profiler_steps", sa.Integer(), nullable=False),
        sa.Column("bottleneck", sa.String(40)),
        sa.Column("phase_basis", sa.String(10)),
        sa.Column("phase_dataloader_pct", sa.Float()),
        sa.Column("phase_forward_pct", sa.Float()),
        sa.Column("phase_backward_pct", sa.Float()),
        sa.Column("phase_optimizer_pct", sa.Float()),
        sa.Column("phase_communication_pct", sa.Float()),
        sa.Column("phase_idle_pct", sa.Float()),
        sa.Column("features", Json, nullable=False),
        sa.Column("notes", Json, nullable=False),
        _created(),
        sa.UniqueConstraint("trace_id", name="uq_analyses_trace_id"),
    )
    op.create_index("ix_analyses_week_job", "analyses", ["week", "job_id"])
    op.create_index("ix_analyses_job_week", "analyses", ["job_id", "week"])

    op.create_table(
        "findings",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("analysis_id", BigId, sa.ForeignKey("analyses.id", ondelete="CASCADE", name="fk_findings_analysis_id_analyses"),
                  nullable=False),
        sa.Column("job_id", BigId, sa.ForeignKey("jobs.id", ondelete="CASCADE", name="fk_findings_job_id_jobs"), nullable=False),
        sa.Column("week", sa.String(8), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("pattern", sa.String(64), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("ms_per_step", sa.Float(), nullable=False),
        sa.Column("pct_of_step", sa.Float(), nullable=False),
        sa.Column("gpu_hours_per_1000_steps", sa.Float(), nullable=False),
        sa.Column("wasted_gpu_hours", sa.Float(), nullable=False, comment="pct_of_step / 100 x the analysis' GPU-hours"),
        sa.Column("wasted_usd", sa.Float(), nullable=False, comment="wasted_gpu_hours x the analysis' price"),
        sa.Column("detected_by", sa.String(20), nullable=False),
        sa.Column("figures", Json),
        sa.UniqueConstraint("analysis_id", "ordinal", name="uq_findings_analysis_ordinal"),
    )
    op.create_index("ix_findings_analysis_id", "findings", ["analysis_id"])
    op.create_index("ix_findings_week_pattern", "findings", ["week", "pattern", "job_id", "wasted_gpu_hours", "wasted_usd"])
    op.create_index("ix_findings_job_week_pattern", "findings", ["job_id", "week", "pattern"])

    op.create_table(
        "verdicts",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("trace_id", BigId, sa.ForeignKey("traces.id", ondelete="CASCADE", name="fk_verdicts_trace_id_traces"), nullable=False),
        sa.Column("finding_id", BigId, sa.ForeignKey("findings.id", ondelete="SET NULL", name="fk_verdicts_finding_id_findings")),
        sa.Column("pattern", sa.String(64), nullable=False),
        sa.Column("label", sa.String(16), nullable=False, comment="positive | negative"),
        sa.Column("author", sa.String(200), nullable=False),
        sa.Column("source", sa.String(40), nullable=False),
        sa.Column("note", sa.Text()),
        _created(),
        sa.UniqueConstraint("trace_id", "pattern", "author", name="uq_verdicts_trace_pattern_author"),
    )
    op.create_index("ix_verdicts_trace_id", "verdicts", ["trace_id"])


def downgrade() -> None:
    for table in ("verdicts", "findings", "analyses", "models", "traces", "jobs"):
        op.drop_table(table)
