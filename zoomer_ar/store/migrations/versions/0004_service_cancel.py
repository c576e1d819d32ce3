"""Analysis service: jobs can be cancelled.

`service_jobs.cancel_requested_at` (epoch seconds, database clock) is set by the API's cancel request: a
queued job moves to the new state `cancelled` in that same UPDATE; a running job keeps running until its
worker sees the request, stops the job's analysis process and moves it to `cancelled`. The state column
is a string, so the new value needs no change of type; only its comment says it.

Revision ID: 0004_service_cancel
Revises: 0003_counted_waste
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_service_cancel"
down_revision = "0003_counted_waste"
branch_labels = None
depends_on = None

OLD_STATES = "queued | running | done | failed"
NEW_STATES = "queued | running | done | failed | cancelled"


def _state_comment(comment: str, old: str) -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite keeps no column comments
        op.alter_column("service_jobs", "state", existing_type=sa.String(16), existing_nullable=False,
                        comment=comment, existing_comment=old)


def upgrade() -> None:
    op.add_column("service_jobs", sa.Column("cancel_requested_at", sa.Float(),
                                            comment="epoch seconds; the team asked to cancel the job"))
    _state_comment(NEW_STATES, OLD_STATES)


def downgrade() -> None:
    op.execute("UPDATE service_jobs SET state = 'failed', error = 'cancelled' WHERE state = 'cancelled'")
    with op.batch_alter_table("service_jobs") as batch:
        batch.drop_column("cancel_requested_at")
    _state_comment(OLD_STATES, NEW_STATES)
