"""Pipeline schedules as data: each GPU's list of actions, plus dependency rules.

A schedule is its per-GPU action list: GPU ``g`` runs ``order[g]`` in that order, each action
``(stage, kind, microbatch)`` on model stage ``stage``. Where each model stage runs is read from
the list itself (:func:`schedule_from_actions`): Megatron's interleaving (GPU ``g`` holds stages
``g, g + S, ...``), torch's V shape (GPU ``g`` holds ``g`` and ``2S - 1 - g``) or anything else.
A GPU's stages are its *chunks*, numbered in ascending stage order. The data dependencies are
the same for every schedule and follow from the model's stage order (``U`` model stages):

- ``forward(u, j) -> forward(u + 1, j)``;
- ``forward(U - 1, j) -> backward(U - 1, j)`` or ``backward_input(U - 1, j)`` (the loss);
- ``backward(u + 1, j)`` or ``backward_input(u + 1, j)`` ``-> backward(u, j)`` or
  ``backward_input(u, j)``;
- ``backward_input(u, j) -> backward_weight(u, j)`` (same GPU: the list must run W after I).

Every (stage, microbatch) runs one forward and either one ``backward`` or a split one
(``backward_input`` and ``backward_weight``). Adding a schedule means writing one function
that returns the per-GPU action lists; :mod:`perseus.solver.zero_bubble` has torch's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perseus.core.errors import ScheduleError
from perseus.core.pipeline import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    CHUNKED_SCHEDULES,
    FORWARD,
    KINDS,
    SCHEDULE_NAMES,
    SPLIT_BACKWARD_SCHEDULES,
    Action,
    InstructionKind,
)
from perseus.solver.zero_bubble import (
    dualpipev,
    dualpipev_overlapped,
    interleaved_zero_bubble,
    looped_bfs,
    zbv,
)

__all__ = [
    "BACKWARD",
    "BACKWARD_INPUT",
    "BACKWARD_WEIGHT",
    "CHUNKED_SCHEDULES",
    "FORWARD",
    "KINDS",
    "SCHEDULE_NAMES",
    "SPLIT_BACKWARD_SCHEDULES",
    "Action",
    "Instruction",
    "InstructionKind",
    "Schedule",
    "make_schedule",
    "per_gpu",
    "schedule_from_actions",
]


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
        virtual_stages: Model chunks per GPU (1 unless interleaved or V-shaped).
        order: ``order[g]`` is GPU ``g``'s instructions in execution order.
        placement: ``placement[g][c]`` is the model stage of chunk ``c`` of GPU ``g``,
            ascending; empty (the default) means Megatron's ``c * stages + g``.
        overlapped: ``(g, k)`` for each forward ``order[g][k]`` issued together with the
            full backward ``order[g][k + 1]`` as one action (torch's ``OVERLAP_F_B``, in
            ``dualpipev``): the halves run one after the other, and both outputs leave once
            the whole action is done (:func:`perseus.solver.build_dag`). Empty by default.
    """

    name: str
    stages: int
    microbatches: int
    virtual_stages: int
    order: tuple[tuple[Instruction, ...], ...]
    placement: tuple[tuple[int, ...], ...] = ()
    overlapped: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.placement:
            megatron = tuple(
                tuple(c * self.stages + g for c in range(self.virtual_stages))
                for g in range(self.stages)
            )
            object.__setattr__(self, "placement", megatron)

    @property
    def num_instructions(self) -> int:
        """Total number of instructions of one iteration."""
        return sum(len(seq) for seq in self.order)

    @property
    def kinds(self) -> tuple[InstructionKind, ...]:
        """The kinds this schedule runs, in :data:`KINDS` order. O(instructions)."""
        used = {inst.kind for seq in self.order for inst in seq}
        return tuple(kind for kind in KINDS if kind in used)

    def virtual_stage(self, gpu: int, instruction: Instruction) -> int:
        """Model stage of ``instruction`` run on ``gpu``."""
        return self.placement[gpu][instruction.chunk]

    def actions(self) -> list[list[Action]]:
        """Every GPU's ``(stage, kind, microbatch)`` list, the inverse of
        :func:`schedule_from_actions`."""
        return [
            [(self.virtual_stage(g, i), i.kind, i.microbatch) for i in seq]
            for g, seq in enumerate(self.order)
        ]


def schedule_from_actions(
    name: str,
    actions: Sequence[Sequence[Action]],
    microbatches: int | None = None,
    overlapped: Sequence[tuple[int, int]] = (),
) -> Schedule:
    """A schedule from every GPU's action list, its placement read from the list.

    Args:
        name: What to call it (a schedule name, or a file's).
        actions: ``actions[g]`` is GPU ``g``'s ``(stage, kind, microbatch)`` in execution
            order; ``kind`` an :class:`InstructionKind` or its value.
        microbatches: Microbatches per iteration; the highest one in the list + 1 if None.
        overlapped: ``(g, k)`` of each forward issued with the full backward after it
            (:attr:`Schedule.overlapped`; :func:`perseus.solver.build_dag` checks them).

    Returns:
        The schedule; :func:`perseus.solver.build_dag` checks that it is complete and free
        of deadlocks. O(actions).

    Raises:
        ScheduleError: A malformed action, a model stage on two GPUs, model stages that are
            not ``0..U-1``, or GPUs holding different numbers of stages.
    """
    if not actions:
        raise ScheduleError("the schedule has no GPUs")
    owner: dict[int, int] = {}
    parsed: list[list[tuple[int, InstructionKind, int]]] = []
    for g, seq in enumerate(actions):
        row = []
        for action in seq:
            try:
                stage, kind, microbatch = action
                kind = InstructionKind(kind)
            except (TypeError, ValueError):
                raise ScheduleError(
                    f"GPU {g}: {action!r} is not a (stage, kind, microbatch) action"
                ) from None
            for label, value in (("stage", stage), ("microbatch", microbatch)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ScheduleError(f"GPU {g}: {label} must be an integer >= 0 in {action!r}")
            if owner.setdefault(stage, g) != g:
                raise ScheduleError(f"stage {stage} runs on GPU {owner[stage]} and on GPU {g}")
            row.append((stage, kind, microbatch))
        parsed.append(row)
    model_stages = len(owner)
    if sorted(owner) != list(range(model_stages)):
        absent = sorted(set(range(max(owner, default=-1) + 1)) - set(owner))
        raise ScheduleError(f"no GPU runs model stage(s) {absent}")
    placement = tuple(
        tuple(sorted(u for u, g in owner.items() if g == gpu)) for gpu in range(len(parsed))
    )
    chunks = {len(p) for p in placement}
    if len(chunks) != 1:
        per_gpu_stages = {g: list(p) for g, p in enumerate(placement)}
        raise ScheduleError(
            f"every GPU must hold the same number of model stages, got {per_gpu_stages}"
        )
    if microbatches is None:
        microbatches = 1 + max(j for row in parsed for _u, _k, j in row)
    chunk_of = {u: c for p in placement for c, u in enumerate(p)}
    order = tuple(tuple(Instruction(kind, j, chunk_of[u]) for u, kind, j in row) for row in parsed)
    pairs = tuple((int(g), int(k)) for g, k in overlapped)
    return Schedule(name, len(parsed), microbatches, chunks.pop(), order, placement, pairs)


def _one_f_one_b(stages: int, microbatches: int, virtual_stages: int) -> list[list[Action]]:
    order = []
    for stage in range(stages):
        warmup = min(stages - stage, microbatches)
        seq: list[Action] = [(stage, FORWARD, j) for j in range(warmup)]
        next_forward = warmup
        for j in range(microbatches):
            seq.append((stage, BACKWARD, j))
            if next_forward < microbatches:
                seq.append((stage, FORWARD, next_forward))
                next_forward += 1
        order.append(seq)
    return order


def _gpipe(stages: int, microbatches: int, virtual_stages: int) -> list[list[Action]]:
    return [
        [(g, FORWARD, j) for j in range(microbatches)]
        + [(g, BACKWARD, j) for j in range(microbatches)]
        for g in range(stages)
    ]


def _interleaved(stages: int, microbatches: int, virtual_stages: int) -> list[list[Action]]:
    """Megatron-LM's interleaved 1F1B (``forward_backward_pipelining_with_interleaving``).

    Virtual microbatch ``k`` runs chunk ``(k // stages) % V`` (reversed for backward) of
    microbatch ``(k // (stages * V)) * stages + k % stages``; chunk ``c`` of GPU ``g`` is
    model stage ``c * stages + g``.
    """
    if microbatches % stages:
        raise ScheduleError(
            f"interleaved-1f1b needs microbatches to be a multiple of stages "
            f"({microbatches} is not a multiple of {stages})"
        )
    group = stages * virtual_stages
    total = microbatches * virtual_stages

    order = []
    for rank in range(stages):

        def unit(k: int, kind: InstructionKind, rank: int = rank) -> Action:
            chunk = (k // stages) % virtual_stages
            if kind == BACKWARD:
                chunk = virtual_stages - 1 - chunk
            return (chunk * stages + rank, kind, (k // group) * stages + k % stages)

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


def _interleaved_zb(stages: int, microbatches: int, virtual_stages: int) -> list[list[Action]]:
    return interleaved_zero_bubble(stages, microbatches, virtual_stages)


def _zbv(stages: int, microbatches: int, virtual_stages: int) -> list[list[Action]]:
    return zbv(stages, microbatches)


def _dualpipev(stages: int, microbatches: int, virtual_stages: int) -> list[list[Action]]:
    return dualpipev(stages, microbatches)


def _looped_bfs(stages: int, microbatches: int, virtual_stages: int) -> list[list[Action]]:
    return looped_bfs(stages, microbatches, virtual_stages)


# One builder per name of perseus.core.pipeline.SCHEDULE_NAMES (tests/solver keep them equal).
_BUILDERS: dict[str, Callable[[int, int, int], list[list[Action]]]] = {
    "1f1b": _one_f_one_b,
    "gpipe": _gpipe,
    "interleaved-1f1b": _interleaved,
    "interleaved-zb": _interleaved_zb,
    "zbv": _zbv,
    "dualpipev": _dualpipev,
    "looped-bfs": _looped_bfs,
}
_V_SHAPED = frozenset({"zbv", "dualpipev"})


def make_schedule(name: str, stages: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """Build the per-GPU instruction order of a named schedule.

    Args:
        name: One of :data:`SCHEDULE_NAMES`: ``1f1b``, ``gpipe``, ``interleaved-1f1b``
            (Megatron's), ``interleaved-zb``, ``zbv``, ``dualpipev``, ``looped-bfs`` (torch's,
            see :mod:`perseus.solver.zero_bubble`).
        stages: Number of GPUs (torch's pipeline ranks), >= 1.
        microbatches: Microbatches per iteration, >= 1.
        virtual_stages: Model chunks per GPU: 1 for ``1f1b`` and ``gpipe``; 2 for ``zbv``
            and ``dualpipev``; >= 2 for the other chunked schedules.

    Returns:
        The schedule, built from its action lists by :func:`schedule_from_actions`.
        O(stages * microbatches * virtual_stages).

    Raises:
        ScheduleError: Unknown name or sizes that the schedule does not support.
    """
    builder = _BUILDERS.get(name)
    if builder is None:
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
    if name in _V_SHAPED:
        if virtual_stages != 2:
            raise ScheduleError(
                f"{name} runs two model chunks per GPU in a V; virtual_stages must be 2"
            )
    elif name in CHUNKED_SCHEDULES:
        if virtual_stages < 2:
            raise ScheduleError(f"{name} needs virtual_stages >= 2")
    elif virtual_stages != 1:
        raise ScheduleError(f"{name} runs one model chunk per GPU; virtual_stages must be 1")
    schedule = schedule_from_actions(name, builder(stages, microbatches, virtual_stages))
    overlapped: tuple[tuple[int, int], ...] = ()
    if name == "dualpipev":
        positions = dualpipev_overlapped(stages, microbatches)
        overlapped = tuple((g, k) for g, seq in enumerate(positions) for k in seq)
    return dataclasses.replace(schedule, microbatches=microbatches, overlapped=overlapped)


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
