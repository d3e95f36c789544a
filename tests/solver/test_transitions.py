"""Clock-change transitions: the replay and the frontier with a margin, against the reference.

:func:`reference.replay_with_margin` re-derives the tail rule (``x`` seconds at the own pace,
``margin`` at the next) without importing perseus.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from perseus.errors import PlanError
from perseus.solver import (
    Policy,
    baselines_at,
    choose_point,
    compute_frontier,
    instruction_times_s,
    load_profile,
    make_schedule,
    replay,
)
from perseus.solver.transitions import with_tails

from . import reference as ref
from .cases import RTOL, Case, cases, examples, frequencies, rel

ALL_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")
MARGINS = st.sampled_from([0.001, 0.005, 0.02, 0.3])  # 0.3 s: whole instructions switch
EXAMPLE = "perseus/data/example_profile.csv"


@st.composite
def plans(draw: st.DrawFn, case: Case) -> list[list[int]]:
    """A random plan: every instruction at one of its own measured clocks."""
    return [
        [
            draw(st.sampled_from(sorted(f for (s, k, f) in case.table if s == g and k == kind)))
            for kind, _mb, _c in seq
        ]
        for g, seq in enumerate(case.order)
    ]


@examples(60)
@given(st.data(), cases(schedules=ALL_SCHEDULES, ragged=True), MARGINS)
def test_replay_with_margin_equals_the_reference(data, case: Case, margin: float) -> None:
    note(repr(case))
    plan = data.draw(plans(case))
    got = replay(
        case.profile(), case.schedule(), case.p_block_w, plan, clock_change_margin_s=margin
    )
    t, e, time_of = ref.replay_with_margin(case.table, case.dag, case.p_block_w, plan, margin)
    assert rel(got.time_s, t) <= RTOL and rel(got.energy_j, e) <= RTOL, (got, t, e)
    assert got.clock_change_margin_s == margin
    for g, row in enumerate(got.durations_s):
        for k, duration in enumerate(row):
            assert rel(duration, time_of[(g, k)]) <= RTOL, (g, k)
            assert rel(got.finish_s[g][k] - got.start_s[g][k], duration) <= 1e-6
    assert got.durations_s == instruction_times_s(
        case.profile(), case.schedule(), plan, clock_change_margin_s=margin
    )
    assert math.isclose(sum(got.busy_s), sum(map(sum, got.durations_s)), rel_tol=1e-12)


@examples(40)
@given(st.data(), cases(schedules=ALL_SCHEDULES, ragged=True))
def test_margin_zero_is_the_plain_replay_exactly(data, case: Case) -> None:
    """At margin 0 every duration is the profile's, and time and energy are the plain sums."""
    note(repr(case))
    plan = data.draw(plans(case))
    got = replay(case.profile(), case.schedule(), case.p_block_w, plan)
    zero = replay(case.profile(), case.schedule(), case.p_block_w, plan, clock_change_margin_s=0)
    assert got == zero
    own = ref.durations(case.table, case.dag, plan)
    assert got.durations_s == tuple(
        tuple(own[(g, k)][0] for k in range(len(seq))) for g, seq in enumerate(case.order)
    )
    # the margin-free replay, as it always summed: energies in order, then blocking power
    energy = 0.0
    for g, seq in enumerate(case.order):
        for k in range(len(seq)):
            energy += own[(g, k)][1]
    times = np.asarray([own[n][0] for n in sorted(own)])
    assert got.time_s == max(f for row in got.finish_s for f in row)
    assert rel(got.time_s, ref.longest_path(case.dag, {n: v[0] for n, v in own.items()})) <= 1e-12
    assert got.energy_j == energy + case.p_block_w * (case.stages * got.time_s - float(times.sum()))


@examples(40)
@given(st.data(), cases(schedules=ALL_SCHEDULES, ragged=True), MARGINS)
def test_one_clock_per_gpu_has_no_transitions(data, case: Case, margin: float) -> None:
    note(repr(case))
    shared = sorted(
        set.intersection(
            *(
                {f for (s, k, f) in case.table if (s, k) == (g, kind)}
                for g in range(case.stages)
                for kind in (ref.F, ref.B)
            )
        )
    )
    clock = data.draw(st.sampled_from(shared))
    plan = [[clock] * len(seq) for seq in case.order]
    profile, schedule = case.profile(), case.schedule()
    plain = replay(profile, schedule, case.p_block_w, plan)
    timed = replay(profile, schedule, case.p_block_w, plan, clock_change_margin_s=margin)
    assert (timed.time_s, timed.energy_j, timed.durations_s, timed.critical) == (
        plain.time_s,
        plain.energy_j,
        plain.durations_s,
        plain.critical,
    )


@examples(40)
@given(st.data(), cases(schedules=ALL_SCHEDULES, monotone=True), MARGINS)
def test_raises_shorten_and_lowerings_lengthen(data, case: Case, margin: float) -> None:
    """On a profile where a higher clock is never slower, an instruction before a raise never
    takes longer than at its own clock, and one before a lowering never shorter; the
    iteration is never slower than with every instruction at the faster of its two clocks,
    nor faster than at the slower."""
    note(repr(case))
    plan = data.draw(plans(case))
    got = replay(
        case.profile(), case.schedule(), case.p_block_w, plan, clock_change_margin_s=margin
    )
    own = ref.durations(case.table, case.dag, plan)
    for g, seq in enumerate(case.order):
        for k in range(len(seq)):
            here, there = plan[g][k], plan[g][(k + 1) % len(seq)]
            t = own[(g, k)][0]
            if there > here:
                assert got.durations_s[g][k] <= t * (1 + 1e-12)
            elif there < here:
                assert got.durations_s[g][k] >= t * (1 - 1e-12)
    fast = [[max(r[k], r[(k + 1) % len(r)]) for k in range(len(r))] for r in plan]
    slow = [[min(r[k], r[(k + 1) % len(r)]) for k in range(len(r))] for r in plan]
    fast_t, _ = case.replay(fast)
    slow_t, _ = case.replay(slow)
    assert fast_t * (1 - 1e-12) <= got.time_s <= slow_t * (1 + 1e-12)


@examples(60)
@given(
    st.floats(0.001, 1.0),
    st.floats(0.001, 1.0),
    st.floats(1.0, 500.0),
    st.floats(1.0, 500.0),
    st.floats(0.0, 0.99),
)
def test_a_tail_moves_toward_the_next_clock(
    t: float, t_next: float, p: float, p_next: float, margin: float
) -> None:
    """Time and energy lie between the instruction at its own and at the next clock, and
    the tail takes exactly ``margin`` seconds at the next pace while it fits."""
    got_t, got_e = with_tails(
        np.asarray([t]), np.asarray([t * p]), np.asarray([t_next]), np.asarray([t_next * p_next]),
        margin,
    )  # fmt: skip
    duration, energy = float(got_t[0]), float(got_e[0])
    assert min(t, t_next) * (1 - 1e-9) <= duration <= max(t, t_next) * (1 + 1e-9)
    lo, hi = sorted((t * p, t_next * p_next))
    assert lo * (1 - 1e-9) <= energy <= hi * (1 + 1e-9)
    if margin < t_next:
        own_s = duration - margin  # seconds at the own clock
        assert math.isclose(own_s / t + margin / t_next, 1.0, rel_tol=1e-9)
        assert math.isclose(energy, own_s * p + margin * p_next, rel_tol=1e-9)
    else:
        assert (duration, energy) == (t_next, t_next * p_next)


@pytest.mark.parametrize("margin", [-0.001, 1.0, math.inf, math.nan, True, "0.005"])
def test_bad_margins_are_refused(margin: object) -> None:
    profile = load_profile(EXAMPLE)
    schedule = make_schedule("1f1b", 4, 2)
    plan = [[1980] * len(seq) for seq in schedule.order]
    with pytest.raises(PlanError, match="clock-change margin"):
        replay(profile, schedule, 100.0, plan, clock_change_margin_s=margin)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="clock-change margin"):
        compute_frontier(profile, schedule, p_block_w=100.0, clock_change_margin_s=margin)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the frontier


def check_stated(case: Case, frontier, margin: float) -> None:
    """Monotone, every point and baseline truthful with its transitions, gaps >= 0."""
    times, energies = frontier.times_s, frontier.energies_j
    assert frontier.clock_change_margin_s == margin
    assert (np.diff(times) > 0).all() and (np.diff(energies) < 0).all()
    assert np.isfinite(frontier.gaps).all() and (frontier.gaps >= 0).all()
    assert times[0] >= case.t_min * (1 - RTOL)
    for i in range(len(frontier)):
        point = frontier.point(i)
        t, e, _ = ref.replay_with_margin(
            case.table, case.dag, case.p_block_w, frequencies(point), margin
        )
        assert rel(point.time_s, t) <= RTOL and rel(point.energy_j, e) <= RTOL, (i, t, e)
    for key, baseline in frontier.baselines.items():
        t, e, _ = ref.replay_with_margin(
            case.table, case.dag, case.p_block_w, baseline.frequencies_mhz, margin
        )
        assert rel(baseline.time_s, t) <= RTOL and rel(baseline.energy_j, e) <= RTOL, key
    # the no-slowdown point never takes longer than the default plan
    chosen = choose_point(frontier, Policy.parse("no-slowdown"))
    assert times[chosen] <= frontier.baselines["default"].time_s * (1 + RTOL)


@examples(25)
@given(cases(schedules=ALL_SCHEDULES, ragged=True), MARGINS)
def test_frontier_with_margin_is_truthful_and_monotone(case: Case, margin: float) -> None:
    note(repr(case))
    frontier = compute_frontier(
        case.profile(), case.schedule(), p_block_w=case.p_block_w, clock_change_margin_s=margin
    )
    check_stated(case, frontier, margin)


@examples(15)
@given(cases(schedules=ALL_SCHEDULES), MARGINS)
def test_baselines_at_with_margin_are_truthful(case: Case, margin: float) -> None:
    note(repr(case))
    deadline = case.t_min * 1.05
    for key, baseline in baselines_at(
        case.profile(), case.schedule(), case.p_block_w, deadline, clock_change_margin_s=margin
    ).items():
        t, e, _ = ref.replay_with_margin(
            case.table, case.dag, case.p_block_w, baseline.frequencies_mhz, margin
        )
        assert rel(baseline.time_s, t) <= RTOL and rel(baseline.energy_j, e) <= RTOL, key


def test_demo_frontier_with_the_default_margin() -> None:
    """The search is the margin-free one; the restated frontier keeps a no-slowdown point
    that saves energy, and margin 0 gives the margin-free frontier."""
    profile = load_profile(EXAMPLE)
    schedule = make_schedule("1f1b", 4, 8)
    plain = compute_frontier(profile, schedule, p_block_w=100.0)
    zero = compute_frontier(profile, schedule, p_block_w=100.0, clock_change_margin_s=0.0)
    for name in ("times_s", "energies_j", "gaps", "frequencies_mhz"):
        assert np.array_equal(getattr(plain, name), getattr(zero, name)), name
    assert plain.baselines == zero.baselines and plain.clock_change_margin_s == 0.0
    timed = compute_frontier(profile, schedule, p_block_w=100.0, clock_change_margin_s=0.005)
    default = timed.baselines["default"]
    assert default == plain.baselines["default"]  # one clock: no transitions
    chosen = choose_point(timed, Policy.parse("no-slowdown"))
    assert timed.times_s[chosen] <= default.time_s
    assert timed.energies_j[chosen] < 0.95 * default.energy_j
    for i in (0, chosen, len(timed) - 1):
        point = timed.point(i)
        again = replay(profile, schedule, 100.0, point.frequencies_mhz, clock_change_margin_s=0.005)
        assert math.isclose(again.time_s, point.time_s, rel_tol=1e-12)
        assert math.isclose(again.energy_j, point.energy_j, rel_tol=1e-12)
