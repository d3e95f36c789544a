"""Job store: SQLAlchemy 2 tables and typed transactions over SQLite or PostgreSQL.

The same code serves an embedded SQLite file (the default, nothing to install) and a
PostgreSQL server shared by several planner processes (``postgresql+psycopg://...``).
Callers never see SQL: a transaction hands out frozen row values and takes them back.
Statements are SQLAlchemy Core (no ORM session): a registration is a handful of short
statements, and the ORM's bookkeeping would cost more than they do.

Write transactions serialize per job: on PostgreSQL by ``SELECT ... FOR UPDATE`` of the
job row, on SQLite by ``BEGIN IMMEDIATE`` (SQLite has one writer at a time anyway). So a
read-check-write inside :meth:`Store.write` is atomic, which is what lets exactly one
process claim a job's planning.

The schema evolves by Alembic revisions (:mod:`perseus.server.alembic`):
:meth:`Store.create_schema` brings any older database to this version's tables.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import (
    JSON,
    Column,
    Connection,
    Engine,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    bindparam,
    cast,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

from perseus.schemas import JobCreate, JobState, PolicyModel, PolicySpec, StragglerView
from perseus.server.alembic import VERSION_TABLE
from perseus.server.alembic import revision as schema_revision
from perseus.server.alembic import upgrade as upgrade_schema

__all__ = [
    "CHANGES_CHANNEL",
    "ChangeListener",
    "FrontierRow",
    "IterationWindow",
    "JobRow",
    "ProfileRecord",
    "RankRow",
    "RankWindow",
    "Store",
    "Transaction",
    "metadata",
    "normalize_database_url",
]

# An arbitrary constant: the advisory lock that serializes schema upgrades on PostgreSQL.
_SCHEMA_LOCK_KEY = 7787_0001

CHANGES_CHANNEL = "perseus_job_changes"
"""PostgreSQL notification channel: ``"<job id> <version> <state>"`` on each plan change."""

_log = logging.getLogger("perseus.server")

metadata = MetaData()
"""The store's tables as this version uses them; ``perseus/server/alembic/versions`` holds
how a database gets there, and a test checks that the two agree."""

_jobs = Table(
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
)

_frontiers = Table(
    "perseus_frontiers",
    metadata,
    Column("job_id", String(64), ForeignKey("perseus_jobs.id"), primary_key=True),
    Column("rev", Integer, nullable=False),
    Column("data", Text, nullable=False),
)

_ranks = Table(
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
    UniqueConstraint("job_id", "stage", "data_parallel_rank", "tensor_parallel_rank"),
)

_profiles = Table(
    "perseus_profiles",
    metadata,
    Column("job_id", String(64), ForeignKey("perseus_jobs.id"), primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("stage", Integer, nullable=False),
    Column("rows", JSON, nullable=False),
    Column("p_block_w", Float),
    Column("reported_at_s", Float, nullable=False),
)


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


@dataclass(frozen=True, slots=True)
class FrontierRow:
    job_id: str
    rev: int
    data: str


_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(JobRow))
_RANK_FIELDS = tuple(f.name for f in dataclasses.fields(RankRow))
_JOB_COLUMNS = [_jobs.c[name] for name in _JOB_FIELDS]
_RANK_COLUMNS = [_ranks.c[name] for name in _RANK_FIELDS]
_RANK_TUPLES = ("supported_clocks_mhz", "recent_times_s", "recent_energies_j")
_WINDOW_FIELDS = tuple(f.name for f in dataclasses.fields(IterationWindow))
_WINDOW_COLUMNS = [_ranks.c[name] for name in _WINDOW_FIELDS]
_PROFILE_COLUMNS = [
    _profiles.c[name] for name in ("job_id", "rank", "stage", "rows", "p_block_w", "reported_at_s")
]


_POLICY: TypeAdapter[PolicyModel] = TypeAdapter(PolicySpec)
_STATE: TypeAdapter[JobState] = TypeAdapter(JobState)
_JSON_COLUMNS = ("spec", "policy", "straggler")


def _job_row(values: Sequence[Any]) -> JobRow:
    """Decode a job row once, here: the rest of the server sees typed values only.

    A row this version did not write fails loudly (pydantic's ValidationError, a 500).
    """
    row = dict(zip(_JOB_FIELDS, values, strict=True))
    row["spec"] = JobCreate.model_validate(row["spec"])
    row["policy"] = _POLICY.validate_python(row["policy"])
    if row["straggler"] is not None:
        row["straggler"] = StragglerView.model_validate(row["straggler"])
    row["state"] = _STATE.validate_python(row["state"])
    return JobRow(**row)


def _job_values(row: JobRow, names: Sequence[str]) -> dict[str, Any]:
    """The columns ``names`` of ``row``, JSON columns encoded."""
    values = {name: getattr(row, name) for name in names}
    for name in _JSON_COLUMNS:
        if name in values and values[name] is not None:
            values[name] = values[name].model_dump(mode="json")
    return values


def _rank_row(values: Sequence[Any]) -> RankRow:
    row = dict(zip(_RANK_FIELDS, values, strict=True))
    for name in _RANK_TUPLES:
        row[name] = tuple(row[name])
    return RankRow(**row)


def _rank_values(row: RankRow) -> dict[str, Any]:
    values = {name: getattr(row, name) for name in _RANK_FIELDS}
    for name in _RANK_TUPLES:
        values[name] = list(values[name])
    return values


def _profile_record(values: Sequence[Any]) -> ProfileRecord:
    job_id, rank, stage, rows, p_block_w, reported_at_s = values
    checked = tuple((str(r[0]), int(r[1]), float(r[2]), float(r[3])) for r in rows)
    return ProfileRecord(job_id, rank, stage, checked, p_block_w, reported_at_s)


# ----------------------------------------------------------------------------- transactions


class Transaction:
    """Typed reads and writes inside one database transaction."""

    def __init__(self, connection: Connection, *, locking: bool, notify: bool = False) -> None:
        self._conn = connection
        self._locking = locking
        self._notify = notify
        self._read: dict[str, JobRow] = {}  # as read here: save_job writes only what changed

    # jobs

    def job(self, job_id: str) -> JobRow | None:
        """The job, locked for the rest of a write transaction."""
        query = select(*_JOB_COLUMNS).where(_jobs.c.id == job_id)
        if self._locking:
            query = query.with_for_update()
        found = self._conn.execute(query).first()
        if found is None:
            return None
        row = _job_row(found)
        self._read[job_id] = row
        return row

    def insert_job(self, row: JobRow) -> None:
        self._conn.execute(insert(_jobs).values(_job_values(row, _JOB_FIELDS)))

    def save_job(self, row: JobRow) -> None:
        """Write ``row`` back: the columns that differ from the row as read here."""
        before = self._read.get(row.id)
        changed = [
            name
            for name in _JOB_FIELDS
            if name != "id" and (before is None or getattr(row, name) != getattr(before, name))
        ]
        values = _job_values(row, changed)
        if values:
            self._conn.execute(update(_jobs).where(_jobs.c.id == row.id).values(values))
        if self._notify and ("version" in values or "state" in values):
            # Delivered at commit to every process listening (Store.listen).
            self._conn.execute(
                select(func.pg_notify(CHANGES_CHANNEL, f"{row.id} {row.version} {row.state}"))
            )
        self._read[row.id] = row

    def delete_job(self, job_id: str) -> bool:
        self.job_version(job_id)  # the job row first, as every write (see job_version)
        for table in (_profiles, _ranks, _frontiers):
            self._conn.execute(delete(table).where(table.c.job_id == job_id))
        result = self._conn.execute(delete(_jobs).where(_jobs.c.id == job_id))
        return bool(result.rowcount)

    def list_jobs(self, limit: int, offset: int) -> list[JobRow]:
        query = (
            select(*_JOB_COLUMNS)
            .order_by(_jobs.c.created_at_s, _jobs.c.id)
            .limit(limit)
            .offset(offset)
        )
        return [_job_row(found) for found in self._conn.execute(query)]

    def count_jobs_by_state(self) -> dict[str, int]:
        query = select(_jobs.c.state, func.count()).group_by(_jobs.c.state)
        return {str(state): int(count) for state, count in self._conn.execute(query)}

    def job_heads(self, job_ids: Sequence[str]) -> dict[str, tuple[int, JobState]]:
        """``job id -> (version, state)`` of these jobs (those that exist)."""
        query = select(_jobs.c.id, _jobs.c.version, _jobs.c.state).where(
            _jobs.c.id.in_(list(job_ids))
        )
        return {
            str(job_id): (int(version), _STATE.validate_python(state))
            for job_id, version, state in self._conn.execute(query)
        }

    def stale_planning_jobs(self, heartbeat_before_s: float) -> list[str]:
        """Ids of jobs in ``planning`` whose owner stopped sending heartbeats."""
        query = select(_jobs.c.id).where(
            _jobs.c.state == "planning",
            or_(
                _jobs.c.planning_heartbeat_s < heartbeat_before_s,
                _jobs.c.planning_heartbeat_s.is_(None),
            ),
        )
        return [str(job_id) for job_id in self._conn.execute(query).scalars()]

    def heartbeat(self, owner: str, job_ids: Sequence[str], now_s: float) -> None:
        if not job_ids:
            return
        self._conn.execute(
            update(_jobs)
            .where(
                _jobs.c.id.in_(job_ids),
                _jobs.c.planning_owner == owner,
                _jobs.c.state == "planning",
            )
            .values(planning_heartbeat_s=now_s)
        )

    # ranks

    def rank(self, job_id: str, rank: int) -> RankRow | None:
        query = select(*_RANK_COLUMNS).where(_ranks.c.job_id == job_id, _ranks.c.rank == rank)
        found = self._conn.execute(query).first()
        return None if found is None else _rank_row(found)

    def rank_at(self, job_id: str, stage: int, dp_rank: int, tp_rank: int) -> RankRow | None:
        """The rank registered at these coordinates, if any."""
        query = select(*_RANK_COLUMNS).where(
            _ranks.c.job_id == job_id,
            _ranks.c.stage == stage,
            _ranks.c.data_parallel_rank == dp_rank,
            _ranks.c.tensor_parallel_rank == tp_rank,
        )
        found = self._conn.execute(query).first()
        return None if found is None else _rank_row(found)

    def ranks(self, job_id: str) -> list[RankRow]:
        query = select(*_RANK_COLUMNS).where(_ranks.c.job_id == job_id).order_by(_ranks.c.rank)
        return [_rank_row(found) for found in self._conn.execute(query)]

    # Iteration reports touch only these columns: they come from every rank every
    # iteration, so a batch of them reads and writes no more than it needs.

    def job_version(self, job_id: str) -> int | None:
        """The job's plan version, its row locked for the rest of a write transaction.

        Every write locks the job row before any row under it (ranks, profiles): two
        writers taking them in opposite orders deadlock on PostgreSQL.
        """
        query = select(_jobs.c.version).where(_jobs.c.id == job_id)
        if self._locking:
            query = query.with_for_update()
        found = self._conn.execute(query).first()
        return None if found is None else int(found[0])

    def iteration_windows(self, job_id: str, ranks: Sequence[int]) -> dict[int, IterationWindow]:
        """The iteration bookkeeping of these ranks (those registered)."""
        query = select(_ranks.c.rank, *_WINDOW_COLUMNS).where(
            _ranks.c.job_id == job_id, _ranks.c.rank.in_(list(ranks))
        )
        return {
            int(rank): IterationWindow(iterations, last, version, tuple(times), tuple(energies))
            for rank, iterations, last, version, times, energies in self._conn.execute(query)
        }

    def save_iteration_windows(
        self, job_id: str, windows: Mapping[int, IterationWindow], reports: int
    ) -> None:
        """Write the ranks' bookkeeping back and count ``reports`` more iteration reports."""
        if windows:
            self._conn.execute(
                update(_ranks)
                .where(_ranks.c.job_id == job_id, _ranks.c.rank == bindparam("rank_"))
                .values({name: bindparam(name) for name in _WINDOW_FIELDS}),
                [
                    {
                        "rank_": rank,
                        "iterations": w.iterations,
                        "last_iteration": w.last_iteration,
                        "window_version": w.window_version,
                        "recent_times_s": list(w.recent_times_s),
                        "recent_energies_j": list(w.recent_energies_j),
                    }
                    for rank, w in windows.items()
                ],
            )
        self._conn.execute(
            update(_jobs)
            .where(_jobs.c.id == job_id)
            .values(iterations_reported=_jobs.c.iterations_reported + reports)
        )

    def windows(self, job_id: str, version: int) -> list[RankWindow]:
        """Recent iterations of every rank that reported under plan ``version``."""
        query = select(
            _ranks.c.data_parallel_rank, _ranks.c.recent_times_s, _ranks.c.recent_energies_j
        ).where(_ranks.c.job_id == job_id, _ranks.c.window_version == version)
        return [
            RankWindow(int(dp), tuple(times), tuple(energies))
            for dp, times, energies in self._conn.execute(query)
        ]

    def rank_layout(self, job_id: str) -> dict[int, tuple[int, int, int]]:
        """``rank -> (stage, data_parallel_rank, tensor_parallel_rank)`` of every rank."""
        query = select(
            _ranks.c.rank,
            _ranks.c.stage,
            _ranks.c.data_parallel_rank,
            _ranks.c.tensor_parallel_rank,
        ).where(_ranks.c.job_id == job_id)
        return {int(r): (int(s), int(d), int(t)) for r, s, d, t in self._conn.execute(query)}

    def rank_hosts(self, job_id: str) -> dict[int, tuple[int, int, str | None]]:
        """``rank -> (stage, data_parallel_rank, host)`` of every rank."""
        query = select(
            _ranks.c.rank, _ranks.c.stage, _ranks.c.data_parallel_rank, _ranks.c.host
        ).where(_ranks.c.job_id == job_id)
        return {int(r): (int(s), int(d), h) for r, s, d, h in self._conn.execute(query)}

    def put_rank(self, row: RankRow, *, new: bool) -> None:
        """Insert a new rank (``new``) or replace an existing one."""
        values = _rank_values(row)
        if new:
            self._conn.execute(insert(_ranks).values(values))
        else:
            self._conn.execute(
                update(_ranks)
                .where(_ranks.c.job_id == row.job_id, _ranks.c.rank == row.rank)
                .values(values)
            )

    # profiles

    def has_profile(self, job_id: str, rank: int) -> bool:
        query = select(_profiles.c.rank).where(
            _profiles.c.job_id == job_id, _profiles.c.rank == rank
        )
        return self._conn.execute(query).first() is not None

    def profile_texts(self, job_id: str) -> list[tuple[int, int, str, float | None]]:
        """``(rank, stage, rows as JSON text, p_block_w)`` of every profile, undecoded."""
        query = (
            select(
                _profiles.c.rank,
                _profiles.c.stage,
                cast(_profiles.c.rows, Text),
                _profiles.c.p_block_w,
            )
            .where(_profiles.c.job_id == job_id)
            .order_by(_profiles.c.rank)
        )
        return [(int(r), int(s), str(text), p) for r, s, text, p in self._conn.execute(query)]

    def profiles(self, job_id: str) -> list[ProfileRecord]:
        query = (
            select(*_PROFILE_COLUMNS).where(_profiles.c.job_id == job_id).order_by(_profiles.c.rank)
        )
        return [_profile_record(found) for found in self._conn.execute(query)]

    def profiled_coverage(self, job_id: str) -> set[tuple[int, int]]:
        """``(stage, tensor_parallel_rank)`` pairs with at least one profile."""
        query = (
            select(_ranks.c.stage, _ranks.c.tensor_parallel_rank)
            .join(
                _profiles,
                and_(_profiles.c.job_id == _ranks.c.job_id, _profiles.c.rank == _ranks.c.rank),
            )
            .where(_ranks.c.job_id == job_id)
            .distinct()
        )
        return {(int(s), int(t)) for s, t in self._conn.execute(query)}

    def put_profile(self, record: ProfileRecord, *, new: bool) -> None:
        """Insert a new profile (``new``) or replace the rank's earlier one."""
        values = {
            "stage": record.stage,
            "rows": [list(r) for r in record.rows],
            "p_block_w": record.p_block_w,
            "reported_at_s": record.reported_at_s,
        }
        if new:
            self._conn.execute(
                insert(_profiles).values(job_id=record.job_id, rank=record.rank, **values)
            )
        else:
            self._conn.execute(
                update(_profiles)
                .where(_profiles.c.job_id == record.job_id, _profiles.c.rank == record.rank)
                .values(values)
            )

    # frontiers

    def frontier(self, job_id: str) -> FrontierRow | None:
        query = select(_frontiers.c.job_id, _frontiers.c.rev, _frontiers.c.data).where(
            _frontiers.c.job_id == job_id
        )
        found = self._conn.execute(query).first()
        return None if found is None else FrontierRow(*found)

    def put_frontier(self, row: FrontierRow) -> None:
        """Store the job's frontier, replacing an earlier one."""
        exists = self._conn.execute(
            select(_frontiers.c.rev).where(_frontiers.c.job_id == row.job_id)
        ).first()
        if exists is None:
            self._conn.execute(insert(_frontiers).values(dataclasses.asdict(row)))
        else:
            self._conn.execute(
                update(_frontiers)
                .where(_frontiers.c.job_id == row.job_id)
                .values(rev=row.rev, data=row.data)
            )


# ----------------------------------------------------------------------------- the store


def normalize_database_url(url: str) -> str:
    """Use psycopg 3 for bare ``postgresql://`` URLs (SQLAlchemy would pick psycopg2)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


def _sqlite_engine(url: str, begin: str, *, in_memory: bool) -> Engine:
    if in_memory:
        engine = create_engine(url, connect_args={"check_same_thread": False}, poolclass=StaticPool)
    else:
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30.0},
            pool_size=8,
            max_overflow=16,
        )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, decide where transactions begin (see _on_begin).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not in_memory:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql(begin)

    return engine


class ChangeListener:
    """A thread that LISTENs on :data:`CHANGES_CHANNEL`, reconnecting after errors.

    Args:
        url: the store's SQLAlchemy URL (PostgreSQL).
        callback: called in the thread with ``(job_id, version, state)``.
    """

    def __init__(self, url: str, callback: Callable[[str, int, str], None]) -> None:
        self._conninfo = (
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        self._callback = callback
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perseus listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANGES_CHANNEL}")
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            job_id, version, state = note.payload.split(" ")
                            self._callback(job_id, int(version), state)
            except Exception:
                # Waits fall back to polling meanwhile (JobHeads); reconnect shortly.
                _log.warning("listening for job changes failed; retrying", exc_info=True)
                self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)


class Store:
    """The job store.

    Args:
        url: SQLAlchemy URL: ``sqlite:///path.db`` or ``postgresql+psycopg://user:pw@host/db``.
    """

    def __init__(self, url: str) -> None:
        self.url = normalize_database_url(url)
        parsed = make_url(self.url)
        self.backend = parsed.get_backend_name()
        self._write_lock: AbstractContextManager[Any]
        if self.backend == "sqlite":
            in_memory = parsed.database in (None, "", ":memory:")
            # Reads take no lock; writes take SQLite's one write lock up front, so that a
            # read-check-write never fails half way with "database is locked".
            self._write_engine = _sqlite_engine(self.url, "BEGIN IMMEDIATE", in_memory=in_memory)
            self._read_engine = (
                self._write_engine
                if in_memory
                else _sqlite_engine(self.url, "BEGIN", in_memory=False)
            )
            # Threads of one process queue here for SQLite's single write lock rather than
            # in SQLite's busy handler, which sleeps in growing steps (long tail latencies).
            self._write_lock = threading.Lock()
        else:
            engine = create_engine(self.url, pool_size=5, max_overflow=10, pool_pre_ping=True)
            self._write_engine = self._read_engine = engine
            self._write_lock = nullcontext()

    def create_schema(self) -> str:
        """Create the tables, or upgrade them to this version's schema (Alembic revisions,
        see :mod:`perseus.server.alembic`), in one transaction; safe when several processes
        start at once.

        Returns:
            The schema revision reached (the newest this version knows).

        Raises:
            StoreError: the database was upgraded by a newer perseus, or is not perseus's.
            sqlalchemy.exc.SQLAlchemyError: the database cannot be reached or written.
        """
        with self._write_lock, self._write_engine.begin() as connection:
            if self.backend == "postgresql":
                # SQLite's BEGIN IMMEDIATE already admits one writer at a time.
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK_KEY}
                )
            return upgrade_schema(connection)

    def schema_revision(self) -> str | None:
        """The database's schema revision; None when it has none (empty, or made before
        migrations)."""
        with self._read_engine.begin() as connection:
            return schema_revision(connection)

    def drop_schema(self) -> None:
        """Drop every table and the schema revision (tests only)."""
        with self._write_engine.begin() as connection:
            metadata.drop_all(connection)
            connection.execute(text(f"DROP TABLE IF EXISTS {VERSION_TABLE}"))

    @contextmanager
    def read(self) -> Iterator[Transaction]:
        """A read-only transaction."""
        with self._read_engine.begin() as connection:
            yield Transaction(connection, locking=False)

    @contextmanager
    def write(self) -> Iterator[Transaction]:
        """A write transaction; :meth:`Transaction.job` locks the job row."""
        with self._write_lock, self._write_engine.begin() as connection:
            yield Transaction(connection, locking=True, notify=self.backend == "postgresql")

    def listen(self, callback: Callable[[str, int, str], None]) -> ChangeListener | None:
        """Call ``callback(job_id, version, state)`` in a thread on every job's plan change
        made by any process (PostgreSQL's LISTEN); None where the database cannot notify.
        """
        if self.backend != "postgresql":
            return None
        listener = ChangeListener(self.url, callback)
        listener.start()
        return listener

    def close(self) -> None:
        self._write_engine.dispose()
        if self._read_engine is not self._write_engine:
            self._read_engine.dispose()
