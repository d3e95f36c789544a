"""The wire's common ground (perseus.wire.common): names shared with the solver, strict
numbers, storable text, unknown fields, the paths."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from perseus.solver import SCHEDULE_NAMES, InstructionKind, make_schedule
from perseus.wire.common import (
    API_PREFIX,
    HEALTHZ_PATH,
    JOB_PATH,
    JOB_STATES,
    METRICS_PATH,
    PLAN_PATH,
    InstructionName,
    Name,
    PositiveSeconds,
    ScheduleName,
    StrictInt,
    WireModel,
)


class Sample(WireModel):
    count: StrictInt = 0
    seconds: PositiveSeconds = 1.0
    name: Name | None = None


def test_schedule_names_are_the_solvers() -> None:
    assert get_args(ScheduleName) == SCHEDULE_NAMES


def test_instruction_names_are_the_solvers() -> None:
    schedule = make_schedule("1f1b", 2, 2)
    kinds = {ins.kind for order in schedule.order for ins in order}
    assert kinds <= set(get_args(InstructionName)) == set(InstructionKind)


def test_job_states_run_in_lifecycle_order() -> None:
    assert JOB_STATES == ("registering", "profiling", "planning", "ready", "failed")


@pytest.mark.parametrize("value", [True, "2", 2.0])
def test_an_integer_is_never_converted(value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        Sample.model_validate({"count": value})
    assert [e["loc"] for e in caught.value.errors()] == [("count",)]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "1.0", False, 0, -1.0, 1e8])
def test_seconds_are_finite_positive_numbers(value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        Sample.model_validate({"seconds": value})
    assert [e["loc"] for e in caught.value.errors()] == [("seconds",)]


def test_an_integer_is_fine_where_seconds_are_expected() -> None:
    assert Sample.model_validate({"seconds": 2}).seconds == 2.0


def test_text_with_a_nul_character_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="must not contain NUL characters"):
        Sample.model_validate({"name": "a\x00b"})
    with pytest.raises(ValidationError):
        Sample.model_validate({"name": "a" * 201})
    assert Sample.model_validate({"name": "ünïcode ✓"}).name == "ünïcode ✓"


def test_an_unknown_field_is_an_error_naming_it() -> None:
    with pytest.raises(ValidationError) as caught:
        Sample.model_validate({"cuont": 1})
    (error,) = caught.value.errors()
    assert error["loc"] == ("cuont",) and error["type"] == "extra_forbidden"


def test_models_are_frozen() -> None:
    sample = Sample(count=1)
    with pytest.raises(ValidationError):
        sample.count = 2  # type: ignore[misc]


def test_api_paths_live_under_the_prefix_and_name_the_job() -> None:
    assert JOB_PATH.startswith(API_PREFIX + "/") and "{job_id}" in JOB_PATH
    assert PLAN_PATH == JOB_PATH + "/plan"
    assert not HEALTHZ_PATH.startswith(API_PREFIX) and not METRICS_PATH.startswith(API_PREFIX)
