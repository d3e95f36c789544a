"""The job routes (perseus.server.api.job_routes): create, list, delete; what creation refuses."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from .conftest import JOB_SPEC, create_job


def test_job_list_and_delete(client: TestClient) -> None:
    a = create_job(client, name="a")
    b = create_job(client, name="b")
    listed = client.get("/v1/jobs").json()["jobs"]
    assert [j["job_id"] for j in listed] == [a.job_id, b.job_id]
    assert a.job_id != b.job_id
    assert client.delete(a.url(), headers=a.auth).status_code == 204
    assert client.get(a.url(), headers=a.auth).status_code == 404
    assert client.delete(a.url(), headers=a.auth).status_code == 404
    assert [j["job_id"] for j in client.get("/v1/jobs").json()["jobs"]] == [b.job_id]


def test_the_job_list_pages(client: TestClient) -> None:
    ids = [create_job(client, name=f"j{i}").job_id for i in range(4)]
    page = client.get("/v1/jobs", params={"limit": 2, "offset": 1}).json()["jobs"]
    assert [j["job_id"] for j in page] == ids[1:3]
    assert [j["name"] for j in page] == ["j1", "j2"]
    for params in ({"limit": 0}, {"limit": 1001}, {"offset": -1}):
        assert client.get("/v1/jobs", params=params).status_code == 422, params


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"stages": 0}, "stages"),
        ({"stages": 2000}, "stages"),
        ({"schedule": "zigzag"}, "schedule"),
        ({"microbatches": -1}, "microbatches"),
        ({"p_block_w": -5}, "p_block_w"),
        ({"policy": {"kind": "deadline"}}, "policy"),
        ({"policy": {"kind": "max-slowdown", "factor": 0.5}}, "policy"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"name": "a" * 201}, "name"),
        ({"name": "a\x00b"}, "name"),
    ],
)
def test_bad_job_specs_name_the_field(
    client: TestClient, change: dict[str, Any], field: str
) -> None:
    r = client.post("/v1/jobs", json={**JOB_SPEC, **change})
    assert r.status_code == 422, r.text
    assert any(field in err["loc"] for err in r.json()["detail"])
    assert client.get("/v1/jobs").json()["jobs"] == []


def test_too_many_instructions_or_ranks_is_422(client: TestClient) -> None:
    body = {
        "schedule": "1f1b",
        "stages": 1024,
        "microbatches": 100_000,
        "data_parallel": 1,
        "tensor_parallel": 1,
    }
    assert client.post("/v1/jobs", json=body).status_code == 422
    body = {
        "schedule": "1f1b",
        "stages": 8,
        "microbatches": 8,
        "data_parallel": 100_000,
        "tensor_parallel": 8,
    }
    assert client.post("/v1/jobs", json=body).status_code == 422
    body = {
        "schedule": "1f1b",
        "stages": 8,
        "microbatches": 8,
        "virtual_stages": 2,
        "data_parallel": 1,
        "tensor_parallel": 1,
    }
    assert client.post("/v1/jobs", json=body).status_code == 422


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"stages": "2"}, "stages"),
        ({"stages": 2.0}, "stages"),
        ({"stages": True}, "stages"),
        ({"p_block_w": True}, "p_block_w"),
        ({"p_block_w": "100"}, "p_block_w"),
        ({"auto_straggler": 1}, "auto_straggler"),
        ({"straggler_window": 5.0}, "straggler_window"),
        ({"policy": {"kind": "zeus-cost", "eta": False}}, "policy"),
    ],
)
def test_job_numbers_are_strict(client: TestClient, change: dict[str, Any], field: str) -> None:
    r = client.post("/v1/jobs", json={**JOB_SPEC, **change})
    assert r.status_code == 422, r.text
    assert field in [err["loc"][1] for err in r.json()["detail"]]
