"""The wire's and the files' models of a ground-floor type are renderings of it: each field is
one of the core type's, and a value goes through and back unchanged. The old names (in
``perseus.solver``) are the core types themselves."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from pydantic import BaseModel

import perseus.core.baselines as core_baselines
import perseus.core.pipeline as core_pipeline
import perseus.core.points as core_points
import perseus.core.policies as core_policies
import perseus.core.profiles as core_profiles
import perseus.formats.profiles as profile_files
import perseus.solver as solver
from perseus.core.pipeline import InstructionKind
from perseus.formats.plan_files import FileBaseline, FilePoint
from perseus.schemas import Baseline as WireBaseline
from perseus.schemas import FrontierPoint
from perseus.schemas import ProfileRow as WireProfileRow

POINT = core_points.Point(0.5, 120.25, 0.003, ((1980, 1410), (1005,)))
BASELINE = core_baselines.Baseline(0.4, 150.5, ((1980, 1980), (1980,)))
ROW = core_profiles.ProfileRow(2, InstructionKind.BACKWARD_INPUT, 1410, 0.031, 7.5)

RENDERINGS: list[tuple[type[BaseModel], type]] = [
    (FrontierPoint, core_points.Point),
    (WireBaseline, core_baselines.Baseline),
    (WireProfileRow, core_profiles.ProfileRow),
    (FilePoint, core_points.Point),
    (FileBaseline, core_baselines.Baseline),
]


#: What the wire adds for its readers, given by the caller (each optional, None by default).
WIRE_ONLY: dict[type[BaseModel], set[str]] = {WireBaseline: {"label"}}


@pytest.mark.parametrize(("model", "core"), RENDERINGS, ids=lambda x: x.__qualname__)
def test_every_field_is_one_of_the_core_types(model: type[BaseModel], core: type) -> None:
    fields = {f.name for f in dataclasses.fields(core)}
    assert set(model.model_fields) - WIRE_ONLY.get(model, set()) <= fields
    hints = typing.get_type_hints(core)
    for name in fields & set(model.model_fields):  # numbers stay numbers, clocks stay clocks
        assert (hints[name] is float) == (model.model_fields[name].annotation is float), name


def test_the_files_keep_every_field_and_the_wire_drops_the_clocks() -> None:
    assert FilePoint.from_point(POINT).model_dump() == {
        "time_s": 0.5,
        "energy_j": 120.25,
        "gap": 0.003,
        "frequencies_mhz": [[1980, 1410], [1005]],
    }
    assert FileBaseline.from_baseline(BASELINE).to_baseline() == BASELINE
    assert FrontierPoint.from_point(POINT).model_dump() == {
        "time_s": 0.5,
        "energy_j": 120.25,
        "gap": 0.003,
    }
    assert WireBaseline.from_baseline(BASELINE).model_dump() == {
        "time_s": 0.4,
        "energy_j": 150.5,
        "label": None,
    }


def test_a_row_goes_over_the_wire_and_back() -> None:
    wire = WireProfileRow.from_row(ROW)
    assert wire.model_dump() == {
        "instruction": "backward_input",
        "frequency_mhz": 1410,
        "time_s": 0.031,
        "energy_j": 7.5,
    }
    back = wire.to_row(2)
    assert back == ROW
    assert type(back.instruction) is InstructionKind


def test_the_old_names_are_the_core_types() -> None:
    """One type per concept: what perseus.solver exports is what the ground floor defines."""
    assert solver.Point is core_points.Point
    assert solver.Baseline is core_baselines.Baseline
    assert solver.BaselineKey is core_baselines.BaselineKey
    assert solver.InstructionKind is core_pipeline.InstructionKind
    assert solver.SCHEDULE_NAMES is core_pipeline.SCHEDULE_NAMES
    assert solver.INSTRUCTIONS is core_pipeline.INSTRUCTIONS
    assert solver.Policy is core_policies.Policy
    assert solver.POLICY_KINDS is core_policies.POLICY_KINDS
    assert solver.ProfileRow is core_profiles.ProfileRow
    assert solver.Profile is core_profiles.Profile
    assert solver.Option is core_profiles.Option
    assert solver.profile_from_rows is core_profiles.profile_from_rows
    assert solver.load_profile is profile_files.load_profile
    assert solver.profile_to_json is profile_files.profile_to_json
    from perseus.solver import profiles, schedules

    assert profiles.profile_to_csv is profile_files.profile_to_csv
    assert profiles.profile_from_json is profile_files.profile_from_json
    assert schedules.CHUNKED_SCHEDULES is core_pipeline.CHUNKED_SCHEDULES


def test_profile_rows_list_every_measurement_in_file_order() -> None:
    rows = [
        (0, "backward", 1410, 0.2, 30.0),
        (0, "forward", 1410, 0.1, 15.0),
        (0, "forward", 1980, 0.08, 18.0),
        (0, "backward_weight", 1980, 0.05, 6.0),
        (0, "backward_input", 1980, 0.06, 7.0),
        (0, "backward", 1980, 0.16, 35.0),
    ]
    profile = core_profiles.profile_from_rows(rows)
    assert [row.as_tuple() for row in profile.rows()] == [
        (0, "forward", 1980, 0.08, 18.0),
        (0, "forward", 1410, 0.1, 15.0),
        (0, "backward", 1980, 0.16, 35.0),
        (0, "backward", 1410, 0.2, 30.0),
        (0, "backward_input", 1980, 0.06, 7.0),
        (0, "backward_weight", 1980, 0.05, 6.0),
    ]
    assert core_profiles.profile_from_rows(profile.rows()) == profile
