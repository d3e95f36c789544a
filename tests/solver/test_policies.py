"""Policies pick the documented frontier point; straggler what-if; bad policy text rejected."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from perseus.core.errors import InfeasibleDeadline, PolicyError
from perseus.solver import POLICY_KINDS, Policy, choose_point, compute_frontier, straggler_point

from .cases import RTOL, Case, cases, examples, frequencies, rel

SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")


def frontier_of(case: Case):
    return compute_frontier(case.profile(), case.schedule(), p_block_w=case.p_block_w)


def latest_within(times: np.ndarray, limit: float) -> int:
    """The largest-time point with time <= limit (the reading a user expects)."""
    return int(np.flatnonzero(times <= limit)[-1])


def clear_of_points(times: np.ndarray, limit: float) -> bool:
    """No point within rounding distance of the limit (so the expected answer is unambiguous)."""
    return bool(np.all(np.abs(times - limit) > 1e-9 * limit))


# ----------------------------------------------------------------------------- parsing


def test_kinds() -> None:
    assert set(POLICY_KINDS) == {"no-slowdown", "max-slowdown", "deadline", "min-energy",
                                 "zeus-cost"}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("no-slowdown", "no-slowdown", None),
        ("min-energy", "min-energy", None),
        ("max-slowdown:1.1", "max-slowdown", 1.1),
        ("max-slowdown:1", "max-slowdown", 1.0),
        ("deadline:0.5", "deadline", 0.5),
        ("deadline:2.75", "deadline", 2.75),
        ("zeus-cost:0.5", "zeus-cost", 0.5),
        ("zeus-cost:0", "zeus-cost", 0.0),
        ("zeus-cost:1", "zeus-cost", 1.0),
    ],
)
def test_parse_and_text(text: str, kind: str, value: float | None) -> None:
    policy = Policy.parse(text)
    assert policy == Policy(kind, value)
    assert Policy.parse(str(policy)) == policy
    if value is None or text.endswith(".1") or text.endswith(".5") or text.endswith(".75"):
        assert str(policy) == text


@examples(200)
@given(
    st.one_of(
        st.tuples(st.just("max-slowdown"), st.floats(1.0, 10.0)),
        st.tuples(st.just("deadline"), st.floats(1e-6, 1e4)),
        st.tuples(st.just("zeus-cost"), st.floats(0.0, 1.0)),
    )
)
def test_text_round_trips_for_every_value(kind_value: tuple[str, float]) -> None:
    """str(policy) is what a user saves in a config: parsing it must give the same policy."""
    policy = Policy(*kind_value)
    assert Policy.parse(str(policy)) == policy, str(policy)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "fast",
        "no_slowdown",
        "max-slowdown",
        "max-slowdown:",
        "max-slowdown:abc",
        "max-slowdown:0.99",
        "max-slowdown:-2",
        "max-slowdown:nan",
        "max-slowdown:inf",
        "deadline",
        "deadline:0",
        "deadline:-1",
        "deadline:inf",
        "deadline:nan",
        "deadline:1:2",
        "zeus-cost",
        "zeus-cost:-0.1",
        "zeus-cost:1.01",
        "zeus-cost:nan",
        "no-slowdown:1",
        "min-energy:0",
    ],
)
def test_invalid_policy_text(text: str) -> None:
    with pytest.raises(PolicyError):
        Policy.parse(text)


@pytest.mark.parametrize(
    ("kind", "value"),
    [("bogus", None), ("max-slowdown", None), ("max-slowdown", 0.5), ("deadline", -1.0),
     ("zeus-cost", 2.0), ("no-slowdown", 1.0), ("deadline", math.inf)],
)  # fmt: skip
def test_invalid_policy_object(kind: str, value: float | None) -> None:
    with pytest.raises(PolicyError):
        Policy(kind, value)


# ----------------------------------------------------------------------------- choosing


@examples(30)
@given(cases(schedules=SCHEDULES), st.data())
def test_choose_point(case: Case, data: st.DataObject) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    frontier = frontier_of(case)
    times = frontier.times_s
    n = len(frontier)
    # no slowdown: the default plan's time (every instruction at the highest clock)
    reference = frontier.baselines["default"].time_s
    assert frontier.reference_time_s == max(reference, float(times[0]))
    reference = frontier.reference_time_s
    assert choose_point(frontier, Policy("no-slowdown")) == latest_within(times, reference)
    assert choose_point(frontier, Policy("min-energy")) == n - 1
    # max-slowdown: the largest-time point within FACTOR x the default plan's time
    top = max(float(times[-1] / reference), 1.0)
    factors = [1.0, 1.0 + 1e-12, top + 1e-6, 1e3]
    factors += [data.draw(st.floats(1.0, top * 1.1)) for _ in range(5)]
    for factor in factors:
        limit = factor * reference
        if factor > 1.0 + 1e-6 and not clear_of_points(times, limit):
            continue
        assert choose_point(frontier, Policy("max-slowdown", factor)) == latest_within(
            times, limit
        ), factor
    # deadline: the largest-time point within SECONDS; exactly at a point's time picks it
    for i in range(n):
        assert choose_point(frontier, Policy("deadline", float(times[i]))) == i
    for _ in range(5):
        d = data.draw(st.floats(float(times[0]), float(times[-1]) * 1.2))
        if clear_of_points(times, d):
            assert choose_point(frontier, Policy("deadline", d)) == latest_within(times, d)
    # a deadline below the fastest point is infeasible
    for d in (float(times[0]) * (1 - 1e-6), float(times[0]) / 2):
        with pytest.raises(InfeasibleDeadline):
            choose_point(frontier, Policy("deadline", d))


@examples(30)
@given(cases(schedules=SCHEDULES), st.data())
def test_straggler_point_and_energy_at(case: Case, data: st.DataObject) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    frontier = frontier_of(case)
    times, energies = frontier.times_s, frontier.energies_j
    stretched = [float(times[0]), float(times[-1]), float(times[-1]) * 1.5]
    stretched += [data.draw(st.floats(float(times[0]), float(times[-1]) * 1.3)) for _ in range(5)]
    for t_prime in stretched:
        if t_prime not in (times[0], times[-1]) and not clear_of_points(times, t_prime):
            continue
        i = straggler_point(frontier, t_prime)
        assert i == latest_within(times, t_prime)
        # stretched energy: the plan's own energy plus blocking power for the extra time
        for k in range(i + 1):
            expected = energies[k] + case.stages * case.p_block_w * (t_prime - times[k])
            assert rel(frontier.energy_at(k, t_prime), float(expected)) <= RTOL
        # ... equal to an independent replay padded to T', and the chosen point is the cheapest
        t, e = case.replay(frequencies(frontier.point(i)))
        padded = e + case.p_block_w * case.stages * (t_prime - t)
        assert rel(frontier.energy_at(i, t_prime), padded) <= 1e-8
        assert frontier.energy_at(i, t_prime) <= min(
            frontier.energy_at(k, t_prime) for k in range(i + 1)
        ) * (1 + RTOL)
    with pytest.raises(InfeasibleDeadline):
        straggler_point(frontier, float(times[0]) * 0.99)
    with pytest.raises(InfeasibleDeadline):  # a point cannot be squeezed below its own time
        frontier.energy_at(len(frontier) - 1, float(times[-1]) * 0.99)


@examples(30)
@given(cases(schedules=SCHEDULES))
def test_zeus_cost(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    frontier = frontier_of(case)
    times, energies = frontier.times_s, frontier.energies_j
    n = len(frontier)
    assert choose_point(frontier, Policy("zeus-cost", 0.0)) == 0  # time only
    assert choose_point(frontier, Policy("zeus-cost", 1.0)) == n - 1  # energy only
    etas = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0]
    picks = [choose_point(frontier, Policy("zeus-cost", eta)) for eta in etas]
    assert picks == sorted(picks), "more weight on energy never picks a faster point"
    # the documented cost: ETA * E + (1 - ETA) * P_max * T, P_max being the whole pipeline's
    # average power in the fastest plan
    p_max = float(energies[0]) / float(times[0])
    for eta, pick in zip(etas, picks, strict=True):
        cost = eta * energies + (1 - eta) * p_max * times
        assert cost[pick] <= cost.min() * (1 + 1e-12), (eta, pick, int(np.argmin(cost)))
