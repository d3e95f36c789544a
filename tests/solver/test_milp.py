"""Small cases (too big for brute force): fast mode against the exact (MILP) mode.

The exact mode itself is checked against brute force in ``test_frontier.py`` and, here, against
an MILP written independently in :mod:`reference` at both ends of the frontier.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, note

import perseus
from perseus.core.errors import PlanError, SolverTimeout
from perseus.solver import compute_frontier, load_profile, make_schedule

from . import reference as ref
from .cases import NEAR, RTOL, Case, cases, examples, grid, query, rel
from .test_frontier import check_frontier

SMALL = cases(
    stages=(2, 3),
    microbatches=(3, 4),
    options=(2, 4),
    schedules=("1f1b", "gpipe", "interleaved-1f1b"),
)

# Found by this suite (shrunk by hypothesis); kept so they are always checked.
NEAR_MISS_1F1B = Case(
    rows=(
        (0, "forward", 1980, 0.125, 2.5), (0, "forward", 1965, 0.0625, 1.25),
        (0, "backward", 1980, 0.125, 2.5), (0, "backward", 1965, 0.125, 2.5),
        (1, "forward", 1980, 0.1875, 3.75), (1, "forward", 1965, 0.1796875, 4.1328125),
        (1, "backward", 1980, 0.078125, 1.5625), (1, "backward", 1965, 0.0625, 1.4375),
    ),
    stages=2, microbatches=3, p_block_w=10.0,
)  # fmt: skip


@examples(25)
@given(SMALL)
@example(NEAR_MISS_1F1B)
def test_small_fast_within_half_percent_of_exact(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    profile, schedule = case.profile(), case.schedule()
    exact = compute_frontier(profile, schedule, p_block_w=case.p_block_w, exact=True)
    fast = compute_frontier(profile, schedule, p_block_w=case.p_block_w)
    check_frontier(case, exact)
    check_frontier(case, fast)
    end = max(float(exact.times_s[-1]), float(fast.times_s[-1]))
    for d in grid(case.t_min, end, 1e-3):
        e_exact = float(exact.energies_j[query(exact, d)])  # type: ignore[index]
        e_fast = float(fast.energies_j[query(fast, d)])  # type: ignore[index]
        assert e_exact <= e_fast * (1 + RTOL), (d, e_exact, e_fast)
        assert e_fast <= e_exact * (1 + NEAR), (d, e_exact, e_fast, e_fast / e_exact - 1)
    # a fast point's gap is to a true lower bound at every grid deadline it answers
    for d in grid(case.t_min, end, 1e-3):
        i = query(fast, d)
        bound = float(fast.energies_j[i]) / (1 + float(fast.gaps[i]))  # type: ignore[index]
        assert bound <= float(exact.energies_j[query(exact, d)]) * (1 + RTOL), (d, i)  # type: ignore[index]
    # both ends against an independent MILP
    slowest = ref.milp_min_energy(case.table, case.dag, case.p_block_w)
    assert slowest is not None
    assert rel(float(exact.energies_j[-1]), slowest[1]) <= 1e-7, (exact.energies_j[-1], slowest)
    fastest = ref.milp_min_energy(case.table, case.dag, case.p_block_w, case.t_min * (1 + 1e-12))
    assert fastest is not None
    if fastest[0] <= case.t_min * (1 + RTOL):
        assert rel(float(exact.energies_j[0]), fastest[1]) <= 1e-7, (exact.energies_j[0], fastest)
    else:  # HiGHS' feasibility tolerance let the reference overrun: it is only a lower bound
        assert exact.energies_j[0] >= fastest[1] * (1 - 1e-7)


@examples(25)
@given(SMALL)
def test_small_fast_slowest_point_is_the_minimum_energy_plan(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    fast = compute_frontier(case.profile(), case.schedule(), p_block_w=case.p_block_w)
    slowest = ref.milp_min_energy(case.table, case.dag, case.p_block_w)
    assert slowest is not None
    assert rel(float(fast.energies_j[-1]), slowest[1]) <= 1e-7, (fast.energies_j[-1], slowest)


DEMO = Path(perseus.__file__).parent / "data" / "example_profile.csv"


def test_highs_says_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    """Neither the exact mode nor the polish lets HiGHS print (it runs in-process: fd level)."""
    profile = load_profile(DEMO)
    compute_frontier(profile, make_schedule("1f1b", 4, 1), p_block_w=100.0, polish_s=0.2)
    compute_frontier(NEAR_MISS_1F1B.profile(), NEAR_MISS_1F1B.schedule(), p_block_w=10.0,
                     exact=True, exact_time_limit_s=30.0)  # fmt: skip
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_exact_refuses_a_large_problem_at_once_with_an_estimate() -> None:
    profile = load_profile(DEMO)
    with pytest.raises(SolverTimeout, match=r"estimated to need at least \d+ s .*fast mode"):
        compute_frontier(profile, make_schedule("1f1b", 4, 8), p_block_w=100.0, exact=True,
                         exact_time_limit_s=1.0)  # fmt: skip
    with pytest.raises(PlanError):
        compute_frontier(profile, make_schedule("1f1b", 4, 8), p_block_w=100.0, exact=True,
                         exact_time_limit_s=0.0)  # fmt: skip


@examples(10)
@given(SMALL)
def test_exact_with_a_time_limit_it_meets_is_the_exact_frontier(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    profile, schedule = case.profile(), case.schedule()
    plain = compute_frontier(profile, schedule, p_block_w=case.p_block_w, exact=True)
    limited = compute_frontier(profile, schedule, p_block_w=case.p_block_w, exact=True,
                               exact_time_limit_s=120.0)  # fmt: skip
    check_frontier(case, limited)
    end = max(float(plain.times_s[-1]), float(limited.times_s[-1]))
    for d in grid(case.t_min, end, 1e-3):
        a = float(plain.energies_j[query(plain, d)])  # type: ignore[index]
        b = float(limited.energies_j[query(limited, d)])  # type: ignore[index]
        assert rel(a, b) <= 1e-7, (d, a, b)
