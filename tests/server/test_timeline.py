"""``GET /v1/jobs/{id}/timeline``: the plan the ranks run, replayed per GPU (the web page's
timeline), equal to the ranks' own plans and to the stated time of the chosen point."""

from __future__ import annotations

import itertools
from typing import Any

from fastapi.testclient import TestClient

from perseus.schemas import TIMELINE_PATH

from .conftest import Job, ProfileRows, clocks_of, create_job


def _timeline(job: Job) -> dict[str, Any]:
    r = job.client.get(TIMELINE_PATH.format(job_id=job.job_id), headers=job.auth)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _check_against_the_plans(job: Job, timeline: dict[str, Any]) -> None:
    """Each GPU's row is that stage's plan (same instructions, same clocks), its boxes do
    not overlap, and the last one ends at the point's stated time."""
    assert len(timeline["gpus"]) == job.stages
    for stage, row in enumerate(timeline["gpus"]):
        plan = job.wait_plan(rank=job.rank_of(stage, 0)).json()
        assert plan["version"] == timeline["version"]
        assert [(i["instruction"], i["microbatch"], i["frequency_mhz"]) for i in row] == [
            (i["instruction"], i["microbatch"], i["frequency_mhz"]) for i in plan["instructions"]
        ]
        for before, after in itertools.pairwise(row):
            assert before["start_s"] < before["finish_s"] <= after["start_s"] + 1e-12
        assert all(i["finish_s"] <= timeline["time_s"] + 1e-9 for i in row)
    ends = [row[-1]["finish_s"] for row in timeline["gpus"]]
    assert max(ends) == timeline["time_s"] or abs(max(ends) - timeline["time_s"]) < 1e-9
    assert any(i["critical"] for row in timeline["gpus"] for i in row)
    assert timeline["min_frequency_mhz"] < timeline["max_frequency_mhz"]


def test_the_timeline_is_the_running_plan(ready_job: Job) -> None:
    job = ready_job
    timeline = _timeline(job)
    chosen = job.view()["chosen"]
    assert (timeline["version"], timeline["point"]) == (1, chosen["index"])
    assert timeline["time_s"] == chosen["time_s"] and timeline["energy_j"] == chosen["energy_j"]
    _check_against_the_plans(job, timeline)

    # A policy change moves it to the new point.
    r = job.client.put(job.url("/policy"), json={"kind": "min-energy"}, headers=job.auth)
    assert r.status_code == 200, r.text
    moved = _timeline(job)
    assert moved["version"] == 2 and moved["point"] == r.json()["chosen"]["index"]
    assert moved["time_s"] > timeline["time_s"]
    _check_against_the_plans(job, moved)


def test_409_before_a_plan_and_the_token_is_needed(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client)
    job.register_all(clocks_of(example_rows))
    path = TIMELINE_PATH.format(job_id=job.job_id)
    r = client.get(path, headers=job.auth)
    assert r.status_code == 409 and r.json()["error"] == "PlanNotReady"
    assert client.get(path).status_code == 401
    r = client.get(TIMELINE_PATH.format(job_id="0" * 32), headers=job.auth)
    assert r.status_code == 404
