"""The planner API through TestClient: the job life cycle, plans, policies, bad input, auth."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from perseus.schemas import PlanResponse, RankRegistration
from perseus.server.settings import Settings

from .conftest import JOB_SPEC, Job, ProfileRows, clocks_of, create_job


def _snapshot(job: Job) -> dict[str, Any]:
    view = job.view()
    view.pop("telemetry")
    return view


# ----------------------------------------------------------------------------- life cycle


def test_job_goes_registering_profiling_planning_ready(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, name="demo")
    view = job.view()
    assert view["state"] == "registering"
    assert view["version"] == 0
    assert view["counts"]["ranks_expected"] == 8
    job.register_all(clocks_of(example_rows))
    assert job.view()["state"] == "profiling"
    job.report_all(example_rows, replicas=range(1))
    assert job.view()["counts"]["stages_profiled"] == 4
    assert job.view()["state"] == "profiling"  # waits for every rank's profile
    last = job.report_all(example_rows, replicas=range(1, 2))
    assert last["planning"] is True
    r = job.wait_plan(rank=5)
    assert r.status_code == 200
    plan = r.json()
    assert r.headers["etag"] == '"1"'
    assert plan["version"] == 1
    assert plan["stage"] == 1
    assert [i["instruction"] for i in plan["instructions"]][:3] == ["forward"] * 3
    assert all("chunk" not in i for i in plan["instructions"])
    assert len(plan["instructions"]) == 2 * 4
    view = job.view()
    assert view["state"] == "ready"
    assert view["frontier_points"] > 1
    assert view["planning_s"] > 0
    assert view["chosen"]["index"] == 0


def test_plan_instructions_follow_the_chosen_point(ready_job: Job) -> None:
    frontier = ready_job.client.get(ready_job.url("/frontier"), headers=ready_job.auth).json()
    assert frontier["version"] == 1
    times = [p["time_s"] for p in frontier["points"]]
    energies = [p["energy_j"] for p in frontier["points"]]
    assert times == sorted(times)
    assert energies == sorted(energies, reverse=True)
    assert set(frontier["baselines"]) >= {"all_fastest"}
    plan = ready_job.wait_plan(rank=ready_job.rank_of(3, 1)).json()
    assert plan["time_s"] == pytest.approx(times[frontier["chosen_index"]])
    assert plan["energy_j"] == pytest.approx(energies[frontier["chosen_index"]])
    # The last stage alternates F, B right away in 1F1B.
    kinds = [i["instruction"][0] for i in plan["instructions"]]
    assert "".join(kinds) == "FBFBFBFB".lower()
    assert [i["microbatch"] for i in plan["instructions"]] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_plan_etag_gives_304_and_policy_makes_a_new_version(ready_job: Job) -> None:
    r = ready_job.wait_plan(etag='"1"', wait_s=0)
    assert r.status_code == 304
    assert r.headers["etag"] == '"1"'
    put = ready_job.client.put(
        ready_job.url("/policy"), json={"kind": "min-energy"}, headers=ready_job.auth
    )
    assert put.status_code == 200, put.text
    assert put.json()["version"] == 2
    r = ready_job.wait_plan(etag='"1"', wait_s=0)
    assert r.status_code == 200
    assert r.headers["etag"] == '"2"'
    frontier = ready_job.client.get(ready_job.url("/frontier"), headers=ready_job.auth).json()
    assert frontier["chosen_index"] == len(frontier["points"]) - 1
    assert ready_job.view()["policy"] == {"kind": "min-energy"}


def test_long_poll_wakes_on_a_new_version(ready_job: Job) -> None:
    result: dict[str, Any] = {}

    def poll() -> None:
        r = ready_job.wait_plan(etag='"1"', wait_s=30)
        result["status"] = r.status_code
        result["etag"] = r.headers.get("etag")

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.5)
    ready_job.client.put(
        ready_job.url("/policy"),
        json={"kind": "max-slowdown", "factor": 1.1},
        headers=ready_job.auth,
    )
    thread.join(60)
    assert result["status"] == 200
    assert result["etag"] == '"2"'


def test_long_poll_times_out_with_304(ready_job: Job) -> None:
    r = ready_job.wait_plan(etag='"1"', wait_s=0.3)
    assert r.status_code == 304
    assert r.headers["etag"] == '"1"'


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
    before = _snapshot(ready_job)
    r = ready_job.client.put(
        ready_job.url("/policy"), json={"kind": "deadline", "seconds": 1e-6}, headers=ready_job.auth
    )
    assert r.status_code == 422
    assert r.json()["error"] == "InfeasibleDeadline"
    assert _snapshot(ready_job) == before


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
def test_bad_straggler_is_422(ready_job: Job, body: dict[str, Any]) -> None:
    r = ready_job.client.put(ready_job.url("/straggler"), json=body, headers=ready_job.auth)
    assert r.status_code == 422


def test_frontier_and_plan_say_not_ready_while_registering(client: TestClient) -> None:
    job = create_job(client)
    r = client.get(job.url("/frontier"), headers=job.auth)
    assert r.status_code == 409
    assert r.json()["state"] == "registering"
    assert "not ready" in r.json()["detail"]
    assert r.headers["retry-after"] == "1"
    job_rank = client.post(
        job.url("/ranks"),
        json={
            "rank": 0,
            "stage": 0,
            "data_parallel_rank": 0,
            "tensor_parallel_rank": 0,
            "gpu_name": "x",
            "supported_clocks_mhz": [1000],
        },
        headers=job.auth,
    )
    assert job_rank.status_code == 200
    r = client.get(job.url("/plan"), params={"rank": 0}, headers=job.auth)
    assert r.status_code == 409
    r = client.get(job.url("/plan"), params={"rank": 1}, headers=job.auth)
    assert r.status_code == 409
    assert "not registered" in r.json()["detail"]


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


def test_plan_compute_with_one_replica_and_recompute(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client)
    job.register_all(clocks_of(example_rows))
    r = client.post(job.url("/plan:compute"), headers=job.auth)
    assert r.status_code == 409
    assert "lack a profile" in r.json()["detail"]
    job.report_all(example_rows, replicas=range(1))
    r = client.post(job.url("/plan:compute"), headers=job.auth)
    assert r.status_code == 202, r.text
    assert r.json()["state"] == "planning"
    assert client.post(job.url("/plan:compute"), headers=job.auth).status_code == 409
    assert job.wait_plan().headers["etag"] == '"1"'
    # Recomputing keeps serving the old plan, then moves to a new version.
    r = client.post(job.url("/plan:compute"), headers=job.auth)
    assert r.status_code == 202
    assert job.wait_plan(wait_s=0).headers["etag"] == '"1"'
    assert job.wait_plan(etag='"1"').headers["etag"] == '"2"'
    assert job.view()["state"] == "ready"


def test_planning_failure_sets_failed_with_the_reason(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, p_block_w=None)  # and no profile reports one
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    r = job.wait_plan(wait_s=60)
    assert r.status_code == 409
    assert r.json()["state"] == "failed"
    view = job.view()
    assert view["state"] == "failed"
    assert "blocking power" in view["reason"]


def test_a_failed_job_replans_on_a_corrected_profile(
    client: TestClient, example_rows: ProfileRows
) -> None:
    # Issue 24, item 7: it stayed failed, with the stale reason, and its ranks polled forever.
    job = create_job(client, p_block_w=None, data_parallel=1)
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    assert job.wait_plan(wait_s=60).json()["state"] == "failed"
    r = client.post(
        job.url("/profiles"),
        json={"rank": 0, "stage": 0, "rows": example_rows[0], "p_block_w": 90.0},
        headers=job.auth,
    )
    assert r.status_code == 200, r.text
    assert r.json()["planning"] is True and r.json()["state"] == "planning"
    assert job.wait_plan().status_code == 200
    view = job.view()
    assert view["state"] == "ready" and view["reason"] is None


def _stage_rows(rows: list[dict[str, Any]], keep: Callable[[int], bool]) -> list[dict[str, Any]]:
    return [r for r in rows if keep(r["frequency_mhz"])]


def _report(job: Job, rank: int, stage: int, rows: list[dict[str, Any]]) -> Any:
    return job.client.post(
        job.url("/profiles"), json={"rank": rank, "stage": stage, "rows": rows}, headers=job.auth
    )


def test_a_replica_with_clocks_disjoint_from_its_stage_is_refused_at_upload(
    client: TestClient, example_rows: ProfileRows
) -> None:
    # Issue 24, item 7: both got 200; the conflict surfaced only at planning.
    job = create_job(client)
    clocks = clocks_of(example_rows)
    job.register_all(clocks)
    middle = clocks[len(clocks) // 2]
    assert (
        _report(job, 0, 0, _stage_rows(example_rows[0], lambda f: f >= middle)).status_code == 200
    )
    r = _report(job, job.rank_of(0, 1), 0, _stage_rows(example_rows[0], lambda f: f < middle))
    assert r.status_code == 422, r.text
    msg = r.json()["detail"][0]["msg"]
    assert "share none of them" in msg and "stage 0's ranks 0" in msg
    assert job.view()["counts"]["profiles_reported"] == 1  # nothing stored


def test_a_single_clock_replica_does_not_pin_its_stage(
    client: TestClient, example_rows: ProfileRows
) -> None:
    # Issue 24, item 8: a replica without clock rights (it measures its default clock only)
    # pinned its whole stage to that clock: a one-point frontier, state ready, no warning.
    job = create_job(client)
    clocks = clocks_of(example_rows)
    job.register_all(clocks)
    top = max(clocks)
    single = _stage_rows(example_rows[0], lambda f: f == top)
    replica = job.rank_of(0, 1)
    assert _report(job, 0, 0, example_rows[0]).status_code == 200
    r = _report(job, replica, 0, single)
    assert r.status_code == 422, r.text
    assert "(this profile) measured" in r.json()["detail"][0]["msg"]
    assert "pinned" in r.json()["detail"][0]["msg"]
    # The other order: the single-clock profile came first; the full one names it.
    other = create_job(client)
    other.register_all(clocks)
    assert _report(other, replica, 0, single).status_code == 200
    r = _report(other, 0, 0, example_rows[0])
    assert r.status_code == 422, r.text
    assert f"stage 0's rank {replica} measured" in r.json()["detail"][0]["msg"]
    # Profiled again with clock control, its new profile replaces the old: both accepted.
    assert _report(other, replica, 0, example_rows[0]).status_code == 200
    assert _report(other, 0, 0, example_rows[0]).status_code == 200
    other.report_all(example_rows)
    assert other.wait_plan().status_code == 200
    assert other.view()["frontier_points"] > 1


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


def test_interleaved_plans_carry_chunks(client: TestClient, example_rows: ProfileRows) -> None:
    job = create_job(
        client, schedule="interleaved-1f1b", virtual_stages=2, data_parallel=1, microbatches=4
    )
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    plan = job.wait_plan().json()
    assert len(plan["instructions"]) == 2 * 4 * 2
    assert {i["chunk"] for i in plan["instructions"]} == {0, 1}
    PlanResponse.model_validate_json(job.wait_plan().content, strict=True)


def test_plan_bytes_are_a_strict_plan_response(ready_job: Job) -> None:
    for rank in range(ready_job.stages * ready_job.data_parallel):
        r = ready_job.wait_plan(rank=rank)
        plan = PlanResponse.model_validate_json(r.content, strict=True)
        assert r.headers["etag"] == f'"{plan.version}"'
        assert all(i.chunk is None for i in plan.instructions)
        assert b'"chunk"' not in r.content  # absent, not null, without chunks


def test_tensor_parallel_ranks_share_their_stage_plan(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, data_parallel=1, tensor_parallel=2)
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    a = job.wait_plan(rank=job.rank_of(2, 0, 0)).json()
    b = job.wait_plan(rank=job.rank_of(2, 0, 1)).json()
    assert a == b
    assert a["stage"] == 2


def test_job_list_and_delete(client: TestClient) -> None:
    a = create_job(client, name="a")
    b = create_job(client, name="b")
    listed = client.get("/v1/jobs").json()["jobs"]
    assert [j["job_id"] for j in listed] == [a.job_id, b.job_id]
    assert a.job_id != b.job_id
    assert client.delete(a.url(), headers=a.auth).status_code == 204
    assert client.get(a.url(), headers=a.auth).status_code == 404
    assert client.delete(a.url(), headers=a.auth).status_code == 404
    assert [j["job_id"] for j in client.get("/v1/jobs").json()["jobs"]] == [b.job_id]


# ----------------------------------------------------------------------------- telemetry


def _report_iterations(
    job: Job, iterations: range, time_of: Callable[[int], float], version: int | None = None
) -> None:
    for it in iterations:
        for dp in range(job.data_parallel):
            for stage in range(job.stages):
                r = job.client.post(
                    job.url("/iterations"),
                    json={
                        "rank": job.rank_of(stage, dp),
                        "iteration": it,
                        "time_s": time_of(dp),
                        "energy_j": 100.0,
                        "plan_version": version,
                    },
                    headers=job.auth,
                )
                assert r.status_code == 200, r.text


def test_iterations_show_predicted_against_measured(ready_job: Job) -> None:
    predicted = ready_job.view()["chosen"]["time_s"]
    _report_iterations(ready_job, range(3), lambda dp: predicted * (1.0 + 0.1 * dp))
    telemetry = ready_job.view()["telemetry"]
    assert telemetry["predicted_time_s"] == pytest.approx(predicted)
    assert telemetry["measured_time_s"] == pytest.approx(predicted * 1.05)
    assert telemetry["measured_energy_j"] == pytest.approx(400.0)
    assert [r["data_parallel_rank"] for r in telemetry["replicas"]] == [0, 1]
    assert ready_job.view()["counts"]["iterations_reported"] == 24
    assert ready_job.view()["version"] == 1  # auto_straggler is off


def test_auto_straggler_switches_the_others_and_recovers(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, data_parallel=3, auto_straggler=True, straggler_window=2)
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    assert job.wait_plan().status_code == 200
    predicted = job.view()["chosen"]["time_s"]
    _report_iterations(job, range(2), lambda dp: predicted * (1.2 if dp == 2 else 1.0), 1)
    deadline = time.monotonic() + 10
    view = job.view()
    it = 2
    while view["version"] == 1 and time.monotonic() < deadline:
        time.sleep(0.3)  # detection runs at most once a second per job
        _report_iterations(
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
    deadline = time.monotonic() + 10
    while view["version"] == 2 and time.monotonic() < deadline:
        time.sleep(0.3)
        _report_iterations(
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
        _report_iterations(
            job, range(it, it + 1), lambda dp, s=slow: predicted * (s if dp == 1 else 1.0), 1
        )
        if it >= 4:
            time.sleep(0.4)  # detection runs at most once a second per job
    time.sleep(1.2)
    _report_iterations(job, range(7, 8), lambda dp: predicted, 1)
    view = job.view()
    assert view["version"] == 1 and view["straggler"] is None


# ----------------------------------------------------------------------------- bad input


def test_unknown_job_is_404_not_a_traceback(client: TestClient) -> None:
    for path in ("/v1/jobs/0123456789abcdef0123456789abcdef", "/v1/jobs/nope", "/v1/jobs/%00"):
        r = client.get(path, headers={"Authorization": "Bearer x"})
        assert r.status_code == 404
        assert r.json()["error"] == "JobNotFound"
        assert "Traceback" not in r.text


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"stages": 0}, "stages"),
        ({"stages": 2000}, "stages"),
        ({"schedule": "zigzag"}, "schedule"),
        ({"microbatches": -1}, "microbatches"),
        ({"p_block_w": -5}, "p_block_w"),
        ({"policy": {"kind": "deadline"}}, "policy"),
        ({"policy": {"kind": "max-slowdown", "factor": 0.5}}, "policy"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"name": "a" * 201}, "name"),
        ({"name": "a\x00b"}, "name"),
    ],
)
def test_bad_job_specs_name_the_field(
    client: TestClient, change: dict[str, Any], field: str
) -> None:
    r = client.post("/v1/jobs", json={**JOB_SPEC, **change})
    assert r.status_code == 422, r.text
    assert any(field in err["loc"] for err in r.json()["detail"])
    assert client.get("/v1/jobs").json()["jobs"] == []


def test_too_many_instructions_or_ranks_is_422(client: TestClient) -> None:
    body = {
        "schedule": "1f1b",
        "stages": 1024,
        "microbatches": 100_000,
        "data_parallel": 1,
        "tensor_parallel": 1,
    }
    assert client.post("/v1/jobs", json=body).status_code == 422
    body = {
        "schedule": "1f1b",
        "stages": 8,
        "microbatches": 8,
        "data_parallel": 100_000,
        "tensor_parallel": 8,
    }
    assert client.post("/v1/jobs", json=body).status_code == 422
    body = {
        "schedule": "1f1b",
        "stages": 8,
        "microbatches": 8,
        "virtual_stages": 2,
        "data_parallel": 1,
        "tensor_parallel": 1,
    }
    assert client.post("/v1/jobs", json=body).status_code == 422


def _rank(rank: int = 0, **change: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "rank": rank,
        "stage": 0,
        "data_parallel_rank": 0,
        "tensor_parallel_rank": 0,
        "gpu_name": "NVIDIA H200",
        "supported_clocks_mhz": [1980, 1000],
    }
    body.update(change)
    return body


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (_rank(stage=4), ["body", "stage"]),
        (_rank(rank=8), ["body", "rank"]),
        (_rank(data_parallel_rank=2), ["body", "data_parallel_rank"]),
        (_rank(tensor_parallel_rank=1), ["body", "tensor_parallel_rank"]),
        (_rank(supported_clocks_mhz=[0]), ["body", "supported_clocks_mhz", 0]),
        (_rank(supported_clocks_mhz=[]), ["body", "supported_clocks_mhz"]),
        (_rank(supported_clocks_mhz=list(range(1, 1100))), ["body", "supported_clocks_mhz"]),
        (_rank(gpu_name=""), ["body", "gpu_name"]),
    ],
)
def test_bad_rank_registrations_name_the_field(
    client: TestClient, body: dict[str, Any], loc: list[Any]
) -> None:
    job = create_job(client)
    before = _snapshot(job)
    r = client.post(job.url("/ranks"), json=body, headers=job.auth)
    assert r.status_code == 422, r.text
    assert loc in [err["loc"] for err in r.json()["detail"]]
    assert _snapshot(job) == before


def test_rank_conflicts_are_409_and_reregistering_is_fine(client: TestClient) -> None:
    job = create_job(client)
    assert client.post(job.url("/ranks"), json=_rank(0), headers=job.auth).status_code == 200
    again = client.post(job.url("/ranks"), json=_rank(0, gpu_name="other"), headers=job.auth)
    assert again.status_code == 200
    assert again.json()["ranks_registered"] == 1
    taken = client.post(job.url("/ranks"), json=_rank(1), headers=job.auth)
    assert taken.status_code == 409
    moved = client.post(job.url("/ranks"), json=_rank(0, stage=1), headers=job.auth)
    assert moved.status_code == 409
    assert job.view()["counts"]["ranks_registered"] == 1


def _profile_rows(**change: Any) -> list[dict[str, Any]]:
    rows = [
        {"instruction": "forward", "frequency_mhz": 1980, "time_s": 0.01, "energy_j": 5.0},
        {"instruction": "backward", "frequency_mhz": 1980, "time_s": 0.02, "energy_j": 10.0},
        {"instruction": "forward", "frequency_mhz": 1000, "time_s": 0.015, "energy_j": 4.0},
        {"instruction": "backward", "frequency_mhz": 1000, "time_s": 0.03, "energy_j": 8.0},
    ]
    rows[1] = {**rows[1], **change}
    return rows


@pytest.mark.parametrize(
    ("body", "status", "loc"),
    [
        (
            {"rank": 0, "stage": 0, "rows": _profile_rows(instruction="sideways")},
            422,
            ["body", "rows", 1, "instruction"],
        ),
        (
            {"rank": 0, "stage": 0, "rows": _profile_rows(time_s=0)},
            422,
            ["body", "rows", 1, "time_s"],
        ),
        (
            {"rank": 0, "stage": 0, "rows": _profile_rows(energy_j=-1.0)},
            422,
            ["body", "rows", 1, "energy_j"],
        ),
        (
            {"rank": 0, "stage": 0, "rows": _profile_rows(frequency_mhz=1500)},
            422,
            ["body", "rows", 1, "frequency_mhz"],
        ),
        ({"rank": 0, "stage": 1, "rows": _profile_rows()}, 422, ["body", "stage"]),
        ({"rank": 0, "stage": 0, "rows": _profile_rows()[:1]}, 422, ["body", "rows"]),
        (
            {
                "rank": 0,
                "stage": 0,
                "rows": _profile_rows(frequency_mhz=1000, instruction="forward"),
            },
            422,
            None,
        ),
        ({"rank": 0, "stage": 0, "rows": _profile_rows()[::2]}, 422, None),
        ({"rank": 5, "stage": 1, "rows": _profile_rows()}, 409, None),
    ],
)
def test_bad_profiles_are_rejected_and_change_nothing(
    client: TestClient, body: dict[str, Any], status: int, loc: list[Any] | None
) -> None:
    job = create_job(client)
    assert client.post(job.url("/ranks"), json=_rank(0), headers=job.auth).status_code == 200
    before = _snapshot(job)
    r = client.post(job.url("/profiles"), json=body, headers=job.auth)
    assert r.status_code == status, r.text
    if loc is not None:
        assert loc in [err["loc"] for err in r.json()["detail"]]
    assert _snapshot(job) == before


def test_non_finite_numbers_are_422(client: TestClient) -> None:
    job = create_job(client)
    client.post(job.url("/ranks"), json=_rank(0), headers=job.auth)
    raw = (
        '{"rank": 0, "stage": 0, "rows": ['
        '{"instruction": "forward", "frequency_mhz": 1980, "time_s": NaN, "energy_j": 1},'
        '{"instruction": "backward", "frequency_mhz": 1980, "time_s": Infinity, "energy_j": 1}]}'
    )
    r = client.post(
        job.url("/profiles"), content=raw, headers={**job.auth, "Content-Type": "application/json"}
    )
    assert r.status_code == 422
    locs = [err["loc"] for err in r.json()["detail"]]
    assert ["body", "rows", 0, "time_s"] in locs
    assert ["body", "rows", 1, "time_s"] in locs


def test_too_many_rows_is_422(client: TestClient) -> None:
    job = create_job(client)
    client.post(job.url("/ranks"), json=_rank(0), headers=job.auth)
    rows = _profile_rows() * 2501
    r = client.post(
        job.url("/profiles"), json={"rank": 0, "stage": 0, "rows": rows}, headers=job.auth
    )
    assert r.status_code == 422


def test_body_over_the_cap_is_413(
    settings: Settings, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(settings.model_copy(update={"max_body_bytes": 4096}))
    job = create_job(client)
    big = {"rank": 0, "stage": 0, "rows": _profile_rows() * 40}
    r = client.post(job.url("/profiles"), json=big, headers=job.auth)
    assert r.status_code == 413
    chunked = client.post(
        job.url("/profiles"),
        content=iter([b'{"rank": 0, ', b" " * 5000, b"}"]),
        headers={**job.auth, "Content-Type": "application/json"},
    )
    assert chunked.status_code == 413
    assert client.get("/healthz").status_code == 200


def test_invalid_json_is_422(client: TestClient) -> None:
    r = client.post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422


def test_bad_plan_query_is_422(ready_job: Job) -> None:
    for params in (
        {"rank": -1},
        {"rank": 0, "wait_s": -1},
        {},
        {"rank": 0, "wait_s": "inf"},
        {"rank": 0, "wait": 30},
    ):
        r = ready_job.client.get(ready_job.url("/plan"), params=params, headers=ready_job.auth)
        assert r.status_code == 422, params


# ----------------------------------------------------------------------------- auth


def test_job_token_is_required_and_scoped(client: TestClient) -> None:
    a = create_job(client)
    b = create_job(client)
    assert client.get(a.url()).status_code == 401
    assert client.get(a.url()).headers["www-authenticate"] == "Bearer"
    assert client.get(a.url(), headers=b.auth).status_code == 403
    assert client.get(a.url(), headers={"Authorization": "Bearer nonsense"}).status_code == 403
    assert client.get(a.url(), headers={"Authorization": "Basic abc"}).status_code == 401
    assert client.get(a.url(), headers=a.auth).status_code == 200
    assert client.delete(a.url(), headers=b.auth).status_code == 403
    for method, suffix in (("post", "/ranks"), ("put", "/policy"), ("get", "/plan?rank=0")):
        r = client.request(method, a.url(suffix), headers=b.auth, json={})
        assert r.status_code == 403, (method, suffix)


def test_admin_token_guards_create_list_delete(
    settings: Settings, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(settings.model_copy(update={"admin_token": SecretStr("s3cret")}))
    admin = {"Authorization": "Bearer s3cret"}
    body = {
        "schedule": "1f1b",
        "stages": 2,
        "microbatches": 2,
        "data_parallel": 1,
        "tensor_parallel": 1,
    }
    assert client.post("/v1/jobs", json=body).status_code == 401
    assert (
        client.post("/v1/jobs", json=body, headers={"Authorization": "Bearer no"}).status_code
        == 403
    )
    job = create_job(client, headers=admin, stages=2, microbatches=2, data_parallel=1)
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/v1/jobs", headers=job.auth).status_code == 403
    assert len(client.get("/v1/jobs", headers=admin).json()["jobs"]) == 1
    assert client.get(job.url(), headers=admin).status_code == 200  # admin may read any job
    assert client.delete(job.url(), headers=job.auth).status_code == 403
    assert client.delete(job.url(), headers=admin).status_code == 204


def test_tokens_are_stored_hashed(client: TestClient, sqlite_url: str) -> None:
    job = create_job(client)
    path = sqlite_url.removeprefix("sqlite:///")
    with open(path, "rb") as f:
        assert job.token.encode() not in f.read()


# ----------------------------------------------------------------------------- server


def test_healthz_docs_openapi(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert "/v1/jobs/{job_id}/plan" in spec["paths"]
    assert "/v1/jobs/{job_id}/plan:compute" in spec["paths"]


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


# ----------------------------------------------------------------------------- strict numbers


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"stages": "2"}, "stages"),
        ({"stages": 2.0}, "stages"),
        ({"stages": True}, "stages"),
        ({"p_block_w": True}, "p_block_w"),
        ({"p_block_w": "100"}, "p_block_w"),
        ({"auto_straggler": 1}, "auto_straggler"),
        ({"straggler_window": 5.0}, "straggler_window"),
        ({"policy": {"kind": "zeus-cost", "eta": False}}, "policy"),
    ],
)
def test_job_numbers_are_strict(client: TestClient, change: dict[str, Any], field: str) -> None:
    r = client.post("/v1/jobs", json={**JOB_SPEC, **change})
    assert r.status_code == 422, r.text
    assert field in [err["loc"][1] for err in r.json()["detail"]]


def test_rank_profile_and_iteration_numbers_are_strict(ready_job: Job) -> None:
    client, auth = ready_job.client, ready_job.auth
    registration = _rank(stage=0)
    for change in ({"tensor_parallel_rank": False}, {"rank": 0.0}, {"stage": "0"}):
        r = client.post(ready_job.url("/ranks"), json={**registration, **change}, headers=auth)
        assert r.status_code == 422, change
    iteration = {"rank": 0, "iteration": 1, "time_s": 1.0, "energy_j": 1.0}
    for change in (
        {"time_s": True},
        {"time_s": "1.0"},
        {"plan_version": False},
        {"iteration": 1.0},
        {"energy_j": None},
    ):
        r = client.post(ready_job.url("/iterations"), json={**iteration, **change}, headers=auth)
        assert r.status_code == 422, change
    assert client.post(ready_job.url("/iterations"), json=iteration, headers=auth).is_success
    row = {"instruction": "forward", "frequency_mhz": 1000, "time_s": True, "energy_j": 1.0}
    r = client.post(
        ready_job.url("/profiles"), json={"rank": 0, "stage": 0, "rows": [row, row]}, headers=auth
    )
    assert r.status_code == 422
    for body in ({"slowdown": True}, {"iteration_time_s": "2"}):
        assert client.put(ready_job.url("/straggler"), json=body, headers=auth).status_code == 422


# ----------------------------------------------------------------------------- hosts


def test_reports_from_another_host_are_logged_once(
    ready_job: Job, caplog: pytest.LogCaptureFixture
) -> None:
    # TestClient's requests come from "testclient"; re-register rank 1 as if from elsewhere.
    service = ready_job.client.app.state.perseus.service  # type: ignore[attr-defined]
    service.jobs.register_rank(
        ready_job.job_id,
        RankRegistration.model_validate(_rank(rank=1, stage=1)),
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


# ----------------------------------------------------------------------------- planning work


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


# ----------------------------------------------------------------------------- quotas


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


def test_cached_jobs_are_evicted(
    settings: Settings, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(settings.model_copy(update={"cached_jobs": 16}))
    jobs = [create_job(client) for _ in range(40)]
    heads = client.app.state.perseus.heads  # type: ignore[attr-defined]
    assert heads.cached <= 16
    assert jobs[0].view()["state"] == "registering"  # read again from the database


def test_long_plan_queries_are_not_remembered() -> None:
    from perseus.server.routes import PlanFastPath

    fast = PlanFastPath(None)  # type: ignore[arg-type]
    for i in range(100):
        fast._query(b"rank=0&wait_s=1&pad=" + b"%d" % i + b"x" * 15_000)
    assert fast._query(b"rank=3&wait_s=30") is not None
    assert len(fast._queries) == 1  # only the rank's own, short query


def test_a_rank_registered_again_from_elsewhere_is_logged(
    client: TestClient, example_rows: ProfileRows, caplog: pytest.LogCaptureFixture
) -> None:
    job = create_job(client, data_parallel=1)
    job.register_all(clocks_of(example_rows))
    reg = {"rank": 0, "stage": 0, "data_parallel_rank": 0, "tensor_parallel_rank": 0,
           "gpu_name": "NVIDIA H200", "supported_clocks_mhz": [1980]}  # fmt: skip
    with caplog.at_level("WARNING", logger="perseus.server"):
        assert client.post(job.url("/ranks"), json=reg, headers=job.auth).status_code == 200
    assert "rank 0 registered again" in caplog.text and "another clock list" in caplog.text


def test_one_rank_from_two_live_processes_is_409_naming_it(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = create_job(client)
    first = client.post(job.url("/ranks"), json=_rank(0, instance="a1"), headers=job.auth)
    assert first.status_code == 200
    # the same process again (a retry) is fine
    again = client.post(job.url("/ranks"), json=_rank(0, instance="a1"), headers=job.auth)
    assert again.status_code == 200
    second = client.post(
        job.url("/ranks"),
        json=_rank(0, instance="b2", supported_clocks_mhz=[1980]),
        headers=job.auth,
    )
    assert second.status_code == 409
    assert "rank 0 is registered by another live process" in second.json()["detail"]
    # the first process's clock list stands
    assert job.view()["counts"]["ranks_registered"] == 1
    # once the first has been quiet long enough, a new process is a restart
    monkeypatch.setattr("perseus.server.jobs.RANK_LIVE_S", 0.0)
    restart = client.post(job.url("/ranks"), json=_rank(0, instance="b2"), headers=job.auth)
    assert restart.status_code == 200
    assert (
        client.post(
            job.url("/ranks"), json=_rank(0, instance="bad id!"), headers=job.auth
        ).status_code
        == 422
    )
