"""Quotas (perseus.server.lifecycle.quotas): each limit answers with a clear 4xx."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from perseus.server.settings import Settings

from .conftest import JOB_SPEC, ProfileRows, clocks_of, create_job


def test_quotas_answer_with_clear_4xx(
    settings: Settings, make_client: Callable[[Settings], TestClient], example_rows: ProfileRows
) -> None:
    # Issue 24, item 6: no quota anywhere (3,000 jobs in 7 s, data_parallel=131072, ~15 GiB
    # of profiles per job).
    limits = {"max_jobs": 3, "max_ranks_per_job": 8, "max_profile_rows": 40,
              "max_job_profile_bytes": 1_500}  # fmt: skip
    client = make_client(settings.model_copy(update=limits))
    r = client.post("/v1/jobs", json={**JOB_SPEC, "data_parallel": 8})
    assert r.status_code == 422, r.text
    assert "max_ranks_per_job" in r.json()["detail"][0]["msg"]
    job = create_job(client, data_parallel=1)
    job.register_all(clocks_of(example_rows))
    too_many = example_rows[0] * 3
    assert len(too_many) > 40
    r = client.post(
        job.url("/profiles"), json={"rank": 0, "stage": 0, "rows": too_many}, headers=job.auth
    )
    assert r.status_code == 422 and "max_profile_rows" in r.json()["detail"][0]["msg"]
    codes = []
    for stage in range(4):
        top = sorted(clocks_of(example_rows))[-10:]
        rows = [r for r in example_rows[stage] if r["frequency_mhz"] in top]  # ~1 KB
        body = {"rank": stage, "stage": stage, "rows": rows}
        codes.append(client.post(job.url("/profiles"), json=body, headers=job.auth))
    refused = [r for r in codes if r.status_code != 200]
    assert refused and refused[0].status_code == 409
    assert "max_job_profile_bytes" in refused[0].json()["detail"]
    create_job(client)
    create_job(client)
    r = client.post("/v1/jobs", json=JOB_SPEC)
    assert r.status_code == 409 and r.json()["error"] == "QuotaExceeded"
    assert "max_jobs" in r.json()["detail"]
    assert client.delete(job.url(), headers=job.auth).status_code == 204
    create_job(client)  # room again
