"""What every route depends on (perseus.server.api.deps): the job, the rank's host."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from perseus.schemas import RankRegistration

from .conftest import Job, rank_body


def test_unknown_job_is_404_not_a_traceback(client: TestClient) -> None:
    for path in ("/v1/jobs/0123456789abcdef0123456789abcdef", "/v1/jobs/nope", "/v1/jobs/%00"):
        r = client.get(path, headers={"Authorization": "Bearer x"})
        assert r.status_code == 404
        assert r.json()["error"] == "JobNotFound"
        assert "Traceback" not in r.text


def test_reports_from_another_host_are_logged_once(
    ready_job: Job, caplog: pytest.LogCaptureFixture
) -> None:
    # TestClient's requests come from "testclient"; re-register rank 1 as if from elsewhere.
    service = ready_job.client.app.state.perseus.service  # type: ignore[attr-defined]
    service.jobs.register_rank(
        ready_job.job_id,
        RankRegistration.model_validate(rank_body(rank=1, stage=1)),
        "10.0.0.7",
    )
    ready_job.client.app.state.perseus.heads.forget(ready_job.job_id)  # type: ignore[attr-defined]
    with caplog.at_level("WARNING", logger="perseus.server"):
        for iteration in range(3):
            r = ready_job.client.post(
                ready_job.url("/iterations"),
                json={"rank": 1, "iteration": iteration, "time_s": 1.0, "energy_j": 1.0},
                headers=ready_job.auth,
            )
            assert r.status_code == 200
    warnings = [rec for rec in caplog.records if "10.0.0.7" in rec.getMessage()]
    # One for the registration from another host (issue 24, item 14), one for the reports.
    assert [("registered again" in w.getMessage()) for w in warnings] == [True, False]
    assert "reports from testclient" in warnings[1].getMessage()
