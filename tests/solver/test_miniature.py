"""The miniature of :mod:`perseus.solver.miniature`: its bases, repeated over the full DAG, put
every column and row in the place it stands for, and start the full relaxation nearer its
optimum than a cold start, at the same optimum."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perseus.core.errors import InfeasibleDeadline, PerseusError
from perseus.solver import (
    build_costs,
    build_dag,
    compute_frontier,
    make_schedule,
    profile_from_rows,
)
from perseus.solver.dag import PipelineDag
from perseus.solver.frontier import Frontier
from perseus.solver.miniature import Extension, Miniature, _maps, _Router
from perseus.solver.planner import Planner
from perseus.solver.profiles import Profile
from perseus.solver.relaxation import Relaxation
from perseus.solver.schedules import SCHEDULE_NAMES, Schedule, schedule_from_actions
from perseus.solver.synthetic import synthetic_profile

from .cases import RTOL

CLOCKS = tuple(range(1980, 344, -15))[::11]


def relaxation_of(name: str, stages: int, microbatches: int, chunks: int = 1) -> Relaxation:
    schedule = make_schedule(name, stages, microbatches, chunks)
    profile = profile_from_rows(synthetic_profile(stages, CLOCKS, 0))
    return Relaxation(build_dag(schedule), build_costs(profile, schedule, 100.0))


def places(dag: PipelineDag) -> list[tuple[int, int, int, int]]:
    """Each node's (gpu, kind, chunk, microbatch), independently of the module's arrays."""
    return [
        (g, int(dag.kind[dag.offsets[g] + k]), i.chunk, i.microbatch)
        for g, seq in enumerate(dag.schedule.order)
        for k, i in enumerate(seq)
    ]


def row_places(dag: PipelineDag) -> tuple[list[int], list[int]]:
    """Per precedence row, in precedence_rows' order, its node and predecessor (-1: a
    source's row); the sink rows after them left out."""
    nodes, preds = [], []
    for j in range(dag.size):
        for p in [int(p) for p in dag.pred[j] if p != dag.size] or [-1]:
            nodes.append(j)
            preds.append(p)
    return nodes, preds


def planned_twice_alike(profile: Profile, schedule: Schedule) -> Frontier:
    """``schedule``'s frontier, checked to be the same on a second run and to replay (three
    of its points) to what it states."""
    first = compute_frontier(profile, schedule, p_block_w=100.0)
    again = compute_frontier(profile, schedule, p_block_w=100.0)
    assert np.array_equal(first.times_s, again.times_s)
    assert np.array_equal(first.energies_j, again.energies_j)
    for i in (0, len(first) // 2, -1):
        replayed = first.replay_point(profile, i)
        assert abs(replayed.time_s / float(first.times_s[i]) - 1) <= RTOL
        assert abs(replayed.energy_j / float(first.energies_j[i]) - 1) <= RTOL
    return first


@pytest.mark.parametrize(
    ("name", "stages", "microbatches", "chunks"),
    [("1f1b", 4, 40, 1), ("gpipe", 3, 40, 1), ("interleaved-1f1b", 4, 48, 2)],
)
def test_every_column_and_row_maps_to_the_same_place_a_whole_period_back(
    name: str, stages: int, microbatches: int, chunks: int
) -> None:
    """Every node maps to the miniature's node of the same GPU, kind and chunk, its
    microbatch moved back by whole periods; every precedence row to the row of the mapped
    node whose predecessor is the original predecessor moved back as far; segments to the
    same segment of the mapped node."""
    big = relaxation_of(name, stages, microbatches, chunks)
    dag = big.dag
    miniature = Miniature.of(big)
    assert miniature is not None
    small = miniature.relaxation
    period = 1 if chunks == 1 else stages
    columns, rows = _maps(big, small, period)
    n, m = dag.size, small.dag.size
    here, there = places(dag), places(small.dag)
    assert (columns[: n + 1] >= 0).all()
    for j in range(n):
        g, kind, chunk, k = here[j]
        g2, kind2, chunk2, k2 = there[columns[j]]
        assert (g, kind, chunk) == (g2, kind2, chunk2)
        assert k2 <= k and (k - k2) % period == 0
    assert columns[n] == m
    segments = columns[n + 1 :] - (m + 1)
    own = small.segment_node[segments]
    assert np.array_equal(own, columns[big.segment_node])
    assert np.array_equal(
        segments - small.segment_start[own],
        np.arange(big.num_segments) - big.segment_start[big.segment_node],
    )
    row_node, row_pred = row_places(dag)
    small_node, small_pred = row_places(small.dag)
    assert (rows[: len(row_node)] >= 0).mean() > 0.99
    for r in np.flatnonzero(rows[: len(row_node)] >= 0):
        s = rows[r]
        assert small_node[s] == columns[row_node[r]]
        if row_pred[r] < 0:
            assert small_pred[s] < 0
            continue
        shift = here[row_node[r]][3] - there[small_node[s]][3]
        g, kind, chunk, k = here[row_pred[r]]
        assert there[small_pred[s]] == (g, kind, chunk, k - shift)
    sinks = rows[len(row_node) :]
    assert (sinks >= len(small_node)).all()


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_the_full_relaxation_reaches_its_own_optimum_from_the_miniature_in_fewer_pivots(
    name: str,
) -> None:
    """On every schedule, the start changes where HiGHS's dual simplex begins, not where it
    ends: the same value and iteration time as a cold start, in under half the iterations
    (counts, not seconds: HiGHS runs single-threaded and deterministic)."""
    chunks = 1 if name in ("1f1b", "gpipe") else 2
    seeded = relaxation_of(name, 4, 64, chunks)
    miniature = Miniature.of(seeded)
    assert miniature is not None
    fast = Planner(seeded.dag, seeded.costs).fastest_time_s
    for slowdown in (None, 1.0, 1.05):
        deadline = None if slowdown is None else slowdown * fast
        cold = relaxation_of(name, 4, 64, chunks)
        expected = cold.solve(deadline)
        seeded.start_from(miniature.basis(slowdown))
        got = seeded.solve(deadline)
        assert got.value_j == pytest.approx(expected.value_j, rel=1e-9)
        assert got.iteration_time_s == pytest.approx(expected.iteration_time_s, rel=RTOL)
        assert seeded.iterations < cold.iterations / 2, (slowdown, seeded.iterations)


@pytest.mark.parametrize(("name", "chunks"), [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_starts_matched_by_steady_state_reach_the_same_optimum(name: str, chunks: int) -> None:
    """:meth:`Miniature.basis_at` (a deadline) and :meth:`Miniature.basis_at_slope` (a slope
    of V) start the full relaxation where its dual simplex reaches its own optimum: the same
    value as a cold start. At a deadline the miniature is solved where its iteration time
    plus its middle period times the full schedule's extra periods is the deadline: below
    the same slowdown of its own all-fastest time."""
    seeded = relaxation_of(name, 4, 64, chunks)
    miniature = Miniature.of(seeded)
    assert miniature is not None
    fast = Planner(seeded.dag, seeded.costs).fastest_time_s
    small = miniature.relaxation
    small_fast = Planner(small.dag, small.costs).fastest_time_s
    cold = relaxation_of(name, 4, 64, chunks)
    for slowdown in (1.02, 1.05):
        deadline = slowdown * fast
        expected = cold.solve(deadline)
        seeded.start_from(miniature.basis_at(deadline, fast))
        matched = small.finish_times()
        small_deadline = float(np.max(matched))
        assert small_fast <= small_deadline < slowdown * small_fast
        got = seeded.solve(deadline)
        assert got.value_j == pytest.approx(expected.value_j, rel=1e-9)
        power = -expected.slope_j_per_s
        seeded.start_from(miniature.basis_at_slope(power))
        at_slope = seeded.solve_at_slope(power)
        assert at_slope.value_j == pytest.approx(cold.solve(at_slope.deadline_s).value_j, rel=1e-9)


def test_no_miniature_where_none_saves_anything() -> None:
    """Too few microbatches to leave any out, or a schedule built from its own action lists
    (no smaller one of the same shape to build): None."""
    short = relaxation_of("1f1b", 4, 30)
    assert Miniature.of(short) is None
    full = relaxation_of("1f1b", 4, 48)
    actions = full.dag.schedule.actions()
    actions[0][1], actions[0][2] = actions[0][2], actions[0][1]  # forwards 1 and 2 swapped
    own = build_dag(schedule_from_actions("1f1b", actions))
    assert Miniature.of(Relaxation(own, full.costs)) is None


def test_a_large_dag_plans_from_the_miniature_the_same_frontier_every_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The large-DAG path (two models; here from 0 instructions) solves its free optimum and
    its chains' first knots from the miniature's bases: the frontier is the same in every
    run and its points replay to what they state."""
    from perseus.solver import fast as fast_module

    monkeypatch.setattr(fast_module, "_FINE_KNOTS_UP_TO", 0)
    calls: list[float | None] = []
    matched: list[float] = []
    real, real_at = Miniature.basis, Miniature.basis_at

    def counted(self: Miniature, slowdown: float | None) -> object:
        calls.append(slowdown)
        return real(self, slowdown)

    def counted_at(self: Miniature, deadline_s: float, full_fast_s: float) -> object:
        matched.append(deadline_s / full_fast_s)
        return real_at(self, deadline_s, full_fast_s)

    monkeypatch.setattr(Miniature, "basis", counted)
    monkeypatch.setattr(Miniature, "basis_at", counted_at)
    profile = profile_from_rows(synthetic_profile(4, CLOCKS, 0))
    schedule = make_schedule("1f1b", 4, 80)  # the miniature 4 x 25: under _MATCHED_SHARE
    first = planned_twice_alike(profile, schedule)
    # the free optimum and the all-fastest deadline, then 1.05 x default (where the upper
    # chain starts on large DAGs) where the steady states match (in each of the two runs)
    assert calls == [None, 1.0] * 2
    assert len(matched) == 2 and matched[0] == pytest.approx(1.05, rel=0.01)
    # the large path's few knots and coarse dives on 10 clocks: 3.4 % (3.5 % without the
    # miniature)
    assert float(first.gaps.max()) <= 0.05


def test_a_miniature_that_fails_to_solve_loses_only_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the miniature's solve fails, the full relaxation solves as it would without one:
    the same frontier as with no miniature at all."""
    from perseus.solver import fast as fast_module

    monkeypatch.setattr(fast_module, "_FINE_KNOTS_UP_TO", 0)
    profile = profile_from_rows(synthetic_profile(4, CLOCKS, 0))
    schedule = make_schedule("1f1b", 4, 48)

    def failing(self: Miniature, *args: object) -> object:
        raise InfeasibleDeadline("the miniature's deadline")

    for method in ("basis", "basis_at", "basis_at_slope"):
        monkeypatch.setattr(Miniature, method, failing)
    failed = compute_frontier(profile, schedule, p_block_w=100.0)
    monkeypatch.setattr(Miniature, "of", classmethod(lambda cls, *args: None))
    without = compute_frontier(profile, schedule, p_block_w=100.0)
    assert np.array_equal(failed.times_s, without.times_s)
    assert np.array_equal(failed.energies_j, without.energies_j)


def extension_of(microbatches: int = 64, edge_extra: int = 4) -> tuple[Relaxation, Extension]:
    """A 1F1B 4-stage relaxation and its extension (a miniature of 4 + edge_extra
    microbatches on each edge)."""
    relaxation = relaxation_of("1f1b", 4, microbatches)
    miniature = Miniature.of(relaxation, edge_extra)
    assert miniature is not None
    fast = Planner(relaxation.dag, relaxation.costs).fastest_time_s
    return relaxation, Extension(miniature, fast)


def test_a_routed_flow_is_conserved_and_keeps_a_conserved_flows_inflows() -> None:
    """The router returns a conserved flow (its imbalance HiGHS's tolerance), and given the
    inflows of the full relaxation's own optimal flow, that flow's inflows again."""
    relaxation, _ = extension_of()
    fast = Planner(relaxation.dag, relaxation.costs).fastest_time_s
    router = _Router(relaxation)
    for deadline in (fast, 1.05 * fast):
        solved = relaxation.solve(deadline)
        assert solved.flow is not None
        routed = relaxation.flow_of(router.route(solved.flow.node_w, solved.durations_s))
        assert routed.imbalance_w <= 1e-7 * solved.flow.total_w
        np.testing.assert_allclose(routed.node_w, solved.flow.node_w, atol=1e-6, rtol=1e-9)
        # any nonnegative inflows: still conserved
        rng = np.random.default_rng(0)
        noisy = solved.flow.node_w * rng.uniform(0.5, 1.5, relaxation.dag.size)
        assert relaxation.flow_of(router.route(noisy, solved.durations_s)).imbalance_w <= (
            1e-7 * solved.flow.total_w
        )


def test_an_extension_bounds_v_from_below_and_close() -> None:
    """Each extended solve's line lies below ``V`` at its own deadline and at others (weak
    duality: it is a conserved flow's), within 0.5 % of it at the deadline; its durations,
    repeated from the miniature, finish near the deadline."""
    relaxation, extension = extension_of()
    fast = Planner(relaxation.dag, relaxation.costs).fastest_time_s
    reference = relaxation_of("1f1b", 4, 64)
    others = [f * fast for f in (1.0, 1.03, 1.1, 1.3)]
    exact = {d: reference.solve(d).value_j for d in others}
    for slowdown in (1.0, 1.02, 1.05, 1.2):
        deadline = slowdown * fast
        got = extension.solve(deadline)
        v = reference.solve(deadline).value_j
        assert got.deadline_s == deadline
        assert got.value_j <= v * (1 + 1e-9)
        assert got.value_j >= v * (1 - 0.005), (slowdown, got.value_j / v)
        assert got.flow is not None and got.flow.imbalance_w <= 1e-7 * got.flow.total_w
        assert got.iteration_time_s == pytest.approx(deadline, rel=0.01)
        for other, value in exact.items():
            assert got.value_j + got.slope_j_per_s * (other - deadline) <= value * (1 + 1e-9)
    free = extension.solve(None)
    assert free.slope_j_per_s == 0.0 and free.deadline_s == math.inf
    assert free.value_j <= reference.solve(None).value_j * (1 + 1e-9)
    at_slope = extension.solve_at_slope(-extension.solve(1.1 * fast).slope_j_per_s)
    assert at_slope.value_j <= reference.solve(at_slope.deadline_s).value_j * (1 + 1e-9)


def test_an_extensions_dive_repeats_the_miniatures_plan() -> None:
    """A dive picks, for every node, the miniature's choice in its place: every microbatch
    of the repeated middle alike, the plan within each node's options."""
    relaxation, extension = extension_of()
    planner = Planner(relaxation.dag, relaxation.costs)
    times = [planner.class_times[c][planner.hull[c]] for c in planner.cls]
    deadline = 1.03 * planner.fastest_time_s
    on_hull = extension.dive(deadline, times, 0.5, 2)
    assert on_hull.shape == (relaxation.dag.size,)
    assert ((on_hull >= 0) & (on_hull < [len(t) for t in times])).all()
    place = places(relaxation.dag)
    middle: dict[tuple[int, int, int], set[int]] = {}
    for j, (g, kind, chunk, k) in enumerate(place):
        if 20 <= k < 44:  # the repeated middle of 4 x 64 (edges of 8 microbatches)
            middle.setdefault((g, kind, chunk), set()).add(int(on_hull[j]))
    assert middle and all(len(choices) == 1 for choices in middle.values())


@pytest.fixture
def extended_everywhere(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """The large-DAG path with extensions from 0 instructions; the deadlines they solved."""
    from perseus.solver import fast as fast_module
    from perseus.solver import knots as knots_module

    monkeypatch.setattr(fast_module, "_FINE_KNOTS_UP_TO", 0)
    monkeypatch.setattr(knots_module, "_EXTEND_FROM", 0)
    solved: list[float | None] = []
    real = Extension.solve

    def counted(self: Extension, deadline_s: float | None, start: object = None) -> object:
        solved.append(deadline_s)
        return real(self, deadline_s, start)  # type: ignore[arg-type]

    monkeypatch.setattr(Extension, "solve", counted)
    return solved


def test_the_extended_path_plans_the_same_frontier_every_run_and_it_replays(
    extended_everywhere: list[float | None],
) -> None:
    """With extensions (two, side by side), the frontier is the same in every run, its
    points replay to what they state and its gaps stay small; a GPipe schedule (no steady
    state a microbatch long) solves the full relaxation instead."""
    profile = profile_from_rows(synthetic_profile(4, CLOCKS, 0))
    schedule = make_schedule("1f1b", 4, 96)
    first = planned_twice_alike(profile, schedule)
    assert None in extended_everywhere and len(extended_everywhere) >= 8  # 4+ a run
    assert float(first.gaps.max()) <= 0.05
    extended_everywhere.clear()
    compute_frontier(profile, make_schedule("gpipe", 4, 96), p_block_w=100.0)
    assert extended_everywhere == []


def test_an_extension_whose_miniature_fails_solves_the_full_relaxation(
    extended_everywhere: list[float | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the miniature's solves or the routing fail, each call solves a full relaxation
    instead: the frontier is still whole, truthful and as close to its bound."""

    def failing(*args: object, **kwargs: object) -> object:
        raise PerseusError("the miniature failed")

    monkeypatch.setattr(Miniature, "matched", failing)
    monkeypatch.setattr(_Router, "route", failing)
    profile = profile_from_rows(synthetic_profile(4, CLOCKS, 0))
    frontier = compute_frontier(profile, make_schedule("1f1b", 4, 96), p_block_w=100.0)
    assert extended_everywhere
    replayed = frontier.replay_point(profile, len(frontier) // 2)
    mid = float(frontier.energies_j[len(frontier) // 2])
    assert abs(replayed.energy_j / mid - 1) <= RTOL
    assert float(frontier.gaps.max()) <= 0.05
