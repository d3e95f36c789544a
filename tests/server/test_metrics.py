"""Prometheus metrics and the middlewares (perseus.server.api.metrics)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from perseus.schemas import JOB_STATES
from perseus.server.api.metrics import JobGauges, Metrics, method_label
from perseus.server.settings import Settings

from .conftest import (
    Job,
    ProfileRows,
    clocks_of,
    create_job,
    job_spec,
    small_profile_rows,
)


def test_metrics_count_requests_jobs_and_planning(ready_job: Job) -> None:
    text = ready_job.client.get("/metrics").text
    assert samples(text)  # every line of it in the text format
    assert (
        'perseus_http_requests_total{method="POST",route="/v1/jobs/{job_id}/ranks",status="200"} 8'
        in text
    )
    assert 'perseus_jobs{state="ready"} 1' in text
    assert 'perseus_planning_seconds_count{outcome="ok"} 1' in text
    assert "perseus_http_request_duration_seconds_bucket" in text


def test_a_job_planned_after_1000_unplanned_ones_has_its_gauges(
    client: TestClient, example_rows: ProfileRows
) -> None:
    # The gauges once covered the 1,000 oldest jobs only, planned or not.
    jobs = client.app.state.perseus.service.jobs  # type: ignore[attr-defined]
    for _ in range(1000):
        jobs.create(job_spec())
    job = create_job(client)
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    assert job.wait_plan().status_code == 200
    found = samples(client.get("/metrics").text)
    assert found[f'perseus_job_plan_version{{job="{job.job_id}"}}'] == 1
    assert f'perseus_job_predicted_iteration_seconds{{job="{job.job_id}"}}' in found
    # Bounded by what is planned: the 1,000 unplanned jobs have no series.
    assert [k for k in found if k.startswith("perseus_job_plan_version")] == [
        f'perseus_job_plan_version{{job="{job.job_id}"}}'
    ]


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


# ----------------------------------------------------------------------------- the text format

SAMPLE = re.compile(r'^([a-z_:]+)(\{(?:[a-z_]+="(?:[^"\\\n]|\\["\\n])*",?)*\})? (\S+)$')


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample line; fails on a line that is not one."""
    assert text.endswith("\n")
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        match = SAMPLE.fullmatch(line)
        assert match is not None, line
        found[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return found


def test_an_empty_registry_renders_every_job_state() -> None:
    found = samples(Metrics().render({"ready": 2}))
    assert {k: v for k, v in found.items() if k.startswith("perseus_jobs")} == {
        f'perseus_jobs{{state="{state}"}}': (2.0 if state == "ready" else 0.0)
        for state in JOB_STATES
    }


def test_histograms_are_cumulative_and_end_at_the_count() -> None:
    metrics = Metrics()
    for seconds in (0.004, 0.004, 0.2, 100.0):
        metrics.observe_request("GET", "/healthz", 200, seconds)
    metrics.observe_request("GET", "/healthz", 503, 0.001)
    metrics.observe_planning(3.0, ok=True)
    metrics.observe_planning(7200.0, ok=False)
    found = samples(metrics.render({}))
    labels = 'method="GET",route="/healthz"'
    assert found[f'perseus_http_requests_total{{{labels},status="200"}}'] == 4
    assert found[f'perseus_http_requests_total{{{labels},status="503"}}'] == 1
    bucket = f"perseus_http_request_duration_seconds_bucket{{{labels}"
    assert found[f'{bucket},le="0.001"}}'] == 1
    assert found[f'{bucket},le="0.005"}}'] == 3
    assert found[f'{bucket},le="0.25"}}'] == 4
    assert found[f'{bucket},le="60.0"}}'] == 4
    assert found[f'{bucket},le="+Inf"}}'] == 5
    assert found[f"perseus_http_request_duration_seconds_count{{{labels}}}"] == 5
    assert found[f"perseus_http_request_duration_seconds_sum{{{labels}}}"] == pytest.approx(100.209)
    assert found['perseus_planning_seconds_bucket{outcome="ok",le="5.0"}'] == 1
    assert found['perseus_planning_seconds_bucket{outcome="failed",le="1800.0"}'] == 0
    assert found['perseus_planning_seconds_bucket{outcome="failed",le="+Inf"}'] == 1


def test_label_values_are_escaped() -> None:
    metrics = Metrics()
    metrics.observe_request("GET", 'a"b\\c\nd', 200, 0.1)
    text = metrics.render({}, {'job"1': (5.0, -1.5)})
    assert 'route="a\\"b\\\\c\\nd"' in text
    found = samples(text)
    assert found['perseus_job_energy_joules_total{job="job\\"1"}'] == 5.0
    assert found['perseus_job_energy_saved_joules_total{job="job\\"1"}'] == -1.5


def test_job_gauges_leave_out_what_is_not_known() -> None:
    gauges = JobGauges(
        predicted_time_s=1.25,
        predicted_energy_j=None,
        measured_time_s=None,
        measured_energy_j=300.0,
        plan_version=2,
        ranks=8,
        ranks_following=7,
    )
    found = samples(Metrics().render({}, {}, {"j1": gauges}))
    assert found['perseus_job_predicted_iteration_seconds{job="j1"}'] == 1.25
    assert found['perseus_job_measured_iteration_energy_joules{job="j1"}'] == 300.0
    assert found['perseus_job_plan_version{job="j1"}'] == 2
    assert found['perseus_job_ranks_following_plan{job="j1"}'] == 7
    assert not any("predicted_iteration_energy" in k or "measured_iteration_seconds" in k
                   for k in found)  # fmt: skip


@pytest.mark.parametrize(
    ("method", "label"),
    [("GET", "GET"), ("DELETE", "DELETE"), ("get", "other"), ("BREW", "other"), ("", "other")],
)
def test_methods_outside_the_apis_are_other(method: str, label: str) -> None:
    assert method_label(method) == label
