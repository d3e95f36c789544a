"""Jobs and their ranks: creation, listing, deletion, the job view, rank registration.

A job goes ``registering`` (ranks announce themselves) -> ``profiling`` (every rank has
registered; profiles arrive) -> ``planning`` (the frontier is being computed in a worker
process) -> ``ready`` (plans are served); ``failed`` carries the reason. The steps after
registration live beside this module: :mod:`~perseus.server.lifecycle.lease` (profiles and the
planning lease), :mod:`~perseus.server.lifecycle.choices` (policy and stragglers),
:mod:`~perseus.server.lifecycle.telemetry` and :mod:`~perseus.server.planning.plans`;
:class:`JobService`
holds one of each.

All methods are synchronous and short; the web layer runs them in a thread. Each write is
one transaction that locks the job row, so several server processes sharing a database
agree on every transition, and a rejected request changes nothing stored.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Sequence

from perseus.core.errors import JobNotFound, JobStateError, RequestFieldError
from perseus.core.jobs import CREATED, JobState, transition
from perseus.schemas import (
    GaveUpAccepted,
    GaveUpReport,
    JobCounts,
    JobCreate,
    JobCreated,
    JobSummary,
    JobView,
    RankGaveUp,
    RankRegistered,
    RankRegistration,
)
from perseus.server.api.auth import hash_token, new_token
from perseus.server.lifecycle.budget import job_budget
from perseus.server.lifecycle.decisions import policy_to_solver
from perseus.server.lifecycle.quotas import QuotaExceeded, Quotas
from perseus.server.lifecycle.savings import BASELINE, PLAN, savings_view
from perseus.server.lifecycle.telemetry import telemetry_view
from perseus.server.planning.plans import FrontierCache, Plans
from perseus.server.store.job_store import JobRow, RankRow, Store, Transaction
from perseus.solver import make_schedule

__all__ = ["JobPart", "Jobs", "RequestFieldError", "existing", "stages_profiled"]

log = logging.getLogger("perseus.server")


RANK_LIVE_S = 120.0
"""A registered rank heard from (registration, iteration report) within this long is live:
another process registering the same rank meanwhile is refused (409). Past it the first is
taken for dead (a restart) and the new registration replaces it."""


def existing(tx: Transaction, job_id: str) -> JobRow:
    """The job (locked in a write transaction).

    Raises:
        JobNotFound: no such job.
    """
    job = tx.job(job_id)
    if job is None:
        raise JobNotFound(f"no job {job_id!r}")
    return job


def stages_profiled(spec: JobCreate, coverage: set[tuple[int, int]]) -> list[bool]:
    """Per stage: whether every tensor-parallel rank of it has reported a profile."""
    return [
        all((stage, tp) in coverage for tp in range(spec.tensor_parallel))
        for stage in range(spec.stages)
    ]


class JobPart:
    """What the parts of the job service that read and change jobs hold.

    Args:
        store: the job store.
        frontiers: parsed frontiers.
        plans: rendered plans.
        clock: wall clock in seconds (tests pass a fake one).
        quotas: the limits on jobs and what they hold (none by default).
    """

    def __init__(
        self,
        store: Store,
        frontiers: FrontierCache,
        plans: Plans,
        *,
        clock: Callable[[], float] = time.time,
        quotas: Quotas | None = None,
    ) -> None:
        self._store = store
        self._frontiers = frontiers
        self._plans = plans
        self._clock = clock
        self._quotas = quotas or Quotas()


class Jobs(JobPart):
    """Job CRUD and rank registration over a :class:`Store` (the job view shows the chosen
    point; a job's rendered plans are dropped with it)."""

    def create(self, spec: JobCreate) -> tuple[JobCreated, JobRow]:
        """Create a job; its token is returned once and stored only hashed.

        Raises:
            ScheduleError: the schedule cannot be built from these sizes.
            PolicyError: the policy's parameter is invalid.
            RequestFieldError: more ranks than ``max_ranks_per_job``.
            QuotaExceeded: the server holds ``max_jobs`` jobs.
        """
        most_ranks = self._quotas.max_ranks_per_job
        if most_ranks is not None and spec.world_size > most_ranks:
            raise RequestFieldError(
                ("body",),
                f"{spec.world_size} ranks (stages x data_parallel x tensor_parallel) is more "
                f"than this server takes per job, {most_ranks} (setting max_ranks_per_job)",
            )
        make_schedule(spec.schedule, spec.stages, spec.microbatches, spec.virtual_stages)
        policy_to_solver(spec.policy)
        token = new_token()
        now_s = self._clock()
        row = JobRow(
            id=uuid.uuid4().hex,
            name=spec.name,
            token_hash=hash_token(token),
            created_at_s=now_s,
            updated_at_s=now_s,
            spec=spec,
            state=CREATED,
            reason=None,
            policy=spec.policy,
            straggler=None,
            version=0,
            frontier_rev=0,
            policy_index=None,
            chosen_index=None,
            ranks_registered=0,
            profiles_reported=0,
            iterations_reported=0,
            planning_owner=None,
            planning_heartbeat_s=None,
            planning_s=None,
            priority=spec.priority,
        )
        with self._store.write() as tx:
            most_jobs = self._quotas.max_jobs
            if most_jobs is not None and tx.count_jobs() >= most_jobs:
                raise QuotaExceeded(
                    f"the server holds {most_jobs} jobs, its limit (setting max_jobs): "
                    "delete finished jobs first"
                )
            tx.insert_job(row)
        return JobCreated(job_id=row.id, token=token), row

    def get(self, job_id: str) -> JobRow:
        """The stored job.

        Raises:
            JobNotFound: no such job.
        """
        with self._store.read() as tx:
            return existing(tx, job_id)

    def list(self, limit: int, offset: int, *, newest_first: bool = False) -> list[JobSummary]:
        """Jobs oldest first (or newest first), ``limit`` of them from ``offset``."""
        with self._store.read() as tx:
            rows = tx.list_jobs(limit, offset, newest_first=newest_first)
        return [
            JobSummary(
                job_id=r.id,
                name=r.name,
                state=r.state,
                version=r.version,
                created_at_s=r.created_at_s,
            )
            for r in rows
        ]

    def count(self) -> int:
        """How many jobs the store holds."""
        with self._store.read() as tx:
            return tx.count_jobs()

    def planned_ids(self) -> tuple[str, ...]:
        """Every job planned at least once (a plan version above 0), oldest first."""
        with self._store.read() as tx:
            return tuple(tx.planned_job_ids())

    def count_by_state(self) -> dict[str, int]:
        with self._store.read() as tx:
            return tx.count_jobs_by_state()

    def energy_totals(self) -> dict[str, tuple[float, float]]:
        """``job id -> (energy reported, energy saved)`` in joules, of every job with
        reports since samples were kept (for ``/metrics``)."""
        with self._store.read() as tx:
            return tx.energy_totals()

    def delete(self, job_id: str) -> None:
        """Delete a job and everything under it.

        Raises:
            JobNotFound: no such job.
        """
        with self._store.write() as tx:
            if not tx.delete_job(job_id):
                raise JobNotFound(f"no job {job_id!r}")
        self._frontiers.forget(job_id)
        self._plans.forget(job_id)

    def view(self, job_id: str) -> JobView:
        """Everything about a job: state, counts, policy, the chosen point, telemetry, the
        saving measured against the one predicted.

        Raises:
            JobNotFound: no such job.
        """
        with self._store.read() as tx:
            job = existing(tx, job_id)
            reported = bool(job.iterations_reported)
            windows = tx.windows(job_id, job.version) if reported else []
            samples = tx.compared_samples(job_id, job.version) if reported else []
            totals = tx.energy_totals([job_id]).get(job_id, (0.0, 0.0)) if reported else None
            coverage = tx.profiled_coverage(job_id)
            ranks = tx.ranks(job_id) if reported else []
            gave_up = tx.gave_up(job_id)
            since = job.planned_from_s
            newer = None if since is None else tx.profiles_reported_since(job_id, since)
            reported_w = (
                []
                if job.spec.p_block_w is not None
                else [w for *_, w in tx.profile_texts(job_id) if w is not None]
            )
        spec = job.spec
        frontier = self._frontiers.of(job)
        chosen = self._plans.chosen(job, frontier)
        spans = (
            None
            if chosen is None or totals is None
            else self._frontiers.spans(job.id, job.frontier_rev, chosen.index)
        )
        return JobView(
            job_id=job.id,
            name=job.name,
            state=job.state,
            reason=job.reason,
            spec=spec,
            policy=job.policy,
            straggler=job.straggler,
            version=job.version,
            counts=JobCounts(
                ranks_expected=spec.world_size,
                ranks_registered=job.ranks_registered,
                profiles_reported=job.profiles_reported,
                stages_profiled=sum(stages_profiled(spec, coverage)),
                iterations_reported=job.iterations_reported,
                iterations=max((r.iterations for r in ranks), default=0),
            ),
            frontier_points=None if frontier is None else len(frontier),
            planning_s=job.planning_s,
            chosen=chosen,
            telemetry=telemetry_view(job, windows, frontier, chosen),
            savings=None
            if totals is None
            else savings_view(
                job.version,
                {rank: b for rank, b in samples if b.phase == BASELINE},
                {rank: b for rank, b in samples if b.phase == PLAN},
                totals,
                frontier,
                chosen,
                spans,
            ),
            p_block_w=frontier.p_block_w
            if frontier is not None
            else stage_p_block_w(spec.p_block_w, reported_w, spec.tensor_parallel),
            planned_from_s=since,
            profiles_since_plan=newer,
            gave_up=[RankGaveUp(rank=r, reason=why, at_s=t) for r, why, t in gave_up],
            priority=job.priority,
            budget=job_budget(job, frontier),
        )

    def rank_gave_up(self, job_id: str, report: GaveUpReport) -> GaveUpAccepted:
        """Record that a rank stopped planning (the latest reason of each rank is kept).

        Raises:
            JobNotFound: no such job.
            RequestFieldError: the rank is outside the job.
        """
        with self._store.write() as tx:
            job = existing(tx, job_id)
            if report.rank >= job.spec.world_size:
                raise RequestFieldError(
                    ("body", "rank"),
                    f"{report.rank} is out of range 0..{job.spec.world_size - 1} for this job",
                )
            now_s = self._clock()
            tx.put_gave_up(job_id, report.rank, report.reason, now_s)
        log.warning("job %s: rank %d gave up: %r", job_id, report.rank, report.reason[:200])
        return GaveUpAccepted(rank=report.rank, at_s=now_s)

    def register_rank(
        self, job_id: str, reg: RankRegistration, host: str | None = None
    ) -> tuple[RankRegistered, JobRow]:
        """Register a rank, or re-register it (a restarted rank) with the same coordinates.

        Args:
            job_id: the job.
            reg: the registration.
            host: the address the registration came from (reports from elsewhere are
                logged).

        Raises:
            JobNotFound: no such job.
            RequestFieldError: a coordinate is outside the job's layout.
            JobStateError: the rank or its coordinates are taken by another registration.
        """
        with self._store.write() as tx:
            job = existing(tx, job_id)
            spec = job.spec
            for field, value, bound in (
                ("rank", reg.rank, spec.world_size),
                ("stage", reg.stage, spec.stages),
                ("data_parallel_rank", reg.data_parallel_rank, spec.data_parallel),
                ("tensor_parallel_rank", reg.tensor_parallel_rank, spec.tensor_parallel),
            ):
                if value >= bound:
                    raise RequestFieldError(
                        ("body", field), f"{value} is out of range 0..{bound - 1} for this job"
                    )
            coords = (reg.stage, reg.data_parallel_rank, reg.tensor_parallel_rank)
            holder = tx.rank_at(job_id, *coords)
            if holder is not None and holder.rank != reg.rank:
                raise JobStateError(
                    f"rank {holder.rank} already registered as stage {coords[0]}, data-parallel "
                    f"rank {coords[1]}, tensor-parallel rank {coords[2]}"
                )
            known = tx.rank(job_id, reg.rank)
            if known is not None and known.coordinates != coords:
                raise JobStateError(
                    f"rank {reg.rank} is registered as stage {known.stage}, data-parallel rank "
                    f"{known.data_parallel_rank}, tensor-parallel rank "
                    f"{known.tensor_parallel_rank}"
                )
            now_s = self._clock()
            if (
                known is not None
                and reg.instance is not None
                and known.instance is not None
                and known.instance != reg.instance
            ):
                heard_s = max(known.seen_at_s or 0.0, known.registered_at_s)
                quiet_s = now_s - heard_s
                if quiet_s < RANK_LIVE_S:
                    raise JobStateError(
                        f"rank {reg.rank} is registered by another live process (from "
                        f"{known.host or 'an unknown host'}, heard from {quiet_s:.0f} s ago): "
                        "two processes share one rank (check RANK/PERSEUS_RANK); a restart "
                        f"is accepted once the first has been quiet for {RANK_LIVE_S:.0f} s"
                    )
                log.warning(
                    "job %s: rank %d registered by a new process; the first was quiet for "
                    "%.0f s (a restart)",
                    job_id,
                    reg.rank,
                    quiet_s,
                )
            if known is None:
                tx.put_rank(
                    RankRow(
                        job_id=job_id,
                        rank=reg.rank,
                        stage=reg.stage,
                        data_parallel_rank=reg.data_parallel_rank,
                        tensor_parallel_rank=reg.tensor_parallel_rank,
                        gpu_name=reg.gpu_name,
                        supported_clocks_mhz=tuple(reg.supported_clocks_mhz),
                        registered_at_s=now_s,
                        host=host,
                        instance=reg.instance,
                        seen_at_s=now_s,
                    ),
                    new=True,
                )
                registered = job.ranks_registered + 1
                job = dataclasses.replace(job, ranks_registered=registered, updated_at_s=now_s)
                if job.state == JobState.REGISTERING and registered == spec.world_size:
                    job = dataclasses.replace(job, state=transition(job.state, JobState.PROFILING))
                tx.save_job(job)
            else:
                clocks = tuple(reg.supported_clocks_mhz)
                if known.host != host or known.supported_clocks_mhz != clocks:
                    # A restart on another node is legitimate; two live processes with one
                    # rank are not, and the second would silently replace the first's clocks.
                    log.warning(
                        "job %s: rank %d registered again from %s (first from %s)%s: two "
                        "processes with one rank, or a restart on another host?",
                        job_id,
                        reg.rank,
                        host,
                        known.host,
                        ", with another clock list" if known.supported_clocks_mhz != clocks else "",
                    )
                tx.put_rank(
                    dataclasses.replace(
                        known,
                        gpu_name=reg.gpu_name,
                        supported_clocks_mhz=tuple(reg.supported_clocks_mhz),
                        host=host,
                        instance=reg.instance,
                        seen_at_s=now_s,
                    ),
                    new=False,
                )
        reply = RankRegistered(
            rank=reg.rank, state=job.state, ranks_registered=job.ranks_registered
        )
        return reply, job

    def heads(self, job_ids: Sequence[str]) -> dict[str, tuple[int, JobState]]:
        """``job id -> (version, state)`` of these jobs (those that still exist)."""
        with self._store.read() as tx:
            return tx.job_heads(job_ids)

    def ranks(self, job_id: str) -> Sequence[RankRow]:
        """Every registered rank of the job, by rank."""
        with self._store.read() as tx:
            return sorted(tx.ranks(job_id), key=lambda r: r.rank)

    def rank_layout(self, job_id: str) -> dict[int, tuple[int, int, str | None]]:
        """``rank -> (stage, data_parallel_rank, host)`` of every registered rank."""
        with self._store.read() as tx:
            return tx.rank_hosts(job_id)


def stage_p_block_w(
    p_block_w: float | None, reported_w: Sequence[float], tensor_parallel: int
) -> float | None:
    """Blocking power of one stage before planning, as planning will take it: the job's per
    GPU, else the mean the ranks reported, times the tensor-parallel size; None without
    either."""
    if p_block_w is not None:
        return p_block_w * tensor_parallel
    if not reported_w:
        return None
    return sum(reported_w) / len(reported_w) * tensor_parallel
