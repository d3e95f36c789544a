"""The planning-work estimate and its limit (perseus.server.planning_work)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from .conftest import ProfileRows, clocks_of, create_job


def test_a_job_too_large_to_plan_is_refused_when_its_profile_arrives(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, microbatches=32_768, data_parallel=1)
    job.register_all(clocks_of(example_rows))
    r = client.post(
        job.url("/profiles"),
        json={"rank": 0, "stage": 0, "rows": example_rows[0]},
        headers=job.auth,
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "PlanningTooLarge"
    assert "planning_max_cells" in r.text
    assert job.view()["counts"]["profiles_reported"] == 0
