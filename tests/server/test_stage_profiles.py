"""Combining a stage's rank profiles (perseus.server.planning.stage_profiles), blocking power."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from perseus.core.errors import ProfileError
from perseus.server.planning.stage_profiles import RankProfile, combine_profiles, stage_p_block_w

from .conftest import ProfileRows, clocks_of, create_job


def test_profile_blocking_power_is_used(client: TestClient, example_rows: ProfileRows) -> None:
    job = create_job(client, p_block_w=None, data_parallel=1)
    job.register_all(clocks_of(example_rows))
    for stage in range(4):
        r = client.post(
            job.url("/profiles"),
            json={"rank": stage, "stage": stage, "rows": example_rows[stage], "p_block_w": 90.0},
            headers=job.auth,
        )
        assert r.status_code == 200
    assert job.wait_plan().status_code == 200


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
