"""The whole loop on CPU: torchrun ranks (gloo) with the fake GPU against a real planner server.

Each test starts ``examples/torch_pipeline.py`` under ``torch.distributed.run``: the ranks
register, profile online, report, receive their plans and follow them. The clock logs are
then checked instruction by instruction against the plans the server hands out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import REPO, LiveServer, free_port

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

# A short profiling budget: every 8th clock, short windows (the fake's counter still
# moves every 100 ms, so each window holds a few updates).
FAST_PROFILE = {
    "PERSEUS_PROFILE_CLOCKS": "every:8",
    "PERSEUS_PROFILE_WINDOW_S": "0.3",
    "PERSEUS_PROFILE_SETTLE_S": "0.1",
    "PERSEUS_PROFILE_BLOCKING_S": "0.5",
}


def create_job(server: LiveServer, **spec: Any) -> tuple[str, str]:
    body = {"data_parallel": 1, "tensor_parallel": 1, **spec}
    reply = httpx.post(f"{server.url}/v1/jobs", json=body, timeout=10)
    assert reply.status_code == 201, reply.text
    created = reply.json()
    return created["job_id"], created["token"]


class Launch:
    """One torchrun process tree running the example."""

    def __init__(
        self, tmp: Path, server: LiveServer, job: str, token: str, ranks: int, *args: str
    ) -> None:
        self.logs = tmp / "clocks"
        self.output = tmp / "torchrun.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
        env.update(FAST_PROFILE)
        env.update(
            PERSEUS_SERVER=server.url,
            PERSEUS_JOB=job,
            PERSEUS_TOKEN=token,
            PERSEUS_GPU="fake",
            PERSEUS_CLOCK_LOG=str(self.logs),
            PERSEUS_POLL_WAIT_S="5",
            OMP_NUM_THREADS="1",
        )
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            str(REPO / "examples" / "torch_pipeline.py"), *args,
        ]  # fmt: skip
        self._out = self.output.open("wb")
        self.process = subprocess.Popen(
            command, env=env, stdout=self._out, stderr=subprocess.STDOUT, cwd=REPO
        )
        self.ranks = ranks

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def entries(self, rank: int) -> list[dict[str, Any]]:
        path = self.logs / f"rank{rank}.jsonl"
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written
                break
        return out

    def iterations(self, rank: int) -> int:
        entries = self.entries(rank)
        return 1 + entries[-1]["iteration"] if entries else 0

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout_s)
        finally:
            self._out.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # torchrun stops its workers on SIGTERM
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.kill()


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float, launch: Launch) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        if launch.process.poll() is not None:
            pytest.fail(f"training exited while waiting for {what}:\n{launch.text()[-4000:]}")
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}:\n{launch.text()[-4000:]}")


def plan_of(server: LiveServer, job: str, token: str, rank: int) -> dict[str, Any]:
    reply = httpx.get(
        f"{server.url}/v1/jobs/{job}/plan",
        params={"rank": rank},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    plan: dict[str, Any] = reply.json()
    return plan


def check_log_follows(launch: Launch, rank: int, plans: dict[int, dict[str, Any]]) -> int:
    """Every complete iteration run under a plan version equals that plan; returns how many."""
    by_iteration: dict[int, list[dict[str, Any]]] = {}
    for entry in launch.entries(rank):
        by_iteration.setdefault(entry["iteration"], []).append(entry)
    checked = 0
    seen_plan = False
    for iteration in sorted(by_iteration):
        entries = by_iteration[iteration]
        versions = {e["plan_version"] for e in entries}
        assert len(versions) == 1, f"rank {rank} iteration {iteration}: versions {versions}"
        version = versions.pop()
        if version is None:
            assert not seen_plan, f"rank {rank} iteration {iteration} lost its plan"
            assert all(e["frequency_mhz"] is None for e in entries)
            continue
        seen_plan = True
        if version not in plans:
            continue
        expected = [
            (i["instruction"], i["microbatch"], i.get("chunk"), i["frequency_mhz"])
            for i in plans[version]["instructions"]
        ]
        ran = [(e["instruction"], e["microbatch"], e["chunk"], e["frequency_mhz"]) for e in entries]
        if len(ran) < len(expected) and iteration == max(by_iteration):
            continue  # the last iteration may be cut short by a signal
        assert ran == expected, f"rank {rank} iteration {iteration} differs from plan {version}"
        checked += 1
    return checked


def test_1f1b_four_ranks_planner_restart_and_sigterm(
    live_server: Callable[..., LiveServer], launches: list[Launch], tmp_path: Path
) -> None:
    server = live_server()
    job, token = create_job(server, schedule="1f1b", stages=4, microbatches=4)
    auth = {"Authorization": f"Bearer {token}"}
    launch = Launch(tmp_path, server, job, token, 4, "--microbatches", "4", "--steps", "100000")
    launches.append(launch)

    def planned(version: int, iterations: int) -> Callable[[], bool]:
        def check() -> bool:
            for rank in range(4):
                done = [e for e in launch.entries(rank) if e["plan_version"] == version]
                if len({e["iteration"] for e in done}) < iterations:
                    return False
            return True

        return check

    wait_for("plan version 1 on every rank", planned(1, 3), 240, launch)
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
    wait_for("plan version 2 on every rank", planned(2, 2), 120, launch)
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
        tmp_path, server, job, token, 2,
        "--schedule", "interleaved-1f1b", "--microbatches", "4", "--steps", "45",
    )  # fmt: skip
    launches.append(launch)
    assert launch.wait(240) == 0, launch.text()[-4000:]
    output = launch.text()
    for rank in range(2):
        assert f"GPU {rank} clocks reset (exit)" in output, output[-4000:]
        plan = plan_of(server, job, token, rank)
        assert any(i["chunk"] == 1 for i in plan["instructions"])
        assert check_log_follows(launch, rank, {plan["version"]: plan}) >= 3
