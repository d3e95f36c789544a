"""The plan machinery of :mod:`perseus.solver.planner`: fit, refill, crossovers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from perseus.solver import build_costs, build_dag, make_schedule
from perseus.solver.planner import FIT_BINS_MAX, Planner

from .cases import Case, cases, examples

ALL_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")


def _planner(case: Case, **options: int) -> Planner:
    schedule = case.schedule()
    costs = build_costs(case.profile(), schedule, case.p_block_w)
    return Planner(build_dag(schedule), costs, **options)


@examples(40)
@given(cases(schedules=ALL_SCHEDULES, options=(2, 5)), st.data())
def test_refill_meets_the_ceiling_and_leaves_no_node_a_slower_option(case: Case, data) -> None:
    """From any plan (even one that overruns), refill meets the ceiling, and no single node
    could take its next slower option without breaking it: no slack is left unused."""
    note(repr(case))  # hypothesis prints composite values blank
    planner = _planner(case)
    n = planner.dag.size
    plan = np.asarray([data.draw(st.integers(0, int(planner.last[j]))) for j in range(n)])
    fastest = float(planner.evaluate(np.zeros((n, 1), dtype=np.int64))[0][0])
    ceiling = fastest * data.draw(st.floats(1.0, 1.5))
    refilled = planner.refill(plan[:, None], np.asarray([ceiling]))[:, 0]
    time_s = float(planner.evaluate(refilled[:, None])[0][0])
    assert time_s <= ceiling * (1 + 1e-12)
    # the time and energy the refill states are what evaluating its plan gives
    _, stated_time, stated_energy = planner.refill_evaluated(plan[:, None], np.asarray([ceiling]))
    assert float(stated_time[0]) == time_s
    assert float(stated_energy[0]) == pytest.approx(
        float(planner.evaluate(refilled[:, None])[1][0]), rel=1e-12
    )
    for j in range(n):
        if refilled[j] < planner.last[j]:
            slower = refilled.copy()
            slower[j] += 1
            assert float(planner.evaluate(slower[:, None])[0][0]) > ceiling * (1 + 1e-12), j


@examples(40)
@given(cases(schedules=ALL_SCHEDULES, options=(2, 6)), st.data(), st.booleans())
def test_fit_takes_the_slowest_option_within_the_room(case: Case, data, one_step: bool) -> None:
    """The vectorised fit (a table lookup per class, then one step, or steps until exact
    where option times are too close for a table of bounded size) equals a per-node search,
    also for rooms exactly at an option's time, a rounding step either side of it, a bin's
    edge, and infinite ones."""
    note(repr(case))  # hypothesis prints composite values blank
    planner = _planner(case, fit_bins_max=FIT_BINS_MAX if one_step else -1)
    if not one_step:
        assert not planner.one_step
    n = planner.dag.size
    rooms = np.empty((n, 10))
    _, scale, offset, low, _ = planner.fit_node
    for j in range(n):
        times = planner.class_times[planner.cls[j]]
        exact = float(times[data.draw(st.integers(0, len(times) - 1))])
        # a bin's lower edge (and a rounding step below it)
        edge = (float(low[j]) + 1 + data.draw(st.integers(0, 2000)) - offset[j]) / scale[j]
        rooms[j] = [exact, np.nextafter(exact, 0.0), np.nextafter(exact, np.inf),
                    exact * 0.5, exact * 3.0, data.draw(st.floats(-1.0, 10.0)),
                    edge, np.nextafter(edge, 0.0), np.inf, -np.inf]  # fmt: skip
    got, taken = planner.fit_times(planner.columns(np.arange(n)), rooms)
    for j in range(n):
        times = planner.class_times[planner.cls[j]]
        for p in range(rooms.shape[1]):
            fits = np.flatnonzero(times <= rooms[j, p])
            assert got[j, p] == (fits[-1] if len(fits) else 0), (j, p, rooms[j, p])
            assert taken[j, p] == times[got[j, p]]


def test_fit_on_the_real_profiles_is_one_step_and_exact(real_profile) -> None:
    """The measured profiles' option times are far enough apart for the one-step table, and
    its answers equal a search for rooms at, just around and between every option's time."""
    from perseus.solver import load_profile

    path, p_block_w = real_profile
    profile = load_profile(path)
    schedule = make_schedule("1f1b", profile.num_stages, 2)
    planner = Planner(build_dag(schedule), build_costs(profile, schedule, p_block_w))
    assert planner.one_step
    n = planner.dag.size
    for j in range(n):
        times = planner.class_times[planner.cls[j]]
        around = [np.nextafter(times, 0.0), np.nextafter(times, np.inf)]
        between = [(times[1:] + times[:-1]) / 2, np.linspace(0, 2 * times[-1], 4001)]
        rooms = np.concatenate([times, *around, *between])
        got, taken = planner.fit_times(planner.columns(np.full(len(rooms), j)), rooms[:, None])
        want = np.maximum(np.searchsorted(times, rooms, side="right") - 1, 0)
        assert np.array_equal(got[:, 0], want), (path.name, j)
        assert np.array_equal(taken[:, 0], times[want])


@examples(20)
@given(cases(schedules=ALL_SCHEDULES, options=(2, 5)), st.data())
def test_crossovers_mix_the_two_plans_node_by_node(case: Case, data) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    planner = _planner(case)
    n = planner.dag.size
    a = np.asarray([data.draw(st.integers(0, int(planner.last[j]))) for j in range(n)])
    b = np.asarray([data.draw(st.integers(0, int(planner.last[j]))) for j in range(n)])
    mixed = planner.crossovers(a[:, None], b[:, None])
    if np.array_equal(a, b):
        assert mixed.shape == (n, 0)
        return
    assert mixed.shape[1] > 0
    assert ((mixed == a[:, None]) | (mixed == b[:, None])).all()
    # from mostly the first plan to mostly the second within each node order
    share_of_b = (mixed == b[:, None]).sum(axis=0)
    per_order = mixed.shape[1] // 3
    for k in range(3):
        block = share_of_b[k * per_order : (k + 1) * per_order]
        assert (np.diff(block) >= 0).all()
