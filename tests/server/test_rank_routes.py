"""The rank routes (perseus.server.api.rank_routes): answers before a plan, strict numbers, the
job's files (profile.csv, profile.json, frontier.json), ranks that gave up.

Their logic is tested with the module that holds it: registration in test_jobs, profiles
and planning in test_lease, plans in test_plans and test_plan_fetch, policy and stragglers
in test_choices, iterations in test_telemetry.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from perseus.cli import main
from perseus.formats.plan_files import FrontierFile
from perseus.schemas import FRONTIER_FILE_PATH, GAVE_UP_PATH, PROFILE_CSV_PATH, PROFILE_JSON_PATH
from perseus.server.planning.worker import merged_profile
from perseus.solver import Profile, load_profile
from perseus.solver.profiles import profile_from_json

from .conftest import Job, ProfileRows, clocks_of, create_job, rank_body, small_profile_rows


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


def test_non_finite_numbers_are_422(client: TestClient) -> None:
    job = create_job(client)
    client.post(job.url("/ranks"), json=rank_body(0), headers=job.auth)
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
    client.post(job.url("/ranks"), json=rank_body(0), headers=job.auth)
    rows = small_profile_rows() * 2501
    r = client.post(
        job.url("/profiles"), json={"rank": 0, "stage": 0, "rows": rows}, headers=job.auth
    )
    assert r.status_code == 422


def test_rank_profile_and_iteration_numbers_are_strict(ready_job: Job) -> None:
    client, auth = ready_job.client, ready_job.auth
    registration = rank_body(stage=0)
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


# ----------------------------------------------------------------------------- profile.csv


def _csv_url(job: Job) -> str:
    return PROFILE_CSV_PATH.format(job_id=job.job_id)


def _read_back(text: str, tmp_path: Path) -> Profile:
    path = tmp_path / "merged.csv"
    path.write_text(text, encoding="utf-8")
    return load_profile(path)


def _server_merge(client: TestClient, job: Job) -> Profile:
    """What planning would merge, by the server's own code path."""
    service = client.app.state.perseus.service  # type: ignore[attr-defined]
    return merged_profile(service.lease.planning_input(job.job_id))


def test_csv_reads_back_equal_to_the_merged_profile(
    ready_job: Job, example_rows: ProfileRows, tmp_path: Path
) -> None:
    r = ready_job.client.get(_csv_url(ready_job), headers=ready_job.auth)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/csv")
    assert r.text.splitlines()[0] == "stage,instruction,frequency,time,energy,p_block_w"
    profile = _read_back(r.text, tmp_path)
    assert profile.stages == _server_merge(ready_job.client, ready_job).stages
    # Two replicas that measured the same rows merge into those rows.
    assert profile.num_stages == 4
    for stage, rows in example_rows.items():
        for row in rows:
            option = profile.option(stage, row["instruction"], row["frequency_mhz"])
            assert option.time_s == row["time_s"]
            assert option.energy_j == row["energy_j"]
    # The job's p_block_w per GPU times one GPU per stage, in the header and the file.
    assert float(r.headers["x-perseus-p-block-w"]) == 100.0
    assert profile.p_block_w == 100.0


def test_tensor_parallel_ranks_merge_slowest_time_and_summed_energy(
    client: TestClient, example_rows: ProfileRows, tmp_path: Path
) -> None:
    job = create_job(client, stages=4, data_parallel=1, tensor_parallel=2, p_block_w=80.0)
    job.register_all(clocks_of(example_rows))
    slower = {
        stage: [
            {**row, "time_s": row["time_s"] * 1.25, "energy_j": row["energy_j"] * 0.5}
            for row in rows
        ]
        for stage, rows in example_rows.items()
    }
    for stage in range(4):
        for tp, measured in ((0, example_rows), (1, slower)):
            r = client.post(
                job.url("/profiles"),
                json={"rank": job.rank_of(stage, 0, tp), "stage": stage, "rows": measured[stage]},
                headers=job.auth,
            )
            assert r.status_code == 200, r.text
    r = client.get(_csv_url(job), headers=job.auth)
    assert r.status_code == 200, r.text
    profile = _read_back(r.text, tmp_path)
    assert profile.stages == _server_merge(client, job).stages
    for stage, rows in example_rows.items():
        for row in rows:
            option = profile.option(stage, row["instruction"], row["frequency_mhz"])
            assert option.time_s == pytest.approx(row["time_s"] * 1.25)
            assert option.energy_j == pytest.approx(row["energy_j"] * 1.5)
    assert float(r.headers["x-perseus-p-block-w"]) == pytest.approx(160.0)
    assert profile.p_block_w == pytest.approx(160.0)


def test_409_until_every_stage_has_a_profile(
    client: TestClient, example_rows: ProfileRows, tmp_path: Path
) -> None:
    job = create_job(client, p_block_w=None)
    job.register_all(clocks_of(example_rows))
    r = client.get(_csv_url(job), headers=job.auth)
    assert r.status_code == 409
    assert r.json()["error"] == "JobStateError"
    assert "stages 0, 1, 2, 3" in r.json()["detail"]
    for stage in range(3):
        r = client.post(
            job.url("/profiles"),
            json={"rank": job.rank_of(stage, 0), "stage": stage, "rows": example_rows[stage]},
            headers=job.auth,
        )
        assert r.status_code == 200, r.text
    r = client.get(_csv_url(job), headers=job.auth)
    assert r.status_code == 409
    assert "stages 3 lack" in r.json()["detail"]
    r = client.post(
        job.url("/profiles"),
        json={"rank": job.rank_of(3, 0), "stage": 3, "rows": example_rows[3]},
        headers=job.auth,
    )
    assert r.status_code == 200, r.text
    # One replica per stage is enough (the job itself still waits for the other replica);
    # no blocking power is known yet, so the header and the column are absent.
    r = client.get(_csv_url(job), headers=job.auth)
    assert r.status_code == 200, r.text
    assert job.view()["state"] == "profiling"
    assert "x-perseus-p-block-w" not in r.headers
    assert r.text.splitlines()[0] == "stage,instruction,frequency,time,energy"
    assert _read_back(r.text, tmp_path).num_stages == 4


def test_needs_the_job_token(ready_job: Job) -> None:
    client = ready_job.client
    assert client.get(_csv_url(ready_job)).status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert client.get(_csv_url(ready_job), headers=wrong).status_code == 403
    r = client.get(PROFILE_CSV_PATH.format(job_id="0" * 32), headers=ready_job.auth)
    assert r.status_code == 404
    assert r.json()["error"] == "JobNotFound"


def test_perseus_plan_reads_the_csv(ready_job: Job, tmp_path: Path) -> None:
    r = ready_job.client.get(_csv_url(ready_job), headers=ready_job.auth)
    path = tmp_path / "job.csv"
    path.write_text(r.text, encoding="utf-8")
    status = main(
        [
            "plan",
            str(path),
            "--microbatches",
            "4",
            "--polish",
            "0",
        ]
    )
    assert status == 0


# ----------------------------------------------------------------- profile.json, frontier.json


def test_the_planned_jobs_profile_and_frontier_files(ready_job: Job) -> None:
    client, auth = ready_job.client, ready_job.auth
    r = client.get(PROFILE_JSON_PATH.format(job_id=ready_job.job_id), headers=auth)
    assert r.status_code == 200, r.text
    assert profile_from_json(r.content).stages == _server_merge(client, ready_job).stages
    r = client.get(FRONTIER_FILE_PATH.format(job_id=ready_job.job_id), headers=auth)
    assert r.status_code == 200, r.text
    frontier = FrontierFile.model_validate_json(r.content).to_frontier()
    shown = client.get(ready_job.url("/frontier"), headers=auth).json()
    assert list(frontier.times_s) == pytest.approx([p["time_s"] for p in shown["points"]])


def test_the_files_are_409_before_planning_and_need_the_token(client: TestClient) -> None:
    job = create_job(client)
    for path in (PROFILE_JSON_PATH, FRONTIER_FILE_PATH):
        url = path.format(job_id=job.job_id)
        r = client.get(url, headers=job.auth)
        assert r.status_code == 409, (path, r.text)
        assert client.get(url).status_code == 401


def test_a_rank_that_gave_up_is_listed_with_its_latest_reason(client: TestClient) -> None:
    job = create_job(client)
    url = GAVE_UP_PATH.format(job_id=job.job_id)
    for reason in ("no clock rights", "the planner refused the job"):
        r = client.post(url, json={"rank": 3, "reason": reason}, headers=job.auth)
        assert r.status_code == 200, r.text
        assert r.json()["rank"] == 3
    (listed,) = job.view()["gave_up"]
    assert (listed["rank"], listed["reason"]) == (3, "the planner refused the job")
    r = client.post(url, json={"rank": 8, "reason": "x"}, headers=job.auth)  # 8 ranks: 0..7
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rank"]
    assert client.post(url, json={"rank": 0, "reason": ""}, headers=job.auth).status_code == 422


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("stage", "999999999999"),
        ("stage", "1024"),
        ("frequency_mhz", "1" + "0" * 30),
        ("frequency_mhz", "9" * 5000),
        ("time_s", "1e308"),
        ("energy_j", "1e300"),
        ("time_s", "[" * 50_000 + "]" * 50_000),
    ],
)
def test_a_hostile_profile_upload_is_422_and_allocates_nothing_per_stage(
    client: TestClient, field: str, raw: str
) -> None:
    import tracemalloc

    job = create_job(client)
    client.post(job.url("/ranks"), json=rank_body(0), headers=job.auth)
    row = '{"instruction": "%s", "frequency_mhz": %s, "time_s": %s, "energy_j": %s}'
    values = {"frequency_mhz": "1980", "time_s": "0.05", "energy_j": "24.0", field: raw}
    rows = [row % (kind, values["frequency_mhz"], values["time_s"], values["energy_j"])
            for kind in ("forward", "backward")]  # fmt: skip
    stage = raw if field == "stage" else "0"
    body = f'{{"rank": 0, "stage": {stage}, "rows": [{", ".join(rows)}]}}'
    tracemalloc.start()
    try:
        r = client.post(
            job.url("/profiles"),
            content=body,
            headers={**job.auth, "Content-Type": "application/json"},
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.status_code == 422, r.text[:300]
    assert len(r.text) < 4000
    assert peak < 100 * len(body) + 16 * 2**20, peak
    assert client.get(job.url(""), headers=job.auth).json()["state"] == "registering"
