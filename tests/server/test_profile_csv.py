"""``GET /v1/jobs/{id}/profile.csv``: the job's merged profile as Zeus CSV (``perseus plan``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from perseus.cli import main
from perseus.schemas import PROFILE_CSV_PATH
from perseus.server.planning import merged_profile
from perseus.solver import Profile, load_profile

from .conftest import Job, ProfileRows, clocks_of, create_job


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
