"""Clock-change transitions: the replay and the frontier with a margin, against the reference.

:func:`reference.replay_with_margin` re-derives the rule (the lower-clocked instruction of a
pair runs ``margin`` seconds next to the boundary at the higher clock: ``x`` seconds at its own
pace, ``margin`` at each higher neighbour's) without importing perseus.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from perseus.core.errors import PlanError
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
from perseus.solver.transitions import with_transitions

from . import reference as ref
from .cases import RTOL, SHARED_PROFILES, Case, cases, examples, frequencies, rel

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


def monotone_energy(case: Case) -> Case:
    """``case`` with every (stage, kind)'s energies re-sorted to rise with the clock."""
    rows = []
    for stage, kind in sorted({(r[0], r[1]) for r in case.rows}):
        mine = sorted((r for r in case.rows if (r[0], r[1]) == (stage, kind)), key=lambda r: r[2])
        energies = sorted(r[4] for r in mine)
        rows += [(s, k, f, t, e) for (s, k, f, t, _e), e in zip(mine, energies, strict=True)]
    return dataclasses.replace(case, rows=tuple(rows))


@examples(40)
@given(st.data(), cases(schedules=ALL_SCHEDULES, monotone=True), MARGINS)
def test_no_instruction_is_slower_than_its_profile_time(data, case: Case, margin: float) -> None:
    """On a profile where a higher clock is never slower, no instruction takes longer than at
    its own clock (it only ever borrows a higher one), so no iteration is slower than without
    transitions, nor faster than with every instruction at the highest clock of its
    neighbourhood; where energy also rises with the clock, the energy is at least the plain
    one less the blocking power of the time saved."""
    note(repr(case))
    case = monotone_energy(case) if data.draw(st.booleans()) else case
    plan = data.draw(plans(case))
    got = replay(
        case.profile(), case.schedule(), case.p_block_w, plan, clock_change_margin_s=margin
    )
    own = ref.durations(case.table, case.dag, plan)
    for g, seq in enumerate(case.order):
        for k in range(len(seq)):
            assert got.durations_s[g][k] <= own[(g, k)][0] * (1 + 1e-12), (g, k)
            if max(plan[g][k - 1], plan[g][(k + 1) % len(seq)]) <= plan[g][k]:
                assert got.durations_s[g][k] == own[(g, k)][0]  # no higher neighbour
    plain_t, plain_e = case.replay(plan)
    assert got.time_s <= plain_t * (1 + 1e-12)
    fast = [[max(r[k - 1], r[k], r[(k + 1) % len(r)]) for k in range(len(r))] for r in plan]
    fast_t, _ = case.replay(fast)
    assert fast_t * (1 - 1e-12) <= got.time_s
    rising = all(
        a[4] <= b[4]
        for a in case.rows
        for b in case.rows
        if (a[0], a[1]) == (b[0], b[1]) and a[2] < b[2]
    )
    if rising:
        saved = case.p_block_w * case.stages * (plain_t - got.time_s)
        assert got.energy_j >= (plain_e - saved) * (1 - 1e-9)


@examples(40)
@given(st.data(), cases(schedules=ALL_SCHEDULES, ragged=True), MARGINS)
def test_every_instruction_mixes_its_own_and_its_higher_neighbours_options(
    data, case: Case, margin: float
) -> None:
    """An adjusted instruction lies within the range of its own option and its options at
    its higher neighbours' clocks (nearest measured), on any profile."""
    note(repr(case))
    plan = data.draw(plans(case))
    got = replay(
        case.profile(), case.schedule(), case.p_block_w, plan, clock_change_margin_s=margin
    )
    _t, _e, time_of = ref.replay_with_margin(case.table, case.dag, case.p_block_w, plan, margin)
    for g, seq in enumerate(case.order):
        for k, (kind, _mb, _c) in enumerate(seq):
            measured = [f for (s, kd, f) in case.table if (s, kd) == (g, kind)]
            clocks = [plan[g][k]] + [
                min(measured, key=lambda f, h=h: (abs(f - h), -f))
                for h in (plan[g][k - 1], plan[g][(k + 1) % len(seq)])
                if h > plan[g][k]
            ]
            times = [case.table[(g, kind, f)][0] / case.chunks for f in clocks]
            duration = got.durations_s[g][k]
            assert min(times) * (1 - 1e-9) <= duration <= max(times) * (1 + 1e-9), (g, k)
            assert rel(duration, time_of[(g, k)]) <= RTOL


@examples(80)
@given(
    st.floats(0.001, 1.0),
    st.tuples(st.booleans(), st.floats(0.001, 1.0), st.floats(1.0, 500.0)),
    st.tuples(st.booleans(), st.floats(0.001, 1.0), st.floats(1.0, 500.0)),
    st.floats(1.0, 500.0),
    st.floats(0.0, 0.99),
)
def test_heads_and_tails_take_margin_seconds_at_the_higher_clocks(
    t: float,
    head: tuple[bool, float, float],
    tail: tuple[bool, float, float],
    p: float,
    margin: float,
) -> None:
    """``x`` seconds at the own pace and ``margin`` at each higher neighbour's do all the
    work; where they cannot, the same seconds at each higher clock do."""
    sides = [(on, th, ph) for on, th, ph in (head, tail) if on]

    def side(on: bool, th: float, ph: float) -> tuple:
        return np.asarray([on]), np.asarray([th]), np.asarray([th * ph])

    got_t, got_e = with_transitions(
        np.asarray([t]), np.asarray([t * p]), side(*head), side(*tail), margin
    )
    duration, energy = float(got_t[0]), float(got_e[0])
    times = [t] + [th for _on, th, _ph in sides]
    assert min(times) * (1 - 1e-9) <= duration <= max(times) * (1 + 1e-9)
    if not sides or margin == 0:
        assert (duration, energy) == (t, t * p)
        return
    if sum(margin / th for _on, th, _ph in sides) < 1:
        own_s = duration - margin * len(sides)  # seconds at the own clock
        assert math.isclose(own_s / t + sum(margin / th for _o, th, _p in sides), 1.0,
                            rel_tol=1e-9)  # fmt: skip
        expected = own_s * p + sum(margin * ph for _o, _t, ph in sides)
        assert math.isclose(energy, expected, rel_tol=1e-9, abs_tol=1e-12)
    else:
        each = 1 / sum(1 / th for _o, th, _p in sides)  # seconds at each higher clock
        assert math.isclose(duration, each * len(sides), rel_tol=1e-9)
        assert math.isclose(energy, sum(each * ph for _o, _t, ph in sides), rel_tol=1e-9)


@pytest.mark.parametrize("t_higher", [5e-324, 1e-310, 1e-300])
def test_tiny_times_at_a_higher_clock_neither_overflow_nor_make_nan(t_higher: float) -> None:
    """A higher neighbour's clock at which the instruction takes a subnormal time (a
    profile may say so): all of it runs there, and nothing overflows on the way."""
    margin, t, e = 0.005, np.asarray([0.002, 0.002, 0.002]), np.asarray([0.5, 0.5, 0.5])
    head = (np.asarray([True, True, False]), np.full(3, t_higher), np.full(3, 1e-3))
    tail = (np.asarray([False, True, True]), np.asarray([1e300, 0.001, 0.001]),
            np.asarray([1e300, 0.25, 0.25]))  # fmt: skip
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        got_t, got_e = with_transitions(t, e, head, tail, margin)
    assert (got_t[0], got_e[0]) == (t_higher, 1e-3)  # the head's clock only: all of it there
    # the same seconds at each of the two clocks, h t / (h + t): the shares of the work,
    # t / (h + t) at the head's and h / (h + t) at the tail's
    assert math.isclose(got_t[1], 2 * t_higher * 0.001 / (t_higher + 0.001), rel_tol=1e-9)
    expected_j = (0.001 * 1e-3 + t_higher * 0.25) / (t_higher + 0.001)
    assert math.isclose(got_e[1], expected_j, rel_tol=1e-9)
    assert (got_t[2], got_e[2]) == (0.001, 0.25)  # the tail's clock only, 1 ms < the margin


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
    """The search is the margin-free one; at margin 0 the frontier is the margin-free one
    exactly, and at 5 ms (the example profile is never slower at a higher clock) no point is
    slower than without transitions and the no-slowdown point still saves over 11 %."""
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
    assert timed.energies_j[chosen] < 0.89 * default.energy_j
    for i in range(len(timed)):
        point = timed.point(i)
        free = replay(profile, schedule, 100.0, point.frequencies_mhz)
        assert point.time_s <= free.time_s * (1 + 1e-12)
        if i in (0, chosen, len(timed) - 1):
            again = replay(
                profile, schedule, 100.0, point.frequencies_mhz, clock_change_margin_s=0.005
            )
            assert math.isclose(again.time_s, point.time_s, rel_tol=1e-12)
            assert math.isclose(again.energy_j, point.energy_j, rel_tol=1e-12)


def test_shared_profile_frontier_with_the_default_margin() -> None:
    """bloom+a100, 1F1B 8 x 12, at 5 ms: every point and baseline truthful, the no-slowdown
    point no slower than the default plan and still saving over 11 %."""
    path = SHARED_PROFILES / "bloom+a100_sxm_bf16.csv"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    profile, schedule = load_profile(path), make_schedule("1f1b", 8, 12)
    table, p_block = ref.read_csv_table(path), 83.64
    dag = ref.build_dag(ref.reference_order("1f1b", 8, 12, 1), 1)
    timed = compute_frontier(profile, schedule, p_block_w=p_block, clock_change_margin_s=0.005)
    chosen = choose_point(timed, Policy.parse("no-slowdown"))
    default = timed.baselines["default"]
    assert timed.times_s[chosen] <= default.time_s
    assert timed.energies_j[chosen] < 0.89 * default.energy_j
    for i in sorted({0, chosen, len(timed) // 2, len(timed) - 1}):
        point = timed.point(i)
        t, e, _ = ref.replay_with_margin(table, dag, p_block, frequencies(point), 0.005)
        assert rel(point.time_s, t) <= RTOL and rel(point.energy_j, e) <= RTOL, i
    for key, baseline in timed.baselines.items():
        t, e, _ = ref.replay_with_margin(table, dag, p_block, baseline.frequencies_mhz, 0.005)
        assert rel(baseline.time_s, t) <= RTOL and rel(baseline.energy_j, e) <= RTOL, key
