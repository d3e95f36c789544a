"""Ranks' measured iterations (perseus.server.lifecycle.telemetry) against the prediction."""

from __future__ import annotations

from typing import Any

import pytest

from perseus.schemas import IterationReport
from perseus.server.service import JobService
from perseus.server.store.job_store import Store

from .conftest import Job, job_spec, register_ranks, report_iterations


def test_iterations_show_predicted_against_measured(ready_job: Job) -> None:
    assert ready_job.view()["telemetry"] is None  # before any report
    predicted = ready_job.view()["chosen"]["time_s"]
    report_iterations(ready_job, range(3), lambda dp: predicted * (1.0 + 0.1 * dp))
    telemetry = ready_job.view()["telemetry"]
    assert telemetry["predicted_time_s"] == pytest.approx(predicted)
    assert telemetry["measured_time_s"] == pytest.approx(predicted * 1.05)
    assert telemetry["measured_energy_j"] == pytest.approx(400.0)
    assert [r["data_parallel_rank"] for r in telemetry["replicas"]] == [0, 1]
    assert ready_job.view()["counts"]["iterations_reported"] == 24
    assert ready_job.view()["version"] == 1  # auto_straggler is off


def test_iteration_batches_keep_windows_per_plan_version(store: Store) -> None:
    service = JobService(store)
    spec = job_spec(stages=2, data_parallel=1)
    _, job = service.jobs.create(spec)
    register_ranks(service, job.id, spec, [1000])

    def report(rank: int, iteration: int, time_s: float, plan_version: int | None = None) -> Any:
        return IterationReport(
            rank=rank, iteration=iteration, time_s=time_s, energy_j=1.0, plan_version=plan_version
        )

    service.iterations.record(
        job.id,
        [
            report(0, 1, 1.0),
            report(0, 1, 9.0),  # sent twice: counted once
            report(0, 2, 2.0),
            report(1, 1, 3.0, plan_version=7),  # another plan's sample: counted, not kept
            report(5, 1, 1.0),  # not a rank of this job: dropped
            report(0, 3, 3.0),
            report(0, 4, 4.0),
        ],
        window=3,
    )
    with store.read() as tx:
        windows = tx.iteration_windows(job.id, [0, 1])
        assert tx.job(job.id) is not None
    assert windows[0].recent_times_s == (2.0, 3.0, 4.0)
    assert windows[0].iterations == 4
    assert windows[1].recent_times_s == ()
    assert windows[1].last_iteration == 1
    assert service.jobs.get(job.id).iterations_reported == 5
    service.iterations.record("0" * 32, [report(0, 1, 1.0)], window=3)  # a deleted job
