"""The whole loop on CPU: torchrun ranks (gloo) with the fake GPU against a real planner server.

Each test starts ``examples/torch_pipeline.py`` under ``torch.distributed.run``: the ranks
register, profile online, report, receive their plans and follow them. The clock logs are
then checked instruction by instruction against the plans the server hands out, the clock
each instruction really started at included.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from .conftest import LiveServer
from .pipelines import (
    Launch,
    check_log_follows,
    check_ranks_follow_plans,
    check_realized_slowdown,
    create_job,
    job_env,
    plan_of,
    wait_for,
)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

EXAMPLE = "torch_pipeline.py"


def test_1f1b_four_ranks_planner_restart_and_sigterm(
    live_server: Callable[..., LiveServer], launches: list[Launch], tmp_path: Path
) -> None:
    server = live_server()
    job, token = create_job(server, schedule="1f1b", stages=4, microbatches=4)
    auth = {"Authorization": f"Bearer {token}"}
    launch = Launch(
        tmp_path, EXAMPLE, 4, "--microbatches", "4", "--steps", "100000",
        perseus=job_env(server, job, token),
    )  # fmt: skip
    launches.append(launch)

    wait_for("plan version 1 on every rank", lambda: launch.all_planned(3, version=1), 240, launch)
    view = httpx.get(f"{server.url}/v1/jobs/{job}", headers=auth, timeout=10).json()
    assert view["state"] == "ready"
    assert view["counts"]["ranks_registered"] == 4
    assert view["counts"]["profiles_reported"] == 4
    frontier = httpx.get(f"{server.url}/v1/jobs/{job}/frontier", headers=auth, timeout=10)
    assert frontier.status_code == 200 and len(frontier.json()["points"]) > 1
    plans = {rank: {1: plan_of(server, job, token, rank)} for rank in range(4)}

    # The planner dies: training keeps its pace and its plan.
    before = launch.iterations(0)
    time.sleep(4)
    rate_up = (launch.iterations(0) - before) / 4
    server.stop(signal.SIGKILL)
    before = launch.iterations(0)
    time.sleep(6)
    rate_down = (launch.iterations(0) - before) / 6
    assert launch.process.poll() is None
    assert rate_down >= 0.6 * rate_up, (rate_up, rate_down)

    # It comes back; a policy change reaches every rank.
    server.start()
    reply = httpx.put(
        f"{server.url}/v1/jobs/{job}/policy",
        json={"kind": "max-slowdown", "factor": 1.1},
        headers=auth,
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["version"] == 2
    wait_for("plan version 2 on every rank", lambda: launch.all_planned(2, version=2), 120, launch)
    for rank in range(4):
        plans[rank][2] = plan_of(server, job, token, rank)
        assert plans[rank][2]["version"] == 2

    # SIGTERM to the launcher stops every rank, each resetting its clocks.
    launch.process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    launch.wait(60)
    assert time.monotonic() - started < 60
    output = launch.text()
    for rank in range(4):
        assert f"GPU {rank} clocks reset (SIGTERM)" in output, output[-4000:]
        assert check_log_follows(launch, rank, plans[rank]) >= 3
    view = httpx.get(f"{server.url}/v1/jobs/{job}", headers=auth, timeout=10).json()
    assert view["counts"]["iterations_reported"] > 0
    assert view["telemetry"]["measured_energy_j"] > 0


def test_interleaved_two_ranks_two_chunks(
    live_server: Callable[..., LiveServer], launches: list[Launch], tmp_path: Path
) -> None:
    server = live_server()
    job, token = create_job(
        server, schedule="interleaved-1f1b", stages=2, microbatches=4, virtual_stages=2
    )
    launch = Launch(
        tmp_path, EXAMPLE, 2,
        "--schedule", "interleaved-1f1b", "--microbatches", "4", "--steps", "45",
        perseus=job_env(server, job, token),
    )  # fmt: skip
    launches.append(launch)
    launch.finish(240)
    check_ranks_follow_plans(launch, server, job, token, reset="exit", chunks=2)
    check_realized_slowdown(server, job, token, 0.02)
