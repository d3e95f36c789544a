"""A power budget for the whole cluster: ``perseus_cluster_budget`` holds one row, the
standing budget and one scheduled window, and what the jobs' points were last chosen for;
``perseus_jobs.priority`` weighs a job's slowdown under a budget (1 for jobs made before),
``perseus_jobs.budget_index`` the frontier point a budget holds the job at (null: none).

Revision ID: 0004
Revises: 0003
Create Date: 2027-01-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    budget = op.create_table(
        "perseus_cluster_budget",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("standing_w", sa.Float),
        sa.Column("window_w", sa.Float),
        sa.Column("window_from_s", sa.Float),
        sa.Column("window_to_s", sa.Float),
        sa.Column("applied_w", sa.Float),
        sa.Column("changed_at_s", sa.Float),
        sa.Column("balanced_at_s", sa.Float),
    )
    # The one row, so that every re-balance has a row to lock from the start.
    op.bulk_insert(budget, [{"id": 1}])
    with op.batch_alter_table("perseus_jobs") as batch:
        batch.add_column(sa.Column("priority", sa.Float, nullable=False, server_default="1"))
        batch.add_column(sa.Column("budget_index", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("perseus_jobs") as batch:
        batch.drop_column("budget_index")
        batch.drop_column("priority")
    op.drop_table("perseus_cluster_budget")
