"""Measured iterations kept per rank and phase (the realized saving), and the profile each
frontier was planned on.

``perseus_samples`` holds, per job, rank, phase and plan version, exact iteration counts and
sums and the most recent samples; ``perseus_frontiers.profile`` the profile a frontier was
planned on (null for frontiers stored before: plans then take instruction times from the
profiles stored now). Existing data is kept; iterations reported before this revision are
not in the samples (their counts stay in ``perseus_jobs.iterations_reported``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-01-15
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "perseus_samples",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("perseus_jobs.id"), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("phase", sa.String(16), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("iterations", sa.Integer, nullable=False),
        sa.Column("time_s_total", sa.Float, nullable=False),
        sa.Column("energy_j_total", sa.Float, nullable=False),
        sa.Column("recent_times_s", sa.JSON, nullable=False),
        sa.Column("recent_energies_j", sa.JSON, nullable=False),
        sa.Column("saved_j", sa.Float, nullable=False),
        sa.Column("saved_iterations", sa.Integer, nullable=False),
    )
    # SQLite alters tables in batch mode (a copy); adding a nullable column needs none, but
    # batch keeps one code path for both databases.
    with op.batch_alter_table("perseus_frontiers") as batch:
        batch.add_column(sa.Column("profile", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("perseus_frontiers") as batch:
        batch.drop_column("profile")
    op.drop_table("perseus_samples")
