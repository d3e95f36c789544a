"""The wire models agree with the solver where they restate its names and bounds."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from perseus.schemas import InstructionName, JobCreate, ScheduleName
from perseus.solver import SCHEDULE_NAMES, InstructionKind, make_schedule
from perseus.solver.frontier import RESOLUTION_S


def test_schedule_names_are_the_solvers() -> None:
    assert get_args(ScheduleName) == SCHEDULE_NAMES


def test_instruction_names_are_the_solvers() -> None:
    schedule = make_schedule("1f1b", 2, 2)
    kinds = {ins.kind for order in schedule.order for ins in order}
    assert kinds <= set(get_args(InstructionName)) == set(InstructionKind)


def test_coarsest_resolution_is_the_solvers() -> None:
    body = {"schedule": "1f1b", "stages": 2, "microbatches": 2, "data_parallel": 1}
    body["tensor_parallel"] = 1
    assert JobCreate.model_validate({**body, "resolution_s": RESOLUTION_S}).resolution_s
    with pytest.raises(ValidationError):
        JobCreate.model_validate({**body, "resolution_s": RESOLUTION_S * 1.001})
