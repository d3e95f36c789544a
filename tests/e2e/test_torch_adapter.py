"""The ``torch.distributed.pipelining`` adapter in one process (gloo, one rank, quick).

A rank that records what the adapter tells it stands in for perseus: evaluation runs no
instruction, instrumenting a stage again (a rebuilt schedule) reports each instruction once,
and the zero-bubble schedules report the backward's halves (and DualPipeV's overlapped
actions as their two halves) in the order perseus plans them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining.schedules import (  # noqa: E402
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from perseus.client.integrations.torch_pipelining import instrument, schedule_name  # noqa: E402
from perseus.solver.schedules import make_schedule  # noqa: E402

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

    bound: dict[str, Any] = field(default_factory=dict)

    def bind(self, **values: Any) -> None:
        self.bound.update(values)


@pytest.fixture
def one_process() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    # An in-process store: no port picked free that something else may take first.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
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


ZERO_BUBBLE = [
    ("interleaved-zb", ScheduleInterleavedZeroBubble),
    ("zbv", ScheduleZBVZeroBubble),
    ("dualpipev", ScheduleDualPipeV),
]


@pytest.mark.parametrize(("name", "schedule_class"), ZERO_BUBBLE)
def test_zero_bubble_schedules_report_their_halves_in_the_planned_order(
    one_process: None, name: str, schedule_class: type
) -> None:
    """One rank with two stages: what the schedule runs, as the adapter reports it, is the
    order perseus plans (the solver's own list of this schedule), halves and overlapped
    actions included; the profiling workload then runs the input half too."""
    stages = [PipelineStage(torch.nn.Linear(4, 4), i, 2, torch.device("cpu")) for i in range(2)]
    schedule = schedule_class(stages, 4, loss_fn=_loss)
    assert schedule_name(schedule) == name
    rank = RecordingRank()
    instrument(rank, stages, schedule, microbatches=4)  # type: ignore[arg-type]
    assert rank.bound["schedule"] == name and rank.bound["virtual_stages"] == 2
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    with rank.iteration():
        schedule.step(x, target=y)
    planned = make_schedule(name, 1, 4, 2).order[0]
    assert [(k, j, c) for k, j, c, _ in rank.events] == [
        (i.kind.value, i.microbatch, i.chunk) for i in planned
    ]
    kinds = {k for k, *_ in rank.events}
    assert {"backward_input", "backward_weight"} <= kinds
    workload = rank.bound["workload"]()
    assert workload is not None and workload.splits_backward
    grads = [p.grad.clone() for s in stages for p in s.submod.parameters()]
    handle = workload.forward()
    workload.backward_input(handle)
    workload.backward(workload.forward())
    # the profiling loops leave the training's gradients alone
    after = [p.grad for s in stages for p in s.submod.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(grads, after, strict=True))


def test_a_split_backward_is_seen_without_the_schedule(one_process: None) -> None:
    stages = [PipelineStage(torch.nn.Linear(4, 4), i, 2, torch.device("cpu")) for i in range(2)]
    schedule = ScheduleInterleavedZeroBubble(stages, 2, loss_fn=_loss)  # type: ignore[arg-type]
    rank = RecordingRank()
    instrument(rank, stages, None, microbatches=2)  # type: ignore[arg-type]
    with rank.iteration():
        schedule.step(torch.randn(4, 4), target=torch.randn(4, 4))
    kinds = [kind for kind, *_ in rank.events]
    assert kinds.count("backward_input") == kinds.count("backward_weight") == 4
    assert rank.bound["workload"]().splits_backward
