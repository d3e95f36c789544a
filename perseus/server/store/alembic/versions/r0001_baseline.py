"""The job store as perseus made it before migrations: jobs, frontiers, ranks, profiles.

A database made then is stamped at this revision instead of running it (see
``perseus.server.store.alembic``): written out here as ``metadata.create_all`` made it, so that both
kinds of database continue from the same schema.

Revision ID: 0001
Revises:
Create Date: 2025-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "perseus_jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200)),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at_s", sa.Float, nullable=False),
        sa.Column("updated_at_s", sa.Float, nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("policy", sa.JSON, nullable=False),
        sa.Column("straggler", sa.JSON),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("frontier_rev", sa.Integer, nullable=False),
        sa.Column("policy_index", sa.Integer),
        sa.Column("chosen_index", sa.Integer),
        sa.Column("ranks_registered", sa.Integer, nullable=False),
        sa.Column("profiles_reported", sa.Integer, nullable=False),
        sa.Column("iterations_reported", sa.Integer, nullable=False),
        sa.Column("planning_owner", sa.String(64)),
        sa.Column("planning_heartbeat_s", sa.Float),
        sa.Column("planning_s", sa.Float),
    )
    op.create_index("ix_perseus_jobs_state", "perseus_jobs", ["state"])
    op.create_table(
        "perseus_frontiers",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("perseus_jobs.id"), primary_key=True),
        sa.Column("rev", sa.Integer, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
    )
    op.create_table(
        "perseus_ranks",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("perseus_jobs.id"), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("stage", sa.Integer, nullable=False),
        sa.Column("data_parallel_rank", sa.Integer, nullable=False),
        sa.Column("tensor_parallel_rank", sa.Integer, nullable=False),
        sa.Column("gpu_name", sa.String(200), nullable=False),
        sa.Column("supported_clocks_mhz", sa.JSON, nullable=False),
        sa.Column("registered_at_s", sa.Float, nullable=False),
        sa.Column("iterations", sa.Integer, nullable=False),
        sa.Column("last_iteration", sa.Integer),
        sa.Column("window_version", sa.Integer, nullable=False),
        sa.Column("recent_times_s", sa.JSON, nullable=False),
        sa.Column("recent_energies_j", sa.JSON, nullable=False),
        sa.Column("host", sa.String(255)),
        sa.UniqueConstraint("job_id", "stage", "data_parallel_rank", "tensor_parallel_rank"),
    )
    op.create_table(
        "perseus_profiles",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("perseus_jobs.id"), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("stage", sa.Integer, nullable=False),
        sa.Column("rows", sa.JSON, nullable=False),
        sa.Column("p_block_w", sa.Float),
        sa.Column("reported_at_s", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in ("perseus_profiles", "perseus_ranks", "perseus_frontiers"):
        op.drop_table(table)
    op.drop_index("ix_perseus_jobs_state", "perseus_jobs")
    op.drop_table("perseus_jobs")
