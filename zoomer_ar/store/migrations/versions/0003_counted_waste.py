"""Findings' counted waste: the share of a finding's waste that combined totals count.

A finding within another of the same analysis (launch-bound, sync-point and dataloader-bound
measure parts of idle-gpu's idle time: zoomer_ar/detect/combine.py) counts once: the digest's totals
sum counted_gpu_hours / counted_usd, its per-pattern rows keep wasted_gpu_hours / wasted_usd. Rows
recorded before this revision count their whole waste, as the totals did then.

Revision ID: 0003_counted_waste
Revises: 0002_service
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_counted_waste"
down_revision = "0002_service"
branch_labels = None
depends_on = None

OLD_INDEX = ["week", "pattern", "job_id", "wasted_gpu_hours", "wasted_usd"]
NEW_INDEX = OLD_INDEX + ["counted_gpu_hours", "counted_usd"]


def upgrade() -> None:
    op.add_column("findings", sa.Column("counted_gpu_hours", sa.Float(), nullable=False, server_default="0",
                                        comment="wasted_gpu_hours x the finding's share in its analysis' combined total"))
    op.add_column("findings", sa.Column("counted_usd", sa.Float(), nullable=False, server_default="0",
                                        comment="counted_gpu_hours x the analysis' price"))
    op.execute("UPDATE findings SET counted_gpu_hours = wasted_gpu_hours, counted_usd = wasted_usd")
    op.drop_index("ix_findings_week_pattern", table_name="findings")
    op.create_index("ix_findings_week_pattern", "findings", NEW_INDEX)


def downgrade() -> None:
    op.drop_index("ix_findings_week_pattern", table_name="findings")
    with op.batch_alter_table("findings") as batch:
        batch.drop_column("counted_usd")
        batch.drop_column("counted_gpu_hours")
    op.create_index("ix_findings_week_pattern", "findings", OLD_INDEX)
