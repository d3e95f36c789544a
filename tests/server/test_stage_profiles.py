"""Combining a stage's rank profiles (perseus.server.stage_profiles), blocking power."""

from __future__ import annotations

from fastapi.testclient import TestClient

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
