"""A cluster power budget end to end: three fake-GPU jobs of different shapes (1F1B,
interleaved 1F1B, zero-bubble ZBV with its split backward) train against one real planner
(``python -m perseus.server``).

The ranks read saved profiles of the fake GPU's own model (``PERSEUS_PROFILE``: no profiling),
so planning starts at once. Each rank is a thread that waits for its inputs from the other
ranks (the schedule's data dependencies), idle at the fake's blocking power meanwhile: without
those waits every rank ran back to back, busy all the time, and drew up to 23 % more than the
frontier's point, whose energy counts the pipeline's bubbles at blocking power.

A budget between the jobs' policy power and their least power moves them: the
predicted cluster power stays within it, the measured (the ranks' reported energy over
time) within 5 % of it, and the priority-weighted slowdown is within 1 % of an exact optimum
computed here by brute force over the frontiers fetched through the API. Lifting the budget
puts every job back at its policy, and the ranks follow.
"""

from __future__ import annotations

import itertools
import threading
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
from perseus.solver import Schedule, make_schedule
from perseus.solver.dag import build_dag

from .conftest import LiveServer

pytestmark = pytest.mark.slow

# (schedule, GPUs, virtual stages, priority)
JOBS = (("1f1b", 3, 1, 1.0), ("interleaved-1f1b", 2, 2, 2.0), ("zbv", 2, 2, 1.0))
MICROBATCHES = 4
CLOCKS_MHZ = (1800, 1650, 1500, 1350, 1200, 1050)
MODEL = FakeGpuModel(clock_change_delay_s=0.0)
P_BLOCK_W = MODEL.idle_power_w


def _saved_profile(path: Path, gpus: int, kinds: set[str]) -> Path:
    """The fake GPU's own model as a saved profile: the schedule's kinds of every GPU at
    CLOCKS_MHZ."""
    model = MODEL
    lines = ["stage,instruction,frequency,time,energy"]
    for gpu in range(gpus):
        for kind, work in default_work(gpu, gpus).items():
            if kind not in kinds:
                continue
            for f in CLOCKS_MHZ:
                lines.append(f"{gpu},{kind},{f},{model.time_s(work, f)!r},"
                             f"{model.energy_j(work, f)!r}")  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


class Pipeline:
    """A job's data dependencies between its ranks' threads, from the schedule's DAG: an
    instruction waits for its data predecessor on another GPU (of the same iteration) to
    finish, outside its bracket, so the fake GPU idles at its blocking power meanwhile, as a
    pipeline stage does while it waits for a peer's activations or gradients."""

    def __init__(self, schedule: Schedule) -> None:
        dag = build_dag(schedule)
        self.offsets = [int(o) for o in dag.offsets]
        self.inputs = [
            [int(p) for p in dag.pred[node] if p < dag.size and dag.gpu[p] != dag.gpu[node]]
            for node in range(dag.size)
        ]
        self.done = [0] * dag.size  # iterations each node has finished
        self.changed = threading.Condition()
        self.stopped = False

    def wait(self, node: int, iteration: int) -> None:
        with self.changed:
            self.changed.wait_for(
                lambda: self.stopped or all(self.done[p] > iteration for p in self.inputs[node])
            )

    def finish(self, node: int) -> None:
        with self.changed:
            self.done[node] += 1
            self.changed.notify_all()

    def stop(self) -> None:
        with self.changed:
            self.stopped = True
            self.changed.notify_all()


class Trainer:
    """One rank training in a thread: the schedule's instructions, the fake GPU's time, each
    waiting for its inputs from the other ranks (:class:`Pipeline`)."""

    def __init__(
        self, rank: Rank, order: list[tuple[str, int, int]], pipeline: Pipeline, gpu: int
    ) -> None:
        self.rank = rank
        self.order = order
        self.pipeline = pipeline
        self.first = pipeline.offsets[gpu]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._train, daemon=True)
        self.thread.start()

    def _train(self) -> None:
        iteration = 0
        while not self.stop.is_set():
            with self.rank.iteration():
                for k, (kind, microbatch, chunk) in enumerate(self.order):
                    self.pipeline.wait(self.first + k, iteration)
                    with self.rank.instruction(kind, microbatch, chunk):
                        pass
                    self.pipeline.finish(self.first + k)
            iteration += 1

    def close(self) -> None:
        self.stop.set()
        self.pipeline.stop()
        self.thread.join(30)
        self.rank.close()


def _get(http: httpx.Client, path: str, token: str | None = None) -> Any:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    r = http.get(path, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def _wait(
    what: str, done: Callable[[], bool], timeout_s: float, show: Callable[[], object]
) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {show()}"
        time.sleep(0.2)


def test_three_jobs_stay_under_a_budget_at_the_least_weighted_slowdown(
    live_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live_server()
    http = httpx.Client(base_url=server.url, timeout=30)
    jobs: list[tuple[str, str]] = []
    trainers: list[Trainer] = []
    try:
        for n, (schedule, gpus, virtual, priority) in enumerate(JOBS):
            body = {"name": schedule, "schedule": schedule, "stages": gpus,
                    "microbatches": MICROBATCHES, "virtual_stages": virtual, "data_parallel": 1,
                    "tensor_parallel": 1, "p_block_w": P_BLOCK_W, "priority": priority}  # fmt: skip
            r = http.post("/v1/jobs", json=body)
            assert r.status_code == 201, r.text
            job, token = r.json()["job_id"], r.json()["token"]
            jobs.append((job, token))
            made = make_schedule(schedule, gpus, MICROBATCHES, virtual)
            order = made.order
            pipeline = Pipeline(made)
            # A saved profile has backward rows in every case (a zero-bubble one its halves too).
            kinds = {str(i.kind) for sequence in order for i in sequence} | {"backward"}
            profile = _saved_profile(tmp_path / f"job{n}.csv", gpus, kinds)
            for gpu in range(gpus):
                settings = ClientSettings(
                    server=server.url, job=job, token=token, rank=gpu, stage=gpu,
                    data_parallel_rank=0, tensor_parallel_rank=0, gpu="fake",
                    profile_path=str(profile),
                    clock_log_dir=str(tmp_path / f"clocks{n}"),
                    poll_wait_s=1.0, baseline_iterations=2, fake_clock_delay_s=0.0,
                )  # fmt: skip
                rank = Rank(
                    settings,
                    gpu=FakeGpu(MODEL, work=default_work(gpu, gpus)),
                    planner=PlannerClient.open(server.url, job, token),
                )
                steps = [(str(i.kind), i.microbatch, i.chunk) for i in order[gpu]]
                trainers.append(Trainer(rank, steps, pipeline, gpu))

        def following(version_of: Callable[[str, str], int]) -> bool:
            return all(t.rank.plan_version == version_of(t.rank.settings.job or "", "")
                       for t in trainers)  # fmt: skip

        versions: dict[str, int] = {}

        def version(job: str, _: str) -> int:
            return versions[job]

        def planned() -> bool:
            for job, token in jobs:
                view = _get(http, f"/v1/jobs/{job}", token)
                if view["state"] != "ready":
                    return False
                versions[job] = view["version"]
            return following(version)

        def show() -> object:
            views = [_get(http, f"/v1/jobs/{job}", token) for job, token in jobs]
            ranks = [(t.rank.plan_version, t.rank.failure) for t in trainers]
            return [(v["state"], v["reason"], v["version"]) for v in views], ranks, versions

        _wait("every rank to follow its plan", planned, 180, show)

        # The frontiers, fetched through the API: each job's power at every point.
        candidates = []
        for job, token in jobs:
            frontier = _get(http, f"/v1/jobs/{job}/frontier", token)
            priority = _get(http, f"/v1/jobs/{job}", token).get("priority", 1.0)  # absent: 1
            times = [p["time_s"] for p in frontier["points"]]
            powers = [p["energy_j"] / p["time_s"] for p in frontier["points"]]  # 1 replica
            policy = frontier["policy_index"]
            candidates.append(
                [(priority * (times[k] / times[policy] - 1), powers[k])
                 for k in range(policy, len(times))]
            )  # fmt: skip
        policy_w = sum(c[0][1] for c in candidates)
        least_w = sum(min(p for _, p in c) for c in candidates)
        budget_w = least_w + 0.4 * (policy_w - least_w)
        optimum = min(
            sum(s for s, _ in combo)
            for combo in itertools.product(*candidates)
            if sum(p for _, p in combo) <= budget_w
        )

        r = http.put("/v1/cluster/budget", json={"power_w": budget_w})
        assert r.status_code == 200, r.text
        status = r.json()
        assert status["met"] is True and status["predicted_w"] <= budget_w * (1 + 1e-9)
        assert optimum - 1e-9 <= status["weighted_slowdown"] <= optimum * 1.01 + 1e-12
        moved = [s for s in status["jobs"] if s["slowdown"] > 0]
        assert moved, status

        _wait("every rank to follow the budget's plans", planned, 60, show)
        time.sleep(4.0)  # a full window of iterations under the new plans
        status = _get(http, "/v1/cluster/budget")
        assert status["measured_w"] is not None
        assert status["measured_w"] <= budget_w * 1.05, status
        assert status["predicted_w"] <= budget_w * (1 + 1e-9)
        assert all(s["counted"] == "plan" for s in status["jobs"])

        r = http.delete("/v1/cluster/budget")
        assert r.status_code == 200, r.text
        for job, token in jobs:
            frontier = _get(http, f"/v1/jobs/{job}/frontier", token)
            assert frontier["budget_index"] is None
            assert frontier["chosen_index"] == frontier["policy_index"]
        _wait("every rank back at its policy", planned, 60, show)
        assert _get(http, "/v1/cluster/budget")["weighted_slowdown"] == 0.0
        assert all(t.rank.failure is None for t in trainers), [t.rank.failure for t in trainers]
    finally:
        for trainer in trainers:  # every thread told first: none waits on a closed peer
            trainer.stop.set()
            trainer.pipeline.stop()
        for trainer in trainers:
            trainer.close()
        http.close()
