"""perseus for ``torch.distributed.pipelining``: one call per rank.

::

    rank = perseus.client.connect()
    # one stage or a list of stages
    perseus.client.integrations.torch_pipelining.instrument(rank, stage, schedule)
    for batch in data:
        with rank.iteration():
            schedule.step(...)

The schedules call ``stage.forward_one_chunk(chunk_id, ...)`` and
``stage.backward_one_chunk(chunk_id, ...)`` through the stage object, in execution order, so
wrapping them on the instance sees every instruction with its microbatch id (``Schedule1F1B``,
``ScheduleGPipe``, ``ScheduleInterleaved1F1B``, ``ScheduleLoopedBFS``). Zero-bubble schedules
(``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``) split a
backward into ``backward_one_chunk(..., full_backward=False)``, reported as
``backward_input``, and ``backward_weight_one_chunk``, reported as ``backward_weight``; an
overlapped action (DualPipeV's ``OVERLAP_F_B``) runs its forward and its full backward one
after the other through the same methods, so it is reported as those two instructions, in
that order (perseus plans it so; it does not model the overlap). The model chunk of a stage on
a rank with several is ``stage_index // pipeline size``: the position of the stage among the
rank's stages in ascending order, for the "loop" placement of the interleaved schedules as
for the "V" of ZBV and DualPipeV (rank ``r`` of ``R`` holds stages ``r`` and ``2R - 1 - r``);
for single-stage schedules it is None. ``schedule.eval()`` (the stages' ``has_backward`` off)
runs no instruction. Instrumenting a stage again (a rebuilt schedule) replaces the earlier
wrappers.

For online profiling the first iteration captures one real microbatch of every local stage
(its inputs, detached); the profiling loops rerun the stage's module on it, forward and
forward+backward, with ``torch.autograd.grad`` so no gradient reaches the parameters, and
with the random-number state and the module's buffers restored afterwards: training after
profiling computes exactly what it would have without it. When the schedule splits the
backward, the profiler also runs the input half alone (the gradient of the stage's inputs
only, which autograd computes without the weight gradients); the weight half is the rest of
the backward (:mod:`perseus.client.profiling.profiler`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)

from perseus.client.integrations.tensors import detached, flatten_tensors, preserved, with_grad
from perseus.client.rank import Rank
from perseus.core.errors import ScheduleError
from perseus.core.pipeline import CHUNKED_SCHEDULES, SPLIT_BACKWARD_SCHEDULES, InstructionKind

__all__ = ["StageWorkload", "instrument", "schedule_name"]


_NAMES: dict[type, str] = {
    Schedule1F1B: "1f1b",
    ScheduleGPipe: "gpipe",
    ScheduleInterleaved1F1B: "interleaved-1f1b",
    ScheduleLoopedBFS: "looped-bfs",
    ScheduleInterleavedZeroBubble: "interleaved-zb",
    ScheduleZBVZeroBubble: "zbv",
    ScheduleDualPipeV: "dualpipev",
}
"""perseus's name of each torch schedule class it plans (exact classes: a subclass may run
another order)."""


def schedule_name(schedule: object) -> str:
    """perseus's name for a torch schedule object.

    Raises:
        ScheduleError: perseus does not plan this schedule.
    """
    name = _NAMES.get(type(schedule))
    if name is None:
        raise ScheduleError(
            f"perseus plans {', '.join(c.__name__ for c in _NAMES)}, not {type(schedule).__name__}"
        )
    return name


def instrument(
    rank: Rank,
    stages: PipelineStage | Sequence[PipelineStage],
    schedule: PipelineScheduleSingle | PipelineScheduleMulti | None = None,
    *,
    microbatches: int | None = None,
) -> None:
    """Make every forward and backward of ``stages`` a perseus instruction.

    Args:
        rank: From :func:`perseus.client.connect`; a rank that is off leaves the stages alone.
        stages: This process's stage, or its stages (interleaved schedules).
        schedule: The schedule that drives them; its kind is checked against the job.
        microbatches: Microbatches per step, checked against the job when given.

    Raises:
        ScheduleError: The schedule is one perseus does not plan, or stages do not belong
            to one pipeline rank.
    """
    local = [stages] if isinstance(stages, PipelineStage) else list(stages)
    if not local:
        raise ScheduleError("instrument: no stages given")
    name = schedule_name(schedule) if schedule is not None else None
    if not rank.active:
        return
    size = local[0].group_size
    group_rank = local[0].group_rank
    if any(s.group_rank != group_rank for s in local):
        raise ScheduleError("instrument: the stages belong to different pipeline ranks")
    chunks = len(local)
    interleaved = chunks > 1 or name in CHUNKED_SCHEDULES
    # Without the schedule, the first split backward seen tells the workload (the profiling
    # loops start at the second iteration).
    workload = StageWorkload(local, splits_backward=name in SPLIT_BACKWARD_SCHEDULES)
    for stage in local:
        chunk = stage.stage_index // size if interleaved else None
        previous = getattr(stage.forward_one_chunk, "__perseus_hook__", None)
        if previous is not None:  # instrumented before: the old workload stops capturing
            previous.remove()
        _wrap(rank, stage, chunk, workload)
        hook = stage.submod.register_forward_pre_hook(
            workload.capture_hook(stage), with_kwargs=True
        )
        stage.forward_one_chunk.__perseus_hook__ = hook  # type: ignore[attr-defined]
    rank.bind(
        stage=group_rank,
        stages=size,
        schedule=name,
        microbatches=microbatches,
        virtual_stages=chunks if interleaved else None,
        workload=workload.ready,
    )


def _wrap(rank: Rank, stage: PipelineStage, chunk: int | None, workload: StageWorkload) -> None:
    # Instrumenting a stage again (a rebuilt schedule) wraps the framework's methods, not the
    # previous wrappers: each instruction is reported once.
    forward = getattr(stage.forward_one_chunk, "__perseus_original__", stage.forward_one_chunk)
    backward = getattr(stage.backward_one_chunk, "__perseus_original__", stage.backward_one_chunk)
    weight = getattr(
        stage.backward_weight_one_chunk,
        "__perseus_original__",
        stage.backward_weight_one_chunk,
    )

    def forward_one_chunk(fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        # schedule.eval() runs the training schedule with has_backward off: no instruction.
        if not stage.has_backward:
            return forward(fwd_chunk_id, *args, **kwargs)
        with rank.instruction(InstructionKind.FORWARD, fwd_chunk_id, chunk):
            return forward(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        if not stage.has_backward:  # eval(): the stage returns at once
            return backward(bwd_chunk_id, *args, **kwargs)
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        kind = InstructionKind.BACKWARD
        if not full:  # the input half of a zero-bubble schedule's split backward
            kind = InstructionKind.BACKWARD_INPUT
            workload.splits_backward = True
        with rank.instruction(kind, bwd_chunk_id, chunk):
            return backward(bwd_chunk_id, *args, **kwargs)

    def backward_weight_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        if not stage.has_backward:
            return weight(bwd_chunk_id, *args, **kwargs)
        with rank.instruction(InstructionKind.BACKWARD_WEIGHT, bwd_chunk_id, chunk):
            return weight(bwd_chunk_id, *args, **kwargs)

    forward_one_chunk.__perseus_original__ = forward  # type: ignore[attr-defined]
    backward_one_chunk.__perseus_original__ = backward  # type: ignore[attr-defined]
    backward_weight_one_chunk.__perseus_original__ = weight  # type: ignore[attr-defined]
    stage.forward_one_chunk = forward_one_chunk  # type: ignore[method-assign]
    stage.backward_one_chunk = backward_one_chunk  # type: ignore[method-assign]
    stage.backward_weight_one_chunk = backward_weight_one_chunk  # type: ignore[method-assign]


class StageWorkload:
    """The local stages' forward and backward on one captured microbatch.

    A forward runs every local stage's module (an interleaved rank's instruction cost is
    the whole stage divided by its chunks, as the planner models it). A
    :class:`~perseus.client.profiling.profiler.SplitWorkload`: with ``splits_backward`` the profiler
    also runs :meth:`backward_input`.
    """

    def __init__(self, stages: list[PipelineStage], *, splits_backward: bool = False) -> None:
        self._stages = stages
        self._inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self.splits_backward = splits_backward
        """Whether the schedule splits the backward (zero-bubble)."""

    def capture_hook(self, stage: PipelineStage) -> Any:
        index = stage.stage_index

        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if index not in self._inputs:
                self._inputs[index] = (detached(args), detached(kwargs))

        return hook

    def ready(self) -> StageWorkload | None:
        """Self once every local stage has seen a microbatch, else None."""
        return self if len(self._inputs) == len(self._stages) else None

    def forward(self) -> object:
        outputs = []
        with preserved(s.submod for s in self._stages):
            for stage in self._stages:
                args, kwargs = self._inputs[stage.stage_index]
                inputs = with_grad(args)
                out = stage.submod(*inputs, **kwargs)
                outputs.append((inputs, out, stage))
        return outputs

    def backward(self, handle: object) -> None:
        with preserved(s.submod for s in self._stages):
            for inputs, out, stage in handle:  # type: ignore[attr-defined]
                tensors = [t for t in flatten_tensors(out) if t.requires_grad]
                if not tensors:
                    continue
                wrt = [p for p in stage.submod.parameters() if p.requires_grad]
                wrt += [t for t in flatten_tensors(inputs) if t.requires_grad]
                grads = [torch.ones_like(t) for t in tensors]
                torch.autograd.grad(tensors, wrt, grads, allow_unused=True)

    def backward_input(self, handle: object) -> None:
        """The input half of a split backward: the gradient of each stage's inputs only.

        Autograd computes only what that gradient needs (no weight gradient); a stage whose
        inputs need none (the first: token ids) has nothing to compute, as in torch, whose
        ``backward_one_chunk(full_backward=False)`` skips the first stage.
        """
        with preserved(s.submod for s in self._stages):
            for inputs, out, _ in handle:  # type: ignore[attr-defined]
                tensors = [t for t in flatten_tensors(out) if t.requires_grad]
                wrt = [t for t in flatten_tensors(inputs) if t.requires_grad]
                if not tensors or not wrt:
                    continue
                grads = [torch.ones_like(t) for t in tensors]
                torch.autograd.grad(tensors, wrt, grads, allow_unused=True)

    def synchronize(self) -> None:
        device = _device(self._stages[0])
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def _device(stage: PipelineStage) -> torch.device:
    for p in stage.submod.parameters():
        return p.device
    return torch.device("cpu")
