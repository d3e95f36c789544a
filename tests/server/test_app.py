"""The app factory (perseus.server.app): docs, the OpenAPI document, error handlers."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_healthz_docs_openapi(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert "/v1/jobs/{job_id}/plan" in spec["paths"]
    assert "/v1/jobs/{job_id}/plan:compute" in spec["paths"]


def test_invalid_json_is_422(client: TestClient) -> None:
    r = client.post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422
