"""Prometheus metrics and the middlewares (perseus.server.metrics)."""

from __future__ import annotations

import re
from collections.abc import Callable

from fastapi.testclient import TestClient

from perseus.server.settings import Settings

from .conftest import Job, create_job, small_profile_rows


def test_metrics_count_requests_jobs_and_planning(ready_job: Job) -> None:
    text = ready_job.client.get("/metrics").text
    assert (
        'perseus_http_requests_total{method="POST",route="/v1/jobs/{job_id}/ranks",status="200"} 8'
        in text
    )
    assert 'perseus_jobs{state="ready"} 1' in text
    assert 'perseus_planning_seconds_count{outcome="ok"} 1' in text
    assert "perseus_http_request_duration_seconds_bucket" in text


def test_metrics_labels_come_from_a_closed_set(client: TestClient) -> None:
    # Issue 24, item 1: any token is a valid HTTP method; each distinct one was a series
    # kept and rendered forever (8 KB names made /metrics hundreds of MB).
    before = client.get("/metrics").text
    for i in range(50):
        client.request(f"X{i:04d}" + "A" * 200, "/healthz")
        client.request(f"Y{i:04d}", f"/nothing-{i}")
    text = client.get("/metrics").text
    assert "X0000" not in text and "Y0049" not in text and "nothing-" not in text
    assert 'method="other",route="unmatched"' in text
    methods = set(re.findall(r'method="([^"]*)"', text))
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}
    assert len(text) - len(before) < 10_000  # bounded by routes x statuses, not by requests


def test_body_over_the_cap_is_413(
    settings: Settings, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(settings.model_copy(update={"max_body_bytes": 4096}))
    job = create_job(client)
    big = {"rank": 0, "stage": 0, "rows": small_profile_rows() * 40}
    r = client.post(job.url("/profiles"), json=big, headers=job.auth)
    assert r.status_code == 413
    chunked = client.post(
        job.url("/profiles"),
        content=iter([b'{"rank": 0, ', b" " * 5000, b"}"]),
        headers={**job.auth, "Content-Type": "application/json"},
    )
    assert chunked.status_code == 413
    assert client.get("/healthz").status_code == 200
