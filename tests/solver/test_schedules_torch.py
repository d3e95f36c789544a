"""torch's zero-bubble and looped schedules, generated without torch, equal torch's own order.

Compares :mod:`perseus.solver.zero_bubble` (through :func:`make_schedule`) with
``torch.distributed.pipelining._schedule_visualizer.get_schedule_ops`` action for action:
bubbles (``None``) dropped, ``OVERLAP_F_B`` as its two halves, forward first. Skipped where
torch is not installed.
"""

from __future__ import annotations

import pytest

from perseus.core.errors import ScheduleError
from perseus.solver import build_dag, make_schedule

pipelining = pytest.importorskip("torch.distributed.pipelining.schedules")
visualizer = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")

KIND = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}
CLASSES = {
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
    "looped-bfs": "ScheduleLoopedBFS",
}


def torch_actions(name: str, ranks: int, microbatches: int, chunks: int) -> list[list[tuple]]:
    cls = getattr(pipelining, CLASSES[name])
    ops = visualizer.get_schedule_ops(cls, ranks, microbatches, num_stages_per_rank=chunks)
    out = []
    for row in ops:
        seq = []
        for action in row:
            if action is None:
                continue
            for part in action.sub_actions or (action,):
                kind = KIND[part.computation_type.value]
                seq.append((part.stage_index, kind, part.microbatch_index))
        out.append(seq)
    return out


def ours(name: str, ranks: int, microbatches: int, chunks: int) -> list[list[tuple]]:
    schedule = make_schedule(name, ranks, microbatches, chunks)
    return [[(u, str(k), j) for u, k, j in seq] for seq in schedule.actions()]


CASES = [
    (name, ranks, microbatches, chunks)
    for name in CLASSES
    for ranks in (1, 2, 3, 4, 8)
    for microbatches in (1, 2, 3, 4, 5, 6, 8, 12, 16, 24)
    for chunks in ((2,) if name in ("zbv", "dualpipev") else (2, 3))
]


@pytest.mark.parametrize(("name", "ranks", "microbatches", "chunks"), CASES)
def test_equals_torch(name: str, ranks: int, microbatches: int, chunks: int) -> None:
    try:
        expected = torch_actions(name, ranks, microbatches, chunks)
    except (ValueError, AssertionError, ZeroDivisionError, IndexError, KeyError):
        with pytest.raises(ScheduleError):
            build_dag(make_schedule(name, ranks, microbatches, chunks))
        return
    got = ours(name, ranks, microbatches, chunks)
    assert got == expected
    build_dag(make_schedule(name, ranks, microbatches, chunks))  # complete, no deadlock


def test_zbv_two_ranks_is_the_issue_example() -> None:
    letter = {long: short for short, long in KIND.items()}
    first = " ".join(f"{u}{letter[k]}{j}" for u, k, j in ours("zbv", 2, 4, 2)[0][:12])
    assert first == "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0"


def torch_overlapped(ranks: int, microbatches: int) -> tuple[tuple[int, int], ...]:
    """``(rank, position)`` of the forward half of each of torch's ``OVERLAP_F_B`` actions, in
    the list with overlapped actions as their halves."""
    ops = visualizer.get_schedule_ops(
        pipelining.ScheduleDualPipeV, ranks, microbatches, num_stages_per_rank=2
    )
    found = []
    for rank, row in enumerate(ops):
        position = 0
        for action in row:
            if action is None:
                continue
            if action.sub_actions:
                found.append((rank, position))
            position += len(action.sub_actions or (action,))
    return tuple(found)


@pytest.mark.parametrize(
    ("ranks", "microbatches"), [(2, 4), (2, 8), (3, 6), (4, 8), (4, 12), (8, 24)]
)
def test_dualpipev_overlapped_pairs_are_torchs(ranks: int, microbatches: int) -> None:
    """The forwards perseus marks as issued with the backward after them are exactly torch's
    ``OVERLAP_F_B`` actions (whose outputs torch sends after both halves)."""
    schedule = make_schedule("dualpipev", ranks, microbatches, 2)
    assert schedule.overlapped == torch_overlapped(ranks, microbatches)
    assert schedule.overlapped  # the steady state has them
