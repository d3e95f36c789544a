"""The convex relaxation of :mod:`perseus.solver.relaxation`: ``V(D)`` convex, non-increasing
and a lower bound of every plan's energy (brute force), its slope a subgradient, its dives
plans that meet the deadline."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from perseus.core.errors import InfeasibleDeadline
from perseus.solver import build_costs, build_dag, make_schedule, profile_from_rows
from perseus.solver.planner import Planner
from perseus.solver.relaxation import Relaxation, side_by_side
from perseus.solver.synthetic import EXAMPLE_P_BLOCK_W, example_profile

from . import reference as ref
from .cases import RTOL, Case, cases, examples

ALL_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")
SMALL = cases(schedules=ALL_SCHEDULES, stages=(1, 3), microbatches=(1, 4), options=(1, 4))
TINY = cases(schedules=ALL_SCHEDULES, stages=(1, 2), microbatches=(1, 3), options=(1, 3),
             max_plans=5_000)  # fmt: skip


def relaxation_of(case: Case) -> Relaxation:
    schedule = case.schedule()
    return Relaxation(build_dag(schedule), build_costs(case.profile(), schedule, case.p_block_w))


def deadlines(case: Case, relaxation: Relaxation, count: int = 9) -> list[float]:
    """From the all-fastest time (the reference's) to past the free optimum's time."""
    free = relaxation.solve(None)
    end = max(free.iteration_time_s * 1.1, case.t_min * 1.05)
    return np.linspace(case.t_min, end, count).tolist()


def scale(case: Case, relaxation: Relaxation) -> float:
    return max(abs(relaxation.solve(case.t_min).value_j), 1.0)


@examples(25)
@given(SMALL)
def test_value_is_convex_and_non_increasing_and_its_slope_a_subgradient(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    relaxation = relaxation_of(case)
    tol = 1e-7 * scale(case, relaxation)
    points = [relaxation.solve(d) for d in deadlines(case, relaxation)]
    values = [p.value_j for p in points]
    assert all(b <= a + tol for a, b in itertools.pairwise(values)), values
    chords = [(b.value_j - a.value_j) / (b.deadline_s - a.deadline_s)
              for a, b in itertools.pairwise(points)]  # fmt: skip
    step = points[1].deadline_s - points[0].deadline_s
    assert all(b >= a - 2 * tol / step for a, b in itertools.pairwise(chords)), chords
    for p in points:
        assert p.slope_j_per_s <= 0
        assert p.iteration_time_s <= p.deadline_s * (1 + RTOL)
        # the tangent at every solved deadline lies below V everywhere
        for q in points:
            tangent = p.value_j + p.slope_j_per_s * (q.deadline_s - p.deadline_s)
            assert tangent <= q.value_j + tol, (p.deadline_s, q.deadline_s)
    free = relaxation.solve(None)
    assert free.slope_j_per_s == 0.0
    assert free.value_j <= min(values) + tol


@examples(25)
@given(SMALL)
def test_a_solve_at_a_slope_lands_on_v_where_that_slope_is_a_subgradient(case: Case) -> None:
    """``solve_at_slope(p)`` (no deadline, the iteration time costing ``p`` more) returns V at
    the deadline it lands on, ``-p`` a subgradient there: its tangent lies below V at every
    deadline, and solving at its deadline gives its value (where V is straight it may land
    anywhere along it); the model's own costs are back afterwards."""
    note(repr(case))  # hypothesis prints composite values blank
    relaxation = relaxation_of(case)
    tol = 1e-7 * scale(case, relaxation)
    points = [relaxation.solve(d) for d in deadlines(case, relaxation, 5)]
    free_value = relaxation.solve(None).value_j
    for a, b in itertools.pairwise(points):
        power = (a.value_j - b.value_j) / (b.deadline_s - a.deadline_s)
        k = relaxation.solve_at_slope(power)
        assert relaxation.iterations >= 0
        assert k.slope_j_per_s == -power
        assert k.deadline_s == k.iteration_time_s
        assert k.value_j == pytest.approx(relaxation.solve(k.deadline_s).value_j, abs=tol)
        for q in points:
            tangent = k.value_j + k.slope_j_per_s * (q.deadline_s - k.deadline_s)
            assert tangent <= q.value_j + tol, (power, q.deadline_s)
        assert k.flow is not None
        values, slopes = relaxation.lines([k.flow, k.flow], mixes=(0.0,), scales=(1.0,))
        assert float(values[0] + slopes[0] * k.deadline_s) == pytest.approx(k.value_j, abs=tol)
    assert relaxation.solve(None).value_j == pytest.approx(free_value, abs=tol)


@examples(25)
@given(SMALL)
def test_lines_of_mixed_flows_bound_v_and_touch_it_at_the_solves(case: Case) -> None:
    """Every line of :meth:`Relaxation.lines` lies below V at every deadline (weak duality),
    and at a solve's own deadline the best of them is V (its flow's line is its tangent)."""
    note(repr(case))  # hypothesis prints composite values blank
    relaxation = relaxation_of(case)
    tol = 1e-7 * scale(case, relaxation)
    points = [relaxation.solve(d) for d in deadlines(case, relaxation, 7)]
    flows = [p.flow for p in points[::3]]
    assert all(f is not None for f in flows)
    values, slopes = relaxation.lines(flows)  # type: ignore[arg-type]
    assert len(values) == len(slopes) == (len(flows) - 1) * 17 * 5
    for p in points:
        best = float(np.max(values + slopes * p.deadline_s))
        assert best <= p.value_j + tol, (p.deadline_s, best, p.value_j)
    for p in points[::3]:
        best = float(np.max(values + slopes * p.deadline_s))
        assert best == pytest.approx(p.value_j, abs=tol), p.deadline_s


def test_lines_of_mixed_flows_bound_v_closer_than_the_tangents() -> None:
    """Between two distant solves, midway, the mixed flows' best line is much closer to V
    than the better of the two tangents."""
    rows = [(g, kind, f, t * (1 + 0.3 * g) * (2 if kind == "backward" else 1), e)
            for g in range(3) for kind in ("forward", "backward")
            for f, t, e in ((1980, 0.05, 12.0), (1700, 0.058, 10.6), (1500, 0.066, 9.9),
                            (1300, 0.077, 9.5), (1100, 0.09, 9.3))]  # fmt: skip
    profile, schedule = profile_from_rows(rows), make_schedule("1f1b", 3, 6)
    relaxation = Relaxation(build_dag(schedule), build_costs(profile, schedule, 20.0))
    free = relaxation.solve(None)
    low = relaxation.solve(free.iteration_time_s * 0.8)
    high = relaxation.solve(free.iteration_time_s * 0.99)
    middle = 0.5 * (low.deadline_s + high.deadline_s)
    v = relaxation.solve(middle).value_j
    tangent = max(s.value_j + s.slope_j_per_s * (middle - s.deadline_s) for s in (low, high))
    values, slopes = relaxation.lines([low.flow, high.flow])  # type: ignore[list-item]
    mixed = float(np.max(values + slopes * middle))
    assert tangent <= mixed <= v * (1 + 1e-9)
    assert v - mixed < 0.5 * (v - tangent), (v, mixed, tangent)


@examples(30)
@given(TINY)
def test_value_is_a_lower_bound_of_the_exact_optimum(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    bf = ref.brute_force(case.table, case.dag, case.p_block_w)
    relaxation = relaxation_of(case)
    tol = 1e-9 * scale(case, relaxation)
    for d in deadlines(case, relaxation, 6):
        assert relaxation.solve(d).value_j <= bf.best(d) + tol, d
    assert relaxation.solve(None).value_j <= bf.e_min + tol


@examples(25)
@given(SMALL, st.floats(0.0, 0.5), st.sampled_from([0.05, 0.25, 1.0]))
def test_a_dive_returns_options_whose_plan_meets_the_deadline(
    case: Case, where: float, fraction: float
) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    schedule = case.schedule()
    dag = build_dag(schedule)
    costs = build_costs(case.profile(), schedule, case.p_block_w)
    relaxation = Relaxation(dag, costs)
    planner = Planner(dag, costs)
    free = relaxation.solve(None)
    deadline = case.t_min + where * max(free.iteration_time_s - case.t_min, 0.0)
    option_times = [costs.times_of(int(c)) for c in dag.cost_class]
    before = relaxation.solve(deadline)
    choice = relaxation.dive(deadline, option_times, fraction)
    assert choice.shape == (dag.size,)
    assert all(0 <= k < len(t) for k, t in zip(choice.tolist(), option_times, strict=True))
    (time_s,), (energy_j,) = planner.evaluate(choice[:, None])
    assert time_s <= deadline * (1 + RTOL)
    assert energy_j >= before.value_j - 1e-9 * max(abs(energy_j), 1.0)
    # the dive fixes nothing for good: the relaxation solves as before afterwards
    after = relaxation.solve(deadline)
    assert after.value_j == pytest.approx(before.value_j, rel=1e-9, abs=1e-9)
    # starting from a solution already at hand, with one round, also meets it
    first = relaxation.dive(deadline, option_times, fraction, rounds=1, first=before)
    assert planner.evaluate(first[:, None])[0][0] <= deadline * (1 + RTOL)


@examples(20)
@given(SMALL)
def test_a_deadline_below_the_all_fastest_time_is_infeasible(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    relaxation = relaxation_of(case)
    # 0.1 % below: HiGHS's feasibility tolerance is absolute (1e-7), so a deadline a hair
    # below the all-fastest time (1e-6 of 0.09 s) still passes as met
    with pytest.raises(InfeasibleDeadline):
        relaxation.solve(case.t_min * (1 - 1e-3))
    at = relaxation.solve(case.t_min)  # the all-fastest time itself is feasible
    assert at.iteration_time_s <= case.t_min * (1 + RTOL)


def test_weighted_relaxation_scales_the_slopes_only_inside_the_block() -> None:
    """Inside ``weighted`` the relaxation optimises the scaled energy slopes (doubling every
    slope doubles what slowing saves, so the value moves); outside it, the real ones."""
    rows = [(g, kind, f, t * (1 + 0.2 * g) * (2 if kind == "backward" else 1), e)
            for g in range(2) for kind in ("forward", "backward")
            for f, t, e in ((1980, 0.05, 12.0), (1500, 0.07, 10.0), (1200, 0.09, 9.5))]  # fmt: skip
    profile, schedule = profile_from_rows(rows), make_schedule("1f1b", 2, 3)
    dag = build_dag(schedule)
    relaxation = Relaxation(dag, build_costs(profile, schedule, 20.0))
    plain = relaxation.solve(None)
    with relaxation.weighted(np.full(dag.size, 2.0)):
        doubled = relaxation.solve(None)
    again = relaxation.solve(None)
    assert doubled.value_j < plain.value_j - 1e-6
    assert again.value_j == pytest.approx(plain.value_j, rel=1e-12)


@examples(10)
@given(SMALL)
def test_two_models_side_by_side_solve_as_one_does(case: Case) -> None:
    """Job k runs on model k % 2, each model's jobs in order on a thread; the results come
    back in the jobs' order and equal one model's (the optimum's value is unique)."""
    one, two = relaxation_of(case), [relaxation_of(case), relaxation_of(case)]
    points = deadlines(case, one, 5)
    threads: list[tuple[int, str]] = []

    def job(k: int, deadline_s: float):  # type: ignore[no-untyped-def]
        def run(relaxation: Relaxation):  # type: ignore[no-untyped-def]
            threads.append((k, threading.current_thread().name))
            assert relaxation is two[k % 2]
            return relaxation.solve(deadline_s)

        return run

    got = side_by_side(two, [job(k, d) for k, d in enumerate(points)])
    alone = [one.solve(d) for d in points]
    tol = RTOL * scale(case, one)
    assert [g.deadline_s for g in got] == points
    for g, a in zip(got, alone, strict=True):
        assert g.value_j == pytest.approx(a.value_j, abs=tol)
    for m in range(2):  # each model's jobs in order, on one thread (not this one)
        mine = [(j, n) for j, n in threads if j % 2 == m]
        assert [j for j, _ in mine] == list(range(m, len(points), 2))
        assert len({n for _, n in mine}) == 1
        assert threading.current_thread().name not in {n for _, n in mine}
    # one model: the jobs in order on the calling thread
    threads.clear()
    side_by_side([two[0]], [job(0, points[0])])
    assert threads == [(0, threading.current_thread().name)]


def test_an_error_in_one_model_reaches_the_caller() -> None:
    rows = [(0, kind, f, t, e) for kind in ("forward", "backward")
            for f, t, e in ((1980, 0.05, 12.0), (1500, 0.07, 10.0))]  # fmt: skip
    profile, schedule = profile_from_rows(rows), make_schedule("1f1b", 1, 2)
    dag = build_dag(schedule)
    models = [Relaxation(dag, build_costs(profile, schedule, 20.0)) for _ in range(2)]
    with pytest.raises(InfeasibleDeadline):
        side_by_side(models, [lambda r: r.solve(None), lambda r: r.solve(0.01)])


def test_a_model_sharing_its_iterations_among_threads_solves_bit_for_bit_as_one() -> None:
    """HiGHS's dual simplex with tasks (``threads=2``) takes the serial one's pivots: the
    same knots, slopes, bases and dive, bit for bit. It solves on a thread of its own, so a
    single-threaded model still solves on this one afterwards (HiGHS sizes one pool of
    threads per calling thread, and refuses a model that asks for another size there)."""
    profile = example_profile()
    schedule = make_schedule("1f1b", 4, 24)
    dag = build_dag(schedule)
    costs = build_costs(profile, schedule, EXAMPLE_P_BLOCK_W)
    planner = Planner(dag, costs)
    options = [planner.class_times[int(c)][planner.hull[int(c)]] for c in dag.cost_class]
    got = []
    for threads in (1, 2):
        relaxation = Relaxation(dag, costs, threads=threads)
        free = relaxation.solve(None)
        points = np.linspace(planner.fastest_time_s, free.iteration_time_s, 6)
        knots = [relaxation.solve(float(d)) for d in points]
        dive = relaxation.dive(float(points[2]), options, 0.1)
        got.append((free, knots, dive))
    (free_1, knots_1, dive_1), (free_2, knots_2, dive_2) = got
    for a, b in zip([free_1, *knots_1], [free_2, *knots_2], strict=True):
        assert (a.value_j, a.slope_j_per_s, a.iteration_time_s) == (
            b.value_j, b.slope_j_per_s, b.iteration_time_s)  # fmt: skip
        np.testing.assert_array_equal(a.durations_s, b.durations_s)
        assert list(a.basis.col_status) == list(b.basis.col_status)
    np.testing.assert_array_equal(dive_1, dive_2)
    # and a single-threaded model still solves on this thread
    assert Relaxation(dag, costs).solve(None).value_j == free_1.value_j
