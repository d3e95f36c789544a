"""A scripted planner for rank tests: serves one given plan and records what the rank sends.

An ``httpx.MockTransport`` handler answering the session and reporter threads the way the
planner server would (job, registration, profile, the plan, long polls, iteration reports),
for tests that need a plan the real planner would not choose (one that changes the clock at
every instruction).
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from perseus.client.api.client import PlannerClient
from perseus.schemas import (
    IterationAccepted,
    IterationReport,
    JobCounts,
    JobCreate,
    JobView,
    NoSlowdownPolicy,
    PlanResponse,
    ProfileAccepted,
    RankRegistered,
)

JOB = "scripted"
SERVER = "http://planner.test"
EXAMPLE_PROFILE = Path(__file__).parents[2] / "perseus" / "data" / "example_profile.csv"


class ScriptedPlanner:
    """Serves ``plan`` to rank 0 of a one-stage job and keeps the iteration reports."""

    def __init__(self, plan: PlanResponse, microbatches: int) -> None:
        self.released = threading.Event()
        self.reports: list[IterationReport] = []
        spec = JobCreate(
            schedule="1f1b", stages=1, microbatches=microbatches, data_parallel=1, tensor_parallel=1
        )
        self._job = JobView(
            job_id=JOB,
            name=None,
            state="ready",
            reason=None,
            spec=spec,
            policy=NoSlowdownPolicy(kind="no-slowdown"),
            straggler=None,
            version=plan.version,
            counts=JobCounts(
                ranks_expected=1,
                ranks_registered=1,
                profiles_reported=1,
                stages_profiled=1,
                iterations_reported=0,
            ),
            frontier_points=None,
            planning_s=None,
            chosen=None,
            telemetry=None,
        ).model_dump_json()
        self._plan = plan.model_dump_json()

    def client(self) -> PlannerClient:
        http = httpx.Client(base_url=SERVER, transport=httpx.MockTransport(self.handle))
        return PlannerClient(http, JOB, "t")

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix(f"/v1/jobs/{JOB}")
        if request.method == "GET" and path == "":
            return httpx.Response(200, text=self._job)
        if request.method == "POST" and path == "/ranks":
            body = RankRegistered(rank=0, state="profiling", ranks_registered=1)
            return httpx.Response(200, text=body.model_dump_json())
        if request.method == "POST" and path == "/profiles":
            accepted = ProfileAccepted(rank=0, state="ready", profiles_reported=1, planning=False)
            return httpx.Response(200, text=accepted.model_dump_json())
        if request.method == "GET" and path == "/plan":
            if "If-None-Match" not in request.headers:
                return httpx.Response(200, text=self._plan, headers={"ETag": '"1"'})
            self.released.wait(min(float(request.url.params.get("wait_s", "0")), 1.0))
            return httpx.Response(304)
        if request.method == "POST" and path == "/iterations":
            report = IterationReport.model_validate_json(request.content)
            self.reports.append(report)
            body3 = IterationAccepted(rank=0, iteration=report.iteration, version=1)
            return httpx.Response(200, text=body3.model_dump_json())
        return httpx.Response(404, json={"detail": "no such route", "error": "JobNotFound"})
