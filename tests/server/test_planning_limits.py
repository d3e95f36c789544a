"""Planning within bounds: the work estimate, its limit, and each run's time and memory limits.

The estimate is pure and checked against the solver; the limits are checked through the
HTTP API on real planning processes, with small limits set in each test's settings.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from perseus.errors import PlanningTooLarge
from perseus.server.planning import (
    DEFAULT_MAX_CELLS,
    InstructionTimes,
    PlanningInput,
    PlanningWork,
    StoredProfile,
    check_planning_work,
    estimate_planning_work,
    failure_reason,
    instruction_times,
    plan_frontier,
)
from perseus.server.runner import PlanningRunner
from perseus.server.settings import Settings
from perseus.solver import compute_frontier, make_schedule, profile_from_rows
from perseus.solver.synthetic import EXAMPLE_P_BLOCK_W, synthetic_profile

from .conftest import Job, ProfileRows, clocks_of, create_job

# ----------------------------------------------------------------------------- the estimate


def _times(stages: int, scale: float = 1.0) -> list[InstructionTimes]:
    """Ranges of the synthetic H200-like profile, its times multiplied by ``scale``."""
    per_stage: dict[int, list[tuple[str, int, float, float]]] = {}
    for stage, kind, clock, time_s, energy_j in synthetic_profile(stages):
        per_stage.setdefault(stage, []).append((kind, clock, time_s * scale, energy_j))
    return [t for stage, rows in per_stage.items() for t in instruction_times(stage, rows)]


def _work(
    stages: int, microbatches: int, virtual_stages: int = 1, scale: float = 1.0, **kw: Any
) -> PlanningWork:
    return estimate_planning_work(
        stages=stages,
        microbatches=microbatches,
        virtual_stages=virtual_stages,
        times=_times(stages, scale),
        resolution_s=kw.get("resolution_s"),
    )


@pytest.mark.parametrize(
    ("stages", "microbatches", "virtual_stages"),
    [(8, 12, 1), (8, 96, 1), (16, 128, 1), (16, 128, 2), (8, 96, 4), (32, 64, 1)],
)
def test_realistic_jobs_fit_the_default_limit(
    stages: int, microbatches: int, virtual_stages: int
) -> None:
    # Instruction times twice as spread as the synthetic model's (large models, slow GPUs).
    work = _work(stages, microbatches, virtual_stages, scale=2.0)
    assert work.cells <= DEFAULT_MAX_CELLS
    assert work.instructions == 2 * stages * microbatches * virtual_stages


@pytest.mark.parametrize(
    ("stages", "microbatches", "time_s"),
    [(4, 32_768, None), (4, 8, 5_000.0), (2, 2, 1e6)],
    ids=["4x32768 microbatches", "4x8 at 5000 s", "2x2 at 1e6 s"],
)
def test_the_issues_pathological_jobs_are_refused(
    stages: int, microbatches: int, time_s: float | None
) -> None:
    scale = 1.0 if time_s is None else time_s / 0.1  # synthetic instructions take ~0.1 s
    times = _times(stages, scale)
    # Very long instructions are refused on a 1 ms grid; by default the grid follows the
    # job's length (a bounded number of deadlines), so they plan.
    resolution_s = None if time_s is None else 1e-3
    if time_s is not None:
        admitted = check_planning_work(
            stages=stages,
            microbatches=microbatches,
            virtual_stages=1,
            times=times,
            resolution_s=None,
            max_cells=DEFAULT_MAX_CELLS,
        )
        assert admitted.cells <= DEFAULT_MAX_CELLS
    with pytest.raises(PlanningTooLarge) as caught:
        check_planning_work(
            stages=stages,
            microbatches=microbatches,
            virtual_stages=1,
            times=times,
            resolution_s=resolution_s,
            max_cells=DEFAULT_MAX_CELLS,
        )
    message = str(caught.value)
    assert "planning_max_cells" in message
    assert "resolution_s" in message
    assert "microbatches" in message
    assert caught.value.max_cells == DEFAULT_MAX_CELLS
    assert caught.value.cells > DEFAULT_MAX_CELLS


def test_the_refusal_says_how_many_microbatches_fit_and_that_many_do() -> None:
    limit = 10_000_000  # below the default grid's bound on cells, so a large job passes it
    with pytest.raises(PlanningTooLarge, match=r"at most ([\d,]+) microbatches fit") as caught:
        check_planning_work(
            stages=8,
            microbatches=1_000,
            virtual_stages=1,
            times=_times(8),
            resolution_s=None,
            max_cells=limit,
        )
    fits = int(str(caught.value).split("at most ")[1].split(" ")[0].replace(",", ""))
    assert _work(8, fits).cells <= limit < _work(8, fits + 1).cells


def test_a_finer_resolution_is_named_as_the_knob() -> None:
    times = _times(8)
    kwargs: dict[str, Any] = {"stages": 8, "microbatches": 96, "virtual_stages": 1}
    at_default = estimate_planning_work(times=times, resolution_s=None, **kwargs)
    with pytest.raises(PlanningTooLarge, match=r"coarser resolution_s \(now 0.0001 s"):
        check_planning_work(
            times=times, resolution_s=1e-4, max_cells=2 * at_default.cells, **kwargs
        )


def test_the_estimate_grows_with_the_job_and_never_with_fewer_ranges() -> None:
    base = _work(8, 32)
    assert _work(8, 64).cells > base.cells
    assert _work(8, 32, resolution_s=1e-4).cells > base.cells
    assert _work(8, 32, scale=3.0).cells > base.cells
    # A subset of the stages (one rank's own profile, checked on arrival) estimates no more.
    every = _times(8)
    for stage in range(8):
        subset = [t for t in every if t.stage == stage]
        part = estimate_planning_work(
            stages=8, microbatches=32, virtual_stages=1, times=subset, resolution_s=None
        )
        assert part.cells <= base.cells


@pytest.mark.parametrize(
    ("schedule", "stages", "microbatches", "virtual_stages"),
    [("1f1b", 4, 8, 1), ("gpipe", 3, 5, 1), ("interleaved-1f1b", 2, 4, 2), ("1f1b", 1, 3, 1)],
)
def test_the_estimate_covers_the_frontier_the_solver_computes(
    schedule: str, stages: int, microbatches: int, virtual_stages: int
) -> None:
    rows = synthetic_profile(stages)
    profile = profile_from_rows(rows, p_block_w=EXAMPLE_P_BLOCK_W)
    frontier = compute_frontier(
        profile, make_schedule(schedule, stages, microbatches, virtual_stages)
    )
    work = _work(stages, microbatches, virtual_stages)
    span_s = float(frontier.times_s[-1] - frontier.times_s[0])
    assert work.deadlines >= span_s / 1e-3
    assert work.deadlines >= len(frontier)


def test_a_memory_error_reads_as_the_limit_not_numpy() -> None:
    numpy_text = "Unable to allocate 29.1 GiB for an array with shape (3906250000,)"
    failure = failure_reason(MemoryError(numpy_text), 512 * 2**20)
    assert "Unable to allocate" not in failure.reason
    assert "512 MiB" in failure.reason and "planning_memory_mb" in failure.reason
    assert not failure.internal
    internal = failure_reason(ValueError("boom"), None)
    assert internal.internal and "ValueError: boom" in internal.details


# ----------------------------------------------------------------------------- the runs


def _rows(stages: int, scale: float = 1.0) -> ProfileRows:
    rows: ProfileRows = {}
    for stage, kind, clock, time_s, energy_j in synthetic_profile(stages):
        rows.setdefault(stage, []).append(
            {
                "instruction": kind,
                "frequency_mhz": clock,
                "time_s": time_s * scale,
                "energy_j": energy_j * scale,
            }
        )
    return rows


def _submit(
    client: TestClient, stages: int, microbatches: int, scale: float = 1.0, **spec: Any
) -> Job:
    """Create a one-replica job and report every profile; the last one starts planning."""
    rows = _rows(stages, scale)
    job = create_job(
        client,
        stages=stages,
        microbatches=microbatches,
        data_parallel=1,
        tensor_parallel=1,
        **spec,
    )
    job.register_all(clocks_of(rows))
    job.report_all(rows)
    return job


def _wait(job: Job, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        view = job.view()
        if view["state"] in ("ready", "failed") or time.monotonic() > deadline:
            return view
        time.sleep(0.05)


def _runner(client: TestClient) -> PlanningRunner:
    runner: PlanningRunner = client.app.state.perseus.runner  # type: ignore[attr-defined]
    return runner


def _wait_running(runner: PlanningRunner, job: Job, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while job.job_id not in runner.processes:
        assert time.monotonic() < deadline, "the planning run never started"
        time.sleep(0.02)
    return runner.processes[job.job_id]


Make = Callable[[Settings], TestClient]


def test_a_run_over_its_time_limit_fails_alone_and_a_small_job_is_planned_meanwhile(
    settings: Settings, make_client: Make
) -> None:
    # 16 x 128 takes half a minute; the limit is 8 s (planning processes run at the lowest
    # CPU priority: on a busy test machine a small job's start alone can take seconds).
    client = make_client(
        settings.model_copy(
            update={"planning_timeout_s": 8.0, "planning_max_cells": 160_000_000, "polish_s": 0}
        )
    )
    large = _submit(client, 16, 128)
    _wait_running(_runner(client), large)
    small = _submit(client, 2, 4)
    assert _wait(small)["state"] == "ready"
    assert large.view()["state"] == "planning"  # the small one did not wait for it
    view = _wait(large)
    assert view["state"] == "failed"
    assert "longer than its limit of 8 s" in view["reason"]
    assert "planning_timeout_s" in view["reason"]


def test_a_run_over_its_memory_limit_fails_with_a_readable_reason(
    settings: Settings, make_client: Make
) -> None:
    # The issue's 2 x 2 job with ~1e6 s instructions on a 1 ms grid (by default the grid
    # follows the job and it would plan), past the work limit on purpose: the memory limit
    # stops it (its deadline grid alone would take GiBs).
    client = make_client(
        settings.model_copy(update={"planning_memory_mb": 512, "planning_max_cells": 10**18})
    )
    view = _wait(_submit(client, 2, 2, scale=1e7, resolution_s=1e-3))
    assert view["state"] == "failed"
    assert "ran out of memory" in view["reason"]
    assert "512 MiB" in view["reason"] and "planning_memory_mb" in view["reason"]
    assert "Unable to allocate" not in view["reason"]


def test_the_worker_checks_the_limit_again_on_every_rank_combined() -> None:
    # A job admitted elsewhere (another server's limit) is refused by the planning run.
    rows = _rows(4)
    profiles = tuple(
        StoredProfile(
            stage,
            0,
            0,
            json.dumps(
                [
                    [r["instruction"], r["frequency_mhz"], r["time_s"], r["energy_j"]]
                    for r in stage_rows
                ]
            ),
        )
        for stage, stage_rows in rows.items()
    )
    inp = PlanningInput(
        job_id="j",
        schedule="1f1b",
        stages=4,
        microbatches=64,
        virtual_stages=1,
        tensor_parallel=1,
        p_block_w=100.0,
        resolution_s=None,
        profiles=profiles,
        max_cells=1_000_000,
    )
    with pytest.raises(PlanningTooLarge, match="planning_max_cells"):
        plan_frontier(inp)


def test_killed_workers_fail_only_their_own_jobs(settings: Settings, make_client: Make) -> None:
    # At this max_cells, 1 x 96 is not small: it waits in the queue behind 8 x 96.
    client = make_client(
        settings.model_copy(update={"planning_max_cells": 22_000_000, "polish_s": 0})
    )
    runner = _runner(client)
    for _ in range(2):  # the process that replaced a killed one can be killed too
        doomed = _submit(client, 8, 96)
        pid = _wait_running(runner, doomed)
        queued = _submit(client, 1, 96)
        small = _submit(client, 2, 4)
        os.kill(pid, signal.SIGKILL)
        view = _wait(doomed)
        assert view["state"] == "failed"
        assert "planning process died (killed by SIGKILL" in view["reason"]
        assert _wait(queued)["state"] == "ready"
        assert _wait(small)["state"] == "ready"
    assert _wait(_submit(client, 4, 8))["state"] == "ready"


def test_a_profile_that_puts_the_job_over_the_limit_gets_422(
    settings: Settings, make_client: Make
) -> None:
    client = make_client(settings.model_copy(update={"planning_max_cells": 1_000_000}))
    rows = _rows(4, scale=100.0)
    job = create_job(client, stages=4, microbatches=8, data_parallel=1, tensor_parallel=1)
    job.register_all(clocks_of(rows))
    r = client.post(
        job.url("/profiles"),
        json={"rank": job.rank_of(0, 0), "stage": 0, "rows": rows[0]},
        headers=job.auth,
    )
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "PlanningTooLarge"
    detail = body["detail"]
    text = detail if isinstance(detail, str) else " ".join(d["msg"] for d in detail)
    assert "planning_max_cells" in text
    assert "microbatches fit" in text and "resolution_s" in text
    assert job.view()["counts"]["profiles_reported"] == 0


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_deleting_a_job_stops_its_planning_queued_or_running(
    settings: Settings, make_client: Make
) -> None:
    # Issue 24, item 4: jobs deleted right after their profiles arrived were planned anyway,
    # and a job queued behind them waited for their runs.
    client = make_client(
        settings.model_copy(update={"planning_max_cells": 160_000_000, "polish_s": 0})
    )
    runner = _runner(client)
    running = _submit(client, 16, 128)  # half a minute of planning
    pid = _wait_running(runner, running)
    queued = _submit(client, 16, 128)  # not small: it waits in the queue
    assert queued.job_id in runner.computing and queued.job_id not in runner.processes
    for job in (queued, running):
        assert client.delete(job.url(), headers=job.auth).status_code == 204
    deadline = time.monotonic() + 5
    while (runner.computing or not _gone(pid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not runner.computing and not runner.processes
    assert _gone(pid)  # its planning process was killed, not left to finish
    assert _wait(_submit(client, 4, 8))["state"] == "ready"


def test_a_job_deleted_through_another_server_stops_planning_at_the_heartbeat(
    settings: Settings, make_client: Make
) -> None:
    client = make_client(
        settings.model_copy(update={"planning_max_cells": 160_000_000, "polish_s": 0})
    )
    runner = _runner(client)
    job = _submit(client, 16, 128)
    pid = _wait_running(runner, job)
    # As another server process deletes it: straight in the store, this process not told.
    client.app.state.perseus.service.jobs.delete(job.job_id)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10  # heartbeats every lease_s / 3 = 1 s
    while (runner.computing or not _gone(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not runner.computing and _gone(pid)
