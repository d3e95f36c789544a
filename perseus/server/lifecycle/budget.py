"""The cluster's power budget: each planned job's point, chosen so the cluster stays under it.

A job's power at a frontier point is the point's energy over its time, times the job's data-
parallel replicas: a frontier's energy is one pipeline's, every stage and every GPU of each
stage's tensor-parallel group (:mod:`perseus.server.planning.stage_profiles` sums a stage's
tensor-parallel ranks and averages its replicas), blocking power included. Jobs without a
plan count at what their ranks measured (energy over time of their recent iterations), else
at ``world size x default_gpu_w``; jobs no rank registered to yet count nothing.

A re-balance (:meth:`ClusterBudget.rebalance`) runs whenever what it depends on changes: the
budget, a window's start or end, a job's frontier, policy, straggler or priority, a job's
deletion. It locks the budget row, then every job row in id order, in one write
transaction, so two server processes sharing a database take turns and never undo each
other; only the jobs whose point moves get a new plan version, which their ranks' long polls
pick up. The choice itself is :func:`perseus.solver.cluster.choose_under_budget` (exact).
A budget the jobs cannot meet is never silently exceeded: every job runs at its least power,
and the shortfall is reported (:meth:`ClusterBudget.status`, ``/metrics``, the page).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from perseus.core.errors import JobNotFound, PerseusError, RequestFieldError
from perseus.formats.plan_files import frontier_from_json
from perseus.schemas import (
    BudgetSet,
    BudgetWindow,
    ClusterBudgetView,
    JobBudget,
    JobPower,
)
from perseus.server.lifecycle.decisions import Choice, choose, expected
from perseus.server.planning.plans import FrontierCache, choice_of
from perseus.server.store.job_store import JobRow, Store, Transaction
from perseus.server.store.tables import BudgetRow, PowerWindow
from perseus.solver import Frontier
from perseus.solver.cluster import JobPoints, choose_under_budget, point_powers_w

__all__ = [
    "DEFAULT_GPU_W",
    "LIVE_S",
    "ClusterBudget",
    "budget_reason",
    "effective_budget_w",
    "job_budget",
    "measured_power_w",
    "next_boundary_s",
]

log = logging.getLogger("perseus.server")

DEFAULT_GPU_W = 700.0
"""What a GPU of a job without plan or telemetry is counted at (an H100 SXM's power limit)."""

LIVE_S = 120.0
"""A rank heard from within this long counts in its job's measured power."""

_TOLERANCE = 1e-9  # relative: sums of the same powers in another order differ by rounding


def effective_budget_w(row: BudgetRow, now_s: float) -> float | None:
    """The budget in force at ``now_s``: the window's while it lasts, else the standing one."""
    if _window_active(row, now_s):
        return row.window_w
    return row.standing_w


def _window_active(row: BudgetRow, now_s: float) -> bool:
    if row.window_w is None:
        return False
    started = row.window_from_s is None or row.window_from_s <= now_s
    ended = row.window_to_s is not None and row.window_to_s <= now_s
    return started and not ended


def next_boundary_s(row: BudgetRow, now_s: float) -> float | None:
    """When the window next starts or ends after ``now_s``; None when it never will."""
    if row.window_w is None:
        return None
    future = [t for t in (row.window_from_s, row.window_to_s) if t is not None and t > now_s]
    return min(future, default=None)


def _window_view(row: BudgetRow, now_s: float) -> BudgetWindow | None:
    if row.window_w is None:
        return None
    return BudgetWindow(
        power_w=row.window_w,
        from_s=row.window_from_s,
        to_s=row.window_to_s,
        active=_window_active(row, now_s),
        ended=row.window_to_s is not None and row.window_to_s <= now_s,
    )


def measured_power_w(job: JobRow, windows: Sequence[PowerWindow], now_s: float) -> float | None:
    """A job's power from its ranks' recent iterations: each live rank's mean energy over
    its mean time, summed, and scaled to the job's world size where some ranks have not
    reported; None when no live rank has.

    A rank is live when heard from within :data:`LIVE_S`.
    """
    powers = [
        statistics.fmean(w.recent_energies_j) / statistics.fmean(w.recent_times_s)
        for w in windows
        if w.recent_times_s
        and w.recent_energies_j
        and w.seen_at_s is not None
        and now_s - w.seen_at_s <= LIVE_S
        and statistics.fmean(w.recent_times_s) > 0
    ]
    if not powers:
        return None
    return math.fsum(powers) * job.spec.world_size / len(powers)


def _powers_w(job: JobRow, frontier: Frontier) -> tuple[float, ...]:
    return point_powers_w(
        [float(t) for t in frontier.times_s],
        [float(e) for e in frontier.energies_j],
        job.spec.data_parallel,
    )


def _predicted_w(job: JobRow, frontier: Frontier, choice: Choice) -> float:
    """The job's power at its current points: a straggler replica at the base point, the
    other replicas at the chosen point stretched to the straggler's pace."""
    replicas = job.spec.data_parallel
    base = choice.base_index
    base_w = float(frontier.energies_j[base]) / float(frontier.times_s[base])
    stragglers = len(job.straggler.data_parallel_ranks) if job.straggler is not None else 0
    stragglers = min(stragglers, replicas)
    time_s, energy_j = expected(frontier, choice, job.straggler)
    return (replicas - stragglers) * energy_j / time_s + stragglers * base_w


def budget_reason(slowdown: float) -> str:
    """What the job view says of a job the budget moved."""
    return f"cluster budget: {100 * slowdown:.1f} % slower than your policy"


def job_budget(job: JobRow, frontier: Frontier | None) -> JobBudget | None:
    """What the cluster budget does to a job (None while it does nothing)."""
    choice = choice_of(job)
    if frontier is None or choice is None or choice.budget_index is None:
        return None
    powers = _powers_w(job, frontier)
    slowdown = float(frontier.times_s[choice.budget_index] / frontier.times_s[choice.policy_index])
    slowdown -= 1.0
    return JobBudget(
        index=choice.budget_index,
        policy_index=choice.policy_index,
        slowdown=slowdown,
        power_w=powers[choice.budget_index],
        policy_power_w=powers[choice.policy_index],
        reason=budget_reason(slowdown),
    )


@dataclass(frozen=True, slots=True)
class _Cluster:
    """Every job as the budget sees it: planned ones with their points, others' power."""

    planned: list[tuple[JobRow, Frontier, Choice]]
    fixed: list[tuple[JobRow, str, float, float | None]]  # job, counted, power, measured

    @property
    def fixed_w(self) -> float:
        return math.fsum(power for _, _, power, _ in self.fixed)


class ClusterBudget:
    """The cluster's power budget: set, lift, re-balance, show.

    Args:
        store: the job store.
        frontiers: parsed frontiers.
        clock: wall clock in seconds (tests pass a fake one).
        default_gpu_w: what a GPU of a job without plan or telemetry is counted at.
    """

    def __init__(
        self,
        store: Store,
        frontiers: FrontierCache,
        *,
        clock: Callable[[], float] = time.time,
        default_gpu_w: float = DEFAULT_GPU_W,
    ) -> None:
        self._store = store
        self._frontiers = frontiers
        self._clock = clock
        self.default_gpu_w = default_gpu_w

    # ------------------------------------------------------------------ changes

    def set(self, spec: BudgetSet) -> list[JobRow]:
        """Set the standing budget, or the window (``from_s``/``to_s``), and re-balance.

        Returns:
            The jobs whose points moved (a new plan version each).

        Raises:
            RequestFieldError: the window ends before now (nothing is changed).
        """
        now_s = self._clock()
        if spec.to_s is not None and spec.to_s <= now_s:
            raise RequestFieldError(
                ("body", "to_s"), f"the window ends at {spec.to_s}, before now ({now_s:.0f})"
            )
        preloaded = self._preload()
        with self._store.write() as tx:
            row = tx.budget()
            if spec.is_window:
                row = dataclasses.replace(
                    row, window_w=spec.power_w, window_from_s=spec.from_s, window_to_s=spec.to_s
                )
            else:
                row = dataclasses.replace(row, standing_w=spec.power_w)
            row = dataclasses.replace(row, changed_at_s=now_s)
            return self._balance(tx, row, now_s, preloaded)

    def lift(self) -> list[JobRow]:
        """Lift the budget (standing and window): every job back at its own policy."""
        now_s = self._clock()
        preloaded = self._preload()
        with self._store.write() as tx:
            locked = tx.budget()
            row = BudgetRow(applied_w=locked.applied_w, changed_at_s=now_s)
            return self._balance(tx, row, now_s, preloaded)

    def set_priority(self, job_id: str, priority: float) -> JobRow:
        """Change a job's priority (the budget re-balances after, :meth:`rebalance`).

        Raises:
            JobNotFound: no such job.
        """
        with self._store.write() as tx:
            job = tx.job(job_id)
            if job is None:
                raise JobNotFound(f"no job {job_id!r}")
            job = dataclasses.replace(job, priority=priority, updated_at_s=self._clock())
            tx.save_job(job)
        return job

    def timer(self) -> tuple[bool, float | None]:
        """For the timer, in one cheap read: whether the budget in force now differs from
        the one the points were chosen for (a window started or ended), and when the window
        next starts or ends (Unix time; None: never)."""
        with self._store.read() as tx:
            row = tx.budget()
        now_s = self._clock()
        return effective_budget_w(row, now_s) != row.applied_w, next_boundary_s(row, now_s)

    def rebalance(self) -> list[JobRow]:
        """Choose every planned job's point again for the budget in force now.

        Nothing is read under a lock where no budget is in force nor was applied (every job
        is at its own policy then, and stays there).

        Returns:
            The jobs whose points moved (a new plan version each).
        """
        now_s = self._clock()
        with self._store.read() as tx:
            row = tx.budget()
        if effective_budget_w(row, now_s) is None and row.applied_w is None:
            return []
        preloaded = self._preload()
        with self._store.write() as tx:
            return self._balance(tx, tx.budget(), now_s, preloaded)

    # ------------------------------------------------------------------ the choice

    def _preload(self) -> dict[tuple[str, int], Frontier]:
        """Every planned job's frontier, parsed before any lock is taken."""
        with self._store.read() as tx:
            jobs = tx.all_jobs()
        return self._parsed(jobs)

    def _parsed(self, jobs: Sequence[JobRow]) -> dict[tuple[str, int], Frontier]:
        """The frontiers of the planned ``jobs`` (outside any transaction: the cache reads
        the store in its own)."""
        found: dict[tuple[str, int], Frontier] = {}
        for job in jobs:
            if choice_of(job) is None:
                continue
            try:
                found[(job.id, job.frontier_rev)] = self._frontiers.get(job.id, job.frontier_rev)
            except PerseusError:
                continue  # replaced or deleted meanwhile: read again inside the transaction
        return found

    def _cluster(
        self,
        tx: Transaction,
        jobs: Sequence[JobRow],
        frontiers: Mapping[tuple[str, int], Frontier],
        windows: Mapping[str, Sequence[PowerWindow]],
        now_s: float,
    ) -> _Cluster:
        planned: list[tuple[JobRow, Frontier, Choice]] = []
        fixed: list[tuple[JobRow, str, float, float | None]] = []
        for job in jobs:
            measured = measured_power_w(job, windows.get(job.id, ()), now_s)
            choice = choice_of(job)
            frontier = None if choice is None else self._frontier(tx, job, frontiers)
            if choice is not None and frontier is not None:
                planned.append((job, frontier, choice))
            elif measured is not None:
                fixed.append((job, "measured", measured, measured))
            elif job.ranks_registered:
                fixed.append((job, "default", job.spec.world_size * self.default_gpu_w, None))
        return _Cluster(planned, fixed)

    def _frontier(
        self, tx: Transaction, job: JobRow, frontiers: Mapping[tuple[str, int], Frontier]
    ) -> Frontier | None:
        frontier = frontiers.get((job.id, job.frontier_rev))
        if frontier is not None:
            return frontier
        stored = tx.frontier(job.id)  # inside the transaction: no second connection
        if stored is None or stored.rev != job.frontier_rev:
            return None
        try:
            return frontier_from_json(stored.data)
        except PerseusError:
            log.exception("job %s: the stored frontier cannot be read", job.id)
            return None

    def _balance(
        self,
        tx: Transaction,
        row: BudgetRow,
        now_s: float,
        frontiers: Mapping[tuple[str, int], Frontier],
    ) -> list[JobRow]:
        """Choose the points for ``row``'s budget at ``now_s`` and save them and ``row``
        (the budget row is locked: :meth:`Transaction.budget` came first)."""
        budget_w = effective_budget_w(row, now_s)
        jobs = tx.all_jobs()
        cluster = self._cluster(tx, jobs, frontiers, _windows(tx), now_s)
        targets: dict[str, int | None] = {job.id: None for job in jobs}
        if budget_w is not None and cluster.planned:
            points = [
                JobPoints(
                    job.id,
                    tuple(float(t) for t in frontier.times_s),
                    _powers_w(job, frontier),
                    choice.policy_index,
                    job.priority,
                )
                for job, frontier, choice in cluster.planned
            ]
            chosen = choose_under_budget(points, budget_w, fixed_power_w=cluster.fixed_w)
            for (job, _, choice), index in zip(cluster.planned, chosen.indices, strict=True):
                targets[job.id] = None if index == choice.policy_index else index
            if not chosen.meetable:
                log.warning(
                    "cluster budget %.0f W cannot be met: the jobs draw at least %.0f W "
                    "(every job at its least power)",
                    budget_w,
                    chosen.power_w,
                )
        moved: list[JobRow] = []
        for job, frontier, _ in cluster.planned:
            target = targets[job.id]
            if target == job.budget_index:
                continue
            try:
                choice = choose(frontier, job.policy, job.straggler, target)
            except PerseusError:
                log.exception("job %s: its point cannot be chosen again", job.id)
                continue
            job = dataclasses.replace(
                job,
                policy_index=choice.policy_index,
                chosen_index=choice.chosen_index,
                budget_index=choice.budget_index,
                version=job.version + 1,
                updated_at_s=now_s,
            )
            tx.save_job(job)
            moved.append(job)
        planned = {job.id for job, _, _ in cluster.planned}
        for job in jobs:  # a budget point without a plan to hold (not expected): dropped
            if job.id not in planned and job.budget_index is not None:
                job = dataclasses.replace(job, budget_index=None, updated_at_s=now_s)
                tx.save_job(job)
        tx.save_budget(dataclasses.replace(row, applied_w=budget_w, balanced_at_s=now_s))
        if moved:
            log.info(
                "cluster budget %s: %d job(s) moved",
                "lifted" if budget_w is None else f"{budget_w:.0f} W",
                len(moved),
            )
        return moved

    # ------------------------------------------------------------------ the view

    def status(self) -> ClusterBudgetView:
        """The budget, the cluster's predicted and measured power, each job's share."""
        now_s = self._clock()
        with self._store.read() as tx:
            row = tx.budget()
            jobs = tx.all_jobs()
            energy = tx.energy_totals()
        frontiers = self._parsed(jobs)
        with self._store.read() as tx:
            windows = _windows(tx)
            cluster = self._cluster(tx, jobs, frontiers, windows, now_s)
        budget_w = effective_budget_w(row, now_s)
        shares: list[JobPower] = []
        weighted = 0.0
        for job, frontier, choice in cluster.planned:
            powers = _powers_w(job, frontier)
            least = min(powers[choice.policy_index :])
            slowdown = float(
                frontier.times_s[choice.base_index] / frontier.times_s[choice.policy_index]
            )
            weighted += job.priority * (slowdown - 1.0)
            shares.append(
                _share(
                    job,
                    "plan",
                    _predicted_w(job, frontier, choice),
                    measured_power_w(job, windows.get(job.id, ()), now_s),
                    slowdown - 1.0,
                    powers[choice.policy_index],
                    least,
                    energy.get(job.id, (0.0, 0.0))[1],
                )
            )
        for job, counted, power, measured in cluster.fixed:
            saved = energy.get(job.id, (0.0, 0.0))[1]
            shares.append(_share(job, counted, power, measured, 0.0, power, power, saved))
        predicted = math.fsum(s.predicted_w for s in shares)
        measured_all = [s.measured_w for s in shares if s.measured_w is not None]
        least = math.fsum(s.least_w for s in shares)
        shares = [
            s.model_copy(update={"share": s.predicted_w / predicted if predicted > 0 else 0.0})
            for s in shares
        ]
        met = meetable = None
        shortfall = 0.0
        message = None
        if budget_w is not None:
            slack = budget_w * _TOLERANCE
            met = predicted <= budget_w + slack
            meetable = least <= budget_w + slack
            shortfall = 0.0 if met else predicted - budget_w
            if not meetable:
                message = (
                    f"the budget, {_watts(budget_w)}, is below the least the jobs can draw, "
                    f"{_watts(least)}: every job runs at its least power and the cluster is "
                    f"predicted to draw {_watts(shortfall)} more than the budget"
                )
            elif not met:
                message = (
                    f"the jobs are predicted to draw {_watts(shortfall)} more than the budget: "
                    "jobs without plans draw more than when the points were chosen (they are "
                    "chosen again at the next change)"
                )
        return ClusterBudgetView(
            budget_w=budget_w,
            standing_w=row.standing_w,
            window=_window_view(row, now_s),
            predicted_w=predicted,
            measured_w=math.fsum(measured_all) if measured_all else None,
            policy_w=math.fsum(s.policy_w for s in shares),
            least_w=least,
            met=met,
            meetable=meetable,
            shortfall_w=shortfall,
            weighted_slowdown=weighted,
            message=message,
            default_gpu_w=self.default_gpu_w,
            applied_w=row.applied_w,
            balanced_at_s=row.balanced_at_s,
            changed_at_s=row.changed_at_s,
            jobs=sorted(shares, key=lambda s: (-s.predicted_w, s.job_id)),
        )


def _windows(tx: Transaction) -> dict[str, list[PowerWindow]]:
    """Every rank's recent iterations, by job."""
    windows: dict[str, list[PowerWindow]] = defaultdict(list)
    for window in tx.power_windows():
        windows[window.job_id].append(window)
    return windows


def _share(
    job: JobRow,
    counted: str,
    predicted_w: float,
    measured_w: float | None,
    slowdown: float,
    policy_w: float,
    least_w: float,
    saved_j: float,
) -> JobPower:
    return JobPower.model_validate(
        {
            "job_id": job.id,
            "name": job.name,
            "state": job.state,
            "priority": job.priority,
            "counted": counted,
            "predicted_w": predicted_w,
            "measured_w": measured_w,
            "share": 0.0,
            "slowdown": slowdown,
            "policy_w": policy_w,
            "least_w": least_w,
            "energy_saved_j": saved_j,
        }
    )


def _watts(value: float) -> str:
    for scale, unit in ((1e6, "MW"), (1e3, "kW")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} W"
