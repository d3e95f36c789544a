"""The cluster power budget through the API: admin only, validation that changes nothing,
the choice against an independent brute force, lifting it, an unmeetable budget, a window's
start and end, priorities, the job view's reason, /metrics."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from perseus.server.settings import Settings

from .conftest import Job, ProfileRows, clocks_of, create_job

BUDGET = "/v1/cluster/budget"
ADMIN = "admin-secret"


def _plan(job: Job, rows: ProfileRows) -> None:
    job.register_all(clocks_of(rows))
    job.report_all(rows)
    r = job.wait_plan()
    assert r.status_code == 200, r.text


@pytest.fixture
def jobs(client: TestClient, example_rows: ProfileRows) -> list[Job]:
    """Two planned jobs of different shapes and priorities."""
    wide = create_job(client, name="wide")
    narrow = create_job(client, name="narrow", data_parallel=1, microbatches=6, priority=2.0)
    for job in (wide, narrow):
        _plan(job, example_rows)
    return [wide, narrow]


def _candidates(job: Job) -> tuple[list[float], list[float], int, float]:
    """(times, whole-job powers, policy index, priority), from the API alone."""
    r = job.client.get(job.url("/frontier"), headers=job.auth)
    assert r.status_code == 200, r.text
    frontier = r.json()
    times = [p["time_s"] for p in frontier["points"]]
    powers = [job.data_parallel * p["energy_j"] / p["time_s"] for p in frontier["points"]]
    return times, powers, frontier["policy_index"], job.view().get("priority", 1.0)


def _brute_force(jobs: list[Job], budget_w: float) -> float:
    """The least priority-weighted slowdown whose power fits: every combination."""
    options = []
    for job in jobs:
        times, powers, policy, priority = _candidates(job)
        slowdowns = [priority * (t / times[policy] - 1) for t in times]
        options.append([(slowdowns[k], powers[k]) for k in range(policy, len(times))])
    best = min(
        (sum(s for s, _ in combo) for combo in itertools.product(*options)
         if sum(p for _, p in combo) <= budget_w),
        default=None,
    )  # fmt: skip
    assert best is not None, "the budget must be meetable"
    return best


def _powers(jobs: list[Job]) -> tuple[float, float]:
    """What the jobs draw at their policies and at their least power."""
    policy = least = 0.0
    for job in jobs:
        _, powers, index, _ = _candidates(job)
        policy += powers[index]
        least += min(powers[index:])
    return policy, least


def test_a_budget_moves_the_jobs_to_the_least_weighted_slowdown_and_lifting_restores_them(
    client: TestClient, jobs: list[Job]
) -> None:
    policy_w, least_w = _powers(jobs)
    versions = [job.view()["version"] for job in jobs]
    budget_w = least_w + 0.4 * (policy_w - least_w)
    r = client.put(BUDGET, json={"power_w": budget_w})
    assert r.status_code == 200, r.text
    status = r.json()
    assert status["budget_w"] == budget_w and status["standing_w"] == budget_w
    assert status["met"] is True and status["meetable"] is True and status["message"] is None
    assert status["predicted_w"] <= budget_w * (1 + 1e-9)
    assert status["policy_w"] == pytest.approx(policy_w)
    assert status["least_w"] == pytest.approx(least_w)
    optimum = _brute_force(jobs, budget_w)
    assert status["weighted_slowdown"] <= optimum * 1.01 + 1e-12
    assert status["weighted_slowdown"] >= optimum - 1e-9
    shares = {s["job_id"]: s for s in status["jobs"]}
    assert sum(s["share"] for s in shares.values()) == pytest.approx(1.0)
    moved = 0
    for job, version in zip(jobs, versions, strict=True):
        view = job.view()
        frontier = client.get(job.url("/frontier"), headers=job.auth).json()
        budget = view["budget"]
        if budget is None:  # left at its policy
            assert frontier["budget_index"] is None and view["version"] == version
            continue
        moved += 1
        assert view["version"] == version + 1
        assert budget["index"] > budget["policy_index"] == frontier["policy_index"]
        assert frontier["budget_index"] == budget["index"] == frontier["chosen_index"]
        assert budget["reason"] == (
            f"cluster budget: {100 * budget['slowdown']:.1f} % slower than your policy"
        )
        assert shares[job.job_id]["slowdown"] == pytest.approx(budget["slowdown"])
        # The ranks' plan is the budget's point.
        plan = job.wait_plan(wait_s=0).json()
        point = frontier["points"][budget["index"]]
        assert plan["version"] == view["version"] and plan["time_s"] == point["time_s"]
    assert moved >= 1

    r = client.delete(BUDGET)
    assert r.status_code == 200, r.text
    assert r.json()["budget_w"] is None and r.json()["met"] is None
    for job in jobs:
        view = job.view()
        frontier = client.get(job.url("/frontier"), headers=job.auth).json()
        assert view.get("budget") is None and frontier["budget_index"] is None
        assert frontier["chosen_index"] == frontier["policy_index"]
        assert job.wait_plan(wait_s=0).json()["version"] == view["version"]


def test_an_unmeetable_budget_is_reported_and_every_job_runs_at_its_least_power(
    client: TestClient, jobs: list[Job]
) -> None:
    _, least_w = _powers(jobs)
    r = client.put(BUDGET, json={"power_w": 0.5 * least_w})
    assert r.status_code == 200, r.text
    status = r.json()
    assert status["met"] is False and status["meetable"] is False
    assert status["shortfall_w"] == pytest.approx(0.5 * least_w)
    assert "below the least the jobs can draw" in status["message"]
    for job in jobs:
        _, powers, policy, _ = _candidates(job)
        least = min(range(policy, len(powers)), key=lambda k: (powers[k], -k))
        budget = job.view()["budget"]
        assert budget is not None and budget["index"] == least
    text = client.get("/metrics").text
    assert "perseus_cluster_budget_met 0.0" in text
    assert "perseus_cluster_budget_meetable 0.0" in text
    assert f"perseus_cluster_power_budget_watts {0.5 * least_w!r}" in text


def test_a_window_starts_and_ends_on_time(client: TestClient, jobs: list[Job]) -> None:
    policy_w, least_w = _powers(jobs)
    standing_w = 10 * policy_w  # above what the jobs draw: nothing moves
    assert client.put(BUDGET, json={"power_w": standing_w}).status_code == 200
    start_s = time.time() + 1.5
    window = {"power_w": least_w * 1.0001, "from_s": start_s, "to_s": start_s + 1.5}
    r = client.put(BUDGET, json=window)
    assert r.status_code == 200, r.text
    status = r.json()
    assert status["budget_w"] == standing_w and status["window"]["active"] is False
    assert all(job.view().get("budget") is None for job in jobs)

    def budgets() -> list[Any]:
        return [job.view().get("budget") for job in jobs]

    _wait_until(lambda: all(b is not None for b in budgets()), deadline_s=start_s + 1.2)
    assert time.time() >= start_s
    status = client.get(BUDGET).json()
    assert status["window"]["active"] is True and status["budget_w"] == window["power_w"]
    _wait_until(lambda: all(b is None for b in budgets()), deadline_s=window["to_s"] + 1.2)
    assert time.time() >= window["to_s"]
    status = client.get(BUDGET).json()
    assert status["window"]["ended"] is True and status["budget_w"] == standing_w


def _wait_until(done: Callable[[], bool], deadline_s: float) -> None:
    while not done():
        assert time.time() < deadline_s, "not in time"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({}, ["body", "power_w"]),
        ({"power_w": 0}, ["body", "power_w"]),
        ({"power_w": "2.4MW"}, ["body", "power_w"]),
        ({"power_w": 1e3, "extra": 1}, ["body", "extra"]),
        ({"power_w": 1e3, "from_s": 2e9, "to_s": 1e9}, ["body"]),
        ({"power_w": 1e3, "to_s": 1.0}, ["body", "to_s"]),
    ],
)
def test_a_rejected_budget_names_the_field_and_changes_nothing(
    client: TestClient, body: dict[str, Any], loc: list[str]
) -> None:
    assert client.put(BUDGET, json={"power_w": 5e3}).status_code == 200
    before = client.get(BUDGET).json()
    r = client.put(BUDGET, json=body)
    assert r.status_code == 422, r.text
    assert loc in [d["loc"] for d in r.json()["detail"]]
    after = client.get(BUDGET).json()
    assert (after["standing_w"], after["window"]) == (before["standing_w"], before["window"])


def test_the_budget_needs_the_admin_token(
    sqlite_url: str, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(Settings(database=sqlite_url, warm_planner=False, admin_token=ADMIN))
    admin = {"Authorization": f"Bearer {ADMIN}"}
    job = create_job(client, headers=admin)
    for method, body in (("GET", None), ("PUT", {"power_w": 1e3}), ("DELETE", None)):
        assert client.request(method, BUDGET, json=body).status_code == 401
        r = client.request(method, BUDGET, json=body, headers=job.auth)
        assert r.status_code == 403, r.text  # a job's token is not the admin's
    assert client.get(BUDGET, headers=admin).json()["budget_w"] is None  # nothing changed
    assert client.put(BUDGET, json={"power_w": 1e3}, headers=admin).status_code == 200
    assert client.get(BUDGET, headers=admin).json()["budget_w"] == 1e3


def test_priority_is_set_at_creation_and_changed_by_the_job_or_the_admin(
    sqlite_url: str, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(Settings(database=sqlite_url, warm_planner=False, admin_token=ADMIN))
    admin = {"Authorization": f"Bearer {ADMIN}"}
    job = create_job(client, headers=admin, priority=3.0)
    other = create_job(client, headers=admin)
    assert job.view().get("priority", 1.0) == 3.0 and other.view().get("priority", 1.0) == 1.0
    url = job.url("/priority")
    assert client.put(url, json={"priority": 2.0}).status_code == 401
    assert client.put(url, json={"priority": 2.0}, headers=other.auth).status_code == 403
    for bad in (0, -1, 1001, "high", None):
        r = client.put(url, json={"priority": bad}, headers=job.auth)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "priority"]
    assert job.view().get("priority", 1.0) == 3.0
    r = client.put(url, json={"priority": 0.5}, headers=job.auth)
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 0  # no plan yet: nothing moved
    assert job.view().get("priority", 1.0) == 0.5
    assert client.put(url, json={"priority": 4.0}, headers=admin).status_code == 200
    assert job.view().get("priority", 1.0) == 4.0
    r = client.post("/v1/jobs", json={"schedule": "1f1b", "stages": 2, "microbatches": 2,
                                      "data_parallel": 1, "tensor_parallel": 1, "priority": 0},
                    headers=admin)  # fmt: skip
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "priority"]


def test_jobs_without_plans_count_at_their_measured_or_default_power(
    client: TestClient, jobs: list[Job], example_rows: ProfileRows
) -> None:
    waiting = create_job(client, name="waiting", stages=2, data_parallel=1)
    idle = create_job(client, name="idle")  # no rank registered: draws nothing
    waiting.register_all(clocks_of(example_rows))
    status = client.get(BUDGET).json()
    shares = {s["job_id"]: s for s in status["jobs"]}
    assert idle.job_id not in shares
    assert shares[waiting.job_id]["counted"] == "default"
    assert shares[waiting.job_id]["predicted_w"] == 2 * status["default_gpu_w"]
    for it in range(3):
        for stage in range(2):
            r = client.post(waiting.url("/iterations"), headers=waiting.auth,
                            json={"rank": stage, "iteration": it, "time_s": 2.0,
                                  "energy_j": 500.0})  # fmt: skip
            assert r.status_code == 200, r.text
    status = client.get(BUDGET).json()
    share = next(s for s in status["jobs"] if s["job_id"] == waiting.job_id)
    assert share["counted"] == "measured" and share["predicted_w"] == pytest.approx(500.0)
    assert share["measured_w"] == pytest.approx(500.0)
    # The planned jobs make room for it: the budget holds with it counted.
    policy_w, least_w = _powers(jobs)
    budget_w = 500.0 + least_w + 0.5 * (policy_w - least_w)
    status = client.put(BUDGET, json={"power_w": budget_w}).json()
    assert status["met"] is True and status["predicted_w"] <= budget_w * (1 + 1e-9)
    assert _brute_force(jobs, budget_w - 500.0) == pytest.approx(
        status["weighted_slowdown"], rel=0.01, abs=1e-12
    )


def test_changes_of_a_job_rebalance_and_its_deletion_frees_its_power(
    client: TestClient, jobs: list[Job]
) -> None:
    wide, narrow = jobs
    policy_w, least_w = _powers(jobs)
    budget_w = least_w + 0.3 * (policy_w - least_w)
    assert client.put(BUDGET, json={"power_w": budget_w}).status_code == 200
    before = client.get(BUDGET).json()["weighted_slowdown"]
    # A far higher priority for one job moves the slowdown to the other.
    r = client.put(narrow.url("/priority"), json={"priority": 1000.0}, headers=narrow.auth)
    assert r.status_code == 200, r.text
    status = client.get(BUDGET).json()
    assert status["met"] is True
    assert status["weighted_slowdown"] == pytest.approx(_brute_force(jobs, budget_w), rel=0.01)
    assert status["weighted_slowdown"] != before
    # A slower policy is followed where it is slower than the budget's point.
    r = client.put(wide.url("/policy"), json={"kind": "min-energy"}, headers=wide.auth)
    assert r.status_code == 200, r.text
    view = wide.view()
    assert view.get("budget") is None and r.json()["version"] == view["version"]
    assert client.get(BUDGET).json()["met"] is True
    # Deleting a job frees its power: the other goes back to its policy.
    assert client.delete(wide.url(), headers=wide.auth).status_code == 204
    status = client.get(BUDGET).json()
    assert [s["job_id"] for s in status["jobs"]] == [narrow.job_id]
    if status["policy_w"] <= budget_w:
        assert narrow.view().get("budget") is None


def test_metrics_show_the_budget_and_each_job(client: TestClient, jobs: list[Job]) -> None:
    policy_w, least_w = _powers(jobs)
    budget_w = least_w + 0.5 * (policy_w - least_w)
    client.put(BUDGET, json={"power_w": budget_w})
    text = client.get("/metrics").text
    assert f"perseus_cluster_power_budget_watts {budget_w!r}" in text
    assert "perseus_cluster_budget_met 1.0" in text
    assert "# TYPE perseus_cluster_power_measured_watts gauge" in text
    for job in jobs:
        assert f'perseus_job_budget_slowdown_ratio{{job="{job.job_id}"}}' in text
        assert f'perseus_job_power_predicted_watts{{job="{job.job_id}"}}' in text
    client.delete(BUDGET)
    text = client.get("/metrics").text
    assert "\nperseus_cluster_power_budget_watts " not in text
    assert "\nperseus_cluster_budget_met " not in text
