"""Policies and stragglers (perseus.server.lifecycle.choices): which point the plans follow."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from .conftest import Job, ProfileRows, clocks_of, create_job, report_iterations, snapshot


@pytest.mark.parametrize(
    ("policy", "moves"),
    [
        ({"kind": "no-slowdown"}, False),
        ({"kind": "max-slowdown", "factor": 1.2}, True),
        ({"kind": "deadline", "seconds": 1000.0}, True),
        ({"kind": "min-energy"}, True),
        ({"kind": "zeus-cost", "eta": 0.5}, None),
    ],
)
def test_every_policy_kind(ready_job: Job, policy: dict[str, Any], moves: bool | None) -> None:
    r = ready_job.client.put(ready_job.url("/policy"), json=policy, headers=ready_job.auth)
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 2
    if moves is not None:
        assert (r.json()["chosen"]["index"] > 0) is moves


def test_infeasible_deadline_is_rejected_and_changes_nothing(ready_job: Job) -> None:
    before = snapshot(ready_job)
    r = ready_job.client.put(
        ready_job.url("/policy"), json={"kind": "deadline", "seconds": 1e-6}, headers=ready_job.auth
    )
    assert r.status_code == 422
    assert r.json()["error"] == "InfeasibleDeadline"
    assert snapshot(ready_job) == before


def test_straggler_moves_plans_and_clearing_moves_them_back(ready_job: Job) -> None:
    c, auth = ready_job.client, ready_job.auth
    r = c.put(ready_job.url("/straggler"), json={"slowdown": 1.05}, headers=auth)
    assert r.status_code == 200, r.text
    slow = r.json()
    assert slow["version"] == 2
    assert slow["chosen"]["index"] > 0
    assert slow["chosen"]["expected_iteration_time_s"] >= slow["chosen"]["time_s"]
    view = ready_job.view()
    assert view["straggler"]["slowdown"] == 1.05
    assert view["straggler"]["automatic"] is False
    r = c.put(ready_job.url("/straggler"), json={"iteration_time_s": 1e-3}, headers=auth)
    assert r.json()["chosen"]["index"] == 0  # a "straggler" faster than us changes nothing
    r = c.delete(ready_job.url("/straggler"), headers=auth)
    assert r.status_code == 200
    assert r.json()["version"] == 4
    assert r.json()["chosen"]["index"] == 0
    assert ready_job.view()["straggler"] is None


@pytest.mark.parametrize(
    "body",
    [{}, {"slowdown": 1.1, "iteration_time_s": 2.0}, {"slowdown": 0.5}, {"iteration_time_s": -1}],
)
def test_bad_straggler_is_422(client: TestClient, body: dict[str, Any]) -> None:
    job = create_job(client)  # refused as read: no plan needed
    r = client.put(job.url("/straggler"), json=body, headers=job.auth)
    assert r.status_code == 422
    assert job.view()["straggler"] is None


def test_policy_set_before_planning_applies_when_ready(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, policy={"kind": "max-slowdown", "factor": 1.05})
    r = client.put(job.url("/policy"), json={"kind": "min-energy"}, headers=job.auth)
    assert r.status_code == 200
    assert r.json() == {"version": 0, "state": "registering", "chosen": None}
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    assert job.wait_plan().status_code == 200
    frontier = client.get(job.url("/frontier"), headers=job.auth).json()
    assert frontier["chosen_index"] == len(frontier["points"]) - 1


def test_auto_straggler_switches_the_others_and_recovers(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, data_parallel=3, auto_straggler=True, straggler_window=2)
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    assert job.wait_plan().status_code == 200
    predicted = job.view()["chosen"]["time_s"]
    report_iterations(job, range(2), lambda dp: predicted * (1.2 if dp == 2 else 1.0), 1)
    deadline = time.monotonic() + 30  # reports are written every 0.25 s, checked at most 1/s
    view = job.view()
    it = 2
    while view["version"] == 1 and time.monotonic() < deadline:
        time.sleep(0.3)  # detection runs at most once a second per job
        report_iterations(
            job, range(it, it + 1), lambda dp: predicted * (1.2 if dp == 2 else 1.0), 1
        )
        it += 1
        view = job.view()
    assert view["version"] == 2
    assert view["straggler"]["automatic"] is True
    assert view["straggler"]["data_parallel_ranks"] == [2]
    assert view["straggler"]["slowdown"] == pytest.approx(1.2, rel=1e-6)
    fast = job.wait_plan(rank=job.rank_of(0, 0), wait_s=0).json()
    slow = job.wait_plan(rank=job.rank_of(0, 2), wait_s=0).json()
    assert fast["version"] == slow["version"] == 2
    assert fast["time_s"] > slow["time_s"]  # the others slow down; the straggler does not
    # The straggler recovers: every replica on time for its own plan.
    slow_plan_s = fast["time_s"]
    deadline = time.monotonic() + 30
    while view["version"] == 2 and time.monotonic() < deadline:
        time.sleep(0.3)
        report_iterations(
            job, range(it, it + 1), lambda dp: predicted if dp == 2 else slow_plan_s, 2
        )
        it += 1
        view = job.view()
    assert view["version"] == 3
    assert view["straggler"] is None


def test_one_slow_iteration_does_not_make_a_straggler(
    client: TestClient, example_rows: ProfileRows
) -> None:
    # Issue 24, item 9: one 3x iteration of one replica moved every other replica to a
    # 16.5 % slower plan (the window mean let one outlier decide).
    job = create_job(client, data_parallel=3, auto_straggler=True, straggler_window=5)
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    assert job.wait_plan().status_code == 200
    predicted = job.view()["chosen"]["time_s"]
    for it in range(7):  # iteration 2 stays in every window of 5 up to iteration 6
        slow = 3.0 if it == 2 else 1.0
        report_iterations(
            job, range(it, it + 1), lambda dp, s=slow: predicted * (s if dp == 1 else 1.0), 1
        )
        if it >= 4:
            time.sleep(0.4)  # detection runs at most once a second per job
    time.sleep(1.2)
    report_iterations(job, range(7, 8), lambda dp: predicted, 1)
    view = job.view()
    assert view["version"] == 1 and view["straggler"] is None
