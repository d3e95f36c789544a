"""A schedule is its per-GPU action list: placement read from the list, bad lists refused."""

from __future__ import annotations

import pytest

from perseus.core.errors import ScheduleError
from perseus.solver import build_dag, make_schedule, schedule_from_actions

F, B, BI, BW = "forward", "backward", "backward_input", "backward_weight"


def v_shape(microbatches: int = 2) -> list[list[tuple]]:
    """2 GPUs, 4 stages in a V (GPU 0: stages 0 and 3), split backward, no overlap."""
    m = range(microbatches)
    gpu0 = [(0, F, j) for j in m] + [(3, F, j) for j in m]
    gpu0 += [(3, k, j) for j in m for k in (BI, BW)] + [(0, k, j) for j in m for k in (BI, BW)]
    gpu1 = [(1, F, j) for j in m] + [(2, F, j) for j in m]
    gpu1 += [(2, k, j) for j in m for k in (BI, BW)] + [(1, k, j) for j in m for k in (BI, BW)]
    return [gpu0, gpu1]


def test_placement_and_chunks_come_from_the_list() -> None:
    schedule = schedule_from_actions("mine", v_shape())
    assert (schedule.stages, schedule.microbatches, schedule.virtual_stages) == (2, 2, 2)
    assert schedule.placement == ((0, 3), (1, 2))
    assert schedule.order[0][2].chunk == 1  # stage 3 is GPU 0's second chunk
    assert schedule.kinds == (F, BI, BW)
    assert schedule.actions() == v_shape()
    dag = build_dag(schedule)
    assert dag.size == 24 and set(dag.cost_class.tolist()) == set(range(6))


def test_named_schedules_round_trip_through_their_actions() -> None:
    for name, v in (("1f1b", 1), ("interleaved-1f1b", 2), ("zbv", 2), ("dualpipev", 2)):
        schedule = make_schedule(name, 2, 4, v)
        again = schedule_from_actions(
            name, schedule.actions(), schedule.microbatches, schedule.overlapped
        )
        assert again == schedule


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda a: a[1].remove((1, BW, 1)), r"no backward_weight 1 of stage 1"),
        (lambda a: a[0].remove((0, F, 0)), r"no forward 0 of stage 0"),
        (lambda a: a[0].append((3, B, 0)), r"both backward 0 of stage 3 and backward_input"),
        (lambda a: a[0].append((0, F, 1)), r"GPU 0 runs forward 1 of stage 0 twice"),
        (lambda a: a[1].append((0, F, 5)), r"stage 0 runs on GPU 0 and on GPU 1"),
        (lambda a: a[1].append((4, F, 0)), r"every GPU must hold the same number"),
        (lambda a: a[0].append((0, "recompute", 0)), r"is not a \(stage, kind, microbatch\)"),
    ],
)
def test_a_bad_list_is_refused_naming_the_actions(edit, message: str) -> None:
    actions = v_shape()
    edit(actions)
    with pytest.raises(ScheduleError, match=message):
        build_dag(schedule_from_actions("bad", actions, 2))


def test_a_weight_half_before_its_input_half_is_refused() -> None:
    actions = v_shape()
    seq = actions[1]
    i, w = seq.index((1, BI, 0)), seq.index((1, BW, 0))
    seq[i], seq[w] = seq[w], seq[i]
    with pytest.raises(ScheduleError, match="GPU 1 runs backward_weight 0 of stage 1 before"):
        build_dag(schedule_from_actions("bad", actions))


def test_a_deadlock_names_the_cycle() -> None:
    actions = v_shape()
    actions[1].insert(0, actions[1].pop(actions[1].index((1, BI, 0))))  # BI before its forward
    with pytest.raises(ScheduleError, match=r"deadlocks: .*GPU 1 backward_input 0 of stage 1"):
        build_dag(schedule_from_actions("bad", actions))


def test_missing_model_stage_is_refused() -> None:
    with pytest.raises(ScheduleError, match=r"no GPU runs model stage\(s\) \[1\]"):
        schedule_from_actions("bad", [[(0, F, 0), (0, B, 0)], [(2, F, 0), (2, B, 0)]])
