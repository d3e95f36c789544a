"""Pipeline schedules as data: per-GPU instruction order plus dependency rules.

A :class:`Schedule` is the execution order on every GPU. The data dependencies are the same for
every schedule and follow from the model's layer order: with ``U = stages * virtual_stages``
model chunks, where chunk ``c`` of GPU ``g`` holds virtual stage ``u = c * stages + g``
(Megatron's placement),

- ``forward(u, j) -> forward(u + 1, j)``;
- ``backward(u + 1, j) -> backward(u, j)``;
- ``forward(U - 1, j) -> backward(U - 1, j)`` (the loss).

Adding a schedule means writing one function that returns the per-GPU order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from perseus.errors import ScheduleError

__all__ = [
    "BACKWARD",
    "BACKWARD_INPUT",
    "BACKWARD_WEIGHT",
    "CHUNKED_SCHEDULES",
    "FORWARD",
    "SCHEDULE_NAMES",
    "SPLIT_BACKWARD_SCHEDULES",
    "Instruction",
    "InstructionKind",
    "Schedule",
    "make_schedule",
    "per_gpu",
]


class InstructionKind(StrEnum):
    """What a pipeline instruction does."""

    # A string, so `kind == "forward"` and the wire's and files' values stay as they are (its
    # docstring is the OpenAPI document's description). A new kind (a split backward, say) is
    # a new member here; the profile then measures it and the DAG gives it its dependencies.

    FORWARD = "forward"
    BACKWARD = "backward"
    BACKWARD_INPUT = "backward_input"
    """The input-gradient half of a split backward (torch's ``I``); the loss's gradient flows
    on to the previous stage once it is done."""
    BACKWARD_WEIGHT = "backward_weight"
    """The weight-gradient half of a split backward (torch's ``W``); nothing waits for it but
    the end of the iteration."""


FORWARD = InstructionKind.FORWARD
BACKWARD = InstructionKind.BACKWARD
BACKWARD_INPUT = InstructionKind.BACKWARD_INPUT
BACKWARD_WEIGHT = InstructionKind.BACKWARD_WEIGHT


@dataclass(frozen=True, slots=True)
class Instruction:
    """One pipeline instruction: ``kind`` of ``microbatch`` on model ``chunk`` of its GPU.

    ``chunk`` is always an int: 0 on schedules without model chunks (the wire's and files'
    ``null`` or absent chunk is read as 0). A plain string ``kind`` is converted (ValueError
    for an unknown one).
    """

    kind: InstructionKind
    microbatch: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if type(self.kind) is not InstructionKind:
            object.__setattr__(self, "kind", InstructionKind(self.kind))


@dataclass(frozen=True, slots=True)
class Schedule:
    """Execution order of every GPU.

    Attributes:
        name: One of :data:`SCHEDULE_NAMES`.
        stages: Number of GPUs (pipeline stages).
        microbatches: Microbatches per iteration.
        virtual_stages: Model chunks per GPU (1 unless interleaved).
        order: ``order[g]`` is GPU ``g``'s instructions in execution order.
    """

    name: str
    stages: int
    microbatches: int
    virtual_stages: int
    order: tuple[tuple[Instruction, ...], ...]

    @property
    def num_instructions(self) -> int:
        """Total number of instructions of one iteration."""
        return sum(len(seq) for seq in self.order)

    def virtual_stage(self, gpu: int, instruction: Instruction) -> int:
        """Model position of ``instruction`` run on ``gpu``."""
        return instruction.chunk * self.stages + gpu


def _one_f_one_b(stages: int, microbatches: int, virtual_stages: int) -> list[list[Instruction]]:
    order = []
    for stage in range(stages):
        warmup = min(stages - stage, microbatches)
        seq = [Instruction(FORWARD, j) for j in range(warmup)]
        next_forward = warmup
        for j in range(microbatches):
            seq.append(Instruction(BACKWARD, j))
            if next_forward < microbatches:
                seq.append(Instruction(FORWARD, next_forward))
                next_forward += 1
        order.append(seq)
    return order


def _gpipe(stages: int, microbatches: int, virtual_stages: int) -> list[list[Instruction]]:
    forwards = [Instruction(FORWARD, j) for j in range(microbatches)]
    backwards = [Instruction(BACKWARD, j) for j in range(microbatches)]
    return [forwards + backwards for _ in range(stages)]


def _interleaved(stages: int, microbatches: int, virtual_stages: int) -> list[list[Instruction]]:
    """Megatron-LM's interleaved 1F1B (``forward_backward_pipelining_with_interleaving``).

    Virtual microbatch ``k`` runs chunk ``(k // stages) % V`` (reversed for backward) of
    microbatch ``(k // (stages * V)) * stages + k % stages``.
    """
    if microbatches % stages:
        raise ScheduleError(
            f"interleaved-1f1b needs microbatches to be a multiple of stages "
            f"({microbatches} is not a multiple of {stages})"
        )
    group = stages * virtual_stages
    total = microbatches * virtual_stages

    def unit(k: int, kind: InstructionKind) -> Instruction:
        chunk = (k // stages) % virtual_stages
        if kind == BACKWARD:
            chunk = virtual_stages - 1 - chunk
        return Instruction(kind, (k // group) * stages + k % stages, chunk)

    order = []
    for rank in range(stages):
        warmup = min((stages - rank - 1) * 2 + (virtual_stages - 1) * stages, total)
        seq = [unit(k, FORWARD) for k in range(warmup)]
        forward, backward = warmup, 0
        while backward < total:
            if forward < total:
                seq.append(unit(forward, FORWARD))
                forward += 1
            seq.append(unit(backward, BACKWARD))
            backward += 1
        order.append(seq)
    return order


_BUILDERS: dict[str, Callable[[int, int, int], list[list[Instruction]]]] = {
    "1f1b": _one_f_one_b,
    "gpipe": _gpipe,
    "interleaved-1f1b": _interleaved,
}
SCHEDULE_NAMES: tuple[str, ...] = (*_BUILDERS, "interleaved-zb", "zbv", "dualpipev", "looped-bfs")
"""Every named schedule (the wire's ``ScheduleName`` restates them)."""
CHUNKED_SCHEDULES = frozenset(
    {"interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev", "looped-bfs"}
)
"""Schedules that run more than one model chunk per GPU."""
SPLIT_BACKWARD_SCHEDULES = frozenset({"interleaved-zb", "zbv", "dualpipev"})
"""Schedules that split the backward into ``backward_input`` and ``backward_weight``."""


def make_schedule(name: str, stages: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """Build the per-GPU instruction order of a named schedule.

    Args:
        name: ``1f1b``, ``gpipe`` or ``interleaved-1f1b``.
        stages: Number of GPUs, >= 1.
        microbatches: Microbatches per iteration, >= 1.
        virtual_stages: Model chunks per GPU; must be 1 except for ``interleaved-1f1b`` (>= 2).

    Returns:
        The schedule. O(stages * microbatches * virtual_stages).

    Raises:
        ScheduleError: Unknown name or sizes that the schedule does not support.
    """
    builder = _BUILDERS.get(name)
    if builder is None:
        if name in SCHEDULE_NAMES:
            raise ScheduleError(f"schedule {name!r} cannot be planned yet")
        raise ScheduleError(
            f"unknown schedule {name!r}; expected one of {', '.join(SCHEDULE_NAMES)}"
        )
    for label, value, low in (
        ("stages", stages, 1),
        ("microbatches", microbatches, 1),
        ("virtual_stages", virtual_stages, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ScheduleError(f"{label} must be an integer >= {low}, got {value!r}")
    if name == "interleaved-1f1b":
        if virtual_stages < 2:
            raise ScheduleError("interleaved-1f1b needs virtual_stages >= 2")
    elif virtual_stages != 1:
        raise ScheduleError(f"{name} runs one model chunk per GPU; virtual_stages must be 1")
    order = builder(stages, microbatches, virtual_stages)
    return Schedule(name, stages, microbatches, virtual_stages, tuple(map(tuple, order)))


def per_gpu(flat: Any, schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    """Split ``flat`` (a sequence or 1-D array of one int per instruction, GPU by GPU in
    execution order) per GPU:
    ``result[g][k]`` belongs to ``schedule.order[g][k]``. O(instructions)."""
    out = []
    at = 0
    for seq in schedule.order:
        out.append(tuple(int(f) for f in flat[at : at + len(seq)]))
        at += len(seq)
    return tuple(out)
