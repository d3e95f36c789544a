"""Plan versions across server processes: two apps on one database never send a rank a plan
older than the version it names, and a change made by one wakes ranks waiting on the other.

Runs on an SQLite file and, when ``PERSEUS_TEST_POSTGRES_URL`` is set, on PostgreSQL
(where the other process is woken by a notification rather than the poll).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from perseus.server.settings import Settings

from .conftest import Job, ProfileRows, clocks_of, create_job


@pytest.fixture
def two_processes(
    database_url: str,
    make_client: Callable[[Settings], TestClient],
    example_rows: ProfileRows,
) -> tuple[TestClient, Job, Job]:
    """Two apps on one database: ``(a, job, on_b)``, a planned job created through ``a`` and
    the same job seen through ``b``, which has cached plan version 1."""
    # A long cache TTL: only the version checks, never an expiring cache, can show the
    # second process the first one's changes.
    # On PostgreSQL, a poll too slow for the tests: only the notification can wake them.
    settings = Settings(
        database=database_url,
        warm_planner=False,
        planning_lease_s=3.0,
        cache_ttl_s=600.0,
        change_poll_s=0.1 if database_url.startswith("sqlite") else 60.0,
    )
    a, b = make_client(settings), make_client(settings)
    job = create_job(a)
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    assert job.wait_plan().status_code == 200
    on_b = Job(b, job.job_id, job.token, job.stages, job.data_parallel, job.tensor_parallel)
    assert on_b.wait_plan(wait_s=0).headers["etag"] == '"1"'
    return a, job, on_b


def test_no_process_serves_a_plan_older_than_the_rank_has(
    two_processes: tuple[TestClient, Job, Job],
) -> None:
    a, job, on_b = two_processes
    r = a.put(job.url("/policy"), json={"kind": "min-energy"}, headers=job.auth)
    assert r.json()["version"] == 2
    # A rank that got version 2 from a asks b: never version 1 back.
    r = on_b.wait_plan(etag='"2"', wait_s=0)
    assert r.status_code == 304
    assert r.headers["etag"] == '"2"'
    r = on_b.wait_plan(etag='"1"', wait_s=0)
    assert r.status_code == 200
    assert r.json()["version"] == 2


def test_a_change_on_one_process_wakes_ranks_waiting_on_another(
    two_processes: tuple[TestClient, Job, Job],
) -> None:
    a, job, on_b = two_processes
    result: dict[str, Any] = {}
    started = threading.Event()

    def poll() -> None:
        started.set()
        r = on_b.wait_plan(etag='"1"', wait_s=300)
        result["status"] = r.status_code
        result["etag"] = r.headers.get("etag")

    thread = threading.Thread(target=poll)
    thread.start()
    started.wait()
    a.put(job.url("/policy"), json={"kind": "min-energy"}, headers=job.auth)
    thread.join(120)
    assert not thread.is_alive()
    assert result == {"status": 200, "etag": '"2"'}


def test_a_rank_registered_through_one_process_reports_through_another(
    database_url: str, make_client: Callable[[Settings], TestClient], example_rows: ProfileRows
) -> None:
    """b read the job's ranks before the others registered (through a): it reads them
    again rather than answer 409 "not registered", and never after storing the profile
    (which once also left the job claimed for planning that b never started)."""
    settings = Settings(
        database=database_url, warm_planner=False, planning_lease_s=600.0, cache_ttl_s=600.0
    )
    a, b = make_client(settings), make_client(settings)
    job = create_job(a, data_parallel=1)
    on_b = Job(b, job.job_id, job.token, job.stages, 1, 1)
    clocks = clocks_of(example_rows)

    def register(stage: int) -> None:
        body = {
            "rank": stage,
            "stage": stage,
            "data_parallel_rank": 0,
            "tensor_parallel_rank": 0,
            "gpu_name": "NVIDIA H200",
            "supported_clocks_mhz": clocks,
        }
        assert a.post(job.url("/ranks"), json=body, headers=job.auth).status_code == 200

    register(0)
    assert on_b.wait_plan(0, wait_s=0).json()["error"] == "PlanNotReady"  # b knows rank 0
    for stage in range(1, job.stages):
        register(stage)
    assert on_b.wait_plan(1, wait_s=0).json()["error"] == "PlanNotReady"
    assert on_b.report_all(example_rows)["planning"] is True
    r = on_b.wait_plan(3)
    assert r.status_code == 200, r.text


def test_a_plan_whose_frontier_was_replaced_meanwhile_comes_from_the_new_one(
    two_processes: tuple[TestClient, Job, Job],
) -> None:
    """b's cached row still names the frontier a replaced, and b's frontier cache has let the
    old one go (it keeps 16): a plan b has not rendered yet comes from the new frontier at the
    new version, not a 409 (which would make the rank give up for good)."""
    a, job, on_b = two_processes
    assert a.post(job.url("/plan:compute"), headers=job.auth).status_code == 202
    assert job.wait_plan(etag='"1"').headers["etag"] == '"2"'
    b_state = on_b.client.app.state.perseus  # type: ignore[attr-defined]
    b_state.service.frontiers.forget(job.job_id)  # as if evicted by 16 other jobs
    r = on_b.wait_plan(rank=1, wait_s=0)
    assert r.status_code == 200, r.text
    assert r.headers["etag"] == '"2"' and r.json()["version"] == 2
