"""How a stage's profile combines its ranks, and the worker-process function."""

from __future__ import annotations

import json

import pytest

from perseus.errors import ProfileError
from perseus.files import frontier_from_json
from perseus.server.planning import (
    PlanningInput,
    RankProfile,
    StoredProfile,
    combine_profiles,
    plan_frontier,
    stage_p_block_w,
)

from .conftest import ProfileRows


def _rank(
    stage: int, dp: int, tp: int, scale: float, clocks: tuple[int, ...] = (1000, 900)
) -> RankProfile:
    rows = tuple(
        (name, f, scale * base * 1000 / f, scale * base * 10)
        for f in clocks
        for name, base in (("forward", 1.0), ("backward", 2.0))
    )
    return RankProfile(stage, dp, tp, rows)


def test_time_is_the_slowest_energy_sums_tensor_parallel_and_averages_replicas() -> None:
    profiles = [
        _rank(0, dp=0, tp=0, scale=1.0),
        _rank(0, dp=0, tp=1, scale=1.2),
        _rank(0, dp=1, tp=0, scale=1.1),
        _rank(0, dp=1, tp=1, scale=1.0),
    ]
    rows = combine_profiles(profiles, stages=1, tensor_parallel=2)
    by_key = {(name, f): (t, e) for _, name, f, t, e in rows}
    time_s, energy_j = by_key[("forward", 1000)]
    assert time_s == pytest.approx(1.2)  # the slowest rank
    # tp 0: mean(10, 11) = 10.5; tp 1: mean(12, 10) = 11; summed over the group.
    assert energy_j == pytest.approx(21.5)
    assert [(name, f) for _, name, f, _, _ in rows] == [
        ("backward", 1000),
        ("backward", 900),
        ("forward", 1000),
        ("forward", 900),
    ]


def test_only_clocks_every_rank_measured_are_kept() -> None:
    profiles = [_rank(0, 0, 0, 1.0, (1000, 900, 800)), _rank(0, 1, 0, 1.0, (1000, 800))]
    rows = combine_profiles(profiles, stages=1, tensor_parallel=1)
    assert sorted({f for _, _, f, _, _ in rows}) == [800, 1000]


def test_missing_stages_and_tensor_parallel_ranks_are_named() -> None:
    with pytest.raises(ProfileError, match="stage 1: no rank"):
        combine_profiles([_rank(0, 0, 0, 1.0)], stages=2, tensor_parallel=1)
    with pytest.raises(ProfileError, match=r"stage 0: no profile from tensor-parallel ranks \[1\]"):
        combine_profiles([_rank(0, 0, 0, 1.0)], stages=1, tensor_parallel=2)
    with pytest.raises(ProfileError, match="share no clock"):
        combine_profiles(
            [_rank(0, 0, 0, 1.0, (1000,)), _rank(0, 1, 0, 1.0, (900,))], stages=1, tensor_parallel=1
        )


def test_blocking_power_is_per_gpu_times_the_tensor_parallel_group() -> None:
    assert stage_p_block_w(80.0, [], tensor_parallel=4) == 320.0
    reported = [
        RankProfile(0, 0, 0, (), 60.0),
        RankProfile(0, 0, 1, (), 80.0),
        RankProfile(0, 1, 0, (), None),
    ]
    assert stage_p_block_w(None, reported, tensor_parallel=2) == 140.0
    with pytest.raises(ProfileError, match="blocking power"):
        stage_p_block_w(None, [RankProfile(0, 0, 0, ())], tensor_parallel=1)


def test_worker_function_returns_the_frontier_and_its_json(example_rows: ProfileRows) -> None:
    profiles = tuple(
        StoredProfile(
            stage,
            0,
            0,
            json.dumps(
                [[r["instruction"], r["frequency_mhz"], r["time_s"], r["energy_j"]] for r in rows]
            ),
        )
        for stage, rows in example_rows.items()
    )
    result = plan_frontier(PlanningInput("j", "gpipe", 4, 3, 1, 1, 100.0, 1e-3, profiles))
    frontier = frontier_from_json(result.frontier_json)
    assert frontier.schedule.name == result.frontier.schedule.name == "gpipe"
    assert len(frontier) == len(result.frontier) > 1
    assert list(frontier.times_s) == list(result.frontier.times_s)
