"""Plans as ranks fetch them: parsed frontiers and rendered plans, cached per process.

A plan is rendered by its wire model, :class:`perseus.schemas.PlanResponse`, once per job
version, stage and role (the straggler replica keeps the policy point), and served as
bytes from then on. Frontiers are parsed from the store once per revision, with the profile
they were planned on: each plan instruction carries its expected duration from it
(:func:`perseus.solver.instruction_times_s`, clock-change tails included), which a rank uses
to issue the next clock change ahead of the boundary.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from perseus.core.baselines import baseline_label
from perseus.core.errors import PlanError, PlanNotReady, ProfileError
from perseus.core.jobs import JobState
from perseus.formats.plan_files import frontier_from_json
from perseus.formats.profiles import profile_from_json
from perseus.schemas import (
    Baseline,
    ChosenPoint,
    FrontierPoint,
    FrontierView,
    PlanResponse,
    PlanVersion,
)
from perseus.server.lifecycle.decisions import Choice, expected
from perseus.server.lifecycle.savings import Spans, predicted_spans
from perseus.server.store.job_store import JobRow, Store
from perseus.solver import Frontier, Profile, instruction_times_s

# Points whose instruction times are kept (each: every instruction of the schedule).
_POINT_TIMES = 64

__all__ = [
    "FrontierCache",
    "Plans",
    "choice_of",
    "has_plan",
    "not_ready",
    "point_index",
    "render_plan",
]


def has_plan(job: JobRow) -> bool:
    """Whether the job has plans at its version (a frontier and a chosen point)."""
    return job.frontier_rev > 0 and job.policy_index is not None and job.chosen_index is not None


def choice_of(job: JobRow) -> Choice | None:
    """The points the job's plans follow, once it has a frontier and a chosen point."""
    if job.policy_index is None or job.chosen_index is None or not job.frontier_rev:
        return None
    return Choice(job.policy_index, job.chosen_index, job.budget_index)


def not_ready(job: JobRow) -> PlanNotReady:
    """The error for a job without a plan at its version."""
    if job.state == JobState.FAILED:
        return PlanNotReady(f"job {job.id} failed: {job.reason}", job.state)
    return PlanNotReady(f"not ready yet: job {job.id} is {job.state}", job.state)


def render_plan(
    job: JobRow,
    frontier: Frontier,
    stage: int,
    straggler_replica: bool,
    times_s: Sequence[float] | None = None,
) -> bytes:
    """The plan of one stage at the job's version, as the JSON of :class:`PlanResponse`.

    Args:
        job: the job as read (its version and chosen point).
        frontier: the job's frontier at ``job.frontier_rev``.
        stage: the rank's stage.
        straggler_replica: the rank's replica is the detected straggler; it keeps the
            policy point while the others follow the straggler.
        times_s: each instruction's expected duration at its clock, in the stage's order
            (None: the plan carries none).

    Raises:
        PlanNotReady: there is no plan at this version.

    Complexity: O(instructions of the stage).
    """
    point = frontier.point(point_index(job, straggler_replica))
    interleaved = frontier.schedule.virtual_stages > 1
    order = frontier.schedule.order[stage]
    times = [None] * len(order) if times_s is None else times_s
    plan = PlanResponse.model_validate(
        {
            "job_id": job.id,
            "version": job.version,
            "stage": stage,
            "time_s": float(point.time_s),
            "energy_j": float(point.energy_j),
            "clock_change_margin_s": float(frontier.clock_change_margin_s),
            "instructions": [
                {
                    "instruction": ins.kind,
                    "microbatch": ins.microbatch,
                    "chunk": ins.chunk if interleaved else None,
                    "frequency_mhz": int(freq),
                    "time_s": time_s,
                }
                for ins, freq, time_s in zip(
                    order, point.frequencies_mhz[stage], times, strict=True
                )
            ],
        }
    )
    # Optional fields are absent rather than null: chunk for schedules without chunks, an
    # instruction's time_s for frontiers stored without their profile.
    return plan.model_dump_json(exclude_none=True).encode()


def point_index(job: JobRow, straggler_replica: bool) -> int:
    """The frontier point a rank's plan follows: the straggler replica keeps the policy
    point (or the cluster budget's), the others run the chosen one.

    Raises:
        PlanNotReady: there is no plan at this version.
    """
    choice = choice_of(job)
    if choice is None:
        raise not_ready(job)
    return choice.base_index if straggler_replica else choice.chosen_index


@dataclass(frozen=True, slots=True)
class _Planned:
    frontier: Frontier
    profile: Profile | None  # None: stored before frontiers kept their profile
    spans: dict[int, tuple[Spans, Spans] | None] = field(default_factory=dict)  # by point


class FrontierCache:
    """Each job's frontier and the profile it was planned on, parsed from the store once
    per revision (least recently used out).

    Thread-safe: the web layer reads it from the thread pool.
    """

    def __init__(self, store: Store, size: int = 16) -> None:
        self._store = store
        self._size = size
        self._lock = threading.Lock()
        self._frontiers: OrderedDict[tuple[str, int], _Planned] = OrderedDict()

    def get(self, job_id: str, rev: int) -> Frontier:
        """The job's frontier at revision ``rev``.

        Raises:
            PlanError: the stored frontier is missing, replaced meanwhile, or invalid.
        """
        return self._planned(job_id, rev).frontier

    def profile(self, job_id: str, rev: int) -> Profile | None:
        """The profile the job's frontier at ``rev`` was planned on; None for a frontier
        stored before frontiers kept it.

        Raises:
            PlanError: as :meth:`get`.
        """
        return self._planned(job_id, rev).profile

    def spans(self, job_id: str, rev: int, index: int) -> tuple[Spans, Spans] | None:
        """The default plan's and point ``index``'s iterations on the ranks' measure
        (:func:`~perseus.server.lifecycle.savings.predicted_spans`), replayed once per point;
        None for a frontier stored without its profile.

        Raises:
            PlanError: as :meth:`get`.
        """
        planned = self._planned(job_id, rev)
        if planned.profile is None:
            return None
        with self._lock:
            if index in planned.spans:
                return planned.spans[index]
        found = predicted_spans(planned.frontier, planned.profile, index)
        with self._lock:
            planned.spans[index] = found
        return found

    def _planned(self, job_id: str, rev: int) -> _Planned:
        with self._lock:
            planned = self._frontiers.get((job_id, rev))
        if planned is not None:
            return planned
        with self._store.read() as tx:
            row = tx.frontier(job_id)
        if row is None or row.rev != rev:
            # A newer computation replaced it meanwhile; callers re-read the job.
            raise PlanError(f"job {job_id}: frontier revision {rev} is no longer stored")
        frontier = frontier_from_json(row.data)
        try:
            profile = (
                None
                if row.profile is None
                else profile_from_json(row.profile, source="stored frontier")
            )
        except (ProfileError, ValueError, KeyError, TypeError) as exc:
            raise PlanError(f"job {job_id}: the stored profile is invalid: {exc}") from exc
        return self.put(job_id, rev, frontier, profile)

    def of(self, job: JobRow) -> Frontier | None:
        """The job's current frontier, if it has one.

        Raises:
            PlanError: as :meth:`get`.
        """
        return self.get(job.id, job.frontier_rev) if job.frontier_rev else None

    def put(
        self, job_id: str, rev: int, frontier: Frontier, profile: Profile | None = None
    ) -> _Planned:
        planned = _Planned(frontier, profile)
        with self._lock:
            self._frontiers[(job_id, rev)] = planned
            self._frontiers.move_to_end((job_id, rev))
            while len(self._frontiers) > self._size:
                self._frontiers.popitem(last=False)
        return planned

    def forget(self, job_id: str) -> None:
        with self._lock:
            for key in [k for k in self._frontiers if k[0] == job_id]:
                del self._frontiers[key]


class Plans:
    """Rendered plans (bytes) per job version, stage and role; and the views of the choice.

    Args:
        frontiers: the frontier cache.
        cache_size: rendered plans kept (least recently rendered out).
    """

    def __init__(self, frontiers: FrontierCache, cache_size: int = 4096) -> None:
        self._frontiers = frontiers
        self._size = cache_size
        self._lock = threading.Lock()
        self._plans: OrderedDict[tuple[str, int, int, bool], bytes] = OrderedDict()
        self._point_times: OrderedDict[tuple[str, int, int], tuple[tuple[float, ...], ...]] = (
            OrderedDict()
        )

    def cached(self, job: JobRow, stage: int, straggler_replica: bool) -> bytes | None:
        """The rendered plan if this process has it (no I/O; safe on the event loop)."""
        return self._plans.get((job.id, job.version, stage, straggler_replica))

    def render(self, job: JobRow, stage: int, straggler_replica: bool) -> bytes:
        """The plan of one stage at the job's version (see :func:`render_plan`), cached.

        Raises:
            PlanNotReady: there is no plan at this version.
            PlanError: the frontier was replaced meanwhile (re-read the job).
        """
        key = (job.id, job.version, stage, straggler_replica)
        body = self._plans.get(key)
        if body is not None:
            return body
        index = point_index(job, straggler_replica)
        frontier = self._frontiers.get(job.id, job.frontier_rev)
        times = self._times(job, frontier, index)
        body = render_plan(
            job, frontier, stage, straggler_replica, None if times is None else times[stage]
        )
        with self._lock:
            self._plans[key] = body
            while len(self._plans) > self._size:
                self._plans.popitem(last=False)
        return body

    def _times(
        self, job: JobRow, frontier: Frontier, index: int
    ) -> tuple[tuple[float, ...], ...] | None:
        """Every instruction's expected duration under point ``index``, GPU by GPU (one
        computation for all of a version's stages); None without the planned profile."""
        key = (job.id, job.frontier_rev, index)
        with self._lock:
            times = self._point_times.get(key)
        if times is not None:
            return times
        profile = self._frontiers.profile(job.id, job.frontier_rev)
        if profile is None:
            return None
        try:
            times = instruction_times_s(
                profile,
                frontier.schedule,
                frontier.point(index).frequencies_mhz,
                clock_change_margin_s=frontier.clock_change_margin_s,
            )
        except PlanError:
            # A profile that does not fit the frontier (not expected): plans without times.
            return None
        with self._lock:
            self._point_times[key] = times
            while len(self._point_times) > _POINT_TIMES:
                self._point_times.popitem(last=False)
        return times

    def forget(self, job_id: str) -> None:
        with self._lock:
            for key in [k for k in self._plans if k[0] == job_id]:
                del self._plans[key]
            for times_key in [k for k in self._point_times if k[0] == job_id]:
                del self._point_times[times_key]

    def chosen(self, job: JobRow, frontier: Frontier | None) -> ChosenPoint | None:
        """The point the plans follow now, with what a straggler makes of it."""
        choice = choice_of(job)
        if frontier is None or choice is None:
            return None
        index = choice.chosen_index
        expected_s, expected_j = expected(frontier, choice, job.straggler)
        return ChosenPoint(
            index=index,
            time_s=float(frontier.times_s[index]),
            energy_j=float(frontier.energies_j[index]),
            gap=float(frontier.gaps[index]),
            expected_iteration_time_s=expected_s,
            expected_energy_j=expected_j,
        )

    def version(self, job: JobRow) -> PlanVersion:
        """The reply to a change of policy or straggler."""
        return PlanVersion(
            version=job.version,
            state=job.state,
            chosen=self.chosen(job, self._frontiers.of(job)),
        )

    def frontier_view(self, job: JobRow) -> FrontierView:
        """The frontier's points and baselines.

        Raises:
            PlanNotReady: there is no frontier, or no plan at this version.
        """
        choice = choice_of(job)
        if choice is None:
            raise not_ready(job)
        frontier = self._frontiers.get(job.id, job.frontier_rev)
        return FrontierView(
            version=job.version,
            points=[FrontierPoint.from_point(frontier.point(i)) for i in range(len(frontier))],
            baselines={
                name: Baseline.from_baseline(b, baseline_label(name))
                for name, b in frontier.baselines.items()
            },
            policy_index=choice.policy_index,
            chosen_index=choice.chosen_index,
            policy=job.policy,
            budget_index=choice.budget_index,
            clock_change_delay_s=float(frontier.clock_change_delay_s),
            clock_change_delay_rank=job.clock_delay_rank,
            straggler_time_s=None
            if job.straggler is None
            else expected(frontier, choice, job.straggler)[0],
        )
