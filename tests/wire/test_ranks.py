"""Wire models a rank sends and fetches (perseus.wire.ranks): a profile row is the solver's
row on the wire; registrations, reports and the plan query refuse what they cannot carry."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from perseus.solver import InstructionKind
from perseus.solver import ProfileRow as MeasuredRow
from perseus.wire.common import MAX_PROFILE_ROWS, MAX_WAIT_QUERY_S
from perseus.wire.ranks import (
    IterationReport,
    PlanInstruction,
    PlanQuery,
    ProfileReport,
    ProfileRow,
    RankRegistration,
)

ROWS = [(g, kind, f, t * (2 if kind == "backward" else 1), e)
        for g in range(2) for kind in ("forward", "backward")
        for f, t, e in ((1980, 0.05, 12.0), (1500, 0.07, 10.0))]  # fmt: skip

REGISTRATION: dict[str, Any] = {
    "rank": 0,
    "stage": 0,
    "data_parallel_rank": 0,
    "tensor_parallel_rank": 0,
    "gpu_name": "NVIDIA H200",
    "supported_clocks_mhz": [1980, 1000],
}


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


def test_plan_instructions_carry_the_kind_enum_and_the_wire_strings() -> None:
    wire = {"instruction": "backward", "microbatch": 2, "frequency_mhz": 1500}
    parsed = PlanInstruction.model_validate(wire)
    assert parsed.instruction is InstructionKind.BACKWARD and parsed.instruction == "backward"
    assert parsed.model_dump_json(exclude_none=True) == (
        '{"instruction":"backward","microbatch":2,"frequency_mhz":1500}'
    )
    with pytest.raises(ValidationError):
        PlanInstruction.model_validate({**wire, "instruction": "recompute"})


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"supported_clocks_mhz": []}, ("supported_clocks_mhz",)),
        ({"supported_clocks_mhz": [1980, 0]}, ("supported_clocks_mhz", 1)),
        ({"gpu_name": ""}, ("gpu_name",)),
        ({"instance": "bad id!"}, ("instance",)),
        ({"instance": "x" * 65}, ("instance",)),
        ({"rank": -1}, ("rank",)),
        ({"stage": 1024}, ("stage",)),
    ],
)
def test_a_bad_registration_names_its_field(change: dict[str, Any], loc: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as caught:
        RankRegistration.model_validate({**REGISTRATION, **change})
    assert [e["loc"] for e in caught.value.errors()] == [loc]


def test_a_registration_may_name_its_process() -> None:
    assert RankRegistration.model_validate({**REGISTRATION, "instance": "host-1_42"}).instance


def test_a_profile_has_two_rows_at_least_and_a_bounded_number() -> None:
    row = {"instruction": "forward", "frequency_mhz": 1980, "time_s": 0.1, "energy_j": 1.0}
    for rows in ([row], [row] * (MAX_PROFILE_ROWS + 1)):
        with pytest.raises(ValidationError) as caught:
            ProfileReport.model_validate({"rank": 0, "stage": 0, "rows": rows})
        assert caught.value.errors()[0]["loc"] == ("rows",)
    assert len(ProfileReport.model_validate({"rank": 0, "stage": 0, "rows": [row] * 2}).rows) == 2


def test_an_iteration_may_take_no_energy_but_some_time() -> None:
    report = {"rank": 0, "iteration": 3, "time_s": 1.5, "energy_j": 0.0}
    assert IterationReport.model_validate(report).phase is None
    for change, loc in (({"time_s": 0.0}, "time_s"), ({"phase": "warmup"}, "phase"),
                        ({"plan_version": -1}, "plan_version")):  # fmt: skip
        with pytest.raises(ValidationError) as caught:
            IterationReport.model_validate({**report, **change})
        assert caught.value.errors()[0]["loc"] == (loc,)


def test_the_plan_query_reads_text_and_refuses_unknown_parameters() -> None:
    assert PlanQuery.model_validate({"rank": "3", "wait_s": "30"}) == PlanQuery(rank=3, wait_s=30.0)
    assert PlanQuery.model_validate({"rank": "0"}).wait_s == 0.0
    for query in (
        {"rank": "0", "wait": "30"},  # a misspelt wait_s would make a long poll a busy loop
        {"rank": "0", "wait_s": "inf"},
        {"rank": "0", "wait_s": str(MAX_WAIT_QUERY_S * 2)},
        {"rank": "-1"},
        {},
    ):
        with pytest.raises(ValidationError):
            PlanQuery.model_validate(query)


def test_profiling_progress_is_optional_and_never_past_its_plan() -> None:
    base = {"rank": 0, "iteration": 3, "time_s": 0.5, "energy_j": 1.0, "phase": "profiling"}
    assert IterationReport.model_validate(base).profiling is None  # an older rank
    progress = {"clocks_done": 3, "clocks_planned": 110, "elapsed_s": 9.5}
    report = IterationReport.model_validate(base | {"profiling": progress})
    assert report.profiling is not None and report.profiling.budget_s is None
    with pytest.raises(ValidationError, match=r"clocks_done \(4\) exceeds clocks_planned \(3\)"):
        IterationReport.model_validate(
            base | {"profiling": {"clocks_done": 4, "clocks_planned": 3, "elapsed_s": 1.0}}
        )
