"""The ``torch.distributed.pipelining`` adapter in one process (gloo, one rank, quick).

A rank that records what the adapter tells it stands in for perseus: evaluation runs no
instruction, instrumenting a stage again (a rebuilt schedule) reports each instruction once,
and a schedule that splits the backward never gets an exception from perseus.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from .conftest import free_port

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining.schedules import (  # noqa: E402
    Schedule1F1B,
    ScheduleInterleavedZeroBubble,
)

from perseus.client.integrations.torch_pipelining import instrument  # noqa: E402

Event = tuple[str, int, int | None, bool]


@dataclass
class RecordingRank:
    """Records each instruction and whether it ran inside an iteration."""

    active: bool = True
    events: list[Event] = field(default_factory=list)
    inside: bool = False

    @contextlib.contextmanager
    def iteration(self) -> Iterator[None]:
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    @contextlib.contextmanager
    def instruction(self, kind: str, microbatch: int, chunk: int | None = None) -> Iterator[None]:
        self.events.append((kind, microbatch, chunk, self.inside))
        yield

    def bind(self, **values: Any) -> None:
        pass


@pytest.fixture
def one_process() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        torch.manual_seed(0)
        yield
    finally:
        dist.destroy_process_group()


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target).square().mean()


ONE_STEP = [
    ("forward", 0, None, True),
    ("backward", 0, None, True),
    ("forward", 1, None, True),
    ("backward", 1, None, True),
]


def test_evaluation_runs_no_instruction(one_process: None) -> None:
    stage = PipelineStage(torch.nn.Linear(4, 4), 0, 1, torch.device("cpu"))
    schedule = Schedule1F1B(stage, 2, loss_fn=_loss)
    rank = RecordingRank()
    instrument(rank, stage, schedule, microbatches=2)  # type: ignore[arg-type]
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    with rank.iteration():
        schedule.step(x, target=y)
    schedule.eval(x, target=y)  # outside any iteration: must not reach the rank
    with rank.iteration():
        schedule.step(x, target=y)
    assert rank.events == ONE_STEP + ONE_STEP


def test_instrumenting_a_rebuilt_schedule_reports_each_instruction_once(
    one_process: None,
) -> None:
    stage = PipelineStage(torch.nn.Linear(4, 4), 0, 1, torch.device("cpu"))
    original = stage.forward_one_chunk
    rank = RecordingRank()
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(2):
        schedule = Schedule1F1B(stage, 2, loss_fn=_loss)
        instrument(rank, stage, schedule, microbatches=2)  # type: ignore[arg-type]
        rank.events.clear()
        with rank.iteration():
            schedule.step(x, target=y)
        assert rank.events == ONE_STEP
    assert stage.forward_one_chunk.__perseus_original__ == original  # type: ignore[attr-defined]
    assert len(stage.submod._forward_pre_hooks) == 1


def test_a_split_backward_is_logged_not_raised_into_training(
    one_process: None, caplog: pytest.LogCaptureFixture
) -> None:
    stages = [PipelineStage(torch.nn.Linear(4, 4), i, 2, torch.device("cpu")) for i in range(2)]
    schedule = ScheduleInterleavedZeroBubble(stages, 2, loss_fn=_loss)  # type: ignore[arg-type]
    rank = RecordingRank()
    instrument(rank, stages, None, microbatches=2)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="perseus.client"), rank.iteration():
        schedule.step(torch.randn(4, 4), target=torch.randn(4, 4))
    assert "zero-bubble" in caplog.text
    assert all(kind == "forward" for kind, *_ in rank.events)
