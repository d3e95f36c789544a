"""Wire models of a job's life (perseus.wire.jobs): creation's bounds and sizes, policies,
straggler changes; bad input is an error naming the field and why."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from perseus.solver.frontier import RESOLUTION_S
from perseus.wire.common import MAX_INSTRUCTIONS, MAX_WORLD_SIZE
from perseus.wire.jobs import (
    DeadlinePolicy,
    JobCreate,
    MaxSlowdownPolicy,
    NoSlowdownPolicy,
    StragglerSpec,
    ZeusCostPolicy,
)

BODY: dict[str, Any] = {
    "schedule": "1f1b",
    "stages": 2,
    "microbatches": 2,
    "data_parallel": 1,
    "tensor_parallel": 1,
}


def errors(**change: Any) -> list[dict[str, Any]]:
    """The validation errors of :data:`BODY` with ``change``."""
    with pytest.raises(ValidationError) as caught:
        JobCreate.model_validate({**BODY, **change})
    return [dict(e) for e in caught.value.errors()]


def test_coarsest_resolution_is_the_solvers() -> None:
    assert JobCreate.model_validate({**BODY, "resolution_s": RESOLUTION_S}).resolution_s
    assert errors(resolution_s=RESOLUTION_S * 1.001)[0]["loc"] == ("resolution_s",)


def test_defaults_are_no_slowdown_and_no_automatic_straggler() -> None:
    job = JobCreate.model_validate(BODY)
    assert job.policy == NoSlowdownPolicy(kind="no-slowdown")
    assert job.auto_straggler is False and job.virtual_stages == 1
    wide = JobCreate.model_validate({**BODY, "data_parallel": 3, "tensor_parallel": 4})
    assert wide.world_size == 2 * 3 * 4


def test_policies_are_told_apart_by_kind() -> None:
    for policy, model in (
        ({"kind": "deadline", "seconds": 2.5}, DeadlinePolicy),
        ({"kind": "max-slowdown", "factor": 1.1}, MaxSlowdownPolicy),
        ({"kind": "zeus-cost", "eta": 0.0}, ZeusCostPolicy),
    ):
        assert type(JobCreate.model_validate({**BODY, "policy": policy}).policy) is model
    (missing,) = errors(policy={"kind": "deadline"})
    assert missing["loc"] == ("policy", "deadline", "seconds") and missing["type"] == "missing"
    (unknown,) = errors(policy={"kind": "fastest"})
    assert unknown["loc"] == ("policy",) and "'deadline'" in unknown["msg"]
    (low,) = errors(policy={"kind": "max-slowdown", "factor": 0.9})
    assert low["loc"] == ("policy", "max-slowdown", "factor")


def test_virtual_stages_need_a_chunked_schedule() -> None:
    (error,) = errors(virtual_stages=2)
    assert "virtual_stages > 1 needs one of" in error["msg"] and "interleaved-1f1b" in error["msg"]
    assert JobCreate.model_validate({**BODY, "schedule": "interleaved-1f1b", "virtual_stages": 2})


def test_the_world_size_is_bounded() -> None:
    (error,) = errors(stages=2, data_parallel=MAX_WORLD_SIZE // 2, tensor_parallel=2)
    assert f"= {MAX_WORLD_SIZE * 2} exceeds {MAX_WORLD_SIZE}" in error["msg"]
    assert JobCreate.model_validate({**BODY, "data_parallel": MAX_WORLD_SIZE // 2})


def test_instructions_are_bounded_and_a_split_backward_counts_three() -> None:
    microbatches = MAX_INSTRUCTIONS // (2 * 32)
    assert JobCreate.model_validate({**BODY, "stages": 32, "microbatches": microbatches})
    (error,) = errors(stages=32, microbatches=microbatches + 1)
    assert error["msg"].endswith(f"exceeds {MAX_INSTRUCTIONS}") and "2 x stages" in error["msg"]
    (split,) = errors(schedule="zbv", stages=32, microbatches=microbatches, virtual_stages=2)
    assert "3 x stages x microbatches x virtual_stages" in split["msg"]


@pytest.mark.parametrize("body", [{}, {"slowdown": 1.1, "iteration_time_s": 2.0}])
def test_a_straggler_is_exactly_one_of_its_two_fields(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="give exactly one of iteration_time_s and slowdown"):
        StragglerSpec.model_validate(body)


def test_a_straggler_is_never_faster_than_its_plan() -> None:
    assert StragglerSpec(slowdown=1.0).slowdown == 1.0
    with pytest.raises(ValidationError) as caught:
        StragglerSpec.model_validate({"slowdown": 0.5})
    assert caught.value.errors()[0]["loc"] == ("slowdown",)
