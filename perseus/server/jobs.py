"""Planning jobs: the server's business logic (no web framework here).

A job goes ``registering`` (ranks announce themselves) -> ``profiling`` (every rank has
registered; profiles arrive) -> ``planning`` (the frontier is being computed in a worker
process) -> ``ready`` (plans are served); ``failed`` carries the reason. Profiles may
arrive before every rank has registered. Planning starts by itself once every rank has
reported a profile, or on request once every stage has a profile from each of its
tensor-parallel ranks.

Every change of what the ranks should run (a new frontier, policy or straggler) makes a
new plan version; ranks fetch their plan by version (the ETag).

All methods are synchronous and short; the web layer runs them in a thread. Each write is
one transaction that locks the job row, so several server processes sharing a database
agree on every transition, and a rejected request changes nothing stored.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from pydantic import TypeAdapter

from perseus.errors import (
    InfeasibleDeadline,
    JobNotFound,
    JobStateError,
    PerseusError,
    PlanError,
    PlanNotReady,
)
from perseus.schemas import Baseline as BaselineModel
from perseus.schemas import (
    ChosenPoint,
    DeadlinePolicy,
    FrontierPoint,
    FrontierView,
    IterationReport,
    JobCounts,
    JobCreate,
    JobCreated,
    JobState,
    JobSummary,
    JobView,
    MaxSlowdownPolicy,
    MinEnergyPolicy,
    NoSlowdownPolicy,
    PlanVersion,
    PolicySpec,
    ProfileAccepted,
    ProfileReport,
    RankRegistered,
    RankRegistration,
    ReplicaTelemetry,
    StragglerSpec,
    StragglerView,
    Telemetry,
    ZeusCostPolicy,
)
from perseus.server.auth import hash_token, new_token
from perseus.server.planning import PlanningInput, StoredProfile
from perseus.server.store import (
    FrontierRow,
    IterationWindow,
    JobRow,
    ProfileRecord,
    RankRow,
    RankWindow,
    Store,
    Transaction,
)
from perseus.solver import (
    Frontier,
    Policy,
    choose_point,
    make_schedule,
    profile_from_rows,
    straggler_point,
)

__all__ = [
    "JobService",
    "RequestFieldError",
    "policy_to_solver",
]

PolicyModel = (
    NoSlowdownPolicy | MaxSlowdownPolicy | DeadlinePolicy | MinEnergyPolicy | ZeusCostPolicy
)
_POLICY_ADAPTER: TypeAdapter[PolicyModel] = TypeAdapter(PolicySpec)

# A replica's recent iteration times must differ from the current automatic straggler's
# slowdown by this much before the plans move again; keeps noise from minting versions.
_AUTO_SLOWDOWN_TOLERANCE = 0.02

# Marks an argument the caller did not give (None is a meaningful value: "no straggler").
_KEEP: Any = object()


class RequestFieldError(PerseusError):
    """A request field is invalid for this job (422), with its path like pydantic's ``loc``."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(f"{'.'.join(str(p) for p in loc)}: {message}")
        self.loc = loc
        self.message = message


def _state(job: JobRow) -> JobState:
    return cast(JobState, job.state)


def policy_to_solver(spec: PolicyModel) -> Policy:
    """The solver's policy for a wire policy.

    Raises:
        PolicyError: the solver rejects the parameter.
    """
    if isinstance(spec, MaxSlowdownPolicy):
        return Policy(spec.kind, spec.factor)
    if isinstance(spec, DeadlinePolicy):
        return Policy(spec.kind, spec.seconds)
    if isinstance(spec, ZeusCostPolicy):
        return Policy(spec.kind, spec.eta)
    return Policy(spec.kind)


@dataclass(frozen=True, slots=True)
class _Choice:
    policy_index: int
    chosen_index: int


def _straggler_time_s(frontier: Frontier, policy_index: int, straggler: dict[str, Any]) -> float:
    if straggler.get("iteration_time_s") is not None:
        return float(straggler["iteration_time_s"])
    return float(straggler["slowdown"]) * float(frontier.times_s[policy_index])


def _choose(
    frontier: Frontier, policy: dict[str, Any], straggler: dict[str, Any] | None
) -> _Choice:
    """Policy point, then the straggler's: the least energy within the imposed time.

    Raises:
        InfeasibleDeadline: the policy's deadline is shorter than the fastest plan.
    """
    policy_index = choose_point(frontier, policy_to_solver(_POLICY_ADAPTER.validate_python(policy)))
    if straggler is None:
        return _Choice(policy_index, policy_index)
    imposed_s = _straggler_time_s(frontier, policy_index, straggler)
    if imposed_s <= float(frontier.times_s[policy_index]):
        return _Choice(policy_index, policy_index)
    return _Choice(policy_index, straggler_point(frontier, imposed_s))


def _expected(frontier: Frontier, job: JobRow, index: int) -> tuple[float, float]:
    """Iteration time and pipeline energy at point ``index`` once a straggler stretches it."""
    time_s = float(frontier.times_s[index])
    if job.straggler is not None and job.policy_index is not None:
        time_s = max(time_s, _straggler_time_s(frontier, job.policy_index, job.straggler))
    return time_s, float(frontier.energy_at(index, time_s))


@dataclass(frozen=True, slots=True)
class _Replica:
    data_parallel_rank: int
    time_s: float
    energy_j: float


def _replica_measurements(
    windows: Sequence[RankWindow], ranks_per_replica: int, min_samples: int
) -> list[_Replica]:
    """Per complete replica: slowest rank's mean time, sum of its ranks' mean energy."""
    by_replica: dict[int, list[RankWindow]] = {}
    for window in windows:
        if len(window.recent_times_s) >= min_samples:
            by_replica.setdefault(window.data_parallel_rank, []).append(window)
    replicas = []
    for dp_rank, members in sorted(by_replica.items()):
        if len(members) < ranks_per_replica:
            continue
        replicas.append(
            _Replica(
                dp_rank,
                max(statistics.fmean(r.recent_times_s) for r in members),
                sum(statistics.fmean(r.recent_energies_j) for r in members),
            )
        )
    return replicas


class JobService:
    """Jobs over a :class:`Store`, with per-process caches of frontiers and rendered plans.

    Args:
        store: the job store.
        owner: this process's identity in planning claims.
        clock: wall clock in seconds (tests pass a fake one).
    """

    def __init__(
        self,
        store: Store,
        *,
        owner: str | None = None,
        clock: Callable[[], float] = time.time,
        frontier_cache_size: int = 16,
        plan_cache_size: int = 4096,
    ) -> None:
        self.store = store
        self.owner = owner or uuid.uuid4().hex
        self._clock = clock
        self._lock = threading.Lock()
        self._frontiers: OrderedDict[tuple[str, int], Frontier] = OrderedDict()
        self._frontier_cache_size = frontier_cache_size
        self._plans: OrderedDict[tuple[str, int, int, bool], bytes] = OrderedDict()
        self._plan_cache_size = plan_cache_size

    # ------------------------------------------------------------------------- jobs

    def create_job(self, spec: JobCreate) -> tuple[JobCreated, JobRow]:
        """Create a job; its token is returned once and stored only hashed.

        Raises:
            ScheduleError: the schedule cannot be built from these sizes.
            PolicyError: the policy's parameter is invalid.
        """
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
            spec=spec.model_dump(mode="json"),
            state="registering",
            reason=None,
            policy=spec.policy.model_dump(mode="json"),
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
        )
        with self.store.write() as tx:
            tx.insert_job(row)
        return JobCreated(job_id=row.id, token=token), row

    def get_job(self, job_id: str) -> JobRow:
        """The stored job.

        Raises:
            JobNotFound: no such job.
        """
        with self.store.read() as tx:
            return self._existing(tx, job_id)

    def list_jobs(self, limit: int, offset: int) -> list[JobSummary]:
        with self.store.read() as tx:
            rows = tx.list_jobs(limit, offset)
        return [
            JobSummary(
                job_id=r.id,
                name=r.name,
                state=_state(r),
                version=r.version,
                created_at_s=r.created_at_s,
            )
            for r in rows
        ]

    def count_jobs_by_state(self) -> dict[str, int]:
        with self.store.read() as tx:
            return tx.count_jobs_by_state()

    def delete_job(self, job_id: str) -> None:
        """Delete a job and everything under it.

        Raises:
            JobNotFound: no such job.
        """
        with self.store.write() as tx:
            if not tx.delete_job(job_id):
                raise JobNotFound(f"no job {job_id!r}")
        with self._lock:
            for key in [k for k in self._frontiers if k[0] == job_id]:
                del self._frontiers[key]
            for pkey in [k for k in self._plans if k[0] == job_id]:
                del self._plans[pkey]

    def job_view(self, job_id: str) -> JobView:
        """Everything about a job: state, counts, policy, the chosen point, telemetry.

        Raises:
            JobNotFound: no such job.
        """
        with self.store.read() as tx:
            job = self._existing(tx, job_id)
            windows = tx.windows(job_id, job.version) if job.iterations_reported else []
            coverage = tx.profiled_coverage(job_id)
        spec = JobCreate.model_validate(job.spec)
        stages_profiled = sum(
            all((stage, tp) in coverage for tp in range(spec.tensor_parallel))
            for stage in range(spec.stages)
        )
        frontier = self._frontier(job.id, job.frontier_rev) if job.frontier_rev else None
        chosen = self._chosen(frontier, job)
        return JobView(
            job_id=job.id,
            name=job.name,
            state=_state(job),
            reason=job.reason,
            spec=spec,
            policy=_POLICY_ADAPTER.validate_python(job.policy),
            straggler=None if job.straggler is None else StragglerView(**job.straggler),
            version=job.version,
            counts=JobCounts(
                ranks_expected=spec.world_size,
                ranks_registered=job.ranks_registered,
                profiles_reported=job.profiles_reported,
                stages_profiled=stages_profiled,
                iterations_reported=job.iterations_reported,
            ),
            frontier_points=None if frontier is None else len(frontier),
            planning_s=job.planning_s,
            chosen=chosen,
            telemetry=self._telemetry(job, spec, windows, frontier, chosen),
        )

    # ------------------------------------------------------------------------- ranks

    def register_rank(self, job_id: str, reg: RankRegistration) -> tuple[RankRegistered, JobRow]:
        """Register a rank, or re-register it (a restarted rank) with the same coordinates.

        Raises:
            JobNotFound: no such job.
            RequestFieldError: a coordinate is outside the job's layout.
            JobStateError: the rank or its coordinates are taken by another registration.
        """
        with self.store.write() as tx:
            job = self._existing(tx, job_id)
            spec = JobCreate.model_validate(job.spec)
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
            existing = tx.rank(job_id, reg.rank)
            holder = tx.rank_at(job_id, *coords)
            if holder is not None and holder.rank != reg.rank:
                raise JobStateError(
                    f"rank {holder.rank} already registered as stage {coords[0]}, data-parallel "
                    f"rank {coords[1]}, tensor-parallel rank {coords[2]}"
                )
            if (
                existing is not None
                and (
                    existing.stage,
                    existing.data_parallel_rank,
                    existing.tensor_parallel_rank,
                )
                != coords
            ):
                raise JobStateError(
                    f"rank {reg.rank} is registered as stage {existing.stage}, data-parallel rank "
                    f"{existing.data_parallel_rank}, tensor-parallel rank "
                    f"{existing.tensor_parallel_rank}"
                )
            now_s = self._clock()
            if existing is None:
                tx.put_rank(
                    new=True,
                    row=RankRow(
                        job_id=job_id,
                        rank=reg.rank,
                        stage=reg.stage,
                        data_parallel_rank=reg.data_parallel_rank,
                        tensor_parallel_rank=reg.tensor_parallel_rank,
                        gpu_name=reg.gpu_name,
                        supported_clocks_mhz=tuple(reg.supported_clocks_mhz),
                        registered_at_s=now_s,
                    ),
                )
                registered = job.ranks_registered + 1
                state = job.state
                if state == "registering" and registered == spec.world_size:
                    state = "profiling"
                job = dataclasses.replace(
                    job, ranks_registered=registered, state=state, updated_at_s=now_s
                )
                tx.save_job(job)
            else:
                tx.put_rank(
                    dataclasses.replace(
                        existing,
                        gpu_name=reg.gpu_name,
                        supported_clocks_mhz=tuple(reg.supported_clocks_mhz),
                    ),
                    new=False,
                )
        reply = RankRegistered(
            rank=reg.rank,
            state=_state(job),
            ranks_registered=job.ranks_registered,
        )
        return reply, job

    def rank_layout(self, job_id: str) -> dict[int, tuple[int, int]]:
        """``rank -> (stage, data_parallel_rank)`` of every registered rank."""
        with self.store.read() as tx:
            layout = tx.rank_layout(job_id)
        return {rank: (stage, dp) for rank, (stage, dp, _) in layout.items()}

    # ------------------------------------------------------------------------- profiles

    def add_profile(
        self, job_id: str, report: ProfileReport
    ) -> tuple[ProfileAccepted, JobRow, bool]:
        """Store a rank's profile; the last missing one claims the job's planning.

        Returns:
            The reply, the job, and whether this call claimed the job's planning (the
            caller must then run it).

        Raises:
            JobNotFound: no such job.
            JobStateError: the rank has not registered.
            RequestFieldError, ProfileError: the rows are unusable.
        """
        rows = tuple((r.instruction, r.frequency_mhz, r.time_s, r.energy_j) for r in report.rows)
        # The solver's own checks (duplicates, both instructions present), on this stage alone.
        profile_from_rows(((0, *row) for row in rows), source="request")
        with self.store.write() as tx:
            job = self._existing(tx, job_id)
            spec = JobCreate.model_validate(job.spec)
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
            now_s = self._clock()
            is_new = not tx.has_profile(job_id, report.rank)
            tx.put_profile(
                ProfileRecord(job_id, report.rank, report.stage, rows, report.p_block_w, now_s),
                new=is_new,
            )
            job = dataclasses.replace(
                job,
                profiles_reported=job.profiles_reported + int(is_new),
                updated_at_s=now_s,
            )
            claimed = job.state in ("registering", "profiling") and (
                job.profiles_reported == spec.world_size
            )
            if claimed:
                job = self._claimed(job, now_s)
            tx.save_job(job)
        reply = ProfileAccepted(
            rank=report.rank,
            state=_state(job),
            profiles_reported=job.profiles_reported,
            planning=claimed,
        )
        return reply, job, claimed

    # ------------------------------------------------------------------------- planning

    def claim_planning(self, job_id: str) -> JobRow:
        """Start (or restart) planning on request.

        Raises:
            JobNotFound: no such job.
            JobStateError: planning is already running, or a stage lacks profiles.
        """
        with self.store.write() as tx:
            job = self._existing(tx, job_id)
            if job.state == "planning":
                raise JobStateError(f"job {job_id} is already planning")
            spec = JobCreate.model_validate(job.spec)
            coverage = tx.profiled_coverage(job_id)
            missing = [
                stage
                for stage in range(spec.stages)
                if not all((stage, tp) in coverage for tp in range(spec.tensor_parallel))
            ]
            if missing:
                shown = ", ".join(str(s) for s in missing[:16])
                raise JobStateError(
                    f"stages {shown}{' ...' if len(missing) > 16 else ''} lack a profile "
                    "from some tensor-parallel rank"
                )
            job = self._claimed(job, self._clock())
            tx.save_job(job)
        return job

    def reclaim_stale(self, lease_s: float) -> list[JobRow]:
        """Take over planning jobs whose owner stopped sending heartbeats."""
        now_s = self._clock()
        with self.store.read() as tx:
            stale = tx.stale_planning_jobs(now_s - lease_s)
        claimed = []
        for job_id in stale:
            with self.store.write() as tx:
                job = tx.job(job_id)
                if job is None or job.state != "planning":
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
        with self.store.write() as tx:
            tx.heartbeat(self.owner, job_ids, self._clock())

    def finish_planning(
        self,
        job_id: str,
        frontier_json: str,
        planning_s: float,
        frontier: Frontier | None = None,
    ) -> JobRow | None:
        """Store a computed frontier and choose the plan; a new plan version.

        Returns:
            The job, or None when this process no longer owns the job's planning (it was
            deleted, or taken over after a missed heartbeat).

        Raises:
            PlanError: the frontier JSON is invalid.
        """
        with self.store.read() as tx:
            if not self._owns_planning(tx.job(job_id)):
                return None
        if frontier is None:
            frontier = Frontier.from_json(json.loads(frontier_json))  # outside the lock
        with self.store.write() as tx:
            job = tx.job(job_id)
            if job is None or not self._owns_planning(job):
                return None
            rev = job.frontier_rev + 1
            tx.put_frontier(FrontierRow(job_id, rev, frontier_json))
            job = dataclasses.replace(
                job,
                frontier_rev=rev,
                version=job.version + 1,
                planning_owner=None,
                planning_heartbeat_s=None,
                planning_s=planning_s,
                updated_at_s=self._clock(),
            )
            try:
                choice = _choose(frontier, job.policy, job.straggler)
            except InfeasibleDeadline as exc:
                job = dataclasses.replace(
                    job,
                    state="failed",
                    reason=f"policy: {exc}",
                    policy_index=None,
                    chosen_index=None,
                )
            else:
                job = dataclasses.replace(
                    job,
                    state="ready",
                    reason=None,
                    policy_index=choice.policy_index,
                    chosen_index=choice.chosen_index,
                )
            tx.save_job(job)
        self._remember_frontier(job_id, rev, frontier)
        return job

    def fail_planning(self, job_id: str, reason: str) -> JobRow | None:
        """Mark the job failed with ``reason`` if this process still owns its planning."""
        with self.store.write() as tx:
            job = tx.job(job_id)
            if job is None or not self._owns_planning(job):
                return None
            job = dataclasses.replace(
                job,
                state="failed",
                reason=reason,
                planning_owner=None,
                planning_heartbeat_s=None,
                updated_at_s=self._clock(),
            )
            tx.save_job(job)
        return job

    # --------------------------------------------------------------------- policy and stragglers

    def set_policy(self, job_id: str, spec: PolicyModel) -> tuple[PlanVersion, JobRow]:
        """Change the policy; with a frontier, plans move at once (a new version).

        Raises:
            JobNotFound: no such job.
            PolicyError: the policy is invalid.
            InfeasibleDeadline: the deadline is shorter than the fastest plan.
        """
        policy_to_solver(spec)
        return self._update_choice(job_id, policy=spec.model_dump(mode="json"))

    def set_straggler(self, job_id: str, spec: StragglerSpec) -> tuple[PlanVersion, JobRow]:
        """Declare a straggler: plans move to the least energy within its iteration time."""
        straggler = StragglerView(iteration_time_s=spec.iteration_time_s, slowdown=spec.slowdown)
        return self._update_choice(job_id, straggler=straggler.model_dump(mode="json"))

    def clear_straggler(self, job_id: str) -> tuple[PlanVersion, JobRow]:
        """Forget any straggler (declared or detected)."""
        return self._update_choice(job_id, straggler=None)

    def _update_choice(
        self, job_id: str, *, policy: Any = _KEEP, straggler: Any = _KEEP
    ) -> tuple[PlanVersion, JobRow]:
        peek = self.get_job(job_id)
        if peek.frontier_rev:
            self._frontier(job_id, peek.frontier_rev)  # parse outside the row lock
        with self.store.write() as tx:
            job = self._existing(tx, job_id)
            if policy is not _KEEP:
                job = dataclasses.replace(job, policy=policy)
            if straggler is not _KEEP:
                job = dataclasses.replace(job, straggler=straggler)
            job = dataclasses.replace(job, updated_at_s=self._clock())
            if job.frontier_rev:
                frontier = self._frontier(job_id, job.frontier_rev)
                choice = _choose(frontier, job.policy, job.straggler)
                job = dataclasses.replace(
                    job,
                    policy_index=choice.policy_index,
                    chosen_index=choice.chosen_index,
                    version=job.version + 1,
                )
                if job.state == "failed":
                    job = dataclasses.replace(job, state="ready", reason=None)
            tx.save_job(job)
        return self._plan_version(job), job

    def _plan_version(self, job: JobRow) -> PlanVersion:
        frontier = self._frontier(job.id, job.frontier_rev) if job.frontier_rev else None
        return PlanVersion(
            version=job.version,
            state=_state(job),
            chosen=self._chosen(frontier, job),
        )

    # ------------------------------------------------------------------------- telemetry

    def record_iterations(
        self, job_id: str, reports: Sequence[IterationReport], window: int
    ) -> None:
        """Record ranks' measured iterations, keeping each rank's last ``window`` of them
        under the current plan version (the samples that telemetry and straggler detection
        compare with the plan). One transaction for the whole batch; reports of ranks or
        jobs deleted meanwhile are dropped.
        """
        with self.store.write() as tx:
            version = tx.job_version(job_id)
            if version is None:
                return
            windows = tx.iteration_windows(job_id, sorted({r.rank for r in reports}))
            counted = 0
            for report in reports:
                state = windows.get(report.rank)
                if state is None or state.last_iteration == report.iteration:
                    continue  # unregistered meanwhile, or a report sent twice
                times: tuple[float, ...] = ()
                energies: tuple[float, ...] = ()
                if state.window_version == version:
                    times, energies = state.recent_times_s, state.recent_energies_j
                if report.plan_version in (None, version):
                    times = (*times, report.time_s)[-window:]
                    energies = (*energies, report.energy_j)[-window:]
                windows[report.rank] = IterationWindow(
                    state.iterations + 1, report.iteration, version, times, energies
                )
                counted += 1
            tx.save_iteration_windows(job_id, windows, counted)

    def detect_straggler(self, job_id: str) -> JobRow | None:
        """With ``auto_straggler`` on, move plans when one replica is consistently slower.

        Each complete replica's recent mean time (its slowest rank) is divided by the time
        its plan predicts; a replica whose ratio exceeds the median ratio by the job's
        ``straggler_threshold`` is the straggler: it keeps the policy plan and the others
        move to the least energy within its iteration time. When it recovers, the
        automatic straggler is cleared. A manually declared straggler is left alone.

        Returns:
            The job when the plans moved (a new version), else None.
        """
        job = self.get_job(job_id)
        spec = JobCreate.model_validate(job.spec)
        if (
            not spec.auto_straggler
            or spec.data_parallel < 2
            or job.chosen_index is None
            or job.policy_index is None
            or (job.straggler is not None and not job.straggler.get("automatic"))
        ):
            return None
        frontier = self._frontier(job.id, job.frontier_rev)
        with self.store.read() as tx:
            windows = tx.windows(job_id, job.version)
        replicas = _replica_measurements(
            windows, spec.stages * spec.tensor_parallel, spec.straggler_window
        )
        if len(replicas) < spec.data_parallel:
            return None
        current = set(job.straggler["data_parallel_ranks"]) if job.straggler else set()

        def predicted_s(dp_rank: int) -> float:
            index = job.policy_index if dp_rank in current else job.chosen_index
            return float(frontier.times_s[index])

        ratios = {
            r.data_parallel_rank: r.time_s / predicted_s(r.data_parallel_rank) for r in replicas
        }
        worst = max(ratios, key=lambda d: ratios[d])
        relative = ratios[worst] / statistics.median(ratios.values())
        if relative >= spec.straggler_threshold:
            if (
                job.straggler is not None
                and current == {worst}
                and math.isclose(
                    float(job.straggler["slowdown"]), relative, rel_tol=_AUTO_SLOWDOWN_TOLERANCE
                )
            ):
                return None
            new: dict[str, Any] | None = StragglerView(
                slowdown=relative, automatic=True, data_parallel_ranks=[worst]
            ).model_dump(mode="json")
        elif job.straggler is not None:
            new = None
        else:
            return None
        with self.store.write() as tx:
            locked = self._existing(tx, job_id)
            if locked.version != job.version or locked.straggler != job.straggler:
                return None  # someone else moved the plans meanwhile
            choice = _choose(frontier, locked.policy, new)
            job = dataclasses.replace(
                locked,
                straggler=new,
                policy_index=choice.policy_index,
                chosen_index=choice.chosen_index,
                version=locked.version + 1,
                updated_at_s=self._clock(),
            )
            tx.save_job(job)
        return job

    # ------------------------------------------------------------------------- frontier and plans

    def frontier_view(self, job: JobRow) -> FrontierView:
        """The frontier's points and baselines.

        Raises:
            PlanNotReady: there is no frontier, or no plan at this version.
        """
        if not job.frontier_rev or job.chosen_index is None or job.policy_index is None:
            raise self._not_ready(job)
        frontier = self._frontier(job.id, job.frontier_rev)
        return FrontierView(
            version=job.version,
            points=[
                FrontierPoint(time_s=float(t), energy_j=float(e), gap=float(g))
                for t, e, g in zip(
                    frontier.times_s, frontier.energies_j, frontier.gaps, strict=True
                )
            ],
            baselines={
                name: BaselineModel(time_s=b.time_s, energy_j=b.energy_j)
                for name, b in frontier.baselines.items()
            },
            policy_index=job.policy_index,
            chosen_index=job.chosen_index,
        )

    def cached_plan(self, job: JobRow, stage: int, straggler_replica: bool) -> bytes | None:
        """The rendered plan if this process has it (no I/O; safe on the event loop)."""
        return self._plans.get((job.id, job.version, stage, straggler_replica))

    def render_plan(self, job: JobRow, stage: int, straggler_replica: bool) -> bytes:
        """The plan of one stage at the job's version as JSON bytes, cached per version.

        Args:
            job: the job as read (its version, frontier revision and chosen point).
            stage: the rank's stage.
            straggler_replica: the rank's replica is the detected straggler; it keeps the
                policy point while the others follow the straggler.

        Raises:
            PlanNotReady: there is no plan at this version.
        """
        key = (job.id, job.version, stage, straggler_replica)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        if not job.frontier_rev or job.chosen_index is None or job.policy_index is None:
            raise self._not_ready(job)
        frontier = self._frontier(job.id, job.frontier_rev)
        index = job.policy_index if straggler_replica else job.chosen_index
        point = frontier.point(index)
        interleaved = frontier.schedule.virtual_stages > 1
        instructions: list[dict[str, Any]] = []
        for ins, freq in zip(
            frontier.schedule.order[stage], point.frequencies_mhz[stage], strict=True
        ):
            item: dict[str, Any] = {"instruction": ins.kind, "microbatch": ins.microbatch}
            if interleaved:
                item["chunk"] = ins.chunk
            item["frequency_mhz"] = int(freq)
            instructions.append(item)
        body = json.dumps(
            {
                "job_id": job.id,
                "version": job.version,
                "stage": stage,
                "time_s": float(point.time_s),
                "energy_j": float(point.energy_j),
                "instructions": instructions,
            },
            separators=(",", ":"),
        ).encode()
        with self._lock:
            self._plans[key] = body
            while len(self._plans) > self._plan_cache_size:
                self._plans.popitem(last=False)
        return body

    # ------------------------------------------------------------------------- helpers

    def _existing(self, tx: Transaction, job_id: str) -> JobRow:
        job = tx.job(job_id)
        if job is None:
            raise JobNotFound(f"no job {job_id!r}")
        return job

    def _owns_planning(self, job: JobRow | None) -> bool:
        return job is not None and job.state == "planning" and job.planning_owner == self.owner

    def _not_ready(self, job: JobRow) -> PlanNotReady:
        if job.state == "failed":
            return PlanNotReady(f"job {job.id} failed: {job.reason}", job.state)
        return PlanNotReady(f"not ready yet: job {job.id} is {job.state}", job.state)

    def _claimed(self, job: JobRow, now_s: float) -> JobRow:
        return dataclasses.replace(
            job,
            state="planning",
            reason=None,
            planning_owner=self.owner,
            planning_heartbeat_s=now_s,
            updated_at_s=now_s,
        )

    def planning_input(self, job_id: str) -> PlanningInput:
        """Everything a worker process needs to compute the job's frontier.

        Read after the claim, outside its transaction: loading every profile takes a while
        and must not hold the job's lock.

        Raises:
            JobNotFound: no such job.
        """
        with self.store.read() as tx:
            job = self._existing(tx, job_id)
            layout = tx.rank_layout(job_id)
            texts = tx.profile_texts(job_id)
        spec = JobCreate.model_validate(job.spec)
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
        )

    def _remember_frontier(self, job_id: str, rev: int, frontier: Frontier) -> None:
        with self._lock:
            self._frontiers[(job_id, rev)] = frontier
            self._frontiers.move_to_end((job_id, rev))
            while len(self._frontiers) > self._frontier_cache_size:
                self._frontiers.popitem(last=False)

    def _frontier(self, job_id: str, rev: int) -> Frontier:
        """The job's frontier at revision ``rev``, parsed once per process.

        Raises:
            PlanError: the stored frontier is missing or invalid.
        """
        with self._lock:
            frontier = self._frontiers.get((job_id, rev))
        if frontier is not None:
            return frontier
        with self.store.read() as tx:
            row = tx.frontier(job_id)
        if row is None or row.rev != rev:
            # A newer computation replaced it meanwhile; callers re-read the job.
            raise PlanError(f"job {job_id}: frontier revision {rev} is no longer stored")
        frontier = Frontier.from_json(json.loads(row.data))
        self._remember_frontier(job_id, rev, frontier)
        return frontier

    def _chosen(self, frontier: Frontier | None, job: JobRow) -> ChosenPoint | None:
        if frontier is None or job.chosen_index is None:
            return None
        index = job.chosen_index
        expected_s, expected_j = _expected(frontier, job, index)
        return ChosenPoint(
            index=index,
            time_s=float(frontier.times_s[index]),
            energy_j=float(frontier.energies_j[index]),
            gap=float(frontier.gaps[index]),
            expected_iteration_time_s=expected_s,
            expected_energy_j=expected_j,
        )

    def _telemetry(
        self,
        job: JobRow,
        spec: JobCreate,
        windows: Sequence[RankWindow],
        frontier: Frontier | None,
        chosen: ChosenPoint | None,
    ) -> Telemetry | None:
        if not job.iterations_reported:
            return None
        replicas = _replica_measurements(windows, spec.stages * spec.tensor_parallel, 1)
        stragglers = set(job.straggler["data_parallel_ranks"]) if job.straggler else set()

        def predicted_s(dp_rank: int) -> float | None:
            if frontier is None or job.chosen_index is None or job.policy_index is None:
                return None
            index = job.policy_index if dp_rank in stragglers else job.chosen_index
            return float(frontier.times_s[index])

        return Telemetry(
            predicted_time_s=None if chosen is None else chosen.expected_iteration_time_s,
            predicted_energy_j=None if chosen is None else chosen.expected_energy_j,
            measured_time_s=statistics.fmean(r.time_s for r in replicas) if replicas else None,
            measured_energy_j=statistics.fmean(r.energy_j for r in replicas) if replicas else None,
            replicas=[
                ReplicaTelemetry(
                    data_parallel_rank=r.data_parallel_rank,
                    time_s=r.time_s,
                    energy_j=r.energy_j,
                    predicted_time_s=predicted_s(r.data_parallel_rank),
                )
                for r in replicas
            ],
        )
