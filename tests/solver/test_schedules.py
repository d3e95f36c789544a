"""Schedules: the per-GPU orders of BACKGROUND.md and Megatron, complete and deadlock-free."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import networkx as nx
import pytest

from perseus.core.errors import ScheduleError
from perseus.solver import SCHEDULE_NAMES, Instruction, make_schedule

from . import reference as ref


def tuples(schedule) -> ref.Order:
    return ref.as_tuples(schedule.order)


def short(seq: list[ref.Inst]) -> str:
    return " ".join(f"{kind[0].upper()}{mb}" for kind, mb, _c in seq)


SIZES = [(s, m) for s in range(1, 9) for m in range(1, 13)]
INTERLEAVED = [(s, m, v) for s in range(1, 6) for v in (2, 3, 4) for m in range(s, 4 * s + 1, s)]


def test_names() -> None:
    assert set(SCHEDULE_NAMES) == {
        "1f1b",
        "gpipe",
        "interleaved-1f1b",
        "interleaved-zb",
        "zbv",
        "dualpipev",
        "looped-bfs",
    }


def test_every_named_schedule_has_one_builder() -> None:
    """The names live on the ground floor (perseus.core.pipeline), the builders here."""
    from perseus.solver import schedules

    assert tuple(schedules._BUILDERS) == SCHEDULE_NAMES


def test_1f1b_stage0_of_4_is_the_textbook_order() -> None:
    order = make_schedule("1f1b", 4, 8).order
    assert short(tuples(make_schedule("1f1b", 4, 8))[0]) == (
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
    )
    assert short(tuples(make_schedule("1f1b", 4, 8))[3]) == (
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"
    )
    assert all(inst.chunk == 0 for seq in order for inst in seq)
    assert order[0][0] == Instruction("forward", 0)


@pytest.mark.parametrize(("stages", "microbatches"), SIZES)
def test_1f1b_matches_background(stages: int, microbatches: int) -> None:
    schedule = make_schedule("1f1b", stages, microbatches)
    got = tuples(schedule)
    assert got == ref.order_1f1b(stages, microbatches)
    for s, seq in enumerate(got):
        # stage s runs min(S - s, M) warm-up forwards, then alternates backward, forward
        first_backward = next(k for k, inst in enumerate(seq) if inst[0] == ref.B)
        assert first_backward == min(stages - s, microbatches)
        steady = seq[first_backward:]
        kinds = [inst[0] for inst in steady]
        forwards_left = microbatches - first_backward
        assert kinds[: 2 * forwards_left] == [ref.B, ref.F] * forwards_left
        assert set(kinds[2 * forwards_left :]) <= {ref.B}


@pytest.mark.parametrize(("stages", "microbatches"), SIZES[::5])
def test_gpipe_all_forwards_then_all_backwards(stages: int, microbatches: int) -> None:
    got = tuples(make_schedule("gpipe", stages, microbatches))
    assert got == ref.order_gpipe(stages, microbatches)


@pytest.mark.parametrize(("stages", "microbatches", "chunks"), INTERLEAVED)
def test_interleaved_matches_megatron(stages: int, microbatches: int, chunks: int) -> None:
    schedule = make_schedule("interleaved-1f1b", stages, microbatches, chunks)
    got = tuples(schedule)
    assert got == ref.order_interleaved(stages, microbatches, chunks)
    for seq in got:
        counts = Counter(seq)
        assert set(counts.values()) == {1}
        assert {(mb, c) for kind, mb, c in seq if kind == ref.F} == {
            (mb, c) for mb in range(microbatches) for c in range(chunks)
        }
        assert {(mb, c) for kind, mb, c in seq if kind == ref.B} == {
            (mb, c) for mb in range(microbatches) for c in range(chunks)
        }


def test_interleaved_small_example() -> None:
    """2 GPUs, 4 microbatches, 2 chunks, written out from Megatron's loop by hand."""
    got = tuples(make_schedule("interleaved-1f1b", 2, 4, 2))
    # rank 0: warm-up 2*(2-0-1) + (2-1)*2 = 4 forwards: (0,c0) (1,c0) (0,c1) (1,c1)
    assert got[0] == [
        ("forward", 0, 0), ("forward", 1, 0), ("forward", 0, 1), ("forward", 1, 1),
        ("forward", 2, 0), ("backward", 0, 1),
        ("forward", 3, 0), ("backward", 1, 1),
        ("forward", 2, 1), ("backward", 0, 0),
        ("forward", 3, 1), ("backward", 1, 0),
        ("backward", 2, 1), ("backward", 3, 1), ("backward", 2, 0), ("backward", 3, 0),
    ]  # fmt: skip
    # rank 1: warm-up (2-1)*2 = 2 forwards
    assert got[1][:4] == [("forward", 0, 0), ("forward", 1, 0), ("forward", 0, 1),
                          ("backward", 0, 1)]  # fmt: skip


def all_schedules():
    for s, m in SIZES[::3]:
        yield "1f1b", s, m, 1
        yield "gpipe", s, m, 1
    for s, m, v in INTERLEAVED[::2]:
        yield "interleaved-1f1b", s, m, v


@pytest.mark.parametrize(("name", "stages", "microbatches", "chunks"), list(all_schedules()))
def test_complete_and_acyclic(name: str, stages: int, microbatches: int, chunks: int) -> None:
    schedule = make_schedule(name, stages, microbatches, chunks)
    assert schedule.name == name
    assert (schedule.stages, schedule.microbatches, schedule.virtual_stages) == (
        stages,
        microbatches,
        chunks,
    )
    assert len(schedule.order) == stages
    assert schedule.num_instructions == 2 * stages * microbatches * chunks
    expected = {(k, mb, c) for k in (ref.F, ref.B) for mb in range(microbatches)
                for c in range(chunks)}  # fmt: skip
    for seq in tuples(schedule):
        assert len(seq) == len(expected)
        assert set(seq) == expected
    # every dependency of the rules is present (dag_edges raises on a missing one) and the
    # order plus the rules never deadlock
    graph = ref.nx_graph(tuples(schedule), chunks)
    assert graph.number_of_nodes() == schedule.num_instructions
    assert nx.is_directed_acyclic_graph(graph)


def test_a_deadlocking_order_is_cyclic_in_the_reference() -> None:
    """Sanity of the acyclicity check itself: B before F on the last stage deadlocks."""
    order = ref.order_1f1b(2, 2)
    order[1][0], order[1][1] = order[1][1], order[1][0]
    assert not nx.is_directed_acyclic_graph(ref.nx_graph(order, 1))


def test_schedule_is_frozen() -> None:
    schedule = make_schedule("1f1b", 2, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.stages = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.order[0][0].microbatch = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "stages", "microbatches", "chunks"),
    [
        ("1f1b", 0, 4, 1),
        ("1f1b", -1, 4, 1),
        ("1f1b", 4, 0, 1),
        ("1f1b", 4, -3, 1),
        ("1f1b", 4, 4, 0),
        ("1f1b", 4, 4, 2),  # one chunk per GPU
        ("gpipe", 4, 4, 2),
        ("gpipe", 0, 4, 1),
        ("1f1b", 2.0, 4, 1),
        ("1f1b", "4", 4, 1),
        ("1f1b", 4, 4.5, 1),
        ("1f1b", True, 4, 1),
        ("interleaved-1f1b", 4, 8, 1),  # interleaving needs >= 2 chunks
        ("interleaved-1f1b", 4, 8, 0),
        ("interleaved-1f1b", 4, 6, 2),  # Megatron: M a multiple of S
        ("interleaved-1f1b", 4, 2, 2),  # Megatron: M >= S
        ("interleaved-1f1b", 4, 0, 2),
        ("zero-bubble", 4, 4, 1),
        ("1F1B ", 4, 4, 1),
        ("", 4, 4, 1),
    ],
)
def test_bad_sizes_raise_schedule_error(
    name: str, stages: object, microbatches: object, chunks: object
) -> None:
    with pytest.raises(ScheduleError):
        make_schedule(name, stages, microbatches, chunks)  # type: ignore[arg-type]


@pytest.mark.parametrize("stages, microbatches", [(2, 2), (4, 8)])
def test_a_deadlocking_order_is_refused_naming_a_real_cycle(stages: int, microbatches: int) -> None:
    """build_dag refuses an order that deadlocks, and the edges it names are dependencies of
    the independent reference graph, each following on from the one before."""
    from perseus.solver.dag import build_dag

    schedule = make_schedule("1f1b", stages, microbatches)
    order = [list(seq) for seq in schedule.order]
    first_backward = next(k for k, inst in enumerate(order[0]) if inst.kind == "backward")
    order[0].insert(0, order[0].pop(first_backward))  # GPU 0 runs B0 first: a cycle through all
    broken = dataclasses.replace(schedule, order=tuple(tuple(seq) for seq in order))
    with pytest.raises(ScheduleError, match="deadlocks: dependency cycle") as err:
        build_dag(broken)
    text = str(err.value).split("starts): ")[1]
    # each action is named "GPU g kind j of stage u"; the reference names nodes (GPU, slot)
    slot = {
        f"GPU {g} {inst.kind} {inst.microbatch} of stage {g}": (g, k)
        for g, seq in enumerate(broken.order)
        for k, inst in enumerate(seq)
    }
    named = [slot[part] for part in text.split(" -> ")]
    graph = ref.nx_graph(tuples(broken), 1)
    assert named[0] == named[-1] and len(named) >= 3
    for a, b in itertools.pairwise(named):
        assert graph.has_edge(a, b), (a, b)


def test_instruction_kinds_are_strings_and_plain_strings_are_converted() -> None:
    """InstructionKind is a string enum: its members equal, hash and format like the strings
    the wire and files carry; an Instruction built from a string holds the enum, and an
    unknown kind is refused."""
    from perseus.solver import InstructionKind

    assert list(InstructionKind) == ["forward", "backward", "backward_input", "backward_weight"]
    assert {InstructionKind.FORWARD: 1}["forward"] == 1
    assert f"{InstructionKind.BACKWARD}" == "backward"
    built = Instruction("backward", 3)  # type: ignore[arg-type]
    assert built.kind is InstructionKind.BACKWARD
    assert built == Instruction(InstructionKind.BACKWARD, 3)
    assert built.chunk == 0  # the one chunk convention: 0 where a schedule has no chunks
    with pytest.raises(ValueError):
        Instruction("recompute", 0)  # type: ignore[arg-type]
    schedule = make_schedule("interleaved-1f1b", 2, 4, 2)
    assert all(type(i.kind) is InstructionKind for seq in schedule.order for i in seq)
    assert {i.chunk for seq in make_schedule("1f1b", 2, 4).order for i in seq} == {0}


def test_per_gpu_splits_values_in_execution_order() -> None:
    from perseus.solver.schedules import per_gpu

    schedule = make_schedule("1f1b", 2, 2)
    flat = list(range(schedule.num_instructions))
    split = per_gpu(flat, schedule)
    assert [len(row) for row in split] == [len(seq) for seq in schedule.order]
    assert [f for row in split for f in row] == flat
