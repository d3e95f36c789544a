"""Plans rendered from the chosen point (perseus.server.planning.plans), as ranks fetch them."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from perseus.schemas import PlanResponse

from .conftest import Job, ProfileRows, clocks_of, create_job


def test_plan_instructions_follow_the_chosen_point(ready_job: Job) -> None:
    frontier = ready_job.client.get(ready_job.url("/frontier"), headers=ready_job.auth).json()
    assert frontier["version"] == 1
    times = [p["time_s"] for p in frontier["points"]]
    energies = [p["energy_j"] for p in frontier["points"]]
    assert times == sorted(times)
    assert energies == sorted(energies, reverse=True)
    assert set(frontier["baselines"]) >= {"all_fastest"}
    plan = ready_job.wait_plan(rank=ready_job.rank_of(3, 1)).json()
    assert plan["time_s"] == pytest.approx(times[frontier["chosen_index"]])
    assert plan["energy_j"] == pytest.approx(energies[frontier["chosen_index"]])
    # The last stage alternates F, B right away in 1F1B.
    kinds = [i["instruction"][0] for i in plan["instructions"]]
    assert "".join(kinds) == "FBFBFBFB".lower()
    assert [i["microbatch"] for i in plan["instructions"]] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_interleaved_plans_carry_chunks(client: TestClient, example_rows: ProfileRows) -> None:
    job = create_job(
        client, schedule="interleaved-1f1b", virtual_stages=2, data_parallel=1, microbatches=4
    )
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    plan = job.wait_plan().json()
    assert len(plan["instructions"]) == 2 * 4 * 2
    assert {i["chunk"] for i in plan["instructions"]} == {0, 1}
    PlanResponse.model_validate_json(job.wait_plan().content, strict=True)


def test_plan_bytes_are_a_strict_plan_response(ready_job: Job) -> None:
    for rank in range(ready_job.stages * ready_job.data_parallel):
        r = ready_job.wait_plan(rank=rank)
        plan = PlanResponse.model_validate_json(r.content, strict=True)
        assert r.headers["etag"] == f'"{plan.version}"'
        assert all(i.chunk is None for i in plan.instructions)
        assert b'"chunk"' not in r.content  # absent, not null, without chunks


def test_tensor_parallel_ranks_share_their_stage_plan(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, data_parallel=1, tensor_parallel=2)
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    a = job.wait_plan(rank=job.rank_of(2, 0, 0)).json()
    b = job.wait_plan(rank=job.rank_of(2, 0, 1)).json()
    assert a == b
    assert a["stage"] == 2
