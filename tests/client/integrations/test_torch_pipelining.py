"""The ``torch.distributed.pipelining`` adapter on one CPU process (gloo, world size 1): which
schedules perseus plans, what ``instrument`` binds and when it leaves a stage alone, and the
stage workload the profiler reruns (the schedules' instruction order, rebuilt schedules and
zero-bubble halves: tests/e2e/test_torch_adapter.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe  # noqa: E402

from perseus.client.integrations.torch_pipelining import (  # noqa: E402
    StageWorkload,
    instrument,
    schedule_name,
)
from perseus.core.errors import ScheduleError  # noqa: E402

from ..gloo import one_rank_group  # noqa: E402


@dataclass
class Rank:
    """The rank's public hooks, recorded."""

    active: bool = True
    instructions: list[tuple[str, int, int | None]] = field(default_factory=list)
    bound: dict[str, Any] = field(default_factory=dict)

    @contextlib.contextmanager
    def instruction(self, kind: str, microbatch: int, chunk: int | None = None) -> Iterator[None]:
        self.instructions.append((str(kind), microbatch, chunk))
        yield

    def bind(self, **values: Any) -> None:
        self.bound.update(values)


@pytest.fixture
def group() -> Iterator[None]:
    with one_rank_group():
        torch.manual_seed(0)
        yield


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target).square().mean()


class Stage(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear(x))


def test_an_unplanned_schedule_is_refused_by_its_exact_class(group: None) -> None:
    stage = PipelineStage(Stage(), 0, 1, torch.device("cpu"))

    class Custom1F1B(Schedule1F1B):
        """A subclass may run another order."""

    assert schedule_name(Schedule1F1B(stage, 2, loss_fn=loss)) == "1f1b"
    assert schedule_name(ScheduleGPipe(stage, 2, loss_fn=loss)) == "gpipe"
    with pytest.raises(ScheduleError, match="not Custom1F1B") as refused:
        schedule_name(Custom1F1B(stage, 2, loss_fn=loss))
    assert "Schedule1F1B" in str(refused.value) and "ScheduleDualPipeV" in str(refused.value)
    with pytest.raises(ScheduleError, match="not object"):
        schedule_name(object())


def test_no_stages_is_an_error_even_for_a_rank_that_is_off() -> None:
    with pytest.raises(ScheduleError, match="no stages given"):
        instrument(Rank(active=False), [])  # type: ignore[arg-type]


def test_a_rank_that_is_off_leaves_the_stage_alone(group: None) -> None:
    stage = PipelineStage(Stage(), 0, 1, torch.device("cpu"))
    methods = stage.forward_one_chunk, stage.backward_one_chunk
    rank = Rank(active=False)
    instrument(rank, stage, Schedule1F1B(stage, 2, loss_fn=loss))  # type: ignore[arg-type]
    assert (stage.forward_one_chunk, stage.backward_one_chunk) == methods
    assert rank.bound == {}


def test_instrument_binds_the_stage_and_profiles_a_captured_microbatch(group: None) -> None:
    model = Stage()
    stage = PipelineStage(model, 0, 1, torch.device("cpu"))
    schedule = Schedule1F1B(stage, 2, loss_fn=loss)
    rank = Rank()
    instrument(rank, stage, schedule, microbatches=2)  # type: ignore[arg-type]
    workload_of = rank.bound.pop("workload")
    assert rank.bound == {
        "stage": 0, "stages": 1, "schedule": "1f1b", "microbatches": 2, "virtual_stages": None,
    }  # fmt: skip
    assert workload_of() is None  # nothing captured before the first step
    schedule.step(torch.randn(4, 4), target=torch.randn(4, 4))
    assert rank.instructions == [
        ("forward", 0, None), ("backward", 0, None), ("forward", 1, None), ("backward", 1, None),
    ]  # fmt: skip
    workload = workload_of()
    assert isinstance(workload, StageWorkload) and not workload.splits_backward
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    handle = workload.forward()
    workload.backward(handle)
    workload.backward_input(handle)  # the first stage's input (the data) needs no gradient
    workload.synchronize()
    assert all(p.grad is None for p in model.parameters())  # no gradient reaches training
    assert torch.equal(torch.rand(3), expected)  # nor does the reruns' dropout
