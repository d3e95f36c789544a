"""The server's pure decisions, without a database: choosing a point, detecting stragglers."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.core.errors import InfeasibleDeadline
from perseus.schemas import (
    DeadlinePolicy,
    MaxSlowdownPolicy,
    MinEnergyPolicy,
    NoSlowdownPolicy,
    StragglerView,
)
from perseus.server.lifecycle.decisions import (
    Choice,
    Replica,
    StragglerChange,
    choose,
    detect_straggler,
    expected,
    predicted_time_s,
    replica_measurements,
    robust_time_s,
)
from perseus.server.store.job_store import RankWindow
from perseus.solver import Frontier, make_schedule

TIMES_S = (1.0, 1.1, 1.25, 1.5, 2.0)
ENERGIES_J = (100.0, 90.0, 85.0, 80.0, 78.0)


@pytest.fixture(scope="module")
def frontier() -> Frontier:
    schedule = make_schedule("1f1b", 2, 2, 1)
    instructions = sum(len(order) for order in schedule.order)
    return Frontier(
        schedule=schedule,
        p_block_w=10.0,
        times_s=np.array(TIMES_S),
        energies_j=np.array(ENERGIES_J),
        gaps=np.zeros(len(TIMES_S)),
        frequencies_mhz=np.full((len(TIMES_S), instructions), 1000, dtype=np.uint16),
    )


def _auto(slowdown: float, dp_rank: int) -> StragglerView:
    return StragglerView(slowdown=slowdown, automatic=True, data_parallel_ranks=[dp_rank])


# ----------------------------------------------------------------------------- choosing a point


def test_policy_point_without_a_straggler(frontier: Frontier) -> None:
    assert choose(frontier, NoSlowdownPolicy(kind="no-slowdown"), None) == Choice(0, 0)
    assert choose(frontier, MinEnergyPolicy(kind="min-energy"), None) == Choice(4, 4)
    assert choose(frontier, MaxSlowdownPolicy(kind="max-slowdown", factor=1.3), None) == Choice(
        2, 2
    )


def test_a_straggler_moves_the_others_to_the_least_energy_within_its_time(
    frontier: Frontier,
) -> None:
    policy = NoSlowdownPolicy(kind="no-slowdown")
    assert choose(frontier, policy, StragglerView(iteration_time_s=1.6)) == Choice(0, 3)
    assert choose(frontier, policy, StragglerView(slowdown=1.2)) == Choice(0, 1)
    # A straggler faster than the policy's point changes nothing.
    slow = MaxSlowdownPolicy(kind="max-slowdown", factor=1.5)
    assert choose(frontier, slow, StragglerView(iteration_time_s=1.2)) == Choice(3, 3)


def test_infeasible_deadline_is_an_error(frontier: Frontier) -> None:
    with pytest.raises(InfeasibleDeadline):
        choose(frontier, DeadlinePolicy(kind="deadline", seconds=0.5), None)


def test_expected_time_and_energy_count_the_straggler_wait(frontier: Frontier) -> None:
    assert expected(frontier, Choice(0, 0), None) == (1.0, 100.0)
    time_s, energy_j = expected(frontier, Choice(0, 3), StragglerView(iteration_time_s=1.6))
    assert time_s == 1.6
    assert energy_j == pytest.approx(80.0 + 2 * 10.0 * 0.1)  # two stages block 0.1 s


def test_stragglers_are_predicted_at_the_policy_point(frontier: Frontier) -> None:
    choice = Choice(0, 3)
    assert predicted_time_s(frontier, choice, {1}, 1) == 1.0
    assert predicted_time_s(frontier, choice, {1}, 0) == 1.5


# ----------------------------------------------------------------------------- stragglers


def test_replicas_need_every_rank_with_enough_samples() -> None:
    windows = [
        RankWindow(0, (1.0, 3.0), (1.0, 1.0)),
        RankWindow(0, (4.0, 4.0), (2.0, 2.0)),
        RankWindow(1, (1.0, 1.0), (1.0, 1.0)),  # its second rank is missing
        RankWindow(2, (1.0,), (1.0,)),
        RankWindow(2, (1.0, 1.0), (1.0, 1.0)),  # too few samples on the first
    ]
    assert replica_measurements(windows, ranks_per_replica=2, min_samples=2) == [
        Replica(0, 4.0, 3.0)
    ]


def test_the_robust_time_ignores_a_minority_of_slow_iterations() -> None:
    outlier = [RankWindow(0, (1.0, 1.0, 3.0, 1.0, 1.0), (1.0,) * 5)]
    mostly_slow = [RankWindow(0, (1.3, 1.0, 1.3, 1.3, 1.0), (1.0,) * 5)]
    assert replica_measurements(outlier, 1, 5, center=robust_time_s)[0].time_s == 1.0
    assert replica_measurements(mostly_slow, 1, 5, center=robust_time_s)[0].time_s == 1.3
    assert robust_time_s((1.0, 3.0)) == 1.0  # a window of 2: both must be slow
    assert replica_measurements(outlier, 1, 5)[0].time_s == pytest.approx(1.4)  # the mean


def test_a_consistently_slower_replica_becomes_the_straggler(frontier: Frontier) -> None:
    replicas = [Replica(0, 1.0, 1.0), Replica(1, 1.0, 1.0), Replica(2, 1.3, 1.0)]
    change = detect_straggler(
        frontier, Choice(0, 0), None, replicas, data_parallel=3, threshold=1.05
    )
    assert change == StragglerChange(_auto(1.3, 2))


def test_nothing_moves_within_the_threshold_or_before_every_replica_reports(
    frontier: Frontier,
) -> None:
    even = [Replica(0, 1.0, 1.0), Replica(1, 1.02, 1.0)]
    assert (
        detect_straggler(frontier, Choice(0, 0), None, even, data_parallel=2, threshold=1.05)
        is None
    )
    partial = [Replica(0, 1.0, 1.0), Replica(1, 2.0, 1.0)]
    assert (
        detect_straggler(frontier, Choice(0, 0), None, partial, data_parallel=3, threshold=1.05)
        is None
    )


def test_the_same_straggler_within_tolerance_mints_no_version(frontier: Frontier) -> None:
    # Replica 1 straggles at 1.3x: the others moved to point 2 (1.25 s), it kept point 0.
    current = _auto(1.3, 1)
    choice = Choice(0, 2)
    same = [Replica(0, 1.25, 1.0), Replica(1, 1.31, 1.0), Replica(2, 1.25, 1.0)]
    assert (
        detect_straggler(frontier, choice, current, same, data_parallel=3, threshold=1.05) is None
    )
    slower = [Replica(0, 1.25, 1.0), Replica(1, 1.6, 1.0), Replica(2, 1.25, 1.0)]
    change = detect_straggler(frontier, choice, current, slower, data_parallel=3, threshold=1.05)
    assert change is not None and change.straggler is not None
    assert change.straggler.data_parallel_ranks == [1]
    assert change.straggler.slowdown == pytest.approx(1.6)


def test_a_recovered_straggler_is_cleared_and_a_declared_one_kept(frontier: Frontier) -> None:
    replicas = [Replica(0, 1.25, 1.0), Replica(1, 1.0, 1.0)]
    change = detect_straggler(
        frontier, Choice(0, 2), _auto(1.25, 1), replicas, data_parallel=2, threshold=1.05
    )
    assert change == StragglerChange(None)
    declared = StragglerView(slowdown=2.0)
    assert (
        detect_straggler(
            frontier, Choice(0, 2), declared, replicas, data_parallel=2, threshold=1.05
        )
        is None
    )
