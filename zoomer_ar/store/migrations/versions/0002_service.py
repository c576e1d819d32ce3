"""Analysis service: teams, API tokens (hashed), the job queue and job artifacts.

Revision ID: 0002_service
Revises: 0001_initial
Create Date: 2026-06-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002_service"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "service_teams",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.UniqueConstraint("name", name="uq_service_teams_name"),
    )

    op.create_table(
        "service_tokens",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("team_id", BigId, sa.ForeignKey("service_teams.id", ondelete="CASCADE",
                                                  name="fk_service_tokens_team_id_service_teams"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, comment="sha256 hex of the token"),
        sa.Column("prefix", sa.String(16), nullable=False, comment="first characters of the token, for listings"),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("revoked_at", sa.Float(), comment="epoch seconds; revoked tokens are refused"),
        sa.UniqueConstraint("token_hash", name="uq_service_tokens_token_hash"),
    )
    op.create_index("ix_service_tokens_team_id", "service_tokens", ["team_id"])

    op.create_table(
        "service_jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("team_id", BigId, sa.ForeignKey("service_teams.id", ondelete="CASCADE",
                                                  name="fk_service_jobs_team_id_service_teams"), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False, comment="analyze | review"),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False, comment="queued | running | done | failed"),
        sa.Column("params", Json, nullable=False),
        sa.Column("input_dir", sa.Text()),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(200)),
        sa.Column("lease_token", sa.String(32)),
        sa.Column("lease_expires_at", sa.Float()),
        sa.Column("heartbeat_at", sa.Float()),
        sa.Column("queued_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float()),
        sa.Column("finished_at", sa.Float()),
        sa.Column("error", sa.Text()),
        sa.Column("result", Json),
        sa.Column("content_hash", sa.String(64)),
        sa.Column("analysis_id", BigId, sa.ForeignKey("analyses.id", ondelete="SET NULL",
                                                      name="fk_service_jobs_analysis_id_analyses")),
    )
    op.create_index("ix_service_jobs_state_queued", "service_jobs", ["state", "queued_at"])
    op.create_index("ix_service_jobs_team_queued", "service_jobs", ["team_id", "queued_at"])

    op.create_table(
        "service_artifacts",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("service_jobs.id", ondelete="CASCADE",
                                                         name="fk_service_artifacts_job_id_service_jobs"),
                  primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("media_type", sa.String(100), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    for table in ("service_artifacts", "service_jobs", "service_tokens", "service_teams"):
        op.drop_table(table)
