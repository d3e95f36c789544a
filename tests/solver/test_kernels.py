"""The compiled loops of :mod:`perseus.solver.kernels` against plain-Python passes (skipped
where numba is not installed: see test_kernel_cache.py for the solver without it)."""

from __future__ import annotations

import bisect
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from perseus.solver import (
    build_costs,
    build_dag,
    compute_frontier,
    make_schedule,
)
from perseus.solver import planner as planner_module
from perseus.solver.planner import COMPILED_FROM, FIT_BINS_MAX, Planner
from perseus.solver.synthetic import example_profile
from perseus.solver.transitions import with_transitions

from .cases import Case, cases, examples

kernels = pytest.importorskip("perseus.solver.kernels", reason="numba is not installed")


def _fit(times: list[float], room: float) -> int:
    """The slowest option that takes at most ``room``; the fastest if none does."""
    return max(bisect.bisect_right(times, room) - 1, 0)


def _refill(planner: Planner, plan: np.ndarray, ceiling: float) -> tuple[list[int], float]:
    """The refill as its docstring states it, one node at a time in topological order."""
    dag = planner.dag
    n = dag.size
    times = [planner.class_times[int(c)].tolist() for c in dag.cost_class]
    chosen = [int(k) for k in plan]
    finish = [0.0] * (n + 1)
    for j in dag.topo.tolist():
        finish[j] = max(finish[int(i)] for i in dag.pred[j]) + times[j][chosen[j]]
    begin = [finish[j] - times[j][chosen[j]] for j in range(n)]
    latest = [0.0] * n + [ceiling]
    finish_by = [0.0] * n
    for j in reversed(dag.topo.tolist()):
        finish_by[j] = min(latest[int(k)] for k in dag.succ[j])
        chosen[j] = _fit(times[j], finish_by[j] - begin[j])
        latest[j] = finish_by[j] - times[j][chosen[j]]
    earliest = [0.0] * (n + 1)
    for j in dag.topo.tolist():
        start = max(earliest[int(i)] for i in dag.pred[j])
        chosen[j] = max(chosen[j], _fit(times[j], finish_by[j] - start))
        earliest[j] = start + times[j][chosen[j]]
    return chosen, max(earliest[:n])


@examples(30)
@given(
    cases(schedules=("1f1b", "gpipe", "interleaved-1f1b"), options=(2, 6)),
    st.data(),
    st.booleans(),
    st.integers(1, 40),
    st.booleans(),
)
def test_refill_equals_the_passes_one_node_at_a_time(
    case: Case, data: st.DataObject, one_step: bool, plans: int, compiled: bool
) -> None:
    """Plans side by side (compiled: in tiles, split into blocks across threads; or numpy, a
    level at a time) refill exactly as the passes do node by node, with the table's one-step
    fit or its stepping one, and state the time and energy that evaluating their plans gives."""
    note(repr(case))
    schedule = case.schedule()
    costs = build_costs(case.profile(), schedule, case.p_block_w)
    fit_bins_max = FIT_BINS_MAX if one_step else -1
    planner = Planner(build_dag(schedule), costs, fit_bins_max=fit_bins_max, compiled=compiled)
    n = planner.dag.size
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    choices = np.stack([rng.integers(0, planner.last + 1) for _ in range(plans)], axis=1)
    ceilings = planner.fastest_time_s * rng.uniform(0.95, 1.6, plans)
    refilled, total, energy = planner.refill_evaluated(choices, ceilings)
    assert refilled.shape == (n, plans)
    for p in range(plans):
        expected, expected_time = _refill(planner, choices[:, p], float(ceilings[p]))
        assert refilled[:, p].tolist() == expected
        assert float(total[p]) == expected_time
    evaluated_time, evaluated_energy = planner.evaluate(refilled)
    np.testing.assert_array_equal(total, evaluated_time)
    np.testing.assert_allclose(energy, evaluated_energy, rtol=1e-12)


@examples(20)
@given(
    cases(schedules=("1f1b", "interleaved-1f1b"), options=(2, 5)),
    st.integers(1, 9),
    st.booleans(),
)
def test_longest_path_equals_the_dag_finish_times(case: Case, plans: int, compiled: bool) -> None:
    note(repr(case))
    schedule = case.schedule()
    costs = build_costs(case.profile(), schedule, 0.0)
    planner = Planner(build_dag(schedule), costs, compiled=compiled)
    rng = np.random.default_rng(plans)
    durations = rng.uniform(0.001, 0.1, (planner.dag.size, plans))
    expected = planner.dag.finish_times(durations).max(axis=0)
    np.testing.assert_array_equal(planner.iteration_time(durations), expected)


@examples(40)
@given(
    cases(schedules=("1f1b", "interleaved-1f1b"), options=(2, 5)),
    st.integers(1, 70),
    st.sampled_from([np.int16, np.int64]),
)
def test_evaluate_compiled_equals_numpys(case: Case, plans: int, dtype: type) -> None:
    """The compiled evaluation of plans (any integer type, more than one tile of them; one
    plan numpy's way): the same times and energies, bit for bit, as numpy's."""
    note(repr(case))
    schedule = case.schedule()
    costs = build_costs(case.profile(), schedule, case.p_block_w)
    dag = build_dag(schedule)
    compiled, plain = Planner(dag, costs, compiled=True), Planner(dag, costs, compiled=False)
    rng = np.random.default_rng(plans)
    choices = np.stack([rng.integers(0, plain.last + 1) for _ in range(plans)], axis=1)
    got = compiled.evaluate(choices.astype(dtype))
    for a, b in zip(got, plain.evaluate(choices), strict=True):
        np.testing.assert_array_equal(a, b)


@examples(10)
@given(cases(schedules=("1f1b", "interleaved-1f1b"), options=(2, 5)), st.integers(2, 5))
def test_refill_on_threads_equals_one_block(case: Case, blocks: int) -> None:
    """Plans split into blocks refilled side by side on threads: the same as in one block."""
    note(repr(case))
    schedule = case.schedule()
    costs = build_costs(case.profile(), schedule, case.p_block_w)
    planner = Planner(build_dag(schedule), costs, compiled=True)
    rng = np.random.default_rng(blocks)
    choices = np.stack([rng.integers(0, planner.last + 1) for _ in range(70)], axis=1)
    ceilings = planner.fastest_time_s * rng.uniform(0.95, 1.6, 70)
    args = (planner.network, planner.fit_table, costs.energy_j, costs.p_block_w, costs.num_gpus)
    one = kernels.refill(choices, ceilings, *args, blocks=1)
    split = kernels.refill(choices, ceilings, *args, blocks=blocks)
    for a, b in zip(one, split, strict=True):
        np.testing.assert_array_equal(a, b)


@examples(50)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([1e-9, 0.004, 0.02, 0.5]),
    st.sampled_from([(7,), (40, 3), (5, 2, 4)]),
)
def test_transitions_compiled_equal_numpys(
    seed: int, margin: float, shape: tuple[int, ...]
) -> None:
    """The compiled transitions give numpy's values bit for bit: neighbours higher or not,
    shares under and over 1, one or both sides whole, subnormal and huge times."""
    rng = np.random.default_rng(seed)
    special = np.asarray([5e-324, 1e-310, 1e-300, margin, 2 * margin, 1e300])

    def times() -> np.ndarray:
        values = margin * rng.uniform(0.05, 5.0, shape)
        return np.where(rng.random(shape) < 0.15, rng.choice(special, shape), values)

    t, e = times(), rng.uniform(0.1, 50.0, shape)
    head = (rng.random(shape) < 0.5, times(), rng.uniform(0.1, 50.0, shape))
    tail = (rng.random(shape) < 0.5, times(), rng.uniform(0.1, 50.0, shape))
    with np.errstate(over="ignore", invalid="ignore"):
        expected = with_transitions(t, e, head, tail, margin)
    got = kernels.with_transitions(t, e, head, tail, margin)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == shape
        np.testing.assert_array_equal(a, b)


def test_after_warm_kernels_small_dags_plan_compiled_with_the_same_frontier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A planner server's worker loads the kernels ahead of its jobs (warm_kernels) and then
    plans small DAGs with them too: the same frontier, bit for bit, as numpy's passes."""
    monkeypatch.setitem(planner_module._kernel_state, "warm", False)  # restored afterwards
    profile = example_profile()
    schedule = make_schedule("1f1b", 4, 6)
    small = build_dag(schedule)
    assert small.size < COMPILED_FROM
    costs = build_costs(profile, schedule, 100.0)
    assert not Planner(small, costs).compiled
    before = compute_frontier(profile, schedule, p_block_w=100.0, clock_change_margin_s=2e-3)
    planner_module.warm_kernels()
    assert Planner(small, costs).compiled
    assert not Planner(small, costs, compiled=False).compiled  # an explicit choice stands
    after = compute_frontier(profile, schedule, p_block_w=100.0, clock_change_margin_s=2e-3)
    for field in ("times_s", "energies_j", "gaps", "frequencies_mhz"):
        np.testing.assert_array_equal(getattr(after, field), getattr(before, field))
    planner_module.warm_kernels()  # once is enough: a second call returns at once
    assert Planner(small, costs).compiled


_SIGNATURES = """
from perseus.solver import compute_frontier, kernels, make_schedule
from perseus.solver.planner import warm_kernels
from perseus.solver.synthetic import example_profile

dispatchers = (kernels._refill_block, kernels._refill_blocks, kernels._evaluate,
               kernels.longest_path, kernels._with_transitions)
assert warm_kernels()
print([len(d.signatures) for d in dispatchers])
for name, microbatches, chunks in (("1f1b", 6, 1), ("gpipe", 4, 1), ("interleaved-1f1b", 8, 2),
                                   ("interleaved-zb", 8, 2), ("zbv", 8, 2), ("dualpipev", 8, 2)):
    schedule = make_schedule(name, 4, microbatches, chunks)
    compute_frontier(example_profile(), schedule, p_block_w=100.0, clock_change_margin_s=5e-3)
print([len(d.signatures) for d in dispatchers])
"""


def test_warm_kernels_loads_every_kernel_a_plan_calls() -> None:
    """warm_kernels calls each kernel with the argument types plans use: in a fresh process,
    frontiers of every schedule afterwards (clock-change transitions included) compile no
    kernel again (each has the one signature warm_kernels gave it)."""
    lines = subprocess.run(
        [sys.executable, "-c", _SIGNATURES], check=True, capture_output=True, text=True,
        timeout=600,
    ).stdout.splitlines()  # fmt: skip
    assert lines == ["[1, 1, 1, 1, 1]", "[1, 1, 1, 1, 1]"]
