"""The cluster budget's choice (perseus.solver.cluster) against brute force on small cases."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perseus.core.errors import PolicyError
from perseus.solver.cluster import JobPoints, choose_under_budget, point_powers_w


@st.composite
def _job(draw: st.DrawFn, name: str) -> JobPoints:
    n = draw(st.integers(1, 6))
    steps = draw(st.lists(st.floats(0.001, 0.5), min_size=n, max_size=n))
    times = tuple(itertools.accumulate(steps, initial=1.0))[1:]
    # energies mostly falling with time, as on a frontier, with some noise a front cuts away
    energies = [draw(st.floats(50.0, 400.0))]
    for _ in range(n - 1):
        energies.append(energies[-1] * draw(st.floats(0.8, 1.05)))
    replicas = draw(st.integers(1, 4))
    return JobPoints(
        name,
        times,
        point_powers_w(times, energies, replicas),
        policy_index=draw(st.integers(0, n - 1)),
        priority=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])),
    )


@st.composite
def _case(draw: st.DrawFn) -> tuple[list[JobPoints], float, float]:
    jobs = [draw(_job(f"j{i}")) for i in range(draw(st.integers(1, 4)))]
    least = sum(min(j.powers_w[j.policy_index :]) for j in jobs)
    most = sum(j.powers_w[j.policy_index] for j in jobs)
    fixed = draw(st.sampled_from([0.0, 10.0]))
    budget = fixed + draw(st.floats(0.8, 1.1)) * (least + draw(st.floats(0, 1)) * (most - least))
    return jobs, budget, fixed


def _brute(jobs: list[JobPoints], budget: float, fixed: float) -> float | None:
    best = None
    for choice in itertools.product(*(range(j.policy_index, len(j.times_s)) for j in jobs)):
        power = fixed + math.fsum(j.powers_w[k] for j, k in zip(jobs, choice, strict=True))
        if power <= budget - 1e-6:
            cost = math.fsum(j.priority * j.slowdown(k) for j, k in zip(jobs, choice, strict=True))
            best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=300, deadline=None)
@given(_case())
def test_the_choice_is_the_least_weighted_slowdown_that_fits(
    case: tuple[list[JobPoints], float, float],
) -> None:
    jobs, budget, fixed = case
    choice = choose_under_budget(jobs, budget, fixed_power_w=fixed)
    for job, k in zip(jobs, choice.indices, strict=True):
        assert k >= job.policy_index  # never faster than the job's own policy
    best = _brute(jobs, budget, fixed)
    policy_power = fixed + sum(j.powers_w[j.policy_index] for j in jobs)
    if policy_power <= budget:
        assert choice.indices == tuple(j.policy_index for j in jobs)
        assert choice.weighted_slowdown == 0.0
    elif best is None:
        least = fixed + sum(min(j.powers_w[j.policy_index :]) for j in jobs)
        if least > budget:
            assert not choice.meetable
            assert choice.power_w == pytest.approx(least)
            assert choice.shortfall_w == pytest.approx(least - budget)
    else:
        assert choice.meetable
        assert choice.power_w <= budget
        assert choice.weighted_slowdown == pytest.approx(best, abs=1e-9)


def test_no_budget_pressure_keeps_every_policy_and_an_unmeetable_one_is_said() -> None:
    a = JobPoints("a", (1.0, 1.1, 1.3), (300.0, 250.0, 200.0), policy_index=0)
    b = JobPoints("b", (2.0, 2.2), (100.0, 90.0), policy_index=1, priority=2.0)
    assert choose_under_budget([a, b], 1e9).indices == (0, 1)
    loose = choose_under_budget([a, b], 345.0)
    assert loose.indices == (1, 1) and loose.meetable
    assert loose.weighted_slowdown == pytest.approx(0.1)
    tight = choose_under_budget([a, b], 100.0, fixed_power_w=5.0)
    assert not tight.meetable and tight.indices == (2, 1)
    assert tight.shortfall_w == pytest.approx(200.0 + 90.0 + 5.0 - 100.0)


def test_bad_jobs_and_budgets_are_refused_by_name() -> None:
    with pytest.raises(PolicyError, match=r"job 'x'.*ascending"):
        JobPoints("x", (2.0, 1.0), (1.0, 1.0), policy_index=0)
    with pytest.raises(PolicyError, match="priority"):
        JobPoints("x", (1.0,), (1.0,), policy_index=0, priority=0.0)
    with pytest.raises(PolicyError, match="budget"):
        choose_under_budget([], math.nan)
