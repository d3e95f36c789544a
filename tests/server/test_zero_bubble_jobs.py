"""Zero-bubble jobs on the server: the names, split-backward profile rows, a plan, the CSV."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from perseus.schemas import PROFILE_CSV_PATH
from perseus.solver import SCHEDULE_NAMES, load_profile

from .conftest import JOB_SPEC, ProfileRows, clocks_of, create_job


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev", "interleaved-zb"])
def test_a_split_backward_job_plans_on_split_rows(
    client: TestClient, example_rows: ProfileRows, tmp_path: Path, schedule: str
) -> None:
    job = create_job(
        client,
        schedule=schedule,
        stages=2,
        microbatches=4,
        virtual_stages=2,
        data_parallel=1,
    )
    job.register_all(clocks_of(example_rows))
    job.report_all({0: example_rows[0], 1: example_rows[1]})
    r = job.wait_plan()
    assert r.status_code == 200, r.text
    kinds = {i["instruction"] for i in r.json()["instructions"]}
    assert kinds == {"forward", "backward_input", "backward_weight"} | (
        {"backward"} if schedule == "dualpipev" else set()
    )
    csv = job.client.get(PROFILE_CSV_PATH.format(job_id=job.job_id), headers=job.auth)
    assert csv.status_code == 200, csv.text
    path = tmp_path / "merged.csv"
    path.write_text(csv.text)
    assert "backward_weight" in load_profile(path).stages[1]


def test_every_schedule_name_is_accepted(client: TestClient) -> None:
    for name in SCHEDULE_NAMES:
        chunks = 1 if name in ("1f1b", "gpipe") else 2
        body = {**JOB_SPEC, "schedule": name, "virtual_stages": chunks, "microbatches": 8}
        r = client.post("/v1/jobs", json=body)
        assert r.status_code == 201, (name, r.text)
    r = client.post("/v1/jobs", json={**JOB_SPEC, "schedule": "zbv"})
    assert r.status_code in (400, 422) and "virtual_stages" in r.text


def test_planning_work_counts_the_split_backward() -> None:
    """A zero-bubble job plans 3 instructions per (stage, microbatch, chunk); the halves
    widen the span only as far as the whole backward would."""
    from perseus.server.planning.worker import InstructionTimes, estimate_planning_work

    whole = [
        InstructionTimes(0, "forward", 1.0, 2.0, 3),
        InstructionTimes(0, "backward", 2.0, 4.0, 3),
    ]
    halves = [InstructionTimes(0, "backward_input", 1.1, 2.2, 3),
              InstructionTimes(0, "backward_weight", 0.9, 1.8, 3)]  # fmt: skip
    sizes = {"stages": 1, "microbatches": 8, "virtual_stages": 2, "resolution_s": 1e-3}
    plain = estimate_planning_work(times=whole, **sizes)
    split = estimate_planning_work(times=whole + halves, schedule="zbv", **sizes)
    assert (plain.instructions, split.instructions) == (32, 48)
    assert split.deadlines == plain.deadlines  # I + W spans 2.0 s, as B does
