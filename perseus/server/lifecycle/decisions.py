"""Pure decisions of the planner: which frontier point the plans follow, who straggles.

No database, no clock, no caches: values in, a small frozen value out, so each rule is
tested on its own (``tests/server/test_decisions.py``). The job logic reads what these
functions need from the store and writes back what they decide.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from perseus.schemas import (
    DeadlinePolicy,
    MaxSlowdownPolicy,
    PolicyModel,
    StragglerView,
    ZeusCostPolicy,
)
from perseus.server.store.job_store import RankWindow
from perseus.solver import Frontier, Policy, choose_point, straggler_point

__all__ = [
    "AUTO_SLOWDOWN_TOLERANCE",
    "REPLAN_DELAY_MIN_S",
    "REPLAN_DELAY_RATIO",
    "Choice",
    "Replica",
    "StragglerChange",
    "choose",
    "delay_outgrown",
    "detect_straggler",
    "expected",
    "policy_to_solver",
    "predicted_time_s",
    "replica_measurements",
    "robust_time_s",
]

AUTO_SLOWDOWN_TOLERANCE = 0.02
"""A replica's recent iteration times must differ from the current automatic straggler's
slowdown by this much (relative) before the plans move again; keeps noise from minting
versions."""


@dataclass(frozen=True, slots=True)
class Choice:
    """The frontier points the plans follow: the policy's, the one a cluster power budget
    holds the job at (never faster than the policy's; None: no budget moves it), and the
    one the replicas other than a straggler run."""

    policy_index: int
    chosen_index: int
    budget_index: int | None = None

    @property
    def base_index(self) -> int:
        """The point the job runs but for a straggler: the budget's, else the policy's."""
        return self.policy_index if self.budget_index is None else self.budget_index


@dataclass(frozen=True, slots=True)
class Replica:
    """One complete data-parallel replica's recent iterations."""

    data_parallel_rank: int
    time_s: float
    energy_j: float


@dataclass(frozen=True, slots=True)
class StragglerChange:
    """The automatic straggler moves: to ``straggler``, or away (None)."""

    straggler: StragglerView | None


REPLAN_DELAY_RATIO = 0.2
REPLAN_DELAY_MIN_S = 0.005
"""A rank's measured clock-change latency replans its job when it is more than
``REPLAN_DELAY_RATIO`` and more than ``REPLAN_DELAY_MIN_S`` above the delay the job's
frontier was planned for: a smaller excess costs at most a few instructions' clocks landing
a little late, a replan a whole planning run."""


def delay_outgrown(planned_s: float, measured_s: float) -> bool:
    """Whether a frontier planned for a clock-change delay of ``planned_s`` is to be planned
    again for the measured ``measured_s`` (materially longer; a shorter one never replans:
    plans for a longer delay only change clocks less often)."""
    excess = measured_s - planned_s
    return excess > REPLAN_DELAY_MIN_S and excess > REPLAN_DELAY_RATIO * planned_s


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


def _straggler_time_s(frontier: Frontier, policy_index: int, straggler: StragglerView) -> float:
    """The iteration time a straggler imposes on the other replicas."""
    if straggler.iteration_time_s is not None:
        return straggler.iteration_time_s
    slowdown = 1.0 if straggler.slowdown is None else straggler.slowdown
    return slowdown * float(frontier.times_s[policy_index])


def choose(
    frontier: Frontier,
    policy: PolicyModel,
    straggler: StragglerView | None,
    budget_index: int | None = None,
) -> Choice:
    """Policy point, held back to the budget's point (when slower), then the straggler's:
    the least energy within the imposed time.

    Args:
        frontier: the job's frontier.
        policy: the job's own policy.
        straggler: a declared or detected straggler, if any.
        budget_index: the point a cluster power budget holds the job at; ignored where it
            is not slower than the policy's point (a budget never speeds a job up) or not a
            point of this frontier.

    Raises:
        InfeasibleDeadline: the policy's deadline is shorter than the fastest plan.
    """
    policy_index = choose_point(frontier, policy_to_solver(policy))
    if budget_index is not None and not policy_index < budget_index < len(frontier):
        budget_index = None
    base = policy_index if budget_index is None else budget_index
    if straggler is None:
        return Choice(policy_index, base, budget_index)
    imposed_s = _straggler_time_s(frontier, base, straggler)
    if imposed_s <= float(frontier.times_s[base]):
        return Choice(policy_index, base, budget_index)
    return Choice(policy_index, straggler_point(frontier, imposed_s), budget_index)


def expected(
    frontier: Frontier, choice: Choice, straggler: StragglerView | None
) -> tuple[float, float]:
    """Iteration time and pipeline energy at the chosen point once a straggler stretches it."""
    time_s = float(frontier.times_s[choice.chosen_index])
    if straggler is not None:
        time_s = max(time_s, _straggler_time_s(frontier, choice.base_index, straggler))
    return time_s, float(frontier.energy_at(choice.chosen_index, time_s))


def predicted_time_s(
    frontier: Frontier, choice: Choice, stragglers: Collection[int], data_parallel_rank: int
) -> float:
    """The iteration time a replica's plan predicts: stragglers run the policy point (or
    the budget's)."""
    index = choice.base_index if data_parallel_rank in stragglers else choice.chosen_index
    return float(frontier.times_s[index])


def replica_measurements(
    windows: Sequence[RankWindow],
    ranks_per_replica: int,
    min_samples: int,
    center: Callable[[Sequence[float]], float] = statistics.fmean,
) -> list[Replica]:
    """Per complete replica: slowest rank's time (``center`` of its window, the mean by
    default), sum of its ranks' mean energy.

    A replica counts once each of its ``ranks_per_replica`` ranks has ``min_samples``.
    Straggler detection passes :func:`robust_time_s`.
    Complexity: O(ranks x window) (x log window for a median).
    """
    by_replica: dict[int, list[RankWindow]] = {}
    for window in windows:
        if len(window.recent_times_s) >= min_samples:
            by_replica.setdefault(window.data_parallel_rank, []).append(window)
    return [
        Replica(
            dp_rank,
            max(center(r.recent_times_s) for r in members),
            sum(statistics.fmean(r.recent_energies_j) for r in members),
        )
        for dp_rank, members in sorted(by_replica.items())
        if len(members) >= ranks_per_replica
    ]


def robust_time_s(times_s: Sequence[float]) -> float:
    """A rank's recent iteration time as straggler detection sees it: the low median of its
    window, so a replica is slow only when more than half its recent iterations are (one 3x
    iteration in a window of 5 moved every other replica's plan when this was the mean; the
    low median of a window of 2 is its faster iteration)."""
    return float(statistics.median_low(times_s))


def detect_straggler(
    frontier: Frontier,
    choice: Choice,
    current: StragglerView | None,
    replicas: Sequence[Replica],
    *,
    data_parallel: int,
    threshold: float,
) -> StragglerChange | None:
    """Whether the automatic straggler moves.

    Each replica's recent time (:func:`replica_measurements` with :func:`robust_time_s`:
    one slow iteration does not make a straggler) is divided by the time its plan predicts;
    a replica whose ratio exceeds the median ratio by ``threshold`` is the straggler (its
    slowdown is that relative ratio). When none does, a current straggler is cleared. A manually
    declared straggler is never touched, and nothing moves until every replica reported.

    Returns:
        The change, or None when the plans stay as they are.
    """
    if current is not None and not current.automatic:
        return None
    if data_parallel < 2 or len(replicas) < data_parallel:
        return None
    stragglers = set(current.data_parallel_ranks) if current is not None else set()
    ratios = {
        r.data_parallel_rank: r.time_s
        / predicted_time_s(frontier, choice, stragglers, r.data_parallel_rank)
        for r in replicas
    }
    worst = max(ratios, key=lambda d: ratios[d])
    relative = ratios[worst] / statistics.median(ratios.values())
    if relative < threshold:
        return None if current is None else StragglerChange(None)
    if (
        current is not None
        and stragglers == {worst}
        and current.slowdown is not None
        and math.isclose(current.slowdown, relative, rel_tol=AUTO_SLOWDOWN_TOLERANCE)
    ):
        return None
    return StragglerChange(
        StragglerView(slowdown=relative, automatic=True, data_parallel_ranks=[worst])
    )
