"""The fast mode of :mod:`perseus.solver.fast`, called directly (``compute_frontier`` solves
small problems exactly instead): a Pareto frontier from the all-fastest time whose every point
replays to what it states, near brute force on tiny cases up to its slowest point; where it
searches; its progress."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from perseus.solver import (
    build_costs,
    build_dag,
    compute_frontier,
    default_resolution,
    default_time,
    load_profile,
    make_schedule,
    profile_from_rows,
)
from perseus.solver.fast import ANCHOR_SLOWDOWNS, anchor_slowdowns, fast_frontier
from perseus.solver.planner import Planner
from perseus.solver.search import ALL_ANCHORS_UP_TO
from perseus.solver.synthetic import synthetic_profile

from . import reference as ref
from .cases import NEAR, RTOL, Case, cases, examples, rel

ALL_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")
SEARCH_WORK = 10**6  # a fortieth of the default: these cases are small
TINY = cases(schedules=ALL_SCHEDULES, stages=(1, 2), microbatches=(1, 3), options=(1, 3),
             max_plans=5_000)  # fmt: skip


def fast(case: Case, resolution_s: float | None = None, progress=None):
    """``(planner, times, energies, gaps, choices)`` of the fast mode on ``case``."""
    profile, schedule = case.profile(), case.schedule()
    dag = build_dag(schedule)
    planner = Planner(dag, build_costs(profile, schedule, case.p_block_w))
    if resolution_s is None:
        span = planner.slowest_time_s - planner.fastest_time_s
        resolution_s = default_resolution(span, dag.size)
    times, energies, gaps, choices, _ = fast_frontier(
        planner,
        resolution_s,
        progress or (lambda done, total: None),
        default_time(profile, schedule, dag=dag),
        SEARCH_WORK,
    )
    return planner, times, energies, gaps, choices


@examples(25)
@given(cases(schedules=ALL_SCHEDULES, options=(1, 5)))
def test_every_point_replays_and_the_points_are_pareto(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    calls: list[tuple[int, int]] = []
    planner, times, energies, gaps, choices = fast(
        case, progress=lambda done, total: calls.append((done, total))
    )
    n = planner.dag.size
    assert choices.shape == (len(times), n) and times.shape == energies.shape == gaps.shape
    assert (np.diff(times) > 0).all(), "time strictly up"
    assert (np.diff(energies) < 0).all(), "energy strictly down"
    assert np.isfinite(gaps).all() and (gaps >= -1e-9).all()
    assert rel(float(times[0]), case.t_min) <= RTOL  # from the all-fastest time
    # every point is what the planner's evaluation of its plan gives, and an independent replay
    plan_times, plan_energies = planner.evaluate(choices.T)
    # (times to the bit; energies summed in another order may differ in the last bits)
    assert np.array_equal(plan_times, times)
    assert np.allclose(plan_energies, energies, rtol=1e-12, atol=0)
    freqs = planner.costs.frequency_mhz[planner.flat(choices)]
    offsets = planner.dag.offsets.tolist()
    for i in sorted({0, len(times) // 2, len(times) - 1}):
        plan = [freqs[i, offsets[g] : offsets[g + 1]].tolist() for g in range(case.stages)]
        t, e = case.replay(plan)
        assert rel(float(times[i]), t) <= RTOL and rel(float(energies[i]), e) <= RTOL, i
    done = [d for d, _ in calls]
    assert {t for _, t in calls} == {1000} and done == sorted(done) and done[-1] == 1000


@examples(30)
@given(TINY)
def test_tiny_cases_within_half_a_percent_of_brute_force_up_to_its_slowest_point(
    case: Case,
) -> None:
    """Up to its slowest point, at every deadline of the grid the best point that meets it
    takes at least the best plan's energy (brute force) and at most 0.5 % more; every point's
    gap is to a true lower bound."""
    note(repr(case))  # hypothesis prints composite values blank
    bf = ref.brute_force(case.table, case.dag, case.p_block_w)
    resolution = 1e-3
    _, times, energies, gaps, _ = fast(case, resolution)
    assert rel(float(times[0]), bf.t_min) <= RTOL
    for d in np.arange(bf.t_min, float(times[-1]) + resolution / 2, resolution).tolist():
        energy = float(energies[np.flatnonzero(times <= d * (1 + RTOL))[-1]])
        best = bf.best(d)
        assert best * (1 - RTOL) <= energy <= best * (1 + NEAR), (d, energy, best)
    for i in range(len(times)):
        assert energies[i] / (1 + gaps[i]) <= bf.best(float(times[i])) * (1 + RTOL), i


# The relaxation's free optimum takes 0.4375 s, where the fast mode's deadlines stop; the
# minimum-energy plan (0.5 s, 24.25 J) lies beyond, off the hull, and the slowest point found
# is (0.4375 s, 24.375 J): 0.52 % more. compute_frontier solves problems this small exactly
# (test_frontier's MISSED_MIN_ENERGY and brute-force tests), so its frontiers are unaffected.
BEYOND_THE_FREE_OPTIMUM = Case(
    rows=(
        (0, "forward", 1980, 0.1875, 3.75), (0, "forward", 1965, 0.0625, 3.0625),
        (0, "backward", 1980, 0.125, 2.5), (0, "backward", 1965, 0.125, 2.5),
        (1, "forward", 1980, 0.125, 2.5), (1, "forward", 1965, 0.0625, 1.25),
        (1, "backward", 1980, 0.125, 2.5), (1, "backward", 1965, 0.0625, 1.25),
    ),
    stages=2, microbatches=2, p_block_w=33.0,
)  # fmt: skip


@pytest.mark.xfail(
    strict=True, reason="fast_frontier's deadlines stop at the relaxation's free optimum"
)
def test_the_slowest_point_is_near_the_minimum_energy_plan_beyond_the_free_optimum() -> None:
    case = BEYOND_THE_FREE_OPTIMUM
    bf = ref.brute_force(case.table, case.dag, case.p_block_w)
    _, times, energies, _, _ = fast(case, 1e-3)
    assert float(energies[-1]) <= bf.e_min * (1 + NEAR), (times[-1], energies[-1], bf.e_min)


@given(st.integers(1, 4 * ALL_ANCHORS_UP_TO))
@examples(30)
def test_anchors_include_the_no_slowdown_deadline(instructions: int) -> None:
    anchors = anchor_slowdowns(instructions)
    assert anchors[0] == 1.0, "no slowdown: the deadline most users pick"
    assert list(anchors) == sorted(set(anchors))
    assert set(anchors) <= set(ANCHOR_SLOWDOWNS)
    if instructions <= ALL_ANCHORS_UP_TO:
        assert anchors == ANCHOR_SLOWDOWNS
    else:  # large DAGs search at fewer deadlines
        assert len(anchors) < len(ANCHOR_SLOWDOWNS)


def test_progress_moves_with_the_work_and_never_back() -> None:
    """Fast mode reports thousandths weighted by where its time goes: the bar moves through
    the searches (most of the time), never back, and ends full (it sat near 0 % while the
    anchors were searched when the grid's deadlines were counted as equal units)."""
    profile = load_profile(Path(__file__).resolve().parents[2] / "perseus/data/example_profile.csv")
    calls: list[tuple[int, int]] = []
    compute_frontier(profile, make_schedule("1f1b", 4, 8), p_block_w=100.0,
                     progress=lambda done, total: calls.append((done, total)))  # fmt: skip
    done = [d for d, _ in calls]
    assert {t for _, t in calls} == {1000}
    assert done == sorted(done) and done[-1] == 1000
    assert len({d for d in done if 150 < d < 700}) >= 3  # anchors' searches, one by one


def test_a_large_dag_plans_the_same_frontier_every_run_and_every_point_replays() -> None:
    """Past 1,536 instructions (16 x 65 1F1B: 2,080) the relaxation runs on two models side by
    side, for the knots and the anchors' dives. Which model solves what, and from which basis,
    follows the order of the work, never the threads' timing: the frontier is the same in
    every run, and its points replay to what they state."""
    clocks = tuple(range(1980, 344, -15))[::11]
    profile = profile_from_rows(synthetic_profile(16, clocks, 0))
    schedule = make_schedule("1f1b", 16, 65)
    assert build_dag(schedule).size > 1536
    first = compute_frontier(profile, schedule, p_block_w=100.0)
    again = compute_frontier(profile, schedule, p_block_w=100.0)
    assert np.array_equal(first.times_s, again.times_s)
    assert np.array_equal(first.energies_j, again.energies_j)
    assert np.array_equal(first.frequencies_mhz, again.frequencies_mhz)
    for i in (0, len(first) // 2, -1):
        replayed = first.replay_point(profile, i)
        assert rel(replayed.time_s, float(first.times_s[i])) <= RTOL
        assert rel(replayed.energy_j, float(first.energies_j[i])) <= RTOL
    # (10 clocks: coarser options than a GPU's, so rounding leaves more than 110 would)
    assert float(first.gaps.max()) <= 0.02


def test_two_models_solve_the_adaptive_knots_two_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With two models, every round of adaptive knots keeps both busy while the budget
    allows: where only one interval is still curved enough, it gets two cuts. The knots are
    distinct, ascending, and bound V from below as tangents (V is convex)."""
    from perseus.solver import knots as knots_module
    from perseus.solver.programs import Relaxation

    profile = profile_from_rows(synthetic_profile(4, tuple(range(1980, 344, -15))[::11], 0))
    schedule = make_schedule("1f1b", 4, 16)
    dag = build_dag(schedule)
    costs = build_costs(profile, schedule, 100.0)
    planner = Planner(dag, costs)
    models = [Relaxation(dag, costs), Relaxation(dag, costs)]
    free = models[0].solve(None)
    t_fast = planner.fastest_time_s
    rounds: list[int] = []
    real = knots_module.side_by_side

    def counted(relaxations, jobs):  # type: ignore[no-untyped-def]
        rounds.append(len(jobs))
        return real(relaxations, jobs)

    monkeypatch.setattr(knots_module, "side_by_side", counted)
    # anchors close together: of the chain's intervals only the last, up to the free
    # optimum, is curved enough for another knot
    anchors = [(1 + k / 1000) * t_fast for k in range(1, 5)]
    knots = knots_module.relaxed_knots(models, t_fast, free, 1e-4, lambda d, t: None,
                                       fine=False, at=anchors)  # fmt: skip
    assert rounds == [2, 2]  # the two chains, then both adaptive knots at once
    assert len(knots) == 1 + len(anchors) + 1 + 2 + 1  # t_fast, the end, two more, free
    deadlines = [k.deadline_s for k in knots[:-1]]
    assert deadlines == sorted(set(deadlines))
    for k in knots[:-1]:
        for other in knots[:-1]:
            tangent = k.value_j + k.slope_j_per_s * (other.deadline_s - k.deadline_s)
            assert tangent <= other.value_j * (1 + 1e-9)


def test_a_fine_dag_whose_solves_share_two_threads_plans_the_same_frontier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From 1,024 instructions, where the process has two cores, a fine DAG's relaxation
    shares each dual simplex iteration among two threads (HiGHS's tasks): the same pivots,
    so the same frontier bit for bit as one thread's. Here on 4 x 24 (192), the threshold
    lowered to it."""
    from perseus.solver import fast as fast_module
    from perseus.solver.programs import Relaxation

    asked: list[int] = []  # each relaxation's threads

    class Counted(Relaxation):
        def __init__(self, dag, costs, threads=1):  # type: ignore[no-untyped-def]
            asked.append(threads)
            super().__init__(dag, costs, threads)

    monkeypatch.setattr(fast_module, "Relaxation", Counted)
    rows = tuple(synthetic_profile(4, tuple(range(1980, 344, -15))[::4], 0))
    case = Case(rows, stages=4, microbatches=24, p_block_w=100.0)
    one = fast(case)
    monkeypatch.setattr(fast_module, "_SHARED_SIMPLEX_FROM", 0)
    monkeypatch.setattr(fast_module, "_spare_cores", lambda: 2.0)  # an idle machine
    two = fast(case)
    assert asked[0] == 1 and asked[-1] == (2 if fast_module._cores() >= 2 else 1)
    for a, b in zip(one[1:], two[1:], strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_busy_machine_solves_each_relaxation_on_one_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the machine's load leaves no core idle, a large fine DAG's relaxation keeps one
    thread (HiGHS's threads would wait on each other a time slice at a time); with a core
    idle it takes two, on a process with two cores."""
    from perseus.solver import fast as fast_module

    monkeypatch.setattr(fast_module, "_cores", lambda: 2)
    monkeypatch.setattr(fast_module.os, "getloadavg", lambda: (1.6, 1.0, 1.0))
    assert fast_module._simplex_threads(1024, fine=True) == 1
    monkeypatch.setattr(fast_module.os, "getloadavg", lambda: (0.9, 1.0, 1.0))
    assert fast_module._simplex_threads(1024, fine=True) == 2
    assert fast_module._simplex_threads(1023, fine=True) == 1
    assert fast_module._simplex_threads(1024, fine=False) == 1
    monkeypatch.setattr(fast_module, "_cores", lambda: 1)
    assert fast_module._simplex_threads(1024, fine=True) == 1
