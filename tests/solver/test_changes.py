"""Clock changes that can land: no run of one clock shorter than the delay its changes need.

Every run is checked on an independent timeline: :func:`reference.replay_with_margin` and
:func:`reference.timeline` for the schedules the reference builds (1F1B, GPipe, interleaved),
:func:`perseus.solver.replay` for the zero-bubble ones; the rule (the changes into and out of a
run are issued ``delay`` apart: span ``>= delay + margin * (s_in - s_out)``, ``s`` -1 for a
raise and +1 for a lowering) is re-derived here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from perseus.core.errors import PlanError
from perseus.solver import (
    Policy,
    build_dag,
    choose_point,
    compute_frontier,
    make_schedule,
    profile_from_rows,
    replay,
)
from perseus.solver.changes import merge_short_runs, short_runs
from perseus.solver.transitions import clock_tables

from . import reference as ref
from .cases import RTOL, Case, cases, examples, rel

SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")
DELAYS = st.sampled_from([0.01, 0.02, 0.05, 0.15])
MARGINS = st.sampled_from([0.0, 0.005])


def short_spans(
    clocks: list[list[int]], starts: list[list[float]], total: float, margin: float, delay: float
) -> list[tuple[int, int, float, float]]:
    """``(gpu, position, span, required)`` of every run shorter than its changes need."""
    found = []
    for g, (row, start) in enumerate(zip(clocks, starts, strict=True)):
        n = len(row)
        firsts = [k for k in range(n) if row[k] != row[k - 1]]
        for i, k in enumerate(firsts):
            nxt = firsts[(i + 1) % len(firsts)]
            span = (start[nxt] if nxt > k else start[nxt] + total) - start[k]
            into = -1 if row[k] > row[k - 1] else 1
            out = -1 if row[nxt] > row[nxt - 1] else 1
            need = delay + margin * (into - out)
            if span < need * (1 - 1e-9):
                found.append((g, k, span, need))
    return found


def reference_shorts(case: Case, plan: list[list[int]], margin: float, delay: float):
    total, _energy, time_of = ref.replay_with_margin(
        case.table, case.dag, case.p_block_w, plan, margin
    )
    start, _critical = ref.timeline(case.dag, time_of)
    starts = [[start[(g, k)] for k in range(len(seq))] for g, seq in enumerate(case.order)]
    return short_spans(plan, starts, total, margin, delay)


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


def flat(plan: list[list[int]]) -> np.ndarray:
    return np.asarray([f for row in plan for f in row], dtype=np.int64)[:, None]


def per_gpu(column: np.ndarray, case: Case) -> list[list[int]]:
    out, at = [], 0
    for seq in case.order:
        out.append([int(f) for f in column[at : at + len(seq)]])
        at += len(seq)
    return out


@examples(80)
@given(st.data(), cases(schedules=SCHEDULES, ragged=True, microbatches=(1, 6)), MARGINS, DELAYS)
def test_merged_runs_all_last_the_delay_in_the_reference_replay(
    data, case: Case, margin: float, delay: float
) -> None:
    note(repr(case))
    plan = data.draw(plans(case))
    schedule = case.schedule()
    tables = clock_tables(case.profile(), schedule)
    dag = build_dag(schedule)
    merged = per_gpu(merge_short_runs(tables, dag, flat(plan), margin, delay)[:, 0], case)
    note(f"{plan} -> {merged}")
    assert reference_shorts(case, merged, margin, delay) == []
    assert short_runs(tables, dag, flat(merged), margin, delay).tolist() == [0]
    for g, (before, after) in enumerate(zip(plan, merged, strict=True)):
        for k, (f0, f1) in enumerate(zip(before, after, strict=True)):
            assert f1 >= f0  # only raised
            assert (g, case.order[g][k][0], f1) in case.table  # measured for it


@examples(40)
@given(st.data(), cases(schedules=SCHEDULES, monotone=True), MARGINS, DELAYS)
def test_merging_never_slows_a_plan_on_a_monotone_profile(
    data, case: Case, margin: float, delay: float
) -> None:
    note(repr(case))
    plan = data.draw(plans(case))
    schedule = case.schedule()
    merged = merge_short_runs(
        clock_tables(case.profile(), schedule), build_dag(schedule), flat(plan), margin, delay
    )
    t0, _e0, _ = ref.replay_with_margin(case.table, case.dag, case.p_block_w, plan, margin)
    t1, _e1, _ = ref.replay_with_margin(
        case.table, case.dag, case.p_block_w, per_gpu(merged[:, 0], case), margin
    )
    assert t1 <= t0 * (1 + RTOL)


@examples(25)
@given(cases(schedules=SCHEDULES, stages=(2, 4), microbatches=(2, 6)), MARGINS, DELAYS)
def test_frontier_with_a_delay_states_merged_plans_truthfully(
    case: Case, margin: float, delay: float
) -> None:
    note(repr(case))
    profile, schedule = case.profile(), case.schedule()
    frontier = compute_frontier(
        profile,
        schedule,
        p_block_w=case.p_block_w,
        clock_change_margin_s=margin,
        clock_change_delay_s=delay,
    )
    assert frontier.clock_change_delay_s == delay
    assert np.all(np.diff(frontier.times_s) > 0) and np.all(np.diff(frontier.energies_j) < 0)
    for i in range(len(frontier)):
        plan = [list(row) for row in frontier.point(i).frequencies_mhz]
        t, e, _ = ref.replay_with_margin(case.table, case.dag, case.p_block_w, plan, margin)
        assert rel(frontier.times_s[i], t) <= RTOL and rel(frontier.energies_j[i], e) <= RTOL
        assert reference_shorts(case, plan, margin, delay) == [], i


@examples(15)
@given(cases(schedules=SCHEDULES, stages=(2, 4), microbatches=(2, 6), monotone=True), DELAYS)
def test_a_delay_never_makes_the_chosen_plan_slower_than_its_policy_allows(
    case: Case, delay: float
) -> None:
    note(repr(case))
    profile, schedule = case.profile(), case.schedule()
    plain = compute_frontier(
        profile, schedule, p_block_w=case.p_block_w, clock_change_margin_s=0.005
    )
    merged = compute_frontier(
        profile,
        schedule,
        p_block_w=case.p_block_w,
        clock_change_margin_s=0.005,
        clock_change_delay_s=delay,
    )
    # the fastest plan is never slower; no slowdown still means none
    assert merged.times_s[0] <= plain.times_s[0] * (1 + RTOL)
    assert merged.reference_time_s == plain.reference_time_s
    for policy in (Policy("no-slowdown"), Policy("max-slowdown", 1.05)):
        i = choose_point(merged, policy)
        limit = plain.reference_time_s * (policy.value or 1.0)
        assert merged.times_s[i] <= limit * (1 + RTOL)


@examples(10)
@given(cases(schedules=SCHEDULES, stages=(2, 3), microbatches=(2, 4)))
def test_delay_zero_plans_as_without_one_bit_for_bit(case: Case) -> None:
    profile, schedule = case.profile(), case.schedule()
    plain = compute_frontier(
        profile, schedule, p_block_w=case.p_block_w, clock_change_margin_s=0.005
    )
    zero = compute_frontier(
        profile,
        schedule,
        p_block_w=case.p_block_w,
        clock_change_margin_s=0.005,
        clock_change_delay_s=0.0,
    )
    for name in ("times_s", "energies_j", "gaps", "frequencies_mhz"):
        assert np.array_equal(getattr(plain, name), getattr(zero, name)), name
    assert plain.baselines == zero.baselines and zero.clock_change_delay_s == 0.0


def _split_rows(stages: int, scale: float) -> list[tuple[int, str, int, float, float]]:
    """A monotone profile with a split backward, instructions ``scale`` seconds or so."""
    rows = []
    for s in range(stages):
        for kind, t in (
            ("forward", 1.0),
            ("backward", 2.0),
            ("backward_input", 1.1),
            ("backward_weight", 0.9),
        ):
            for f, power in ((1980, 600.0), (1605, 420.0), (1200, 260.0), (900, 190.0)):
                time_s = scale * t * (1980 / f) * (1 + 0.1 * s)
                rows.append((s, kind, f, time_s, time_s * power))
    return rows


@pytest.mark.parametrize(("name", "stages", "microbatches"), [("zbv", 2, 4), ("dualpipev", 2, 4),
                                                               ("zbv", 4, 8)])  # fmt: skip
@pytest.mark.parametrize("delay", [0.02, 0.04])
def test_zero_bubble_frontiers_with_a_delay_in_perseus_replay(
    name: str, stages: int, microbatches: int, delay: float
) -> None:
    profile = profile_from_rows(_split_rows(stages, 0.02), p_block_w=120.0)
    schedule = make_schedule(name, stages, microbatches, 2)
    plain = compute_frontier(profile, schedule, clock_change_margin_s=0.005)
    frontier = compute_frontier(
        profile, schedule, clock_change_margin_s=0.005, clock_change_delay_s=delay
    )
    assert frontier.times_s[0] <= plain.times_s[0] * (1 + RTOL)
    plans_short = 0
    for i in range(len(plain)):
        got = replay(
            profile, schedule, 120.0, plain.point(i).frequencies_mhz, clock_change_margin_s=0.005
        )
        plans_short += bool(
            short_spans(
                [list(r) for r in plain.point(i).frequencies_mhz],
                list(got.start_s),
                got.time_s,
                0.005,
                delay,
            )
        )
    assert plans_short  # the case needs the merge
    for i in range(len(frontier)):
        clocks = [list(r) for r in frontier.point(i).frequencies_mhz]
        got = replay(profile, schedule, 120.0, clocks, clock_change_margin_s=0.005)
        assert rel(got.time_s, frontier.times_s[i]) <= RTOL
        assert rel(got.energy_j, frontier.energies_j[i]) <= RTOL
        assert short_spans(clocks, [list(s) for s in got.start_s], got.time_s, 0.005, delay) == []


@pytest.mark.parametrize("bad", [-0.01, 1.0, float("nan"), float("inf"), True, "0.02"])
def test_a_bad_delay_is_refused(bad: object) -> None:
    profile = profile_from_rows(_split_rows(2, 0.02), p_block_w=120.0)
    schedule = make_schedule("1f1b", 2, 2)
    with pytest.raises(PlanError, match="clock-change delay"):
        compute_frontier(profile, schedule, clock_change_delay_s=bad)  # type: ignore[arg-type]


def test_the_delay_travels_with_the_frontier_file() -> None:
    from perseus.formats.plan_files import frontier_from_json, frontier_to_json

    profile = profile_from_rows(_split_rows(2, 0.02), p_block_w=120.0)
    schedule = make_schedule("1f1b", 2, 3)
    merged = compute_frontier(profile, schedule, clock_change_delay_s=0.03)
    assert frontier_from_json(frontier_to_json(merged)).clock_change_delay_s == 0.03
    plain = frontier_to_json(compute_frontier(profile, schedule))
    assert "clock_change_delay_s" not in plain  # files without a delay read as before
    assert frontier_from_json(plain).clock_change_delay_s == 0.0
