"""``perseus plan``'s report as text: the head, the plan table with its baselines and straggler
rows, the what-if table, what an exact sweep proved, and the straggler arithmetic
(:func:`stretched`) that ``perseus job frontier`` shares."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perseus.cli.plan_views import (
    ScheduleOutcome,
    cut_text,
    describe,
    exact_text,
    margin_text,
    plan_table,
    straggler_note,
    stretched,
    whatif_table,
)
from perseus.core.baselines import shown_baselines
from perseus.core.errors import PlanError
from perseus.solver import Baseline, Frontier, Policy, load_profile, make_schedule
from perseus.solver.exact import ExactSweep

from .plans import frontier_of

positive = st.floats(1e-3, 1e3, allow_nan=False)


@pytest.fixture(scope="module")
def frontier(planned: tuple[Path, Path, Path, str]) -> Frontier:
    return frontier_of(planned[0])


def cells(table: str, label: str) -> list[str]:
    """The cells of the row of ``table`` whose first cell is ``label``."""
    for line in table.splitlines():
        if line.startswith(label + "  "):
            return re.split(r"\s{2,}", line[len(label) :].strip())
    raise AssertionError(f"no row {label!r} in:\n{table}")


# ----------------------------------------------------------------------------- stragglers


@given(time_s=positive, energy_j=positive, blocking_w=positive, iteration_s=positive)
def test_a_stretched_plan_blocks_for_the_difference(
    time_s: float, energy_j: float, blocking_w: float, iteration_s: float
) -> None:
    at_s, at_j = stretched(time_s, energy_j, blocking_w, iteration_s)
    if iteration_s <= time_s:
        assert (at_s, at_j) == (time_s, energy_j)
    else:
        assert at_s == iteration_s
        assert at_j == pytest.approx(energy_j + blocking_w * (iteration_s - time_s))
    assert at_s >= time_s and at_j >= energy_j


def test_the_straggler_note_says_what_the_saving_is_against() -> None:
    longer = straggler_note("default (max clock)", 2.0, 1.5)
    assert longer.endswith("their saving is against default (max clock) stretched to that time")
    assert "the iteration takes 2.0000 s because of another pipeline" in longer
    shorter = straggler_note("default (max clock)", 2.0, 2.5)
    assert "which takes longer (2.5000 s) and is not stretched" in shorter
    none = straggler_note("default (max clock)", 1.0, 1.25, slows=False)
    assert none == (
        "straggler: its 1.0000 s is not longer than the chosen plan's 1.2500 s,\n"
        "so it does not slow this pipeline: the chosen plan runs as it is"
    )


# ----------------------------------------------------------------------------- small texts


def test_the_margin_is_shown_in_milliseconds_and_not_at_all_when_zero() -> None:
    assert margin_text(0.0) == ""
    assert margin_text(0.005) == ", clock-change margin 5 ms"
    assert margin_text(0.0125) == ", clock-change margin 12.5 ms"


def test_what_an_exact_sweep_proved() -> None:
    full = ExactSweep(time_limit_s=60.0, deadlines=12, solves=5, stopped=0, unsolved=0)
    assert exact_text(full) == "every point proven optimal (5 MILPs for 12 deadlines)"
    assert cut_text(full) == ""
    cut = replace(full, stopped=2, unsolved=3)
    assert cut_text(cut) == (
        "2 of 5 MILPs stopped before proving optimality (their gaps stand); 3 of 12 deadlines "
        "(the shortest) left to the fast mode's plans"
    )
    assert exact_text(cut) == f"PARTIAL: the time limit of 60 s cut {cut_text(cut)}"
    assert exact_text(replace(cut, time_limit_s=None)).startswith("PARTIAL: the time limit cut")


# ----------------------------------------------------------------------------- the report


def test_the_head_names_profile_schedule_and_frontier(example: Path, frontier: Frontier) -> None:
    profile = load_profile(example)
    text = describe(profile, frontier.schedule, frontier, 1.234)
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f"profile   {profile.source}: {profile.num_stages} stages, ")
    assert f"({frontier.schedule.num_instructions} instructions)" in lines[1]
    assert f"P_block {frontier.p_block_w:g} W" in lines[1]
    assert lines[2] == (
        f"frontier  {len(frontier)} points, {frontier.times_s[0]:.4f} s to "
        f"{frontier.times_s[-1]:.4f} s, solved in 1.23 s"
    )


def test_the_plan_table_has_every_baseline_and_the_chosen_point(frontier: Frontier) -> None:
    chosen = len(frontier) // 2
    table = plan_table(frontier, frontier.baselines, chosen, "min-energy", None, None)
    reference = frontier.baselines["default"]
    assert table.splitlines()[0].split() == [
        "plan", "time", "(s)", "energy", "(J)", "saving", "slowdown", "gap",
    ]  # fmt: skip
    # a baseline at one clock everywhere names it
    (clock,) = {f for gpu in reference.frequencies_mhz for f in gpu}
    default = cells(table, f"default (max clock) {clock} MHz")
    assert default == [f"{reference.time_s:.4f}", f"{reference.energy_j:.1f}", "0.00 %", "0.00 %",
                       "-"]  # fmt: skip
    # the header, one row per shown baseline, the chosen point, the note
    assert len(table.splitlines()) == 3 + len(shown_baselines(frontier.baselines))
    point = frontier.point(chosen)
    row = cells(table, f"min-energy (point {chosen} of {len(frontier)})")
    assert row[:2] == [f"{point.time_s:.4f}", f"{point.energy_j:.1f}"]
    assert row[2] == f"{100 * (1 - point.energy_j / reference.energy_j):.2f} %"
    assert table.endswith("saving and slowdown are against default (max clock)\n")


def test_a_straggler_that_slows_the_pipeline_adds_stretched_rows(frontier: Frontier) -> None:
    reference = frontier.baselines["default"]
    imposed_s = 1.5 * reference.time_s
    index = len(frontier) - 1
    table = plan_table(frontier, frontier.baselines, 0, "no-slowdown", (imposed_s, index), None)
    blocking_w = frontier.p_block_w * frontier.schedule.stages
    base_s, base_j = stretched(reference.time_s, reference.energy_j, blocking_w, imposed_s)
    assert cells(table, "default (max clock), stretched")[:3] == [
        f"{base_s:.4f}",
        f"{base_j:.1f}",
        "0.00 %",
    ]
    straggler = cells(table, f"straggler (point {index} of {len(frontier)})")
    energy_j = frontier.energy_at(index, imposed_s)
    assert straggler[:3] == [
        f"{imposed_s:.4f}",
        f"{energy_j:.1f}",
        f"{100 * (1 - energy_j / base_j):.2f} %",
    ]
    assert "the straggler plan is the one that runs" in table


def test_a_straggler_that_does_not_slow_the_pipeline_is_a_note(frontier: Frontier) -> None:
    table = plan_table(frontier, frontier.baselines, 0, "no-slowdown", None, 0.001)
    assert "stretched" not in table and "straggler (point" not in table
    assert "so it does not slow this pipeline" in table


def test_a_plan_table_needs_a_reference_baseline(frontier: Frontier) -> None:
    others = {k: b for k, b in frontier.baselines.items() if k not in ("default", "all_fastest")}
    with pytest.raises(PlanError, match="neither default nor all_fastest"):
        plan_table(frontier, others, 0, "no-slowdown", None, None)


def test_the_whatif_table_compares_against_the_first_schedules_default(example: Path) -> None:
    profile = load_profile(example)
    stages = profile.num_stages
    outcomes = [
        ScheduleOutcome(
            "1f1b", make_schedule("1f1b", stages, 4, 1), Baseline(10.0, 1000.0, ()), 10.0, 900.0
        ),
        ScheduleOutcome(
            "zbv", make_schedule("zbv", stages, 4, 2), Baseline(8.0, 1100.0, ()), 9.0, 990.0
        ),
    ]
    text = whatif_table(profile, 4, 100.0, 0.005, Policy.parse("no-slowdown"), outcomes)
    assert text.startswith(
        f"profile   {profile.source}: {stages} stages, 4 microbatches, P_block 100 W, "
        "clock-change margin 5 ms\n"
    )
    first = cells(text, "1f1b")
    assert first[0] == "1" and first[-3:] == ["10.00 %", "+0.00 %", "-10.00 %"]
    second = cells(text, "zbv")
    assert second[0] == "2" and second[-3:] == ["10.00 %", "-10.00 %", "-1.00 %"]
    assert text.endswith("vs 1f1b: no-slowdown against 1f1b's default\n")
