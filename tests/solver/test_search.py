"""The local search of :mod:`perseus.solver.search`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from perseus.solver import build_costs, build_dag
from perseus.solver.planner import Planner
from perseus.solver.search import local_search, moves, restarts, searched

from .cases import Case, cases, examples

ALL_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")


def _planner(case: Case, **options: int) -> Planner:
    schedule = case.schedule()
    costs = build_costs(case.profile(), schedule, case.p_block_w)
    return Planner(build_dag(schedule), costs, **options)


@examples(25)
@given(cases(schedules=ALL_SCHEDULES, options=(2, 5)), st.floats(1.0, 1.3))
def test_local_search_never_ends_worse_than_it_starts(case: Case, slack: float) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    planner = _planner(case)
    n = planner.dag.size
    deadline = float(planner.evaluate(np.zeros((n, 1), dtype=np.int64))[0][0]) * slack
    start = planner.refill(np.zeros((n, 1), dtype=np.int64), np.asarray([deadline]))[:, 0]
    end = local_search(planner, start.copy(), deadline, 10**6)
    _, (e0,) = planner.evaluate(start[:, None])
    (t1,), (e1,) = planner.evaluate(end[:, None])
    assert t1 <= deadline * (1 + 1e-12)
    assert e1 <= e0 * (1 + 1e-12), (e0, e1)
    # with work to spare it stops at a local optimum: no single move of its own improves
    nodes, options = moves(planner, end)
    for j, k in zip(nodes.tolist(), options.tolist(), strict=True):
        moved = end.copy()
        moved[j] = k
        moved = planner.refill(moved[:, None], np.asarray([deadline]))
        (t2,), (e2,) = planner.evaluate(moved)
        assert t2 > deadline * (1 + 1e-12) or e2 >= e1 * (1 - 1e-12), (j, k, e1, e2)


@examples(25)
@given(cases(schedules=ALL_SCHEDULES, options=(2, 5)), st.floats(1.0, 1.3))
def test_local_search_before_the_refill_leaves_no_slack_and_never_ends_worse(
    case: Case, slack: float
) -> None:
    """The search over hull plans before the refill returns a refilled plan (no node can
    take a slower option), meeting the deadline, no worse than its start refilled."""
    note(repr(case))  # hypothesis prints composite values blank
    planner = _planner(case)
    n = planner.dag.size
    deadline = float(planner.evaluate(np.zeros((n, 1), dtype=np.int64))[0][0]) * slack
    ceiling = np.asarray([deadline])
    start = np.asarray([planner.hull[c][-1] for c in planner.cls])  # all slowest: overruns
    end = local_search(planner, start.copy(), deadline, 10**6, raw=True)
    _, (e0,) = planner.evaluate(planner.refill(start[:, None], ceiling))
    (t1,), (e1,) = planner.evaluate(end[:, None])
    assert t1 <= deadline * (1 + 1e-12)
    assert e1 <= e0 * (1 + 1e-12), (e0, e1)
    assert np.array_equal(planner.refill(end[:, None], ceiling)[:, 0], end)
    # the state it stopped in (hull options, to go on from) is what the plan was refilled from
    state = local_search(planner, start.copy(), deadline, 10**6, raw=True, keep_state=True)
    assert all(state[j] in planner.hull[planner.cls[j]] for j in range(n))
    assert np.array_equal(planner.refill(state[:, None], ceiling)[:, 0], end)
    # going on from it, with the work left over or more, never ends worse
    more, _ = searched(planner, state, deadline, 10**6)
    assert float(planner.evaluate(more[:, None])[1][0]) <= e1 * (1 + 1e-12)


@examples(20)
@given(cases(schedules=ALL_SCHEDULES, options=(2, 5)), st.floats(1.0, 1.2))
def test_restarts_keep_the_best_plan_and_leave_the_relaxation_as_it_was(
    case: Case, slack: float
) -> None:
    """The restarted searches (from relaxations with scaled slopes) return a plan meeting the
    deadline, no worse than the plan they were given; afterwards the relaxation solves as
    before (its costs and basis restored, so later dives are unaffected)."""
    from perseus.solver.programs import Relaxation

    note(repr(case))  # hypothesis prints composite values blank
    planner = _planner(case)
    n = planner.dag.size
    deadline = float(planner.evaluate(np.zeros((n, 1), dtype=np.int64))[0][0]) * slack
    relaxation = Relaxation(planner.dag, planner.costs)
    before = relaxation.solve(deadline)
    given_plan = planner.refill(np.zeros((n, 1), dtype=np.int64), np.asarray([deadline]))[:, 0]
    best = restarts(planner, relaxation, deadline, 10**5, given_plan)
    (t1,), (e1,) = planner.evaluate(best[:, None])
    _, (e0,) = planner.evaluate(given_plan[:, None])
    assert t1 <= deadline * (1 + 1e-12)
    assert e1 <= e0 * (1 + 1e-12), (e0, e1)
    after = relaxation.solve(deadline)
    assert after.value_j == pytest.approx(before.value_j, rel=1e-9)
    assert np.allclose(after.durations_s, before.durations_s, rtol=1e-9, atol=1e-12)
