"""Ranks' measured clock-change latencies: the registration answer says the server takes
them, each rank's largest is kept, the job is planned for the largest of its ranks' (the
server's setting while none reported), a latency materially above what the frontier was
planned for plans the job again, and a bad report is refused and changes nothing."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from perseus.schemas import CLOCK_LATENCY_HEADER, CLOCK_LATENCY_PATH, FRONTIER_PATH, TIMELINE_PATH
from perseus.server.lifecycle.decisions import delay_outgrown
from perseus.server.settings import Settings
from perseus.server.store.job_store import Store

from .conftest import Job, ProfileRows, clocks_of, create_job
from .test_clock_change_delay import _runs_too_short


def _job(client: TestClient, example_rows: ProfileRows) -> Job:
    job = create_job(client, stages=2, microbatches=4, data_parallel=1)
    job.register_all(clocks_of(example_rows))
    return job


def _report(job: Job, rank: int, latency: Any) -> Any:
    return job.client.post(
        CLOCK_LATENCY_PATH.format(job_id=job.job_id),
        json={"rank": rank, "clock_change_latency_s": latency},
        headers=job.auth,
    )


def _frontier(job: Job) -> dict[str, Any]:
    r = job.client.get(FRONTIER_PATH.format(job_id=job.job_id), headers=job.auth)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def _stored(sqlite_url: str, job_id: str) -> tuple[int, float] | None:
    """The job's largest stored latency and its rank, read from the database."""
    store = Store(sqlite_url)
    try:
        with store.read() as tx:
            return tx.clock_latency(job_id)
    finally:
        store.close()


def test_the_registration_answer_says_the_server_takes_latencies(client: TestClient) -> None:
    job = create_job(client, stages=1, data_parallel=1)
    r = client.post(
        job.url("/ranks"),
        json={"rank": 0, "stage": 0, "data_parallel_rank": 0, "tensor_parallel_rank": 0,
              "gpu_name": "NVIDIA H200", "supported_clocks_mhz": [1980, 1500]},
        headers=job.auth,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.headers[CLOCK_LATENCY_HEADER] == "1"
    assert set(r.json()) == {"rank", "state", "ranks_registered"}  # the body old ranks read


def test_a_latency_reported_before_planning_is_planned_for(
    client: TestClient, example_rows: ProfileRows, sqlite_url: str
) -> None:
    job = _job(client, example_rows)
    r = _report(job, 1, 0.08)
    assert r.status_code == 200, r.text
    assert r.json() == {"rank": 1, "clock_change_delay_s": 0.08, "planning": False}
    r = _report(job, 0, 0.05)  # smaller: the job's delay stays rank 1's
    assert r.json()["clock_change_delay_s"] == 0.08
    assert _stored(sqlite_url, job.job_id) == (1, 0.08)
    _report(job, 1, 0.06)  # each rank's largest is kept
    assert _stored(sqlite_url, job.job_id) == (1, 0.08)
    job.report_all({0: example_rows[0], 1: example_rows[1]})
    assert job.wait_plan().status_code == 200
    view = _frontier(job)
    assert (view["clock_change_delay_s"], view["clock_change_delay_rank"]) == (0.08, 1)
    timeline = client.get(TIMELINE_PATH.format(job_id=job.job_id), headers=job.auth).json()
    assert (timeline["clock_change_delay_s"], timeline["clock_change_delay_rank"]) == (0.08, 1)
    margin = timeline["clock_change_margin_s"]
    assert _runs_too_short(timeline["gpus"], timeline["time_s"], margin, 0.08) == 0


def test_without_reports_the_servers_setting_is_planned_for(
    settings: Settings,
    make_client: Callable[[Settings], TestClient],
    example_rows: ProfileRows,
) -> None:
    client = make_client(settings.model_copy(update={"clock_change_delay_s": 0.04}))
    job = _job(client, example_rows)
    job.report_all({0: example_rows[0], 1: example_rows[1]})
    assert job.wait_plan().status_code == 200
    view = _frontier(job)
    assert (view["clock_change_delay_s"], view["clock_change_delay_rank"]) == (0.04, None)


def test_a_materially_longer_latency_replans_the_job(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = _job(client, example_rows)  # planned for the server's 0.03 s
    job.report_all({0: example_rows[0], 1: example_rows[1]})
    first = job.wait_plan()
    assert first.status_code == 200
    assert _frontier(job)["clock_change_delay_s"] == 0.03
    # Not materially longer (under 20 % more), or shorter: the plan stands.
    for latency in (0.035, 0.01):
        r = _report(job, 1, latency)
        assert r.status_code == 200 and r.json()["planning"] is False, r.text
    assert job.view()["state"] == "ready"
    r = _report(job, 0, 0.09)
    assert r.status_code == 200, r.text
    assert r.json() == {"rank": 0, "clock_change_delay_s": 0.09, "planning": True}
    second = job.wait_plan(etag=first.headers["ETag"])
    assert second.status_code == 200, second.text
    assert second.json()["version"] > first.json()["version"]
    view = _frontier(job)
    assert (view["clock_change_delay_s"], view["clock_change_delay_rank"]) == (0.09, 0)
    timeline = client.get(TIMELINE_PATH.format(job_id=job.job_id), headers=job.auth).json()
    margin = timeline["clock_change_margin_s"]
    assert _runs_too_short(timeline["gpus"], timeline["time_s"], margin, 0.09) == 0
    # The same latency again: planned for already.
    r = _report(job, 0, 0.09)
    assert r.json()["planning"] is False


@pytest.mark.parametrize(
    ("rank", "latency", "status"),
    [
        (0, -0.001, 422),
        (0, 1.0, 422),
        (0, 5, 422),
        (0, "0.05", 422),
        (0, None, 422),
        (0, math.inf, 422),
        (7, 0.05, 409),  # not registered
        (-1, 0.05, 422),
    ],
)
def test_a_bad_report_is_refused_and_changes_nothing(
    client: TestClient,
    example_rows: ProfileRows,
    sqlite_url: str,
    rank: int,
    latency: Any,
    status: int,
) -> None:
    job = _job(client, example_rows)
    if isinstance(latency, float) and math.isinf(latency):
        r = client.post(
            CLOCK_LATENCY_PATH.format(job_id=job.job_id),
            content=b'{"rank": 0, "clock_change_latency_s": Infinity}',
            headers={**job.auth, "Content-Type": "application/json"},
        )
    else:
        r = _report(job, rank, latency)
    assert r.status_code == status, r.text
    assert _stored(sqlite_url, job.job_id) is None


def test_unknown_fields_are_refused(client: TestClient, example_rows: ProfileRows) -> None:
    job = _job(client, example_rows)
    r = client.post(
        CLOCK_LATENCY_PATH.format(job_id=job.job_id),
        json={"rank": 0, "clock_change_latency_s": 0.02, "p99_s": 0.03},
        headers=job.auth,
    )
    assert r.status_code == 422, r.text


@pytest.mark.parametrize(
    ("planned", "measured", "outgrown"),
    [
        (0.03, 0.03, False),
        (0.03, 0.036, False),  # 20 % more, not over it
        (0.03, 0.0361, True),
        (0.01, 0.0149, False),  # 49 % more but under 5 ms
        (0.01, 0.0151, True),
        (0.0, 0.004, False),
        (0.0, 0.006, True),
        (0.05, 0.001, False),  # shorter: never
    ],
)
def test_delay_outgrown(planned: float, measured: float, outgrown: bool) -> None:
    assert delay_outgrown(planned, measured) is outgrown
