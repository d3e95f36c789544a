"""The exact problem of :mod:`perseus.solver.programs` as one MILP: its optimum equals brute
force, its pruning keeps every option of an optimal plan, and a given incumbent is never lost.

(The exact mode built on it, :mod:`perseus.solver.exact`, is checked in ``test_exact.py``, and
against the fast mode and an independent MILP in ``test_milp.py``.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note

from perseus.core.errors import SolverTimeout
from perseus.solver import build_costs, build_dag
from perseus.solver.planner import Planner
from perseus.solver.programs import ExactProgram

from . import reference as ref
from .cases import Case, cases, examples

TINY = cases(schedules=("1f1b", "gpipe", "interleaved-1f1b"), stages=(1, 2), microbatches=(1, 3),
             options=(1, 3), max_plans=5_000)  # fmt: skip


def _setup(case: Case) -> tuple[Planner, ExactProgram]:
    schedule = case.schedule()
    dag = build_dag(schedule)
    costs = build_costs(case.profile(), schedule, case.p_block_w)
    return Planner(dag, costs), ExactProgram(dag, costs)


@examples(25)
@given(TINY)
def test_the_optimum_equals_brute_force_and_its_plan_meets_the_deadline(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    planner, program = _setup(case)
    bf = ref.brute_force(case.table, case.dag, case.p_block_w)
    for factor in (1.0, 1.05, 1.2, 1.6):
        deadline = case.t_min * factor
        solution = program.solve(deadline)
        assert solution.optimal
        (time_s,), (energy_j,) = planner.evaluate(solution.choice[:, None])
        assert time_s <= deadline * (1 + 1e-9)
        best = bf.best(deadline)
        assert energy_j <= best * (1 + 1e-9) + 1e-9, (factor, energy_j, best)
        assert solution.bound_j <= energy_j * (1 + 1e-9) + 1e-9


@examples(20)
@given(TINY)
def test_pruning_keeps_the_options_of_a_plan_that_fits(case: Case) -> None:
    """``fits`` drops only options no plan meeting the deadline can use: the all-fastest
    plan's options and the optimum's always stay."""
    note(repr(case))
    planner, program = _setup(case)
    n = planner.dag.size
    columns = np.concatenate([[0], np.cumsum([planner.last[j] + 1 for j in range(n)])])
    for factor in (1.0, 1.1, 1.5):
        deadline = case.t_min * factor
        fits = program.fits(deadline)
        optimum = program.solve(deadline).choice
        for j in range(n):
            assert fits[columns[j]], (j, factor)  # the fastest option
            assert fits[columns[j] + optimum[j]], (j, factor)


@examples(20)
@given(TINY)
def test_an_incumbent_is_never_lost(case: Case) -> None:
    """A node limit of 1 stops the search at its root: the incumbent (the all-fastest plan)
    comes back, or a plan at least as good; no nodes at all is a SolverTimeout."""
    note(repr(case))
    planner, program = _setup(case)
    n = planner.dag.size
    fastest = np.zeros(n, dtype=np.int64)
    deadline = case.t_min * 1.3
    with pytest.raises(SolverTimeout):
        program.solve(deadline, node_limit=0, incumbent=fastest, allow_incomplete=True)
    solution = program.solve(deadline, node_limit=1, incumbent=fastest, allow_incomplete=True)
    (_,), (incumbent_energy,) = planner.evaluate(fastest[:, None])
    (time_s,), (energy_j,) = planner.evaluate(solution.choice[:, None])
    assert time_s <= deadline * (1 + 1e-9)
    assert energy_j <= incumbent_energy * (1 + 1e-12)
