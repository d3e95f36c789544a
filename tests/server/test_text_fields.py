"""Every text a request carries gets the same answer on SQLite and PostgreSQL: a 422 naming the
field, or the text stored without what no database takes (NUL). PostgreSQL refuses NUL in
text outright; a reason that reached it once answered a plain-text 500 with a traceback in
the log, while SQLite stored the same request."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from perseus.server.settings import Settings

from .conftest import JOB_SPEC, create_job, rank_body

# Every free-form string field of every request body, and what it does with a NUL. A new
# text field fails test_every_request_text_field_is_covered until it is listed here.
TEXT_FIELDS = {
    ("JobCreate", "name"): "refused",
    ("RankRegistration", "gpu_name"): "refused",
    ("RankRegistration", "instance"): "refused",
    ("GaveUpReport", "reason"): "cleaned",
}


@pytest.fixture
def any_database_client(
    database_url: str, make_client: Callable[[Settings], TestClient]
) -> TestClient:
    settings = Settings(database=database_url, warm_planner=False, planning_lease_s=3.0)
    return make_client(settings)


def _string_fields(schema: dict[str, Any]) -> set[str]:
    found = set()
    for name, field in schema.get("properties", {}).items():
        options = field.get("anyOf", [field])
        if any(o.get("type") == "string" and "enum" not in o and "const" not in o for o in options):
            found.add(name)
    return found


def test_every_request_text_field_is_covered(client: TestClient) -> None:
    document = client.app.openapi()  # type: ignore[attr-defined]
    schemas = document["components"]["schemas"]
    bodies = set()
    for operations in document["paths"].values():
        for operation in operations.values():
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                refs = [media["schema"], *media["schema"].get("oneOf", [])]
                bodies |= {r["$ref"].rsplit("/", 1)[1] for r in refs if "$ref" in r}
    fields = {(body, name) for body in bodies for name in _string_fields(schemas[body])}
    assert fields == set(TEXT_FIELDS)


def test_a_nul_in_a_name_is_422_on_both_databases(any_database_client: TestClient) -> None:
    client = any_database_client
    r = client.post("/v1/jobs", json={**JOB_SPEC, "name": "bert\x00large"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "name"]
    assert client.get("/v1/jobs").json()["jobs"] == []
    job = create_job(client)
    for field, value in (("gpu_name", "NVIDIA\x00H200"), ("instance", "a\x00b")):
        r = client.post(job.url("/ranks"), json=rank_body(**{field: value}), headers=job.auth)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", field]
    assert job.view()["counts"]["ranks_registered"] == 0


def test_a_nul_in_a_reason_is_dropped_on_both_databases(any_database_client: TestClient) -> None:
    client = any_database_client
    job = create_job(client)
    reason = "cannot set clocks:\x00 NVML_ERROR_NO_PERMISSION"
    r = client.post(job.url("/ranks:gave-up"), json={"rank": 1, "reason": reason}, headers=job.auth)
    assert r.status_code == 200, r.text
    [gave_up] = job.view()["gave_up"]
    assert (gave_up["rank"], gave_up["reason"]) == (
        1,
        "cannot set clocks: NVML_ERROR_NO_PERMISSION",
    )
    # A lone surrogate (a file name decoded with surrogateescape) becomes U+FFFD. As JSON
    # escapes: httpx would refuse to encode it itself.
    body = json.dumps({"rank": 3, "reason": "no /dev/nvidia\udcff"})
    headers = {**job.auth, "Content-Type": "application/json"}
    r = client.post(job.url("/ranks:gave-up"), content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert job.view()["gave_up"][1]["reason"] == "no /dev/nvidia\ufffd"
    # Nothing but NULs is no reason: 422, and nothing stored.
    r = client.post(
        job.url("/ranks:gave-up"), json={"rank": 2, "reason": "\x00\x00"}, headers=job.auth
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "reason"]
    assert [g["rank"] for g in job.view()["gave_up"]] == [1, 3]
