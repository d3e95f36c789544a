"""Planning runs (perseus.server.planning.runner): each run's time and memory limits, killed
workers,
deleted jobs; through the HTTP API on real planning processes, small limits in each test's
settings."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from perseus.server.planning.runner import PlanningProcess, PlanningRunner
from perseus.server.settings import Settings

from .conftest import Job, clocks_of, create_job, synthetic_rows


def _submit(
    client: TestClient, stages: int, microbatches: int, scale: float = 1.0, **spec: Any
) -> Job:
    """Create a one-replica job and report every profile; the last one starts planning."""
    rows = synthetic_rows(stages, scale)
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


# Planning processes run at niceness 19: on two cores kept busy at normal priority a small
# job's start and run, or a killed process's exit, can take tens of seconds.
def _wait(job: Job, timeout_s: float = 180.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        view = job.view()
        if view["state"] in ("ready", "failed") or time.monotonic() > deadline:
            return view
        time.sleep(0.05)


def _runner(client: TestClient) -> PlanningRunner:
    runner: PlanningRunner = client.app.state.perseus.runner  # type: ignore[attr-defined]
    return runner


def _wait_running(runner: PlanningRunner, job: Job, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while job.job_id not in runner.processes:
        assert time.monotonic() < deadline, "the planning run never started"
        time.sleep(0.02)
    return runner.processes[job.job_id]


Make = Callable[[Settings], TestClient]


def test_a_run_over_its_time_limit_fails_alone_and_a_small_job_is_planned_meanwhile(
    settings: Settings, make_client: Make
) -> None:
    # 32 x 128 takes over half a minute; the limit is 8 s (planning processes run at the
    # lowest CPU priority: on a busy test machine a small job's start alone can take seconds).
    client = make_client(
        settings.model_copy(
            update={"planning_timeout_s": 8.0, "planning_max_cells": 160_000_000, "polish_s": 0}
        )
    )
    runner = _runner(client)
    large = _submit(client, 32, 128)
    _wait_running(runner, large)
    small = _submit(client, 2, 4)
    # The small one did not wait for it: it got a planning process while the large one
    # still ran. (Whether it also finished within the large one's 8 s depends on the host:
    # niced planning processes on two busy cores may take longer; its start does not.)
    alongside = False
    deadline = time.monotonic() + 180
    while small.view()["state"] not in ("ready", "failed"):
        running = runner.processes
        alongside = alongside or (small.job_id in running and large.job_id in running)
        assert time.monotonic() < deadline, "the small job was never planned"
        time.sleep(0.02)
    assert alongside, "the small job's run did not start while the large one ran"
    assert small.view()["state"] == "ready"
    view = _wait(large)
    assert view["state"] == "failed"
    assert "longer than its limit of 8 s" in view["reason"]
    assert "planning_timeout_s" in view["reason"]


def test_a_run_over_its_memory_limit_fails_with_a_readable_reason(
    settings: Settings, make_client: Make
) -> None:
    # The 2 x 2 job with ~1e6 s instructions on a 1 ms grid (by default the grid
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
        view = _wait(doomed, 150.0)  # the runner waits up to 90 s for a niced exit
        assert view["state"] == "failed"
        assert "planning process died (killed by SIGKILL" in view["reason"]
        assert _wait(queued)["state"] == "ready"
        assert _wait(small)["state"] == "ready"
    assert _wait(_submit(client, 4, 8))["state"] == "ready"


def test_a_process_reaped_by_a_starting_one_still_says_how_it_died(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # multiprocessing's Process.start reaps every earlier child that has ended. Here a
    # process starting on another thread reaps the killed one, and is held just after its
    # waitpid (a thread descheduled there on a busy host): the killed one's death must
    # still read its SIGKILL, not "still not gone".
    context = multiprocessing.get_context("spawn")
    doomed = PlanningProcess(context, None)
    real_waitpid = os.waitpid
    reaped = threading.Event()

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        answer = real_waitpid(pid, options)
        if pid == doomed.pid and answer[0] == pid and not reaped.is_set():
            reaped.set()
            time.sleep(0.5)
        return answer

    monkeypatch.setattr(os, "waitpid", waitpid)
    os.kill(doomed.pid, signal.SIGKILL)
    # A zombie now (looked at without reaping it).
    os.waitid(os.P_PID, doomed.pid, os.WEXITED | os.WNOWAIT)
    started: list[PlanningProcess] = []
    starting = threading.Thread(target=lambda: started.append(PlanningProcess(context, None)))
    starting.start()
    try:
        assert reaped.wait(30.0), "the starting process did not reap the killed one"
        assert "(killed by SIGKILL" in doomed.death()
    finally:
        starting.join(30.0)
        for process in [doomed, *started]:
            process.kill()
            process.close()


def _dead(pid: int) -> bool:
    """Whether our child ``pid`` has ended: reaped, or a zombie (looked at without reaping).

    A killed planning process still runs its exit (unmapping its memory) at niceness 19, on
    a busy host for seconds; the runner stops waiting to reap it after 5 s, and the next
    process start reaps it then. Dead is what stopping it means.
    """
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped already


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
    deadline = time.monotonic() + 120
    while (runner.computing or not _dead(pid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not runner.computing and not runner.processes
    # Its planning process was killed, not left to finish (a run that ends returns its
    # process, alive, to the idle ones: never dead).
    assert _dead(pid)
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
    deadline = time.monotonic() + 120  # heartbeats every lease_s / 3 = 1 s; a niced exit
    while (runner.computing or not _dead(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not runner.computing and _dead(pid)
