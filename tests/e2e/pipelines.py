"""Helpers of the multi-process pipeline tests: torchrun ranks running an example.

``tests/e2e/test_torch_pipeline.py``, ``test_zero_bubble.py``, ``test_deepspeed.py`` and
``test_megatron.py`` each start one of ``examples/*_pipeline.py`` under
``torch.distributed.run`` (gloo, fake GPU), with or without perseus, against a real planner
server, and compare the ranks' clock logs with the
plans the server hands out: the planned clock of every instruction, and the clock it really
started at (``ran_mhz``, the fake's latched clock). The ``launches`` fixture (in
``conftest.py``) stops whatever a test left running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from perseus.client.gpu.fake_model import default_throttled_clocks_mhz
from perseus.core.defaults import CLOCK_CHANGE_MARGIN_S

from .conftest import REPO, LiveServer, free_port

FAKE_DELAY_S = 0.02  # the fake GPU's clock-change delay (its default)
# The fake throttles a lock above an instruction's unlocked clock to it (its power limit, as
# on a real GPU; the same on every stage): the clock such an instruction runs at.
THROTTLED_MHZ = default_throttled_clocks_mhz()

# A short profiling budget: every 8th clock, short windows (the fake's counter still
# moves every 100 ms, so each window holds a few updates).
FAST_PROFILE = {
    "PERSEUS_PROFILE_CLOCKS": "every:8",
    "PERSEUS_PROFILE_WINDOW_S": "0.3",
    "PERSEUS_PROFILE_SETTLE_S": "0.1",
    "PERSEUS_PROFILE_BLOCKING_S": "0.5",
}

Plan = dict[str, Any]

WARM_UP_ITERATIONS = 3
"""Iterations of a new plan version whose clocks are not held to the plan (see below)."""


def create_job(server: LiveServer, **spec: Any) -> tuple[str, str]:
    body = {"data_parallel": 1, "tensor_parallel": 1, **spec}
    reply = httpx.post(f"{server.url}/v1/jobs", json=body, timeout=10)
    assert reply.status_code == 201, reply.text
    created = reply.json()
    return created["job_id"], created["token"]


def plan_of(server: LiveServer, job: str, token: str, rank: int) -> Plan:
    reply = httpx.get(
        f"{server.url}/v1/jobs/{job}/plan",
        params={"rank": rank},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    plan: Plan = reply.json()
    return plan


def job_env(server: LiveServer, job: str, token: str, **settings: str) -> dict[str, str]:
    """The PERSEUS_* variables that join a job: ``settings`` add or override (``PROFILE_MAX_S``)."""
    return {
        "PERSEUS_SERVER": server.url,
        "PERSEUS_JOB": job,
        "PERSEUS_TOKEN": token,
        **{f"PERSEUS_{k.upper()}": v for k, v in settings.items()},
    }


class Launch:
    """One torchrun process tree running ``examples/<example>``.

    ``perseus``: the job's variables (``job_env``), or None for a run without perseus; with them
    the ranks use the fake GPU, profile fast and write their clock logs under ``tmp/clocks``.
    ``env``: other variables for both kinds of run. ``loss_log``: pass ``--loss-log``.
    """

    def __init__(
        self,
        tmp: Path,
        example: str,
        ranks: int,
        *args: str,
        perseus: dict[str, str] | None,
        env: dict[str, str] | None = None,
        loss_log: bool = False,
    ) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.ranks = ranks
        self.logs = tmp / "clocks"
        self.output = tmp / "torchrun.log"
        self.losses = tmp / "losses.txt"
        full = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
        full.update(OMP_NUM_THREADS="1", **(env or {}))
        if perseus is not None:
            full.update(FAST_PROFILE)
            full.update(
                PERSEUS_GPU="fake", PERSEUS_CLOCK_LOG=str(self.logs), PERSEUS_POLL_WAIT_S="5"
            )
            full.update(perseus)
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            str(REPO / "examples" / example), *args,
        ]  # fmt: skip
        if loss_log:
            command += ["--loss-log", str(self.losses)]
        with self.output.open("wb") as out:
            self.process = subprocess.Popen(
                command, env=full, stdout=out, stderr=subprocess.STDOUT, cwd=REPO
            )

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def entries(self, rank: int) -> list[dict[str, Any]]:
        path = self.logs / f"rank{rank}.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written
                break
        return out

    def iterations(self, rank: int) -> int:
        entries = self.entries(rank)
        return 1 + entries[-1]["iteration"] if entries else 0

    def planned_iterations(self, rank: int, version: int | None = None) -> int:
        """Iterations run under a plan (under plan ``version`` if given)."""
        return len(
            {
                e["iteration"]
                for e in self.entries(rank)
                if e["plan_version"] is not None
                and (version is None or e["plan_version"] == version)
            }
        )

    def all_planned(self, iterations: int, version: int | None = None) -> bool:
        """Every rank has run ``iterations`` planned iterations (under ``version`` if given)."""
        return all(self.planned_iterations(r, version) >= iterations for r in range(self.ranks))

    def loss_lines(self) -> list[str]:
        """Complete lines of the loss log (a stopped run may leave half a line)."""
        text = self.losses.read_text() if self.losses.exists() else ""
        return text.splitlines()[: text.count("\n")]

    def wait(self, timeout_s: float) -> int:
        return self.process.wait(timeout_s)

    def finish(self, timeout_s: float) -> None:
        """The run ends on its own (``--steps``) within ``timeout_s``, and succeeds."""
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"training did not finish in {timeout_s} s:\n{self.text()[-4000:]}")
        assert code == 0, self.text()[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # torchrun stops its workers on SIGTERM
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float, launch: Launch) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        if launch.process.poll() is not None:
            pytest.fail(f"training exited while waiting for {what}:\n{launch.text()[-4000:]}")
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}:\n{launch.text()[-4000:]}")


def stop_after_planned(launch: Launch, iterations: int, timeout_s: float = 150) -> None:
    """Let every rank run ``iterations`` planned iterations, then SIGTERM the launcher."""
    wait_for(
        f"{iterations} planned iterations on every rank",
        lambda: launch.all_planned(iterations),
        timeout_s,
        launch,
    )
    launch.stop()


def check_log_follows(
    launch: Launch, rank: int, plans: dict[int, Plan], *, strict: bool = False
) -> int:
    """Every complete iteration run under a plan version equals that plan; returns how many.

    ``strict``: every planned iteration ran under one of ``plans`` and none was cut short.
    """
    by_iteration: dict[int, list[dict[str, Any]]] = {}
    measured = 0  # planned instructions whose clocks were checked
    measured_in: list[int] = []  # the iterations they ran in
    late_in: dict[int, list[Any]] = {}  # by iteration, its instructions off their clock
    first_of_version: dict[int, int] = {}
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
            assert not strict, f"rank {rank} iteration {iteration}: plan {version}"
            continue
        expected = [
            # chunk: null on the wire for schedules without chunks, 0 inside the rank
            (i["instruction"], i["microbatch"], i.get("chunk") or 0, i["frequency_mhz"])
            for i in plans[version]["instructions"]
        ]
        ran = [(e["instruction"], e["microbatch"], e["chunk"], e["frequency_mhz"]) for e in entries]
        if not strict and len(ran) < len(expected) and iteration == max(by_iteration):
            continue  # the last iteration may be cut short by a signal
        assert ran == expected, f"rank {rank} iteration {iteration} differs from plan {version}"
        # What really ran: the fake's latched clock at each instruction's start.
        # A change can be aimed only from inside the instruction before it: after one shorter
        # than the fake's delay plus the margin it lands late by design (counted apart).
        steps = plans[version]["instructions"]
        aimable = [
            (steps[k - 1].get("time_s") or 1.0) >= FAKE_DELAY_S + CLOCK_CHANGE_MARGIN_S
            for k in range(len(steps))
        ]
        checked += 1
        first = first_of_version.setdefault(version, iteration)
        if iteration < first + WARM_UP_ITERATIONS:
            # The rank aims changes from the intervals it measures under the plan; the first
            # iterations of a plan predict from its times alone.
            continue
        late = [
            (e["instruction"], e["microbatch"], e["chunk"], e["frequency_mhz"], e["ran_mhz"])
            for k, e in enumerate(entries)
            if e["ran_mhz"] != min(e["frequency_mhz"], THROTTLED_MHZ[e["instruction"]])
            and aimable[k]
        ]
        measured += len(entries)
        measured_in.append(iteration)
        if late:
            late_in[iteration] = late
    # A loaded 2-core host may now and then deschedule the clock thread past a boundary: a
    # handful in thousands, a burst within an iteration or two, or (a CI host 25 % slower than
    # usual) a few scattered over the run; a change requested too late, or aimed with a wrong
    # latency, misses at the same place in every iteration (CI saw one instruction of 16 at
    # the higher clock in all 12 on interleaved, 1 run in 4: a plan that changes clocks every
    # few milliseconds never had its latency measured and aimed with 30 ms).
    late_total = sum(len(late) for late in late_in.values())
    places = Counter((e[0], e[1], e[2]) for late in late_in.values() for e in late)
    systematic = {place: n for place, n in places.items() if n > max(2, len(measured_in) // 3)}
    assert (
        late_total <= max(2, measured // 200)
        or len(late_in) <= max(1, len(measured_in) // 6)
        or (not systematic and late_total <= max(2, measured // 25))
    ), (
        f"rank {rank}: {late_total} of {measured} planned instructions in "
        f"{len(late_in)} of {len(measured_in)} iterations did not start at their planned clock "
        f"(in most iterations: {systematic}): {late_in}"
    )
    return checked


def check_ranks_follow_plans(
    launch: Launch,
    server: LiveServer,
    job: str,
    token: str,
    *,
    reset: str,
    chunks: int = 1,
    strict: bool = False,
) -> None:
    """Each rank reset its clocks (``reset``: "SIGTERM", "exit") and followed its current plan
    for at least 3 iterations; with ``chunks`` > 1 the plan runs a second model chunk."""
    output = launch.text()
    for rank in range(launch.ranks):
        assert f"GPU {rank} clocks reset ({reset})" in output, output[-4000:]
        plan = plan_of(server, job, token, rank)
        if chunks > 1:
            assert any(i["chunk"] == 1 for i in plan["instructions"])
        followed = check_log_follows(launch, rank, {plan["version"]: plan}, strict=strict)
        assert followed >= 3, output[-4000:]


def check_realized_slowdown(server: LiveServer, job: str, token: str, limit: float) -> None:
    """The job view's median plan iteration is at most ``limit`` slower than its baseline,
    or than half the baseline's own p10-p90 spread where that is wider: gloo ranks on two
    shared cores spread their iterations by several percent (a baseline of 0.363-0.387 s
    seen in CI), and a 2.2 % "slowdown" inside that is noise; a change landing late costs
    every iteration more (8 % before the controller aimed ahead). Skipped while the server
    does not show the measured saving."""
    view = httpx.get(
        f"{server.url}/v1/jobs/{job}", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ).json()
    savings = view.get("savings")
    if not savings or savings.get("realized_slowdown") is None:
        return
    assert savings["baseline"]["iterations"] > 0 and savings["plan"]["iterations"] > 0
    baseline = savings["baseline"]
    spread = (baseline["time_p90_s"] - baseline["time_p10_s"]) / (2 * baseline["time_s"])
    assert savings["realized_slowdown"] <= max(limit, spread), savings
