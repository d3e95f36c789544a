"""Typed reads and writes inside one job-store transaction (:class:`Transaction`).

:class:`perseus.server.store.job_store.Store` opens the transactions; this module holds what a
transaction can read and write: jobs, ranks, profiles, frontiers, iteration windows and
telemetry samples, each as the frozen row values of :mod:`perseus.server.store.tables`. A write
transaction locks the job row it reads (``SELECT ... FOR UPDATE`` on PostgreSQL).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from sqlalchemy import (
    Connection,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)

from perseus.core.errors import JobStateError
from perseus.core.jobs import CREATED, JobState, transition
from perseus.server.store.database import CHANGES_CHANNEL
from perseus.server.store.tables import (
    BUDGET_COLUMNS,
    BUDGET_FIELDS,
    CLUSTER_BUDGET,
    FRONTIERS,
    GAVE_UP,
    JOB_COLUMNS,
    JOB_FIELDS,
    JOBS,
    PROFILE_COLUMNS,
    PROFILES,
    RANK_COLUMNS,
    RANKS,
    SAMPLE_COLUMNS,
    SAMPLE_FIELDS,
    SAMPLES,
    STATE,
    WINDOW_COLUMNS,
    WINDOW_FIELDS,
    BudgetRow,
    FrontierRow,
    IterationWindow,
    JobRow,
    PowerWindow,
    ProfileRecord,
    RankRow,
    RankWindow,
    SampleBucket,
    job_row,
    job_values,
    profile_record,
    rank_row,
    rank_values,
    sample_bucket,
    sample_values,
)

__all__ = ["Transaction"]


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
        query = select(*JOB_COLUMNS).where(JOBS.c.id == job_id)
        if self._locking:
            query = query.with_for_update()
        found = self._conn.execute(query).first()
        if found is None:
            return None
        row = job_row(found)
        self._read[job_id] = row
        return row

    def insert_job(self, row: JobRow) -> None:
        """Store a new job.

        Raises:
            JobStateError: it is not in the state jobs are created in.
        """
        if row.state != CREATED:
            raise JobStateError(f"a job is created {CREATED}, not {row.state}")
        self._conn.execute(insert(JOBS).values(job_values(row, JOB_FIELDS)))

    def save_job(self, row: JobRow) -> None:
        """Write ``row`` back: the columns that differ from the row as read here.

        Raises:
            JobStateError: its state moved in a way :data:`perseus.core.jobs.TRANSITIONS`
                does not hold.
        """
        before = self._read.get(row.id)
        if before is None:
            before = self.job(row.id)  # every caller read it already; the check needs it
        if before is not None and row.state != before.state:
            transition(before.state, row.state)
        changed = [
            name
            for name in JOB_FIELDS
            if name != "id" and (before is None or getattr(row, name) != getattr(before, name))
        ]
        values = job_values(row, changed)
        if values:
            self._conn.execute(update(JOBS).where(JOBS.c.id == row.id).values(values))
        if self._notify and ("version" in values or "state" in values):
            # Delivered at commit to every process listening (Store.listen).
            self._conn.execute(
                select(func.pg_notify(CHANGES_CHANNEL, f"{row.id} {row.version} {row.state}"))
            )
        self._read[row.id] = row

    def delete_job(self, job_id: str) -> bool:
        self.job_version(job_id)  # the job row first, as every write (see job_version)
        for table in (SAMPLES, PROFILES, RANKS, FRONTIERS, GAVE_UP):
            self._conn.execute(delete(table).where(table.c.job_id == job_id))
        result = self._conn.execute(delete(JOBS).where(JOBS.c.id == job_id))
        return bool(result.rowcount)

    def list_jobs(self, limit: int, offset: int, *, newest_first: bool = False) -> list[JobRow]:
        order = (JOBS.c.created_at_s, JOBS.c.id)
        query = (
            select(*JOB_COLUMNS)
            .order_by(*(column.desc() for column in order) if newest_first else order)
            .limit(limit)
            .offset(offset)
        )
        return [job_row(found) for found in self._conn.execute(query)]

    def planned_job_ids(self) -> list[str]:
        """Every job with a plan version (planned at least once), oldest first."""
        query = select(JOBS.c.id).where(JOBS.c.version > 0).order_by(JOBS.c.created_at_s, JOBS.c.id)
        return [str(job_id) for job_id in self._conn.execute(query).scalars()]

    def count_jobs(self) -> int:
        return int(self._conn.execute(select(func.count()).select_from(JOBS)).scalar_one())

    def profile_bytes(self, job_id: str, except_rank: int) -> int:
        """Size of the job's stored profile rows as JSON text, but for one rank's."""
        query = select(func.coalesce(func.sum(func.length(cast(PROFILES.c.rows, Text))), 0)).where(
            PROFILES.c.job_id == job_id, PROFILES.c.rank != except_rank
        )
        return int(self._conn.execute(query).scalar_one())

    def count_jobs_by_state(self) -> dict[str, int]:
        query = select(JOBS.c.state, func.count()).group_by(JOBS.c.state)
        return {str(state): int(count) for state, count in self._conn.execute(query)}

    def job_heads(self, job_ids: Sequence[str]) -> dict[str, tuple[int, JobState]]:
        """``job id -> (version, state)`` of these jobs (those that exist)."""
        query = select(JOBS.c.id, JOBS.c.version, JOBS.c.state).where(JOBS.c.id.in_(list(job_ids)))
        return {
            str(job_id): (int(version), STATE.validate_python(state))
            for job_id, version, state in self._conn.execute(query)
        }

    def stale_planning_jobs(self, heartbeat_before_s: float) -> list[str]:
        """Ids of jobs in ``planning`` whose owner stopped sending heartbeats."""
        query = select(JOBS.c.id).where(
            JOBS.c.state == JobState.PLANNING.value,
            or_(
                JOBS.c.planning_heartbeat_s < heartbeat_before_s,
                JOBS.c.planning_heartbeat_s.is_(None),
            ),
        )
        return [str(job_id) for job_id in self._conn.execute(query).scalars()]

    def heartbeat(self, owner: str, job_ids: Sequence[str], now_s: float) -> None:
        if not job_ids:
            return
        self._conn.execute(
            update(JOBS)
            .where(
                JOBS.c.id.in_(job_ids),
                JOBS.c.planning_owner == owner,
                JOBS.c.state == JobState.PLANNING.value,
            )
            .values(planning_heartbeat_s=now_s)
        )

    # ranks

    def rank(self, job_id: str, rank: int) -> RankRow | None:
        query = select(*RANK_COLUMNS).where(RANKS.c.job_id == job_id, RANKS.c.rank == rank)
        found = self._conn.execute(query).first()
        return None if found is None else rank_row(found)

    def rank_at(self, job_id: str, stage: int, dp_rank: int, tp_rank: int) -> RankRow | None:
        """The rank registered at these coordinates, if any."""
        query = select(*RANK_COLUMNS).where(
            RANKS.c.job_id == job_id,
            RANKS.c.stage == stage,
            RANKS.c.data_parallel_rank == dp_rank,
            RANKS.c.tensor_parallel_rank == tp_rank,
        )
        found = self._conn.execute(query).first()
        return None if found is None else rank_row(found)

    def ranks(self, job_id: str) -> list[RankRow]:
        query = select(*RANK_COLUMNS).where(RANKS.c.job_id == job_id).order_by(RANKS.c.rank)
        return [rank_row(found) for found in self._conn.execute(query)]

    # Iteration reports touch only these columns: they come from every rank every
    # iteration, so a batch of them reads and writes no more than it needs.

    def job_version(self, job_id: str) -> int | None:
        """The job's plan version, its row locked for the rest of a write transaction.

        Every write locks the job row before any row under it (ranks, profiles): two
        writers taking them in opposite orders deadlock on PostgreSQL.
        """
        query = select(JOBS.c.version).where(JOBS.c.id == job_id)
        if self._locking:
            query = query.with_for_update()
        found = self._conn.execute(query).first()
        return None if found is None else int(found[0])

    def iteration_windows(self, job_id: str, ranks: Sequence[int]) -> dict[int, IterationWindow]:
        """The iteration bookkeeping of these ranks (those registered)."""
        query = select(RANKS.c.rank, *WINDOW_COLUMNS).where(
            RANKS.c.job_id == job_id, RANKS.c.rank.in_(list(ranks))
        )
        return {
            int(rank): IterationWindow(
                iterations, last, version, tuple(times), tuple(energies), seen_at_s
            )
            for rank, iterations, last, version, times, energies, seen_at_s in self._conn.execute(
                query
            )
        }

    def save_iteration_windows(
        self, job_id: str, windows: Mapping[int, IterationWindow], reports: int
    ) -> None:
        """Write the ranks' bookkeeping back and count ``reports`` more iteration reports."""
        if windows:
            self._conn.execute(
                update(RANKS)
                .where(RANKS.c.job_id == job_id, RANKS.c.rank == bindparam("rank_"))
                .values({name: bindparam(name) for name in WINDOW_FIELDS}),
                [
                    {
                        "rank_": rank,
                        "iterations": w.iterations,
                        "last_iteration": w.last_iteration,
                        "window_version": w.window_version,
                        "recent_times_s": list(w.recent_times_s),
                        "recent_energies_j": list(w.recent_energies_j),
                        "seen_at_s": w.seen_at_s,
                    }
                    for rank, w in windows.items()
                ],
            )
        self._conn.execute(
            update(JOBS)
            .where(JOBS.c.id == job_id)
            .values(iterations_reported=JOBS.c.iterations_reported + reports)
        )

    def windows(self, job_id: str, version: int) -> list[RankWindow]:
        """Recent iterations of every rank that reported under plan ``version``."""
        query = select(
            RANKS.c.data_parallel_rank, RANKS.c.recent_times_s, RANKS.c.recent_energies_j
        ).where(RANKS.c.job_id == job_id, RANKS.c.window_version == version)
        return [
            RankWindow(int(dp), tuple(times), tuple(energies))
            for dp, times, energies in self._conn.execute(query)
        ]

    def rank_layout(self, job_id: str) -> dict[int, tuple[int, int, int]]:
        """``rank -> (stage, data_parallel_rank, tensor_parallel_rank)`` of every rank."""
        query = select(
            RANKS.c.rank,
            RANKS.c.stage,
            RANKS.c.data_parallel_rank,
            RANKS.c.tensor_parallel_rank,
        ).where(RANKS.c.job_id == job_id)
        return {int(r): (int(s), int(d), int(t)) for r, s, d, t in self._conn.execute(query)}

    def rank_hosts(self, job_id: str) -> dict[int, tuple[int, int, str | None]]:
        """``rank -> (stage, data_parallel_rank, host)`` of every rank."""
        query = select(RANKS.c.rank, RANKS.c.stage, RANKS.c.data_parallel_rank, RANKS.c.host).where(
            RANKS.c.job_id == job_id
        )
        return {int(r): (int(s), int(d), h) for r, s, d, h in self._conn.execute(query)}

    def put_rank(self, row: RankRow, *, new: bool) -> None:
        """Insert a new rank (``new``) or replace an existing one."""
        values = rank_values(row)
        if new:
            self._conn.execute(insert(RANKS).values(values))
        else:
            self._conn.execute(
                update(RANKS)
                .where(RANKS.c.job_id == row.job_id, RANKS.c.rank == row.rank)
                .values(values)
            )

    # ranks that gave up

    def put_gave_up(self, job_id: str, rank: int, reason: str, at_s: float) -> None:
        """Record (or replace) why ``rank`` stopped planning."""
        where = (GAVE_UP.c.job_id == job_id, GAVE_UP.c.rank == rank)
        self._conn.execute(delete(GAVE_UP).where(*where))
        self._conn.execute(
            insert(GAVE_UP).values(job_id=job_id, rank=rank, reason=reason, at_s=at_s)
        )

    def gave_up(self, job_id: str) -> list[tuple[int, str, float]]:
        """``(rank, reason, at_s)`` of every rank that gave up, by rank."""
        query = (
            select(GAVE_UP.c.rank, GAVE_UP.c.reason, GAVE_UP.c.at_s)
            .where(GAVE_UP.c.job_id == job_id)
            .order_by(GAVE_UP.c.rank)
        )
        return [(int(r), str(why), float(t)) for r, why, t in self._conn.execute(query)]

    # measured clock-change latencies

    def raise_clock_latency(self, job_id: str, rank: int, latency_s: float) -> bool:
        """Keep ``latency_s`` as the rank's clock-change latency if it is larger than the one
        kept (or none is); whether it was."""
        result = self._conn.execute(
            update(RANKS)
            .where(
                RANKS.c.job_id == job_id,
                RANKS.c.rank == rank,
                or_(RANKS.c.clock_latency_s.is_(None), RANKS.c.clock_latency_s < latency_s),
            )
            .values(clock_latency_s=latency_s)
        )
        return bool(result.rowcount)

    def clock_latency(self, job_id: str) -> tuple[int, float] | None:
        """``(rank, latency_s)`` of the job's largest reported clock-change latency (the
        lowest such rank); None while no rank reported one."""
        query = (
            select(RANKS.c.rank, RANKS.c.clock_latency_s)
            .where(RANKS.c.job_id == job_id, RANKS.c.clock_latency_s.is_not(None))
            .order_by(RANKS.c.clock_latency_s.desc(), RANKS.c.rank)
            .limit(1)
        )
        found = self._conn.execute(query).first()
        return None if found is None else (int(found[0]), float(found[1]))

    # profiles

    def profiles_reported_since(self, job_id: str, since_s: float) -> int:
        """Profiles reported after ``since_s``."""
        query = (
            select(func.count())
            .select_from(PROFILES)
            .where(PROFILES.c.job_id == job_id, PROFILES.c.reported_at_s > since_s)
        )
        return int(self._conn.execute(query).scalar_one())

    def has_profile(self, job_id: str, rank: int) -> bool:
        query = select(PROFILES.c.rank).where(PROFILES.c.job_id == job_id, PROFILES.c.rank == rank)
        return self._conn.execute(query).first() is not None

    def profile_texts(self, job_id: str) -> list[tuple[int, int, str, float | None]]:
        """``(rank, stage, rows as JSON text, p_block_w)`` of every profile, undecoded."""
        query = (
            select(
                PROFILES.c.rank,
                PROFILES.c.stage,
                cast(PROFILES.c.rows, Text),
                PROFILES.c.p_block_w,
            )
            .where(PROFILES.c.job_id == job_id)
            .order_by(PROFILES.c.rank)
        )
        return [(int(r), int(s), str(text), p) for r, s, text, p in self._conn.execute(query)]

    def profiles(self, job_id: str) -> list[ProfileRecord]:
        query = (
            select(*PROFILE_COLUMNS).where(PROFILES.c.job_id == job_id).order_by(PROFILES.c.rank)
        )
        return [profile_record(found) for found in self._conn.execute(query)]

    def stage_profiles(self, job_id: str, stage: int) -> list[ProfileRecord]:
        """The profiles of one stage's ranks, by rank."""
        query = (
            select(*PROFILE_COLUMNS)
            .where(PROFILES.c.job_id == job_id, PROFILES.c.stage == stage)
            .order_by(PROFILES.c.rank)
        )
        return [profile_record(found) for found in self._conn.execute(query)]

    def profiled_coverage(self, job_id: str) -> set[tuple[int, int]]:
        """``(stage, tensor_parallel_rank)`` pairs with at least one profile."""
        query = (
            select(RANKS.c.stage, RANKS.c.tensor_parallel_rank)
            .join(
                PROFILES,
                and_(PROFILES.c.job_id == RANKS.c.job_id, PROFILES.c.rank == RANKS.c.rank),
            )
            .where(RANKS.c.job_id == job_id)
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
                insert(PROFILES).values(job_id=record.job_id, rank=record.rank, **values)
            )
        else:
            self._conn.execute(
                update(PROFILES)
                .where(PROFILES.c.job_id == record.job_id, PROFILES.c.rank == record.rank)
                .values(values)
            )

    # frontiers

    def frontier(self, job_id: str) -> FrontierRow | None:
        query = select(
            FRONTIERS.c.job_id, FRONTIERS.c.rev, FRONTIERS.c.data, FRONTIERS.c.profile
        ).where(FRONTIERS.c.job_id == job_id)
        found = self._conn.execute(query).first()
        return None if found is None else FrontierRow(*found)

    def put_frontier(self, row: FrontierRow) -> None:
        """Store the job's frontier, replacing an earlier one."""
        exists = self._conn.execute(
            select(FRONTIERS.c.rev).where(FRONTIERS.c.job_id == row.job_id)
        ).first()
        if exists is None:
            self._conn.execute(insert(FRONTIERS).values(dataclasses.asdict(row)))
        else:
            self._conn.execute(
                update(FRONTIERS)
                .where(FRONTIERS.c.job_id == row.job_id)
                .values(rev=row.rev, data=row.data, profile=row.profile)
            )

    # measured iterations by phase (the realized saving)

    def sample_buckets(
        self, job_id: str, ranks: Sequence[int], versions: Sequence[int]
    ) -> dict[tuple[int, str, int], SampleBucket]:
        """``(rank, phase, version) -> bucket`` of these ranks: their baseline and
        totals-only buckets, and their plan buckets of ``versions``."""
        query = select(SAMPLES.c.rank, *SAMPLE_COLUMNS).where(
            SAMPLES.c.job_id == job_id,
            SAMPLES.c.rank.in_(list(ranks)),
            or_(SAMPLES.c.phase != "plan", SAMPLES.c.version.in_(list(versions))),
        )
        found = (
            (int(values[0]), sample_bucket(values[1:])) for values in self._conn.execute(query)
        )
        return {(rank, b.phase, b.version): b for rank, b in found}

    def save_sample_buckets(
        self,
        job_id: str,
        buckets: Mapping[tuple[int, str, int], SampleBucket],
        new: Collection[tuple[int, str, int]],
    ) -> None:
        """Write buckets back: insert those in ``new``, update the others."""
        inserts = [
            {"job_id": job_id, "rank": key[0], **sample_values(b)}
            for key, b in buckets.items()
            if key in new
        ]
        updates = [
            {"rank_": key[0], "phase_": key[1], "version_": key[2], **sample_values(b)}
            for key, b in buckets.items()
            if key not in new
        ]
        if inserts:
            self._conn.execute(insert(SAMPLES), inserts)
        if updates:
            names = [n for n in SAMPLE_FIELDS if n not in ("phase", "version")]
            self._conn.execute(
                update(SAMPLES)
                .where(
                    SAMPLES.c.job_id == job_id,
                    SAMPLES.c.rank == bindparam("rank_"),
                    SAMPLES.c.phase == bindparam("phase_"),
                    SAMPLES.c.version == bindparam("version_"),
                )
                .values({name: bindparam(name) for name in names}),
                [{k: v for k, v in u.items() if k not in ("phase", "version")} for u in updates],
            )

    def compared_samples(self, job_id: str, version: int) -> list[tuple[int, SampleBucket]]:
        """``(rank, bucket)`` of every rank's baseline and plan ``version`` buckets."""
        query = select(SAMPLES.c.rank, *SAMPLE_COLUMNS).where(
            SAMPLES.c.job_id == job_id,
            or_(
                SAMPLES.c.phase == "baseline",
                and_(SAMPLES.c.phase == "plan", SAMPLES.c.version == version),
            ),
        )
        return [(int(v[0]), sample_bucket(v[1:])) for v in self._conn.execute(query)]

    def energy_totals(self, job_ids: Sequence[str] | None = None) -> dict[str, tuple[float, float]]:
        """``job id -> (energy of every reported iteration, energy saved)`` in joules, of
        these jobs (None: every job with samples)."""
        query = select(
            SAMPLES.c.job_id, func.sum(SAMPLES.c.energy_j_total), func.sum(SAMPLES.c.saved_j)
        ).group_by(SAMPLES.c.job_id)
        if job_ids is not None:
            query = query.where(SAMPLES.c.job_id.in_(list(job_ids)))
        return {
            str(job_id): (float(energy or 0.0), float(saved or 0.0))
            for job_id, energy, saved in self._conn.execute(query)
        }

    # the cluster's power budget (one row; a re-balance locks it before any job row)

    def budget(self) -> BudgetRow:
        """The cluster's budget (all None before one is first set), its row locked for the
        rest of a write transaction: re-balances take turns on it, across processes."""
        query = select(*BUDGET_COLUMNS).where(CLUSTER_BUDGET.c.id == 1)
        if self._locking:
            query = query.with_for_update()
        found = self._conn.execute(query).first()
        if found is None and self._locking:
            # Made by the schema revision (0004); a database whose tables were made some
            # other way gets it here.
            self._conn.execute(insert(CLUSTER_BUDGET).values(id=1))
            found = self._conn.execute(query).first()
        if found is None:
            return BudgetRow()
        return BudgetRow(**dict(zip(BUDGET_FIELDS, found, strict=True)))

    def save_budget(self, row: BudgetRow) -> None:
        """Write the budget back (after :meth:`budget` in this transaction)."""
        values = {name: getattr(row, name) for name in BUDGET_FIELDS}
        self._conn.execute(update(CLUSTER_BUDGET).where(CLUSTER_BUDGET.c.id == 1).values(values))

    def all_jobs(self) -> list[JobRow]:
        """Every job, by id, locked for the rest of a write transaction (a re-balance: the
        budget row is locked first, then the jobs in one order, so writers never deadlock)."""
        query = select(*JOB_COLUMNS).order_by(JOBS.c.id)
        if self._locking:
            query = query.with_for_update()
        rows = [job_row(found) for found in self._conn.execute(query)]
        self._read.update((row.id, row) for row in rows)
        return rows

    def power_windows(self) -> list[PowerWindow]:
        """Every rank's recent iterations, whatever plan version they ran under."""
        query = select(
            RANKS.c.job_id, RANKS.c.recent_times_s, RANKS.c.recent_energies_j, RANKS.c.seen_at_s
        ).where(RANKS.c.iterations > 0)
        return [
            PowerWindow(str(job_id), tuple(times), tuple(energies), seen)
            for job_id, times, energies, seen in self._conn.execute(query)
        ]
