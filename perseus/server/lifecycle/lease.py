"""Profiles and the planning lease: who computes a job's frontier, and storing it.

The last missing profile claims the job's planning for this process (or a request does,
once every stage has a profile from each of its tensor-parallel ranks); so does a profile
re-reported to a failed job, whose planning runs again on it. A stage is planned on the
clocks every one of its ranks measured: a profile that would leave its stage no common clock,
or pin it to one clock while its ranks measured several (a rank without clock rights measures
only its default clock), is refused at upload, naming the ranks. The claim is a
lease: the owner renews a heartbeat while it computes, and another process takes over a
job whose heartbeat went stale (a crashed or restarted server). Only the owner may store
the frontier or fail the job; a frontier comes with the choice of point, a new plan
version.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence

from perseus.core.errors import InfeasibleDeadline, JobStateError, ProfileError
from perseus.core.jobs import JobState, transition
from perseus.formats.plan_files import frontier_from_json
from perseus.schemas import (
    ClockLatencyAccepted,
    ClockLatencyReport,
    ProfileAccepted,
    ProfileReport,
)
from perseus.server.lifecycle.decisions import choose, delay_outgrown
from perseus.server.lifecycle.jobs import RequestFieldError, existing, stages_profiled
from perseus.server.lifecycle.quotas import QuotaExceeded, Quotas
from perseus.server.planning.plans import FrontierCache
from perseus.server.planning.worker import (
    PlanningInput,
    StoredProfile,
    check_planning_work,
    instruction_times,
    merged_profile,
)
from perseus.server.store.job_store import FrontierRow, JobRow, ProfileRecord, Store
from perseus.solver import Frontier, Profile, profile_from_rows, profile_to_json

log = logging.getLogger("perseus.server")

__all__ = ["PlanningLease", "check_stage_clocks", "planned_profile"]

ProfileRows = Sequence[tuple[str, int, float, float]]


def _clocks(rows: ProfileRows) -> dict[str, set[int]]:
    by_name: dict[str, set[int]] = {}
    for name, frequency_mhz, _, _ in rows:
        by_name.setdefault(name, set()).add(frequency_mhz)
    return by_name


def _shown(clocks: set[int]) -> str:
    if len(clocks) == 1:
        return f"{next(iter(clocks))} MHz"
    return f"{len(clocks)} clocks, {min(clocks)}-{max(clocks)} MHz"


def check_stage_clocks(
    rank: int, stage: int, rows: ProfileRows, others: Sequence[tuple[int, ProfileRows]]
) -> None:
    """Refuse a profile its stage could not be planned with, beside the stage's others.

    A stage is planned on the clocks all its ranks measured, per instruction. The profile
    is refused when that leaves an instruction no clock (replicas that measured disjoint
    clocks: planning would fail), or one clock while some rank measured several (a rank
    that cannot set clocks measures only its default one: the whole stage would be pinned
    to it, silently).

    Args:
        rank: the reporting rank.
        stage: its stage.
        rows: its rows ``(instruction, frequency_mhz, time_s, energy_j)``.
        others: ``(rank, rows)`` of the stage's other ranks that reported.

    Raises:
        RequestFieldError: the profile conflicts with the stage's (422, at ``body.rows``).

    Complexity: O(rows of the stage).
    """
    mine = _clocks(rows)
    theirs = [(other, _clocks(other_rows)) for other, other_rows in others if other != rank]
    for name, clocks in sorted(mine.items()):
        measured = [(other, by_name[name]) for other, by_name in theirs if name in by_name]
        if not measured:
            continue
        common = clocks.intersection(*(c for _, c in measured))
        ranks = ", ".join(str(other) for other, _ in measured[:8])
        if not common:
            raise RequestFieldError(
                ("body", "rows"),
                f"rank {rank} measured {name} at {_shown(clocks)}, and stage {stage}'s ranks "
                f"{ranks} share none of them ({_shown(set().union(*(c for _, c in measured)))}):"
                " a stage is planned on the clocks all its ranks measured; profile its ranks "
                "over the same clocks",
            )
        most = max(len(clocks), *(len(c) for _, c in measured))
        if len(common) == 1 and most > 1:
            narrow = [other for other, c in measured if len(c) == 1]
            who = (
                f"rank {rank} (this profile) measured {name} only at {_shown(common)}"
                if len(clocks) == 1
                else f"stage {stage}'s rank {', '.join(map(str, narrow[:8]))} measured {name} "
                f"only at {_shown(common)}"
            )
            raise RequestFieldError(
                ("body", "rows"),
                f"{who} while its stage's ranks measured up to {most} clocks: the whole stage "
                "would be pinned to that clock. A rank that cannot set clocks (no clock "
                "rights) measures only its default one: give it clock control and profile "
                "it again (its new profile replaces the old one)",
            )


def planned_profile(planning: PlanningInput) -> Profile | None:
    """The profile a frontier was computed from (every stage's ranks combined), or None
    when it cannot be rebuilt (planning read the same input, so this is not expected)."""
    try:
        return merged_profile(planning)
    except ProfileError:
        return None


class PlanningLease:
    """Profiles in, frontiers out, and the lease on each job's planning.

    Args:
        store: the job store.
        frontiers: where a computed frontier is remembered.
        owner: this process's identity in planning claims.
        clock: wall clock in seconds (tests pass a fake one).
        max_cells: the most planning work a job may imply
            (:func:`perseus.server.planning.worker.check_planning_work`); None: no limit.
        quotas: rows per profile and profile bytes per job (none by default).
    """

    def __init__(
        self,
        store: Store,
        frontiers: FrontierCache,
        *,
        owner: str | None = None,
        clock: Callable[[], float] = time.time,
        max_cells: int | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        self._quotas = quotas or Quotas()
        self._store = store
        self._frontiers = frontiers
        self.owner = owner or uuid.uuid4().hex
        self._clock = clock
        self._max_cells = max_cells

    def _owns(self, job: JobRow | None) -> bool:
        return (
            job is not None and job.state == JobState.PLANNING and job.planning_owner == self.owner
        )

    def _claimed(self, job: JobRow, now_s: float) -> JobRow:
        return dataclasses.replace(
            job,
            state=transition(job.state, JobState.PLANNING),
            reason=None,
            planning_owner=self.owner,
            planning_heartbeat_s=now_s,
            planned_from_s=now_s,
            updated_at_s=now_s,
        )

    def add_profile(
        self, job_id: str, report: ProfileReport
    ) -> tuple[ProfileAccepted, JobRow, bool]:
        """Store a rank's profile; the last missing one claims the job's planning, as does
        any one to a failed job with every profile in.

        Returns:
            The reply, the job, and whether this call claimed the job's planning (the
            caller must then run it).

        Raises:
            JobNotFound: no such job.
            JobStateError: the rank has not registered.
            RequestFieldError, ProfileError: the rows are unusable, or leave their stage no
                clock, or one (:func:`check_stage_clocks`).
            PlanningTooLarge: planning the job would be over the work limit (judged from
                this profile: the whole job's estimate is never smaller).
        """
        rows = tuple((r.instruction, r.frequency_mhz, r.time_s, r.energy_j) for r in report.rows)
        most_rows = self._quotas.max_profile_rows
        if most_rows is not None and len(rows) > most_rows:
            raise RequestFieldError(
                ("body", "rows"),
                f"{len(rows)} rows is more than this server takes per profile, {most_rows} "
                "(setting max_profile_rows)",
            )
        size = len(json.dumps([list(row) for row in rows]))
        # The solver's own checks (duplicates, both instructions present), on this stage alone.
        profile_from_rows(((0, *row) for row in rows), source="request")
        with self._store.write() as tx:
            job = existing(tx, job_id)
            rank = tx.rank(job_id, report.rank)
            if rank is None:
                raise JobStateError(f"rank {report.rank} has not registered")
            if report.stage != rank.stage:
                raise RequestFieldError(
                    ("body", "stage"), f"rank {rank.rank} is registered for stage {rank.stage}"
                )
            clocks = set(rank.supported_clocks_mhz)
            for i, row in enumerate(rows):
                if row[1] not in clocks:
                    raise RequestFieldError(
                        ("body", "rows", i, "frequency_mhz"),
                        f"{row[1]} MHz is not among rank {rank.rank}'s supported clocks",
                    )
            most_bytes = self._quotas.max_job_profile_bytes
            if most_bytes is not None:
                total = tx.profile_bytes(job_id, report.rank) + size
                if total > most_bytes:
                    raise QuotaExceeded(
                        f"the job's profiles would take {total} bytes, more than this server "
                        f"keeps per job, {most_bytes} (setting max_job_profile_bytes)"
                    )
            others = tx.stage_profiles(job_id, report.stage)
            check_stage_clocks(report.rank, report.stage, rows, [(p.rank, p.rows) for p in others])
            if self._max_cells is not None:
                check_planning_work(
                    stages=job.spec.stages,
                    microbatches=job.spec.microbatches,
                    virtual_stages=job.spec.virtual_stages,
                    times=instruction_times(report.stage, rows),
                    resolution_s=job.spec.resolution_s,
                    max_cells=self._max_cells,
                    schedule=job.spec.schedule,
                )
            now_s = self._clock()
            is_new = not tx.has_profile(job_id, report.rank)
            tx.put_profile(
                ProfileRecord(job_id, report.rank, report.stage, rows, report.p_block_w, now_s),
                new=is_new,
            )
            job = dataclasses.replace(
                job, profiles_reported=job.profiles_reported + int(is_new), updated_at_s=now_s
            )
            # A failed job replans on a profile re-reported to it (a corrected one); a ready
            # one once every rank re-reported since its plan (a re-run of the training).
            claimed = job.state in (JobState.REGISTERING, JobState.PROFILING, JobState.FAILED) and (
                job.profiles_reported == job.spec.world_size
            )
            if job.state == JobState.READY and job.planned_from_s is not None:
                newer = tx.profiles_reported_since(job_id, job.planned_from_s)
                claimed = newer == job.spec.world_size
                if claimed:
                    log.info("job %s: every rank re-reported its profile: replanning", job_id)
            if claimed:
                job = self._claimed(job, now_s)
            tx.save_job(job)
        reply = ProfileAccepted(
            rank=report.rank,
            state=job.state,
            profiles_reported=job.profiles_reported,
            planning=claimed,
        )
        return reply, job, claimed

    def claim_planning(self, job_id: str) -> JobRow:
        """Start (or restart) planning on request.

        Raises:
            JobNotFound: no such job.
            JobStateError: planning is already running, or a stage lacks profiles.
        """
        with self._store.write() as tx:
            job = existing(tx, job_id)
            if job.state == JobState.PLANNING:
                raise JobStateError(f"job {job_id} is already planning")
            profiled = stages_profiled(job.spec, tx.profiled_coverage(job_id))
            missing = [stage for stage, done in enumerate(profiled) if not done]
            if missing:
                shown = ", ".join(str(s) for s in missing[:16])
                raise JobStateError(
                    f"stages {shown}{' ...' if len(missing) > 16 else ''} lack a profile "
                    "from some tensor-parallel rank"
                )
            job = self._claimed(job, self._clock())
            tx.save_job(job)
        return job

    def add_clock_latency(
        self, job_id: str, report: ClockLatencyReport
    ) -> tuple[ClockLatencyAccepted, JobRow | None]:
        """Keep a rank's measured clock-change latency (each rank's largest); plan the job
        again if its frontier was planned for a materially shorter delay.

        Returns:
            The reply, and the job if this call claimed its planning (the caller must then
            run it), else None.

        Raises:
            JobNotFound: no such job.
            JobStateError: the rank has not registered.
        """
        with self._store.write() as tx:
            existing(tx, job_id)
            if tx.rank(job_id, report.rank) is None:
                raise JobStateError(f"rank {report.rank} has not registered")
            if tx.raise_clock_latency(job_id, report.rank, report.clock_change_latency_s):
                log.info(
                    "job %s: rank %d measured a clock-change latency of %.1f ms",
                    job_id,
                    report.rank,
                    1e3 * report.clock_change_latency_s,
                )
            measured = tx.clock_latency(job_id)
        claimed = self.claim_outgrown_delay(job_id)
        delay_s = report.clock_change_latency_s if measured is None else measured[1]
        reply = ClockLatencyAccepted(
            rank=report.rank, clock_change_delay_s=delay_s, planning=claimed is not None
        )
        return reply, claimed

    def claim_outgrown_delay(self, job_id: str) -> JobRow | None:
        """Claim a ready job's planning when its ranks reported a clock-change latency
        materially above the delay its frontier was planned for
        (:func:`~perseus.server.lifecycle.decisions.delay_outgrown`).

        Returns:
            The job, claimed (the caller must run its planning), or None: nothing to do (no
            latency reported, not outgrown, not ready, deleted, or claimed meanwhile).
        """
        with self._store.read() as tx:
            job = tx.job(job_id)
            measured = tx.clock_latency(job_id)
        if job is None or measured is None or job.state != JobState.READY:
            return None
        planned_s = self._frontiers.get(job_id, job.frontier_rev).clock_change_delay_s
        if not delay_outgrown(planned_s, measured[1]):
            return None
        with self._store.write() as tx:
            now = tx.job(job_id)
            if now is None or now.state != JobState.READY or now.frontier_rev != job.frontier_rev:
                return None
            claimed = self._claimed(now, self._clock())
            tx.save_job(claimed)
        log.info(
            "job %s: rank %d measured a clock-change latency of %.1f ms, the frontier was "
            "planned for %.1f ms: replanning",
            job_id,
            measured[0],
            1e3 * measured[1],
            1e3 * planned_s,
        )
        return claimed

    def reclaim_stale(self, lease_s: float) -> list[JobRow]:
        """Take over planning jobs whose owner stopped sending heartbeats."""
        now_s = self._clock()
        with self._store.read() as tx:
            stale = tx.stale_planning_jobs(now_s - lease_s)
        claimed = []
        for job_id in stale:
            with self._store.write() as tx:
                job = tx.job(job_id)
                if job is None or job.state != JobState.PLANNING:
                    continue
                if (
                    job.planning_heartbeat_s is not None
                    and job.planning_heartbeat_s >= now_s - lease_s
                ):
                    continue
                job = self._claimed(job, now_s)
                tx.save_job(job)
            claimed.append(job)
        return claimed

    def heartbeat(self, job_ids: Sequence[str]) -> None:
        """Tell other processes this one still computes these jobs."""
        with self._store.write() as tx:
            tx.heartbeat(self.owner, job_ids, self._clock())

    def lost(self, job_ids: Sequence[str]) -> list[str]:
        """Those of ``job_ids`` that were deleted, or whose planning another process took
        over: their runs here would store nothing."""
        lost = []
        with self._store.read() as tx:
            for job_id in job_ids:
                job = tx.job(job_id)
                if job is None or (
                    job.state == JobState.PLANNING and job.planning_owner != self.owner
                ):
                    lost.append(job_id)
        return lost

    def planning_input(self, job_id: str) -> PlanningInput:
        """Everything a worker process needs to compute the job's frontier.

        Read after the claim, outside its transaction: loading every profile takes a while
        and must not hold the job's lock.

        Raises:
            JobNotFound: no such job.
        """
        with self._store.read() as tx:
            job = existing(tx, job_id)
            layout = tx.rank_layout(job_id)
            texts = tx.profile_texts(job_id)
            measured = tx.clock_latency(job_id)
        spec = job.spec
        profiles = tuple(
            StoredProfile(stage, layout[rank][1], layout[rank][2], rows_json, p_block_w)
            for rank, stage, rows_json, p_block_w in texts
            if rank in layout
        )
        return PlanningInput(
            job_id=job.id,
            schedule=spec.schedule,
            stages=spec.stages,
            microbatches=spec.microbatches,
            virtual_stages=spec.virtual_stages,
            tensor_parallel=spec.tensor_parallel,
            p_block_w=spec.p_block_w,
            resolution_s=spec.resolution_s,
            profiles=profiles,
            measured_delay=measured,
        )

    def finish_planning(
        self,
        job_id: str,
        frontier_json: str,
        planning_s: float,
        frontier: Frontier | None = None,
        planning: PlanningInput | None = None,
    ) -> JobRow | None:
        """Store a computed frontier and choose the plan; a new plan version.

        ``planning``, the input the frontier was computed from, gives the profile stored
        beside it: plans take their instructions' expected times from it.

        Returns:
            The job, or None when this process no longer owns the job's planning (it was
            deleted, or taken over after a missed heartbeat).

        Raises:
            PlanError: the frontier JSON is invalid.
        """
        with self._store.read() as tx:
            if not self._owns(tx.job(job_id)):
                return None
        if frontier is None:
            frontier = frontier_from_json(frontier_json)  # outside the lock
        profile = None if planning is None else planned_profile(planning)
        profile_json = None if profile is None else json.dumps(profile_to_json(profile))
        with self._store.write() as tx:
            job = tx.job(job_id)
            if job is None or not self._owns(job):
                return None
            rev = job.frontier_rev + 1
            tx.put_frontier(FrontierRow(job_id, rev, frontier_json, profile_json))
            job = dataclasses.replace(
                job,
                frontier_rev=rev,
                version=job.version + 1,
                planning_owner=None,
                planning_heartbeat_s=None,
                planning_s=planning_s,
                updated_at_s=self._clock(),
                # Whose measured latency the runner planned for (it does whenever one is in).
                clock_delay_rank=(
                    None
                    if planning is None or planning.measured_delay is None
                    else planning.measured_delay[0]
                ),
            )
            try:
                choice = choose(frontier, job.policy, job.straggler)
            except InfeasibleDeadline as exc:
                job = dataclasses.replace(
                    job,
                    state=transition(job.state, JobState.FAILED),
                    reason=f"policy: {exc}",
                    policy_index=None,
                    chosen_index=None,
                    budget_index=None,
                )
            else:
                job = dataclasses.replace(
                    job,
                    state=transition(job.state, JobState.READY),
                    reason=None,
                    policy_index=choice.policy_index,
                    chosen_index=choice.chosen_index,
                    # A new frontier's points are others: the cluster budget, if any, places
                    # the job again once it is stored (ClusterBudget.rebalance).
                    budget_index=None,
                )
            tx.save_job(job)
        self._frontiers.put(job_id, rev, frontier, profile)
        return job

    def fail_planning(self, job_id: str, reason: str) -> JobRow | None:
        """Mark the job failed with ``reason`` if this process still owns its planning."""
        with self._store.write() as tx:
            job = tx.job(job_id)
            if job is None or not self._owns(job):
                return None
            job = dataclasses.replace(
                job,
                state=transition(job.state, JobState.FAILED),
                reason=reason,
                planning_owner=None,
                planning_heartbeat_s=None,
                updated_at_s=self._clock(),
            )
            tx.save_job(job)
        return job
