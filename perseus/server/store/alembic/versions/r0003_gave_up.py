"""Ranks that gave up, and re-runs: ``perseus_gave_up`` keeps, per job and rank, the latest
reason a rank reported for no longer planning (it rejected the job, the planner refused it)
and when; ``perseus_jobs.planned_from_s`` when the planning behind the current frontier
began (profiles reported after it are a re-run's; null for jobs planned before);
``perseus_ranks.instance`` and ``seen_at_s``, the registering process's id and when the rank
was last heard from (a second live process registering the same rank is refused).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "perseus_gave_up",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("perseus_jobs.id"), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("at_s", sa.Float, nullable=False),
    )
    with op.batch_alter_table("perseus_jobs") as batch:
        batch.add_column(sa.Column("planned_from_s", sa.Float))
    with op.batch_alter_table("perseus_ranks") as batch:
        batch.add_column(sa.Column("instance", sa.String(64)))
        batch.add_column(sa.Column("seen_at_s", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("perseus_ranks") as batch:
        batch.drop_column("seen_at_s")
        batch.drop_column("instance")
    with op.batch_alter_table("perseus_jobs") as batch:
        batch.drop_column("planned_from_s")
    op.drop_table("perseus_gave_up")
