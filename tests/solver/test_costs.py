"""The cost tables of :mod:`perseus.solver.costs`: one class per (GPU, kind) the schedule runs,
the options no other beats once blocking power is counted, a chunk's share of the stage, and
errors that name the stage and kind a profile lacks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note

from perseus.core.errors import ProfileError
from perseus.solver import build_costs, build_dag, make_schedule, profile_from_rows

from .cases import Case, cases, examples, split_rows


def not_dominated(
    options: list[tuple[float, float]], p_block_w: float
) -> list[tuple[float, float]]:
    """The (time, energy) pairs no other pair beats in time and effective energy (energy
    minus blocking power over the time), each once, time ascending. O(k^2)."""
    effective = {(t, e): e - p_block_w * t for t, e in options}
    kept = {
        (t, e)
        for t, e in options
        if not any(
            (u, f) != (t, e) and u <= t and effective[(u, f)] <= effective[(t, e)]
            for u, f in options
        )
    }
    return sorted(kept)


@examples(40)
@given(cases(schedules=("1f1b", "gpipe", "interleaved-1f1b"), ragged=True))
def test_one_class_per_gpu_and_kind_with_the_options_not_dominated(case: Case) -> None:
    note(repr(case))  # hypothesis prints composite values blank
    schedule = case.schedule()
    costs = build_costs(case.profile(), schedule, case.p_block_w)
    kinds = schedule.kinds
    assert kinds == ("forward", "backward")
    assert costs.num_gpus == case.stages and costs.p_block_w == case.p_block_w
    assert len(costs.start) - 1 == case.stages * len(kinds)
    assert costs.start[0] == 0 and costs.start[-1] == len(costs.time_s)
    assert len(costs.energy_j) == len(costs.frequency_mhz) == len(costs.time_s)
    for g in range(case.stages):
        for k, kind in enumerate(kinds):
            c = len(kinds) * g + k
            lo, hi = int(costs.start[c]), int(costs.start[c + 1])
            measured = {f: te for (s, kd, f), te in case.table.items() if (s, kd) == (g, kind)}
            # a chunk's instruction is a 1/V share of the stage's
            pairs = [(t / case.chunks, e / case.chunks) for t, e in measured.values()]
            got = list(
                zip(costs.time_s[lo:hi].tolist(), costs.energy_j[lo:hi].tolist(), strict=True)
            )
            want = not_dominated(pairs, case.p_block_w)
            assert np.allclose(got, want, rtol=1e-12, atol=0), (g, kind)
            assert np.array_equal(costs.times_of(c), costs.time_s[lo:hi])
            for f, t, e in zip(
                costs.frequency_mhz[lo:hi].tolist(), *zip(*got, strict=True), strict=True
            ):
                mt, me = measured[f]  # every option is a measured clock of its class
                assert (t, e) == pytest.approx((mt / case.chunks, me / case.chunks), rel=1e-12)
    # effective energies: time ascending, effective energy strictly descending in each class
    effective = costs.effective_j
    assert np.allclose(effective, costs.energy_j - case.p_block_w * costs.time_s, rtol=1e-12)
    for c in range(len(costs.start) - 1):
        lo, hi = int(costs.start[c]), int(costs.start[c + 1])
        assert hi > lo  # never empty: a class's fastest option is never dominated
        assert (np.diff(costs.time_s[lo:hi]) > 0).all()
        assert (np.diff(effective[lo:hi]) < 0).all()


@examples(15)
@given(cases(schedules=("1f1b", "interleaved-1f1b")))
def test_every_node_s_class_is_its_gpu_and_kind(case: Case) -> None:
    """The DAG's ``cost_class`` indexes the table: ``K * gpu + kind``."""
    schedule = case.schedule()
    dag = build_dag(schedule)
    costs = build_costs(case.profile(), schedule, case.p_block_w)
    assert (dag.cost_class == len(schedule.kinds) * dag.gpu + dag.kind).all()
    assert int(dag.cost_class.max()) == len(costs.start) - 2


def test_blocking_power_keeps_a_slower_option_that_costs_a_little_more() -> None:
    """Without blocking power a slower option is kept only when it takes less energy; with it,
    also when it takes less than the faster one plus the blocking power drawn meanwhile."""
    base = [(0, "forward", 1400, 0.10, 10.0), (0, "forward", 1000, 0.14, 9.0),
            (0, "backward", 1400, 0.20, 20.0), (0, "backward", 1000, 0.28, 20.5)]  # fmt: skip
    schedule = make_schedule("1f1b", 1, 2)
    plain = build_costs(profile_from_rows(base), schedule, 0.0)
    assert plain.frequency_mhz.tolist() == [1400, 1000, 1400]
    assert plain.start.tolist() == [0, 2, 3]
    # at 10 W the backward's 1000 MHz takes 0.5 J more, but the 1400 MHz one then waits 0.08 s
    # drawing 0.8 J
    blocked = build_costs(profile_from_rows(base), schedule, 10.0)
    assert blocked.frequency_mhz.tolist() == [1400, 1000, 1400, 1000]
    assert blocked.start.tolist() == [0, 2, 4]
    assert blocked.effective_j.tolist() == pytest.approx([9.0, 7.6, 18.0, 17.7])
    assert blocked.energy_j.tolist() == [10.0, 9.0, 20.0, 20.5]  # measured, not effective


def test_a_profile_with_another_stage_count_is_refused_naming_both() -> None:
    profile = profile_from_rows(split_rows(stages=2, split=False))
    with pytest.raises(
        ProfileError, match="stage: the profile has 2 stages but the schedule has 3"
    ):
        build_costs(profile, make_schedule("1f1b", 3, 4), 50.0)


def test_a_split_schedule_needs_the_halves_naming_stage_and_kind() -> None:
    profile = profile_from_rows(split_rows(split=False))
    build_costs(profile, make_schedule("1f1b", 2, 4), 50.0)  # forward/backward only: fine
    with pytest.raises(ProfileError, match="stage 0: instruction: no backward_input rows"):
        build_costs(profile, make_schedule("zbv", 2, 4, 2), 50.0)


def test_split_schedule_costs_have_one_class_per_kind_it_runs() -> None:
    profile = profile_from_rows(split_rows())
    schedule = make_schedule("zbv", 2, 4, 2)
    assert schedule.kinds == ("forward", "backward_input", "backward_weight")
    costs = build_costs(profile, schedule, 50.0)
    assert len(costs.start) - 1 == 2 * 3
    # a chunk's instruction is half the stage's (V = 2)
    assert costs.times_of(1)[0] == pytest.approx(2.0 * 0.55 / 2)
