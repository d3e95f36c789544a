"""The wire models render the solver's own types (perseus.schemas; routes: tests/server)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from perseus.schemas import Baseline, FrontierPoint, PlanInstruction, ProfileRow
from perseus.solver import (
    InstructionKind,
    compute_frontier,
    make_schedule,
    profile_from_rows,
)
from perseus.solver import ProfileRow as MeasuredRow

ROWS = [(g, kind, f, t * (2 if kind == "backward" else 1), e)
        for g in range(2) for kind in ("forward", "backward")
        for f, t, e in ((1980, 0.05, 12.0), (1500, 0.07, 10.0))]  # fmt: skip


def test_a_profile_row_goes_to_the_wire_and_back_unchanged() -> None:
    for stage, kind, f, t, e in ROWS:
        row = MeasuredRow(stage, InstructionKind(kind), f, t, e)
        wire = ProfileRow.from_row(row)
        assert wire.model_dump() == {"instruction": kind, "frequency_mhz": f, "time_s": t,
                                     "energy_j": e}  # fmt: skip
        back = wire.to_row(stage)
        assert back == row and type(back.instruction) is InstructionKind
    with pytest.raises(ValidationError):
        ProfileRow.from_row(MeasuredRow(0, InstructionKind.FORWARD, 1980, -1.0, 1.0))


def test_points_and_baselines_render_from_the_solvers() -> None:
    frontier = compute_frontier(
        profile_from_rows(ROWS), make_schedule("1f1b", 2, 3), p_block_w=20.0
    )
    point = frontier.point(0)
    assert FrontierPoint.from_point(point).model_dump() == {
        "time_s": point.time_s, "energy_j": point.energy_j, "gap": point.gap}  # fmt: skip
    for baseline in frontier.baselines.values():
        assert Baseline.from_baseline(baseline).model_dump() == {
            "time_s": baseline.time_s, "energy_j": baseline.energy_j}  # fmt: skip


def test_plan_instructions_carry_the_kind_enum_and_the_wire_strings() -> None:
    wire = {"instruction": "backward", "microbatch": 2, "frequency_mhz": 1500}
    parsed = PlanInstruction.model_validate(wire)
    assert parsed.instruction is InstructionKind.BACKWARD and parsed.instruction == "backward"
    assert parsed.model_dump_json(exclude_none=True) == (
        '{"instruction":"backward","microbatch":2,"frequency_mhz":1500}'
    )
    with pytest.raises(ValidationError):
        PlanInstruction.model_validate({**wire, "instruction": "recompute"})
