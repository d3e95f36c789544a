"""The app factory (perseus.server.app): docs, the OpenAPI document, and every error in the
documented shape (router errors, unreadable bodies, a request-level 422)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from .conftest import Job, create_job


def test_healthz_docs_openapi(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert "/v1/jobs/{job_id}/plan" in spec["paths"]
    assert "/v1/jobs/{job_id}/plan:compute" in spec["paths"]


def test_invalid_json_is_422(client: TestClient) -> None:
    r = client.post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422


def _is_error(body: Any, status: int) -> bool:
    if not (isinstance(body, dict) and isinstance(body.get("error"), str)):
        return False
    if status == 422:
        return isinstance(body["detail"], list) and all(
            {"loc", "msg", "type"} <= set(d) for d in body["detail"]
        )
    return isinstance(body["detail"], str)


@pytest.mark.parametrize(
    "content",
    [b"{bad", b'{"rank": "\xff\xfe"}', b"[" * 10_000 + b"]" * 10_000],
    ids=["invalid", "not-utf8", "deep"],
)
def test_undecodable_bodies_are_documented_422s(client: TestClient, content: bytes) -> None:
    job = create_job(client)
    r = client.post(
        job.url("/profiles"),
        content=content,
        headers={**job.auth, "content-type": "application/json"},
    )
    assert r.status_code == 422
    assert _is_error(r.json(), 422)


def test_a_request_level_422_has_the_field_shape(ready_job: Job) -> None:
    r = ready_job.client.put(
        ready_job.url("/policy"), json={"kind": "deadline", "seconds": 1e-6}, headers=ready_job.auth
    )
    assert r.status_code == 422
    assert r.json()["error"] == "InfeasibleDeadline"
    assert _is_error(r.json(), 422)


def test_router_errors_and_options(client: TestClient) -> None:
    job = create_job(client)
    r = client.get("/v1/nothing")
    assert (r.status_code, r.json()["error"]) == (404, "NotFound")
    r = client.get("/v1/jobs/")
    assert r.status_code == 404 and _is_error(r.json(), 404)
    r = client.patch(job.url(), headers=job.auth)
    assert r.status_code == 405 and _is_error(r.json(), 405)
    assert r.headers["allow"] == "DELETE, GET, OPTIONS"
    r = client.options("/v1/jobs")
    assert r.status_code == 204
    assert r.headers["allow"] == "GET, OPTIONS, POST"


def test_openapi_documents_the_error_bodies(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    operation = spec["paths"]["/v1/jobs/{job_id}/profiles"]["post"]
    ref = operation["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/ValidationErrorBody")
    assert "error" in spec["components"]["schemas"]["ValidationErrorBody"]["required"]
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_docs_load_nothing_from_a_cdn(client: TestClient) -> None:
    page = client.get("/docs").text
    assert "cdn." not in page and "https://" not in page.split("<script>")[0]
    assert client.get("/docs/static/swagger-ui-bundle.js").status_code == 200
