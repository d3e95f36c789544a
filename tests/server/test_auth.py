"""Tokens (perseus.server.auth): the admin token and each job's own."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient
from pydantic import SecretStr

from perseus.server.settings import Settings

from .conftest import create_job


def test_job_token_is_required_and_scoped(client: TestClient) -> None:
    a = create_job(client)
    b = create_job(client)
    assert client.get(a.url()).status_code == 401
    assert client.get(a.url()).headers["www-authenticate"] == "Bearer"
    assert client.get(a.url(), headers=b.auth).status_code == 403
    assert client.get(a.url(), headers={"Authorization": "Bearer nonsense"}).status_code == 403
    assert client.get(a.url(), headers={"Authorization": "Basic abc"}).status_code == 401
    assert client.get(a.url(), headers=a.auth).status_code == 200
    assert client.delete(a.url(), headers=b.auth).status_code == 403
    for method, suffix in (("post", "/ranks"), ("put", "/policy"), ("get", "/plan?rank=0")):
        r = client.request(method, a.url(suffix), headers=b.auth, json={})
        assert r.status_code == 403, (method, suffix)


def test_admin_token_guards_create_list_delete(
    settings: Settings, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(settings.model_copy(update={"admin_token": SecretStr("s3cret")}))
    admin = {"Authorization": "Bearer s3cret"}
    body = {
        "schedule": "1f1b",
        "stages": 2,
        "microbatches": 2,
        "data_parallel": 1,
        "tensor_parallel": 1,
    }
    assert client.post("/v1/jobs", json=body).status_code == 401
    assert (
        client.post("/v1/jobs", json=body, headers={"Authorization": "Bearer no"}).status_code
        == 403
    )
    job = create_job(client, headers=admin, stages=2, microbatches=2, data_parallel=1)
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/v1/jobs", headers=job.auth).status_code == 403
    assert len(client.get("/v1/jobs", headers=admin).json()["jobs"]) == 1
    assert client.get(job.url(), headers=admin).status_code == 200  # admin may read any job
    assert client.delete(job.url(), headers=job.auth).status_code == 403
    assert client.delete(job.url(), headers=admin).status_code == 204


def test_tokens_are_stored_hashed(client: TestClient, sqlite_url: str) -> None:
    job = create_job(client)
    path = sqlite_url.removeprefix("sqlite:///")
    with open(path, "rb") as f:
        assert job.token.encode() not in f.read()
