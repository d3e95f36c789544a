"""A rank's measured clock-change latency, end to end: two fake-GPU ranks whose clock changes
take 60 ms train against a real planner (``python -m perseus.server``, planning for its
default 30 ms). Following the first plan, their clock controllers measure the latency and
report it; the planner plans the job again for it, and the ranks follow the new plan, in
which no run of one clock is shorter than its changes need at that latency."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from perseus.client.api.client import PlannerClient
from perseus.client.gpu.fake import FakeGpu, default_work
from perseus.client.gpu.fake_model import FakeGpuModel
from perseus.client.rank import Rank
from perseus.client.settings import ClientSettings
from perseus.core.defaults import CLOCK_CHANGE_DELAY_S
from perseus.solver import make_schedule

from .conftest import LiveServer
from .test_cluster_budget import P_BLOCK_W, Pipeline, Trainer, _saved_profile

pytestmark = pytest.mark.slow

DELAY_S = 0.06
"""The fake GPUs' clock-change delay: materially above the planner's default."""
GPUS = 2
MICROBATCHES = 4


def _runs_too_short(gpus: list[list[dict]], total: float, margin: float, delay: float) -> int:
    """Runs of one clock, on the timeline view's replayed starts, shorter than the delay
    their changes need (as tests/server/test_clock_change_delay.py counts them)."""
    short = 0
    for row in gpus:
        clocks = [i["frequency_mhz"] for i in row]
        starts = [i["start_s"] for i in row]
        firsts = [k for k in range(len(row)) if clocks[k] != clocks[k - 1]]
        for j, k in enumerate(firsts):
            nxt = firsts[(j + 1) % len(firsts)]
            span = (starts[nxt] if nxt > k else starts[nxt] + total) - starts[k]
            into = -1 if clocks[k] > clocks[k - 1] else 1
            out = -1 if clocks[nxt] > clocks[nxt - 1] else 1
            short += span < (delay + margin * (into - out)) * (1 - 1e-9)
    return short


def test_ranks_report_their_latency_and_the_job_is_planned_for_it(
    live_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    assert DELAY_S > 1.2 * CLOCK_CHANGE_DELAY_S + 0.005  # what makes the planner replan
    server = live_server()
    http = httpx.Client(base_url=server.url, timeout=30)
    body = {"schedule": "1f1b", "stages": GPUS, "microbatches": MICROBATCHES,
            "data_parallel": 1, "tensor_parallel": 1, "p_block_w": P_BLOCK_W}  # fmt: skip
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    job, token = r.json()["job_id"], r.json()["token"]
    auth = {"Authorization": f"Bearer {token}"}
    schedule = make_schedule("1f1b", GPUS, MICROBATCHES)
    pipeline = Pipeline(schedule)
    profile = _saved_profile(tmp_path / "profile.csv", GPUS, {"forward", "backward"})
    model = FakeGpuModel(clock_change_delay_s=DELAY_S)
    trainers: list[Trainer] = []

    def get(path: str) -> Any:
        r = http.get(path, headers=auth)
        assert r.status_code == 200, r.text
        return r.json()

    try:
        for gpu in range(GPUS):
            settings = ClientSettings(
                server=server.url, job=job, token=token, rank=gpu, stage=gpu,
                data_parallel_rank=0, tensor_parallel_rank=0, gpu="fake",
                profile_path=str(profile), poll_wait_s=1.0, baseline_iterations=2,
            )  # fmt: skip
            rank = Rank(
                settings,
                gpu=FakeGpu(model, work=default_work(gpu, GPUS)),
                planner=PlannerClient.open(server.url, job, token),
            )
            steps = [(str(i.kind), i.microbatch, i.chunk) for i in schedule.order[gpu]]
            trainers.append(Trainer(rank, steps, pipeline, gpu))

        def show() -> object:
            view = get(f"/v1/jobs/{job}")
            ranks = [(t.rank.plan_version, t.rank.failure, t.rank.controller and
                      t.rank.controller.latency.samples) for t in trainers]  # fmt: skip
            return view["state"], view["reason"], view["version"], ranks

        def replanned() -> bool:
            view = get(f"/v1/jobs/{job}")
            if view["state"] != "ready":
                return False
            frontier = get(f"/v1/jobs/{job}/frontier")
            return frontier["clock_change_delay_rank"] is not None and all(
                t.rank.plan_version == view["version"] for t in trainers
            )

        deadline = time.monotonic() + 240
        while not replanned():
            assert time.monotonic() < deadline, f"timed out waiting for the replan: {show()}"
            time.sleep(0.5)

        frontier = get(f"/v1/jobs/{job}/frontier")
        delay_s = frontier["clock_change_delay_s"]
        # Measured: past the fake's delay (a read sees a change once it landed), by a few
        # reads and the controller thread's wake-ups on a busy host.
        assert DELAY_S <= delay_s < DELAY_S + 0.03, frontier
        assert frontier["clock_change_delay_rank"] in range(GPUS)
        assert frontier["version"] >= 2  # the first plan was for the server's setting
        timeline = get(f"/v1/jobs/{job}/timeline")
        assert timeline["clock_change_delay_s"] == delay_s
        margin = timeline["clock_change_margin_s"]
        assert _runs_too_short(timeline["gpus"], timeline["time_s"], margin, delay_s) == 0
        assert all(t.rank.failure is None for t in trainers), [t.rank.failure for t in trainers]
    finally:
        for trainer in trainers:  # every thread told first: none waits on a closed peer
            trainer.stop.set()
            trainer.pipeline.stop()
        for trainer in trainers:
            trainer.close()
        http.close()
