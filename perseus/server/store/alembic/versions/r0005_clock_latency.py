"""Measured clock-change latencies: ``perseus_ranks.clock_latency_s`` keeps the largest
latency each rank reported (null: none, as for every rank registered before), and
``perseus_jobs.clock_delay_rank`` the rank whose latency the job's frontier was planned for
(null: the server's setting, as for every frontier planned before).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("perseus_ranks") as batch:
        batch.add_column(sa.Column("clock_latency_s", sa.Float))
    with op.batch_alter_table("perseus_jobs") as batch:
        batch.add_column(sa.Column("clock_delay_rank", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("perseus_jobs") as batch:
        batch.drop_column("clock_delay_rank")
    with op.batch_alter_table("perseus_ranks") as batch:
        batch.drop_column("clock_latency_s")
