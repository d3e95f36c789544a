"""A power budget for a whole cluster: each job's point on its own frontier, chosen so that
the jobs together draw at most the budget, at the least total slowdown.

A job's power at a frontier point is its iteration energy over its iteration time (blocking
power included, as the frontier's energies include it), times its pipeline replicas. A job
never runs faster than its own policy's point, so its candidates are that point and every
slower one. Choosing one candidate per job so that the summed power fits and the summed
priority-weighted slowdown is least is a multiple-choice knapsack: solved here exactly, as a
MILP in HiGHS (one binary per candidate, one row per job, one power row), after each job's
candidates are cut to those on its own (slowdown, power) Pareto front. Greedy moves along
the fronts' convex hulls would solve only the LP relaxation exactly, not this.

Complexity: ``O(P log P)`` for the fronts over ``P`` points in all; the MILP has at most
``P`` binaries and ``jobs + 1`` rows (milliseconds for a hundred jobs of a few hundred points).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perseus.core.errors import PolicyError
from perseus.core.profiles import Profile
from perseus.solver.lp_model import MODEL_STATUS, SparseRows, highs_model
from perseus.solver.schedules import Schedule

__all__ = [
    "BudgetChoice",
    "JobPoints",
    "choose_under_budget",
    "clocks_under_power_limit",
    "point_powers_w",
]


@dataclass(frozen=True, slots=True)
class JobPoints:
    """One job as the budget sees it.

    Attributes:
        name: The job's name, for messages.
        times_s: Iteration time of each frontier point, ascending.
        powers_w: The job's whole power at each point (every replica, every GPU).
        policy_index: The point the job's own policy chooses: the fastest it may run.
        priority: Weight of the job's slowdown (> 0; default 1).
    """

    name: str
    times_s: tuple[float, ...]
    powers_w: tuple[float, ...]
    policy_index: int
    priority: float = 1.0

    def __post_init__(self) -> None:
        where = f"job {self.name!r}"
        if not self.times_s or len(self.times_s) != len(self.powers_w):
            raise PolicyError(f"{where}: needs as many powers as times, at least one")
        values = (*self.times_s, *self.powers_w)
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise PolicyError(f"{where}: times and powers must be finite and positive")
        if any(b < a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):
            raise PolicyError(f"{where}: times must be ascending")
        if not 0 <= self.policy_index < len(self.times_s):
            raise PolicyError(f"{where}: policy point {self.policy_index} is not a point")
        if not (math.isfinite(self.priority) and self.priority > 0):
            raise PolicyError(f"{where}: priority must be > 0, got {self.priority}")

    def slowdown(self, index: int) -> float:
        """Point ``index``'s iteration time against the policy point's, less one."""
        return self.times_s[index] / self.times_s[self.policy_index] - 1.0

    def least_power_index(self) -> int:
        """The candidate (policy point or slower) of least power; the slower on ties."""
        candidates = range(self.policy_index, len(self.times_s))
        return min(candidates, key=lambda k: (self.powers_w[k], -k))


@dataclass(frozen=True, slots=True)
class BudgetChoice:
    """Each job's point under a budget.

    Attributes:
        indices: The chosen point of each job, in the order given.
        power_w: The predicted power of the chosen points plus the fixed power.
        weighted_slowdown: The sum of each job's priority times its slowdown.
        meetable: Whether the budget can be met at all; where it cannot, every job is at
            its least-power candidate and ``power_w`` exceeds the budget by ``shortfall_w``.
        shortfall_w: How far above the budget the least possible power is (0 when met).
    """

    indices: tuple[int, ...]
    power_w: float
    weighted_slowdown: float
    meetable: bool
    shortfall_w: float


def point_powers_w(
    times_s: Sequence[float], energies_j: Sequence[float], replicas: int
) -> tuple[float, ...]:
    """A job's power at each frontier point: ``replicas * energy / time``."""
    if replicas < 1:
        raise PolicyError(f"replicas must be >= 1, got {replicas}")
    return tuple(replicas * e / t for t, e in zip(times_s, energies_j, strict=True))


def choose_under_budget(
    jobs: Sequence[JobPoints], budget_w: float, *, fixed_power_w: float = 0.0
) -> BudgetChoice:
    """Choose each job's point so that the total power stays within ``budget_w``.

    Args:
        jobs: The planned jobs, each with its frontier's times and powers.
        budget_w: The cluster's power budget, in watts.
        fixed_power_w: Power the choice cannot move (jobs without a plan), counted against
            the budget.

    Returns:
        The least priority-weighted total slowdown whose power fits; where none fits, every
        job at its least power and ``meetable`` False (a budget is never silently exceeded).

    Raises:
        PolicyError: A budget or fixed power that is not a finite, non-negative number.
    """
    if not (math.isfinite(budget_w) and budget_w >= 0):
        raise PolicyError(f"budget must be a finite power >= 0 W, got {budget_w}")
    if not (math.isfinite(fixed_power_w) and fixed_power_w >= 0):
        raise PolicyError(f"fixed power must be finite and >= 0 W, got {fixed_power_w}")
    policy = tuple(job.policy_index for job in jobs)
    if _power(jobs, policy) + fixed_power_w <= budget_w * (1 + 1e-12):
        # within rounding of the budget: sums of the same powers in another order differ
        return _choice(jobs, policy, fixed_power_w, budget_w)
    least = tuple(job.least_power_index() for job in jobs)
    if _power(jobs, least) + fixed_power_w > budget_w:
        return _choice(jobs, least, fixed_power_w, budget_w)
    fronts = [_front(job) for job in jobs]
    return _choice(jobs, _solve(jobs, fronts, budget_w - fixed_power_w), fixed_power_w, budget_w)


def _power(jobs: Sequence[JobPoints], indices: Sequence[int]) -> float:
    return math.fsum(job.powers_w[k] for job, k in zip(jobs, indices, strict=True))


def _choice(
    jobs: Sequence[JobPoints], indices: tuple[int, ...], fixed_w: float, budget_w: float
) -> BudgetChoice:
    power = _power(jobs, indices) + fixed_w
    slowdown = math.fsum(
        job.priority * job.slowdown(k) for job, k in zip(jobs, indices, strict=True)
    )
    over = power - budget_w
    if over <= 1e-12 * budget_w:  # rounding: the same powers summed in another order
        over = 0.0
    return BudgetChoice(indices, power, slowdown, over == 0.0, over)


def _front(job: JobPoints) -> list[int]:
    """The job's candidates that no other candidate beats on both slowdown and power."""
    kept: list[int] = []
    best = math.inf
    for k in range(job.policy_index, len(job.times_s)):  # slowdown ascending
        if job.powers_w[k] < best:
            kept.append(k)
            best = job.powers_w[k]
    return kept


def _solve(jobs: Sequence[JobPoints], fronts: list[list[int]], budget_w: float) -> tuple[int, ...]:
    """The exact multiple-choice knapsack: one binary per front point."""
    columns = [(j, k) for j, front in enumerate(fronts) for k in front]
    n = len(columns)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for c, (j, k) in enumerate(columns):
        rows += [j, len(jobs)]
        cols += [c, c]
        vals += [1.0, jobs[j].powers_w[k]]
    matrix = SparseRows.from_entries(rows, cols, vals, (len(jobs) + 1, n))
    cost = np.array([jobs[j].priority * jobs[j].slowdown(k) for j, k in columns])
    # HiGHS holds rows to an absolute feasibility tolerance (1e-7): aim inside the budget by
    # more than that, and further where a solution still lands over it (rounding in the sum).
    inside = max(1e-6, 1e-12 * budget_w)
    for _ in range(4):
        lower = np.concatenate([np.ones(len(jobs)), [-np.inf]])
        upper = np.concatenate([np.ones(len(jobs)), [budget_w - inside]])
        highs = highs_model(matrix, lower, upper, cost, np.ones(n), np.ones(n, dtype=bool))
        highs.setOptionValue("mip_rel_gap", 0.0)
        highs.setOptionValue("mip_abs_gap", 0.0)
        highs.run()
        if highs.getModelStatus() != MODEL_STATUS.kOptimal:
            break
        x = np.asarray(highs.getSolution().col_value)
        chosen = [fronts[j][0] for j in range(len(jobs))]
        for c, (j, k) in enumerate(columns):
            if x[c] > 0.5:
                chosen[j] = k
        indices = tuple(chosen)
        over = _power(jobs, indices) - budget_w
        if over <= 0:
            return indices
        inside += 2 * over
    # Feasible by the check before the call, so this is HiGHS failing (or its tolerance
    # beating the margin): the least-power choice is the one that surely fits.
    return tuple(job.least_power_index() for job in jobs)


def clocks_under_power_limit(
    profile: Profile, schedule: Schedule, cap_w: float
) -> tuple[tuple[int, ...], ...]:
    """Each instruction's clock where every GPU has the power limit ``cap_w``: the highest
    measured clock whose power (the instruction's energy over its time there) fits under the
    cap, the lowest clock where none does. A model of what a uniformly lowered power limit
    does, the way operators shed load today: the GPU's own governor lowers the clock until
    the power fits, instruction by instruction.

    Returns:
        ``clocks[g][k]``: the clock of ``schedule.order[g][k]``, as a plan's clocks are.
    """
    chosen: dict[tuple[int, str], int] = {}
    clocks: list[tuple[int, ...]] = []
    for g, sequence in enumerate(schedule.order):
        row = []
        for instruction in sequence:
            key = (g, str(instruction.kind))  # a profile's stages are the schedule's GPUs
            if key not in chosen:
                options = profile.options(g, instruction.kind)  # frequency descending
                fits = [o for o in options if o.energy_j / o.time_s <= cap_w]
                chosen[key] = (fits[0] if fits else options[-1]).frequency_mhz
            row.append(chosen[key])
        clocks.append(tuple(row))
    return tuple(clocks)
