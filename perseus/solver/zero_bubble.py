"""Per-GPU action lists of torch's multi-stage schedules, generated without torch.

``torch.distributed.pipelining`` builds each schedule's ``pipeline_order`` in plain Python
(``_calculate_single_rank_operations`` of ``ScheduleLoopedBFS``,
``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV``, torch
2.13). The functions here restate those orders, so the solver plans exactly what torch runs
while staying importable without torch; ``tests/solver/test_schedules_torch.py`` compares them
with ``torch.distributed.pipelining._schedule_visualizer.get_schedule_ops`` action for action
wherever torch is installed (checked with torch 2.13; the functions never import torch, so a
torch that moves its private names breaks only that test, never planning). Bubbles (torch's
``None`` slots) are left out: they only say when an action may start, which the DAG knows from
the dependencies.

An action is ``(stage, kind, microbatch)`` with ``stage`` the model stage (not the GPU).
Torch's ``OVERLAP_F_B`` (a forward and a full backward of two microbatches issued together)
appears as its two halves, forward first, on the same GPU: perseus plans them one after the
other (it does not model their overlap), and, as torch sends both outputs once the whole action
is done, the forward's output leaves for another GPU with the backward's
(:func:`dualpipev_overlapped` says which forwards; :func:`perseus.solver.build_dag` draws it).

Every function is O(ranks * microbatches * chunks).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from perseus.core.errors import ScheduleError
from perseus.core.pipeline import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Action,
    InstructionKind,
)

__all__ = ["dualpipev", "dualpipev_overlapped", "interleaved_zero_bubble", "looped_bfs", "zbv"]


def looped_bfs(ranks: int, microbatches: int, chunks: int) -> list[list[Action]]:
    """``ScheduleLoopedBFS``: every forward of a rank's first stage, then of its next, ...;
    then the backwards in reverse. Megatron placement (stage ``c * ranks + rank``)."""
    order = []
    for rank in range(ranks):
        stages = range(rank, ranks * chunks, ranks)
        seq: list[Action] = [(s, FORWARD, j) for s in stages for j in range(microbatches)]
        seq += [(s, BACKWARD, j) for s in reversed(stages) for j in reversed(range(microbatches))]
        order.append(seq)
    return order


def interleaved_zero_bubble(ranks: int, microbatches: int, chunks: int) -> list[list[Action]]:
    """``ScheduleInterleavedZeroBubble`` (ZB1P): interleaved 1F1B whose backward is split, the
    weight halves delayed by ``rank`` steps to fill the bubbles. Megatron placement.

    Raises:
        ScheduleError: ``microbatches`` is not a multiple of the number of rounds
            (``max(1, microbatches // ranks)``), as torch requires.
    """
    rounds = max(1, microbatches // ranks)
    if microbatches % rounds:
        raise ScheduleError(
            f"interleaved-zb needs microbatches to be a multiple of the number of rounds "
            f"max(1, microbatches // stages) = {rounds}, got {microbatches}"
        )
    per_round = microbatches // rounds
    order = []
    for rank in range(ranks):
        work = chunks * microbatches
        warmup = min((chunks - 1) * per_round + (ranks - 1 - rank), work)

        def forward_stage(step: int, rank: int = rank) -> int:
            return ((step // per_round) % chunks) * ranks + rank

        def backward_stage(step: int, rank: int = rank, warmup: int = warmup) -> int:
            local = chunks - 1 - ((step - warmup) // per_round) % chunks
            return local * ranks + rank

        order.append(_one_f_one_b_ops(work, warmup, rank, forward_stage, backward_stage))
    return order


def _one_f_one_b_ops(
    work: int,
    warmup: int,
    delay: int,
    forward_stage: Callable[[int], int],
    backward_stage: Callable[[int], int],
) -> list[Action]:
    """torch's ``_get_1f1b_rank_ops`` with ``enable_zero_bubble=True``, bubbles left out.

    ``work`` forwards (chunks x microbatches): ``warmup`` forwards, then a forward and a
    backward_input per step until the forwards run out, then the remaining backward_inputs;
    from step ``warmup + delay`` on, every step also runs the oldest pending backward_weight.
    """
    counts: dict[tuple[int, InstructionKind], int] = defaultdict(int)
    seq: list[Action] = []

    def emit(stage: int, kind: InstructionKind) -> None:
        seq.append((stage, kind, counts[stage, kind]))
        counts[stage, kind] += 1

    backward_steps: list[int] = []
    weights = 0
    for op in range(work + warmup):
        if op < warmup:
            emit(forward_stage(op), FORWARD)
            continue
        if op < work:
            emit(forward_stage(op), FORWARD)
        emit(backward_stage(op), BACKWARD_INPUT)
        backward_steps.append(op)
        if op - warmup >= delay:
            emit(backward_stage(backward_steps[weights]), BACKWARD_WEIGHT)
            weights += 1
    while weights < len(backward_steps):
        emit(backward_stage(backward_steps[weights]), BACKWARD_WEIGHT)
        weights += 1
    return seq


def zbv(ranks: int, microbatches: int) -> list[list[Action]]:
    """``ScheduleZBVZeroBubble``: two stages per rank in a V (rank ``r`` holds stages ``r``
    and ``2 * ranks - 1 - r``)."""
    stages = 2 * ranks
    padded = max(2 * ranks - 1, microbatches)
    order = []
    for rank in range(ranks):
        first, second = rank, stages - 1 - rank
        seq: list[Action] = []
        f0 = f1 = b0 = b1 = 0
        for _ in range(2 * (ranks - rank) - 1):
            seq.append((first, FORWARD, f0))
            f0 += 1
        for _ in range(rank):
            seq.append((second, FORWARD, f1))
            f1 += 1
            seq.append((first, FORWARD, f0))
            f0 += 1
        for _ in range(ranks - rank):
            seq += [(second, FORWARD, f1), (second, BACKWARD_INPUT, b1)]
            seq.append((second, BACKWARD_WEIGHT, b1))
            f1 += 1
            b1 += 1
        while f1 < f0 or f0 < padded:
            if f0 < padded:
                seq.append((first, FORWARD, f0))
                f0 += 1
            seq += [(first, BACKWARD_INPUT, b0), (first, BACKWARD_WEIGHT, b0)]
            b0 += 1
            seq += [(second, FORWARD, f1), (second, BACKWARD_INPUT, b1)]
            seq.append((second, BACKWARD_WEIGHT, b1))
            f1 += 1
            b1 += 1
        w0, w1 = b0, b1
        for _ in range(rank):
            seq += [(first, BACKWARD_INPUT, b0), (second, BACKWARD_INPUT, b1)]
            b0 += 1
            b1 += 1
        for _ in range(ranks - rank):
            seq += [(first, BACKWARD_INPUT, b0), (first, BACKWARD_WEIGHT, w0)]
            b0 += 1
            w0 += 1
        seq += [(second, BACKWARD_WEIGHT, j) for j in range(w1, b1)]
        seq += [(first, BACKWARD_WEIGHT, j) for j in range(w0, b0)]
        # torch pads to 2 * ranks - 1 microbatches and blanks the actions of the padding
        order.append([action for action in seq if action[2] < microbatches])
    return order


def dualpipev(ranks: int, microbatches: int) -> list[list[Action]]:
    """``ScheduleDualPipeV`` (DeepSeek's DualPipeV): the V placement of :func:`zbv`; in the
    steady state a forward of one stage and a full backward of the other are issued together
    (``OVERLAP_F_B``), here as the forward then the backward.

    Raises:
        ScheduleError: Fewer microbatches than ``2 * ranks`` stages, as torch requires.
    """
    if microbatches < 2 * ranks:
        raise ScheduleError(
            f"dualpipev needs at least as many microbatches as model stages (2 x stages = "
            f"{2 * ranks}), got {microbatches}"
        )
    return [_dualpipev_rank(rank, ranks, microbatches)[0] for rank in range(ranks)]


def dualpipev_overlapped(ranks: int, microbatches: int) -> list[list[int]]:
    """Per rank, the positions in :func:`dualpipev`'s list of the forwards torch issues
    together with the full backward after them (``OVERLAP_F_B``). Torch sends the outputs
    of both halves once the whole action is done, so the forward's output leaves with the
    backward's (see :func:`perseus.solver.build_dag`).

    Raises:
        ScheduleError: As :func:`dualpipev`.
    """
    dualpipev(ranks, microbatches)  # the same checks
    return [_dualpipev_rank(rank, ranks, microbatches)[1] for rank in range(ranks)]


def _dualpipev_rank(rank: int, ranks: int, microbatches: int) -> tuple[list[Action], list[int]]:
    first, second = rank, 2 * ranks - 1 - rank
    seq: list[Action] = []
    overlapped: list[int] = []  # positions of the forward halves of OVERLAP_F_B
    counts: dict[tuple[int, InstructionKind], int] = defaultdict(int)
    pending: list[tuple[int, int]] = []  # (stage, microbatch) of backward_inputs awaiting W

    def add(stage: int, kind: InstructionKind) -> None:
        key = (stage, BACKWARD_INPUT if kind == BACKWARD else kind)
        j = counts[key]
        seq.append((stage, kind, j))
        if kind == BACKWARD:
            counts[stage, BACKWARD_INPUT] += 1
            counts[stage, BACKWARD_WEIGHT] += 1
        else:
            if kind == BACKWARD_INPUT:
                pending.append((stage, j))
            counts[key] = j + 1

    def weight() -> None:
        if pending:
            stage, j = pending.pop(0)
            seq.append((stage, BACKWARD_WEIGHT, j))
            counts[stage, BACKWARD_WEIGHT] += 1

    def overlap(forward_stage: int, backward_stage: int) -> None:
        overlapped.append(len(seq))
        add(forward_stage, FORWARD)
        add(backward_stage, BACKWARD)

    for _ in range((ranks - rank - 1) * 2):
        add(first, FORWARD)
    for _ in range(rank + 1):
        add(first, FORWARD)
        add(second, FORWARD)
    for _ in range(ranks - rank - 1):
        add(second, BACKWARD_INPUT)
        weight()
        add(second, FORWARD)
    for i in range(microbatches - ranks * 2 + rank + 1):
        if i == 0 and rank == ranks - 1:
            add(first, FORWARD)
            add(second, BACKWARD)
        else:
            overlap(first, second)
        overlap(second, first)
    for _ in range(ranks - rank - 1):
        add(second, BACKWARD)
        overlap(second, first)
    split = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        add(second, BACKWARD_INPUT if split else BACKWARD)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        add(first, BACKWARD_INPUT if split else BACKWARD)
    for _ in range(ranks - rank - 1):
        weight()
        add(first, BACKWARD_INPUT if split else BACKWARD)
    for _ in range(rank + 1):
        weight()
    return seq, overlapped
