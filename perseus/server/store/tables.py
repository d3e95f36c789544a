"""The job store's tables (SQLAlchemy Core) and the frozen row values the store hands out.

Each row value is decoded once, here (:func:`job_row`, :func:`rank_row`, ...): the rest of
the server sees typed values only, never a JSON column's dict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import (
    JSON,
    Column,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from perseus.schemas import JobCreate, JobState, PolicyModel, PolicySpec, StragglerView

__all__ = [
    "CLUSTER_BUDGET",
    "FRONTIERS",
    "GAVE_UP",
    "JOBS",
    "PROFILES",
    "RANKS",
    "SAMPLES",
    "BudgetRow",
    "FrontierRow",
    "IterationWindow",
    "JobRow",
    "PowerWindow",
    "ProfileRecord",
    "RankRow",
    "RankWindow",
    "SampleBucket",
    "metadata",
]

metadata = MetaData()
"""The store's tables as this version uses them; ``perseus/server/alembic/versions`` holds
how a database gets there, and a test checks that the two agree."""

JOBS = Table(
    "perseus_jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200)),
    Column("token_hash", String(64), nullable=False),
    Column("created_at_s", Float, nullable=False),
    Column("updated_at_s", Float, nullable=False),
    Column("spec", JSON, nullable=False),
    Column("state", String(16), nullable=False, index=True),
    Column("reason", Text),
    Column("policy", JSON, nullable=False),
    Column("straggler", JSON),
    Column("version", Integer, nullable=False),
    Column("frontier_rev", Integer, nullable=False),
    Column("policy_index", Integer),
    Column("chosen_index", Integer),
    Column("ranks_registered", Integer, nullable=False),
    Column("profiles_reported", Integer, nullable=False),
    Column("iterations_reported", Integer, nullable=False),
    Column("planning_owner", String(64)),
    Column("planning_heartbeat_s", Float),
    Column("planning_s", Float),
    Column("planned_from_s", Float),
    # The weight of the job's slowdown under a cluster power budget (0004).
    Column("priority", Float, nullable=False, server_default="1"),
    # The frontier point a cluster power budget holds the job at; null: none (0004).
    Column("budget_index", Integer),
    # The rank whose measured clock-change latency the frontier was planned for; null: the
    # server's setting (0005).
    Column("clock_delay_rank", Integer),
)

FRONTIERS = Table(
    "perseus_frontiers",
    metadata,
    Column("job_id", String(64), ForeignKey("perseus_jobs.id"), primary_key=True),
    Column("rev", Integer, nullable=False),
    Column("data", Text, nullable=False),
    # The profile the frontier was planned on (perseus.profile/1 JSON; null before 0002).
    Column("profile", Text),
)

RANKS = Table(
    "perseus_ranks",
    metadata,
    Column("job_id", String(64), ForeignKey("perseus_jobs.id"), primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("stage", Integer, nullable=False),
    Column("data_parallel_rank", Integer, nullable=False),
    Column("tensor_parallel_rank", Integer, nullable=False),
    Column("gpu_name", String(200), nullable=False),
    Column("supported_clocks_mhz", JSON, nullable=False),
    Column("registered_at_s", Float, nullable=False),
    Column("iterations", Integer, nullable=False),
    Column("last_iteration", Integer),
    Column("window_version", Integer, nullable=False),
    Column("recent_times_s", JSON, nullable=False),
    Column("recent_energies_j", JSON, nullable=False),
    Column("host", String(255)),
    Column("instance", String(64)),
    Column("seen_at_s", Float),
    # The largest clock-change latency the rank reported, seconds; null: none (0005).
    Column("clock_latency_s", Float),
    UniqueConstraint("job_id", "stage", "data_parallel_rank", "tensor_parallel_rank"),
)

PROFILES = Table(
    "perseus_profiles",
    metadata,
    Column("job_id", String(64), ForeignKey("perseus_jobs.id"), primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("stage", Integer, nullable=False),
    Column("rows", JSON, nullable=False),
    Column("p_block_w", Float),
    Column("reported_at_s", Float, nullable=False),
)

SAMPLES = Table(
    "perseus_samples",
    metadata,
    Column("job_id", String(64), ForeignKey("perseus_jobs.id"), primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("phase", String(16), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("iterations", Integer, nullable=False),
    Column("time_s_total", Float, nullable=False),
    Column("energy_j_total", Float, nullable=False),
    Column("recent_times_s", JSON, nullable=False),
    Column("recent_energies_j", JSON, nullable=False),
    Column("saved_j", Float, nullable=False),
    Column("saved_iterations", Integer, nullable=False),
)
"""A rank's measured iterations of one phase (and plan version): exact counts and sums,
and the most recent samples (see :mod:`perseus.server.lifecycle.savings`)."""

GAVE_UP = Table(
    "perseus_gave_up",
    metadata,
    Column("job_id", String(64), ForeignKey("perseus_jobs.id"), primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("reason", Text, nullable=False),
    Column("at_s", Float, nullable=False),
)
"""Ranks that stopped planning (the latest report of each): registered or not, since a rank
may reject its job before it registers."""

CLUSTER_BUDGET = Table(
    "perseus_cluster_budget",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("standing_w", Float),
    Column("window_w", Float),
    Column("window_from_s", Float),
    Column("window_to_s", Float),
    Column("applied_w", Float),
    Column("changed_at_s", Float),
    Column("balanced_at_s", Float),
)
"""The cluster's power budget: one row (id 1), absent until a budget is first set. Every
re-balance locks it first, so server processes sharing a database take turns."""


# ----------------------------------------------------------------------------- row values


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job as stored, its JSON columns decoded: ``spec`` is the creation request."""

    id: str
    name: str | None
    token_hash: str
    created_at_s: float
    updated_at_s: float
    spec: JobCreate
    state: JobState
    reason: str | None
    policy: PolicyModel
    straggler: StragglerView | None
    version: int
    frontier_rev: int
    policy_index: int | None
    chosen_index: int | None
    ranks_registered: int
    profiles_reported: int
    iterations_reported: int
    planning_owner: str | None
    planning_heartbeat_s: float | None
    planning_s: float | None
    planned_from_s: float | None = None
    """When the planning behind the current frontier began: profiles reported after it are
    newer than the plan (a re-run of the training)."""
    priority: float = 1.0
    """The weight of the job's slowdown under a cluster power budget."""
    budget_index: int | None = None
    """The frontier point a cluster power budget holds the job at (never faster than its
    policy's); None while no budget moves it."""
    clock_delay_rank: int | None = None
    """The rank whose measured clock-change latency the current frontier was planned for;
    None: the server's setting (or no frontier)."""


@dataclass(frozen=True, slots=True)
class RankRow:
    """One registered rank and its recent iteration telemetry."""

    job_id: str
    rank: int
    stage: int
    data_parallel_rank: int
    tensor_parallel_rank: int
    gpu_name: str
    supported_clocks_mhz: tuple[int, ...]
    registered_at_s: float
    iterations: int = 0
    last_iteration: int | None = None
    window_version: int = 0
    recent_times_s: tuple[float, ...] = ()
    recent_energies_j: tuple[float, ...] = ()
    host: str | None = None
    """The address the rank registered from."""
    instance: str | None = None
    """The registering process's own id (a client that sends none: None)."""
    seen_at_s: float | None = None
    """When the rank last registered or reported an iteration."""

    @property
    def coordinates(self) -> tuple[int, int, int]:
        """``(stage, data_parallel_rank, tensor_parallel_rank)``."""
        return self.stage, self.data_parallel_rank, self.tensor_parallel_rank


@dataclass(frozen=True, slots=True)
class ProfileRecord:
    """One rank's profile rows ``(instruction, frequency_mhz, time_s, energy_j)``."""

    job_id: str
    rank: int
    stage: int
    rows: tuple[tuple[str, int, float, float], ...]
    p_block_w: float | None
    reported_at_s: float


@dataclass(frozen=True, slots=True)
class RankWindow:
    """A rank's recent iterations under one plan version (what telemetry needs)."""

    data_parallel_rank: int
    recent_times_s: tuple[float, ...]
    recent_energies_j: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class IterationWindow:
    """A rank's iteration bookkeeping, read and written on every iteration report."""

    iterations: int
    last_iteration: int | None
    window_version: int
    recent_times_s: tuple[float, ...]
    recent_energies_j: tuple[float, ...]
    seen_at_s: float | None = None


@dataclass(frozen=True, slots=True)
class FrontierRow:
    job_id: str
    rev: int
    data: str
    profile: str | None = None
    """The profile the frontier was planned on, as ``perseus.profile/1`` JSON text."""


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """The cluster's power budget as stored.

    Attributes:
        standing_w: The budget outside any window; None: no standing budget.
        window_w: The scheduled window's budget; None: no window.
        window_from_s: When the window starts (Unix time); None: at once.
        window_to_s: When it ends; None: never.
        applied_w: The budget the jobs' points were last chosen for; None: none (every job
            at its own policy).
        changed_at_s: When the budget was last set or lifted.
        balanced_at_s: When the jobs' points were last chosen.
    """

    standing_w: float | None = None
    window_w: float | None = None
    window_from_s: float | None = None
    window_to_s: float | None = None
    applied_w: float | None = None
    changed_at_s: float | None = None
    balanced_at_s: float | None = None


@dataclass(frozen=True, slots=True)
class PowerWindow:
    """A rank's recent iterations as cluster power sees them (any plan version)."""

    job_id: str
    recent_times_s: tuple[float, ...]
    recent_energies_j: tuple[float, ...]
    seen_at_s: float | None


@dataclass(frozen=True, slots=True)
class SampleBucket:
    """A rank's iterations of one phase: ``baseline`` (default clocks), ``plan`` (under plan
    ``version``), or a phase kept only for its totals (``profiling``, ``default``,
    ``other``: an older rank's report that the comparison cannot place).

    ``saved_j`` is the energy the plan iterations saved against the rank's baseline median
    at the time each was recorded, over the ``saved_iterations`` that had a baseline.
    """

    phase: str
    version: int
    iterations: int = 0
    time_s_total: float = 0.0
    energy_j_total: float = 0.0
    recent_times_s: tuple[float, ...] = ()
    recent_energies_j: tuple[float, ...] = ()
    saved_j: float = 0.0
    saved_iterations: int = 0


JOB_FIELDS = tuple(f.name for f in dataclasses.fields(JobRow))
RANK_FIELDS = tuple(f.name for f in dataclasses.fields(RankRow))
JOB_COLUMNS = [JOBS.c[name] for name in JOB_FIELDS]
RANK_COLUMNS = [RANKS.c[name] for name in RANK_FIELDS]
_RANK_TUPLES = ("supported_clocks_mhz", "recent_times_s", "recent_energies_j")
WINDOW_FIELDS = tuple(f.name for f in dataclasses.fields(IterationWindow))
WINDOW_COLUMNS = [RANKS.c[name] for name in WINDOW_FIELDS]
SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(SampleBucket))
SAMPLE_COLUMNS = [SAMPLES.c[name] for name in SAMPLE_FIELDS]
BUDGET_FIELDS = tuple(f.name for f in dataclasses.fields(BudgetRow))
BUDGET_COLUMNS = [CLUSTER_BUDGET.c[name] for name in BUDGET_FIELDS]
PROFILE_COLUMNS = [
    PROFILES.c[name] for name in ("job_id", "rank", "stage", "rows", "p_block_w", "reported_at_s")
]


_POLICY: TypeAdapter[PolicyModel] = TypeAdapter(PolicySpec)
STATE: TypeAdapter[JobState] = TypeAdapter(JobState)
_JSON_COLUMNS = ("spec", "policy", "straggler")


def job_row(values: Sequence[Any]) -> JobRow:
    """Decode a job row once, here: the rest of the server sees typed values only.

    A row this version did not write fails loudly (pydantic's ValidationError, a 500).
    """
    row = dict(zip(JOB_FIELDS, values, strict=True))
    row["spec"] = JobCreate.model_validate(row["spec"])
    row["policy"] = _POLICY.validate_python(row["policy"])
    if row["straggler"] is not None:
        row["straggler"] = StragglerView.model_validate(row["straggler"])
    row["state"] = STATE.validate_python(row["state"])
    return JobRow(**row)


def job_values(row: JobRow, names: Sequence[str]) -> dict[str, Any]:
    """The columns ``names`` of ``row``, JSON columns encoded."""
    values = {name: getattr(row, name) for name in names}
    if "state" in values:
        values["state"] = str(values["state"])  # the plain text, whatever the driver
    for name in _JSON_COLUMNS:
        if name in values and values[name] is not None:
            values[name] = values[name].model_dump(mode="json")
    return values


def rank_row(values: Sequence[Any]) -> RankRow:
    row = dict(zip(RANK_FIELDS, values, strict=True))
    for name in _RANK_TUPLES:
        row[name] = tuple(row[name])
    return RankRow(**row)


def rank_values(row: RankRow) -> dict[str, Any]:
    values = {name: getattr(row, name) for name in RANK_FIELDS}
    for name in _RANK_TUPLES:
        values[name] = list(values[name])
    return values


def sample_bucket(values: Sequence[Any]) -> SampleBucket:
    row = dict(zip(SAMPLE_FIELDS, values, strict=True))
    row["recent_times_s"] = tuple(row["recent_times_s"])
    row["recent_energies_j"] = tuple(row["recent_energies_j"])
    return SampleBucket(**row)


def sample_values(bucket: SampleBucket) -> dict[str, Any]:
    values = {name: getattr(bucket, name) for name in SAMPLE_FIELDS}
    values["recent_times_s"] = list(bucket.recent_times_s)
    values["recent_energies_j"] = list(bucket.recent_energies_j)
    return values


def profile_record(values: Sequence[Any]) -> ProfileRecord:
    job_id, rank, stage, rows, p_block_w, reported_at_s = values
    checked = tuple((str(r[0]), int(r[1]), float(r[2]), float(r[3])) for r in rows)
    return ProfileRecord(job_id, rank, stage, checked, p_block_w, reported_at_s)
