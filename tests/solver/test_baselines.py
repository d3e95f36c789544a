"""Baselines: default (highest clock), all-fastest, best global clock, best clock per stage;
the frontier beats them."""

from __future__ import annotations

import itertools

from hypothesis import given, note
from hypothesis import strategies as st

from perseus.solver import baselines_at, compute_frontier

from . import reference as ref
from .cases import NEAR, RTOL, Case, cases, examples, query, rel

KEYS = {"default", "all_fastest", "global_clock", "per_stage_clock"}
# Monotone profiles (a higher clock is never slower), as on real GPUs: the top clock meets the
# no-slowdown deadline, so every baseline exists at every deadline of the frontier.
MONOTONE = cases(stages=(1, 4), microbatches=(1, 5), options=(1, 5),
                 schedules=("1f1b", "gpipe", "interleaved-1f1b"), monotone=True)  # fmt: skip


def clocks_of(case: Case) -> list[int]:
    return sorted({f for (_s, _k, f) in case.table}, reverse=True)


def plan_with(case: Case, per_stage: tuple[int, ...]) -> list[list[int]]:
    return [[per_stage[g]] * len(seq) for g, seq in enumerate(case.order)]


def best_plan(case: Case, candidates, deadline: float) -> float | None:
    """Least replayed energy among candidate one-clock-per-stage plans that meet the deadline."""
    best = None
    for per_stage in candidates:
        t, e = case.replay(plan_with(case, per_stage))
        if t <= deadline * (1 + RTOL) and (best is None or e < best):
            best = e
    return best


def check_baselines(case: Case, baselines, deadline: float, frontier) -> None:
    assert set(baselines) == KEYS
    for name, b in baselines.items():
        plan = [list(row) for row in b.frequencies_mhz]
        t, e = case.replay(plan)  # truthful
        assert rel(b.time_s, t) <= RTOL and rel(b.energy_j, e) <= RTOL, name
    default = baselines["default"]
    for g, (seq, row) in enumerate(zip(case.order, default.frequencies_mhz, strict=True)):
        for (kind, _mb, _c), f in zip(seq, row, strict=True):
            assert f == max(c for c, _t, _e in ref.options_of(case.table, g, kind))
    fastest = baselines["all_fastest"]
    assert rel(fastest.time_s, case.t_min) <= RTOL
    for g, (seq, row) in enumerate(zip(case.order, fastest.frequencies_mhz, strict=True)):
        for (kind, _mb, _c), f in zip(seq, row, strict=True):
            quickest = min(t for _f, t, _e in ref.options_of(case.table, g, kind))
            assert case.table[(g, kind, f)][0] == quickest
    glob, stage = baselines["global_clock"], baselines["per_stage_clock"]
    assert len({f for row in glob.frequencies_mhz for f in row}) == 1
    assert all(len(set(row)) == 1 for row in stage.frequencies_mhz)
    for b in (glob, stage):
        assert b.time_s <= deadline * (1 + RTOL)
    # the best single clock, and the best clock per stage (exhaustive over the few clocks)
    clocks = clocks_of(case)
    best_global = best_plan(case, [(f,) * case.stages for f in clocks], deadline)
    assert rel(glob.energy_j, best_global) <= RTOL, ("not the best global clock", glob, best_global)
    assert stage.energy_j <= glob.energy_j * (1 + RTOL)
    if len(clocks) ** case.stages <= 256:
        every = itertools.product(clocks, repeat=case.stages)
        best = best_plan(case, every, deadline)
        assert rel(stage.energy_j, best) <= RTOL, ("not the best clock per stage", stage, best)
    # per-instruction planning is at least as good, up to the fast mode's tolerance
    point = query(frontier, deadline)
    assert point is not None
    for b in (glob, stage):
        assert frontier.energies_j[point] <= b.energy_j * (1 + NEAR)


@examples(30)
@given(MONOTONE)
def test_baselines_at_no_slowdown(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    frontier = compute_frontier(case.profile(), case.schedule(), p_block_w=case.p_block_w)
    deadline = frontier.baselines["default"].time_s
    assert frontier.reference_time_s == max(deadline, float(frontier.times_s[0]))
    check_baselines(case, frontier.baselines, deadline, frontier)


@examples(30)
@given(MONOTONE, st.floats(0.0, 1.2))
def test_baselines_at_a_deadline(case: Case, where: float) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    profile, schedule = case.profile(), case.schedule()
    frontier = compute_frontier(profile, schedule, p_block_w=case.p_block_w)
    # a deadline on the frontier's grid (between grid deadlines the frontier keeps the plan of
    # the one below, which a baseline may legitimately beat)
    steps = round(where * (float(frontier.times_s[-1]) - case.t_min) / 1e-3)
    deadline = case.t_min + steps * 1e-3
    baselines = baselines_at(profile, schedule, case.p_block_w, deadline)
    check_baselines(case, baselines, deadline, frontier)


@examples(30)
@given(cases(stages=(3, 4), microbatches=(2, 4), options=(4, 6), monotone=True),
       st.floats(0.0, 0.3))  # fmt: skip
def test_per_stage_clock_no_single_stage_change_improves(case: Case, slack: float) -> None:
    """Beyond exhaustive search (here 4^3 to 6^4 combinations): a local optimum, checked by
    replaying every single-stage change with the reference."""
    note(repr(case))  # hypothesis prints composite values blank
    profile, schedule = case.profile(), case.schedule()
    top = tuple(max(clocks_of(case)) for _ in range(case.stages))
    deadline = case.replay(plan_with(case, top))[0] * (1 + slack)
    stage = baselines_at(profile, schedule, case.p_block_w, deadline)["per_stage_clock"]
    current = tuple(row[0] for row in stage.frequencies_mhz)
    for g in range(case.stages):
        for f in clocks_of(case):
            trial = (*current[:g], f, *current[g + 1 :])
            t, e = case.replay(plan_with(case, trial))
            if t <= deadline * (1 + RTOL):
                assert e >= stage.energy_j * (1 - RTOL), ("a better clock for a stage", g, f)


def test_baseline_keys_are_the_one_enum() -> None:
    """Every key baselines_at gives is a BaselineKey member, in the enum's order, and plain
    strings still index them (and every label is defined for them)."""
    from perseus.core.baselines import BASELINE_LABELS, BaselineKey
    from perseus.solver import make_schedule, profile_from_rows

    rows = [(g, kind, f, t * (2 if kind == "backward" else 1), e)
            for g in range(2) for kind in ("forward", "backward")
            for f, t, e in ((1980, 0.05, 12.0), (1500, 0.07, 10.0))]  # fmt: skip
    schedule = make_schedule("1f1b", 2, 2)
    result = baselines_at(profile_from_rows(rows), schedule, 20.0, 1.0)
    assert list(result) == list(BaselineKey)
    assert all(type(key) is BaselineKey for key in result)
    assert result["per_stage_clock"] is result[BaselineKey.PER_STAGE_CLOCK]
    assert set(BASELINE_LABELS) == set(BaselineKey)
