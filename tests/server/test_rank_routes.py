"""The rank routes (perseus.server.rank_routes): answers before a plan, strict numbers.

Their logic is tested with the module that holds it: registration in test_jobs, profiles
and planning in test_lease, plans in test_plans and test_plan_fetch, policy and stragglers
in test_choices, iterations in test_telemetry.
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from .conftest import Job, create_job, rank_body, small_profile_rows


def test_frontier_and_plan_say_not_ready_while_registering(client: TestClient) -> None:
    job = create_job(client)
    r = client.get(job.url("/frontier"), headers=job.auth)
    assert r.status_code == 409
    assert r.json()["state"] == "registering"
    assert "not ready" in r.json()["detail"]
    assert r.headers["retry-after"] == "1"
    job_rank = client.post(
        job.url("/ranks"),
        json={
            "rank": 0,
            "stage": 0,
            "data_parallel_rank": 0,
            "tensor_parallel_rank": 0,
            "gpu_name": "x",
            "supported_clocks_mhz": [1000],
        },
        headers=job.auth,
    )
    assert job_rank.status_code == 200
    r = client.get(job.url("/plan"), params={"rank": 0}, headers=job.auth)
    assert r.status_code == 409
    r = client.get(job.url("/plan"), params={"rank": 1}, headers=job.auth)
    assert r.status_code == 409
    assert "not registered" in r.json()["detail"]


def test_non_finite_numbers_are_422(client: TestClient) -> None:
    job = create_job(client)
    client.post(job.url("/ranks"), json=rank_body(0), headers=job.auth)
    raw = (
        '{"rank": 0, "stage": 0, "rows": ['
        '{"instruction": "forward", "frequency_mhz": 1980, "time_s": NaN, "energy_j": 1},'
        '{"instruction": "backward", "frequency_mhz": 1980, "time_s": Infinity, "energy_j": 1}]}'
    )
    r = client.post(
        job.url("/profiles"), content=raw, headers={**job.auth, "Content-Type": "application/json"}
    )
    assert r.status_code == 422
    locs = [err["loc"] for err in r.json()["detail"]]
    assert ["body", "rows", 0, "time_s"] in locs
    assert ["body", "rows", 1, "time_s"] in locs


def test_too_many_rows_is_422(client: TestClient) -> None:
    job = create_job(client)
    client.post(job.url("/ranks"), json=rank_body(0), headers=job.auth)
    rows = small_profile_rows() * 2501
    r = client.post(
        job.url("/profiles"), json={"rank": 0, "stage": 0, "rows": rows}, headers=job.auth
    )
    assert r.status_code == 422


def test_rank_profile_and_iteration_numbers_are_strict(ready_job: Job) -> None:
    client, auth = ready_job.client, ready_job.auth
    registration = rank_body(stage=0)
    for change in ({"tensor_parallel_rank": False}, {"rank": 0.0}, {"stage": "0"}):
        r = client.post(ready_job.url("/ranks"), json={**registration, **change}, headers=auth)
        assert r.status_code == 422, change
    iteration = {"rank": 0, "iteration": 1, "time_s": 1.0, "energy_j": 1.0}
    for change in (
        {"time_s": True},
        {"time_s": "1.0"},
        {"plan_version": False},
        {"iteration": 1.0},
        {"energy_j": None},
    ):
        r = client.post(ready_job.url("/iterations"), json={**iteration, **change}, headers=auth)
        assert r.status_code == 422, change
    assert client.post(ready_job.url("/iterations"), json=iteration, headers=auth).is_success
    row = {"instruction": "forward", "frequency_mhz": 1000, "time_s": True, "energy_j": 1.0}
    r = client.post(
        ready_job.url("/profiles"), json={"rank": 0, "stage": 0, "rows": [row, row]}, headers=auth
    )
    assert r.status_code == 422
    for body in ({"slowdown": True}, {"iteration_time_s": "2"}):
        assert client.put(ready_job.url("/straggler"), json=body, headers=auth).status_code == 422
