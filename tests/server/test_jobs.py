"""Jobs and ranks (perseus.server.lifecycle.jobs): the life cycle's states, registration's
checks."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

from perseus.schemas import RankRegistration
from perseus.server.service import JobService
from perseus.server.store.job_store import Store

from .conftest import Clock, ProfileRows, clocks_of, create_job, job_spec, rank_body, snapshot


def test_job_goes_registering_profiling_planning_ready(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, name="demo")
    view = job.view()
    assert view["state"] == "registering"
    assert view["version"] == 0
    assert view["counts"]["ranks_expected"] == 8
    job.register_all(clocks_of(example_rows))
    assert job.view()["state"] == "profiling"
    job.report_all(example_rows, replicas=range(1))
    assert job.view()["counts"]["stages_profiled"] == 4
    assert job.view()["state"] == "profiling"  # waits for every rank's profile
    last = job.report_all(example_rows, replicas=range(1, 2))
    assert last["planning"] is True
    r = job.wait_plan(rank=5)
    assert r.status_code == 200
    plan = r.json()
    assert r.headers["etag"] == '"1"'
    assert plan["version"] == 1
    assert plan["stage"] == 1
    assert [i["instruction"] for i in plan["instructions"]][:3] == ["forward"] * 3
    assert all("chunk" not in i for i in plan["instructions"])
    assert len(plan["instructions"]) == 2 * 4
    view = job.view()
    assert view["state"] == "ready"
    assert view["frontier_points"] > 1
    assert view["planning_s"] > 0
    assert view["chosen"]["index"] == 0


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (rank_body(stage=4), ["body", "stage"]),
        (rank_body(rank=8), ["body", "rank"]),
        (rank_body(data_parallel_rank=2), ["body", "data_parallel_rank"]),
        (rank_body(tensor_parallel_rank=1), ["body", "tensor_parallel_rank"]),
        (rank_body(supported_clocks_mhz=[0]), ["body", "supported_clocks_mhz", 0]),
        (rank_body(supported_clocks_mhz=[]), ["body", "supported_clocks_mhz"]),
        (rank_body(supported_clocks_mhz=list(range(1, 1100))), ["body", "supported_clocks_mhz"]),
        (rank_body(gpu_name=""), ["body", "gpu_name"]),
        # requests stay strict (ranks ignore unknown fields only in the server's answers)
        ({**rank_body(), "gpu_nmae": "x"}, ["body", "gpu_nmae"]),
    ],
)
def test_bad_rank_registrations_name_the_field(
    client: TestClient, body: dict[str, Any], loc: list[Any]
) -> None:
    job = create_job(client)
    before = snapshot(job)
    r = client.post(job.url("/ranks"), json=body, headers=job.auth)
    assert r.status_code == 422, r.text
    assert loc in [err["loc"] for err in r.json()["detail"]]
    assert snapshot(job) == before


def test_rank_conflicts_are_409_and_reregistering_is_fine(client: TestClient) -> None:
    job = create_job(client)
    assert client.post(job.url("/ranks"), json=rank_body(0), headers=job.auth).status_code == 200
    again = client.post(job.url("/ranks"), json=rank_body(0, gpu_name="other"), headers=job.auth)
    assert again.status_code == 200
    assert again.json()["ranks_registered"] == 1
    taken = client.post(job.url("/ranks"), json=rank_body(1), headers=job.auth)
    assert taken.status_code == 409
    moved = client.post(job.url("/ranks"), json=rank_body(0, stage=1), headers=job.auth)
    assert moved.status_code == 409
    assert job.view()["counts"]["ranks_registered"] == 1


def test_a_rank_registered_again_from_elsewhere_is_logged(
    client: TestClient, example_rows: ProfileRows, caplog: pytest.LogCaptureFixture
) -> None:
    job = create_job(client, data_parallel=1)
    job.register_all(clocks_of(example_rows))
    reg = {"rank": 0, "stage": 0, "data_parallel_rank": 0, "tensor_parallel_rank": 0,
           "gpu_name": "NVIDIA H200", "supported_clocks_mhz": [1980]}  # fmt: skip
    with caplog.at_level("WARNING", logger="perseus.server"):
        assert client.post(job.url("/ranks"), json=reg, headers=job.auth).status_code == 200
    assert "rank 0 registered again" in caplog.text and "another clock list" in caplog.text


def test_one_rank_from_two_live_processes_is_409_naming_it(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = create_job(client)
    first = client.post(job.url("/ranks"), json=rank_body(0, instance="a1"), headers=job.auth)
    assert first.status_code == 200
    # the same process again (a retry) is fine
    again = client.post(job.url("/ranks"), json=rank_body(0, instance="a1"), headers=job.auth)
    assert again.status_code == 200
    second = client.post(
        job.url("/ranks"),
        json=rank_body(0, instance="b2", supported_clocks_mhz=[1980]),
        headers=job.auth,
    )
    assert second.status_code == 409
    assert "rank 0 is registered by another live process" in second.json()["detail"]
    # the first process's clock list stands
    assert job.view()["counts"]["ranks_registered"] == 1
    # once the first has been quiet long enough, a new process is a restart
    monkeypatch.setattr("perseus.server.lifecycle.jobs.RANK_LIVE_S", 0.0)
    restart = client.post(job.url("/ranks"), json=rank_body(0, instance="b2"), headers=job.auth)
    assert restart.status_code == 200
    assert (
        client.post(
            job.url("/ranks"), json=rank_body(0, instance="bad id!"), headers=job.auth
        ).status_code
        == 422
    )


def test_list_is_ordered_and_paged(store: Store) -> None:
    clock = Clock()
    service = JobService(store, clock=clock)
    ids = []
    for i in range(5):
        clock.now_s += 1
        ids.append(service.jobs.create(job_spec(name=f"j{i}"))[1].id)
    assert [j.job_id for j in service.jobs.list(100, 0)] == ids
    assert [j.job_id for j in service.jobs.list(2, 1)] == ids[1:3]


def test_concurrent_registrations_count_exactly(store: Store) -> None:
    service = JobService(store)
    spec = job_spec(stages=8, data_parallel=4)
    _, job = service.jobs.create(spec)

    def register(rank: int) -> None:
        service.jobs.register_rank(
            job.id,
            RankRegistration(
                rank=rank,
                stage=rank % 8,
                data_parallel_rank=rank // 8,
                tensor_parallel_rank=0,
                gpu_name="H200",
                supported_clocks_mhz=[1000],
            ),
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(register, range(32)))
    row = service.jobs.get(job.id)
    assert row.ranks_registered == 32
    assert row.state == "profiling"
