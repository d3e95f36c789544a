"""The reporter thread: iteration telemetry once the planner knows the rank, the device has
passed the iteration and the meter has read past it (a bounded queue, dropped reports, a
planner that comes back), and the clock log, one JSON line per instruction, that a write
error stops without stopping the thread."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient

from perseus.client.api.client import PlannerClient
from perseus.client.clocks.boundary import LogEntry, Stamp
from perseus.client.reporter import Reporter
from perseus.client.settings import ClientSettings
from perseus.core.errors import JobStateError, PlannerUnavailable, RequestRejected
from perseus.schemas import (
    CLOCK_LATENCY_HEADER,
    CLOCK_LATENCY_PATH,
    ITERATIONS_PATH,
    RANKS_PATH,
    ClockLatencyAccepted,
    ClockLatencyReport,
    IterationAccepted,
    IterationPhase,
    IterationReport,
    ProfilingProgress,
    RankRegistered,
    RankRegistration,
)
from perseus.server.app import _validation_error
from perseus.wire.common import WireModel

from .clocks import ManualClock


class Meter:
    """Energy at 100 W from time 0 up to ``read_to_s``; ``failed`` as the meter's."""

    def __init__(self, read_to_s: float = 1e9) -> None:
        self.read_to_s = read_to_s
        self.failed: str | None = None

    def energy_between(self, start_s: float, end_s: float) -> float | None:
        return 100.0 * (end_s - start_s) if end_s <= self.read_to_s else None


class Planner:
    """Keeps the reports; raises the errors it is given, one per report, first."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.reports: list[IterationReport] = []
        self.sent = threading.Event()

    def report_iteration(self, body: IterationReport) -> None:
        if self.errors:
            raise self.errors.pop(0)
        self.reports.append(body)
        self.sent.set()


class Running:
    """A started reporter, its planner, meter and events."""

    def __init__(
        self, settings: ClientSettings, planner: Planner, meter: Meter, clock: ManualClock
    ) -> None:
        self.planner, self.meter, self.clock = planner, meter, clock
        self.registered, self.stop = threading.Event(), threading.Event()
        self.reporter = Reporter(
            settings,
            planner,  # type: ignore[arg-type]
            meter,  # type: ignore[arg-type]
            self.registered,
            self.stop,
            clock=clock,
        )

    def until(self, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, "timed out"
            self.reporter.wake()
            time.sleep(0.01)


@pytest.fixture
def running(request: pytest.FixtureRequest) -> Iterator[Running]:
    settings, planner, meter = getattr(
        request, "param", (ClientSettings(rank=3), Planner(), Meter())
    )
    run = Running(settings, planner, meter, ManualClock())
    run.reporter.start()
    yield run
    run.stop.set()
    run.reporter.wake()
    run.reporter.thread.join(5.0)
    assert not run.reporter.thread.is_alive()
    run.reporter.close()


def iteration(i: int, start_s: float | None, end_s: float | None) -> tuple[int, Stamp, Stamp]:
    return i, Stamp(start_s), Stamp(end_s)


# ----------------------------------------------------------------------------- telemetry


def test_a_report_waits_for_registration_and_the_devices_end(running: Running) -> None:
    start, end = Stamp(1.0), Stamp()
    running.reporter.queue_iteration(7, start, end, 2, "plan")
    running.reporter.wake()
    time.sleep(0.05)
    assert running.planner.reports == []  # not registered yet
    running.registered.set()
    running.reporter.wake()
    time.sleep(0.05)
    assert running.planner.reports == []  # the device has not reached the end
    end.at_s = 1.25
    running.until(running.planner.sent.is_set)
    (report,) = running.planner.reports
    assert report == IterationReport(
        rank=3, iteration=7, time_s=0.25, energy_j=25.0, plan_version=2,
        phase="plan",
    )  # fmt: skip


def test_a_report_waits_for_the_meter_and_is_dropped_when_it_never_reads_past(
    running: Running,
) -> None:
    running.meter.read_to_s = 1.0
    running.registered.set()
    running.reporter.queue_iteration(*iteration(0, 0.5, 1.5), None, "baseline")
    running.reporter.queue_iteration(*iteration(1, 0.0, 0.75), None, "baseline")
    running.clock.advance(1.6)  # just past the first's end: the meter may still catch up
    running.reporter.wake()
    time.sleep(0.05)
    assert running.planner.reports == []
    running.clock.advance(1.0)  # a second later: it will not
    running.until(running.planner.sent.is_set)
    assert [r.iteration for r in running.planner.reports] == [1]


@pytest.mark.parametrize(
    "running", [(ClientSettings(telemetry_queue=2), Planner(), Meter())], indirect=True
)
def test_the_queue_keeps_the_latest_reports(running: Running) -> None:
    for i in range(5):
        running.reporter.queue_iteration(*iteration(i, i, i + 0.5), 1, "plan")
    running.registered.set()
    running.until(lambda: len(running.planner.reports) == 2)
    assert [r.iteration for r in running.planner.reports] == [3, 4]


@pytest.mark.parametrize(
    "running",
    [(ClientSettings(), Planner(JobStateError("stale"), PlannerUnavailable("down")), Meter())],
    indirect=True,
)
def test_a_refused_report_is_dropped_and_an_outage_retried(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    running.registered.set()
    with caplog.at_level(logging.WARNING, logger="perseus.client"):
        running.reporter.queue_iteration(*iteration(0, 0.0, 1.0), 1, "plan")  # refused
        running.reporter.queue_iteration(*iteration(1, 1.0, 2.0), 1, "plan")  # down, then sent
        running.until(running.planner.sent.is_set)
    assert [r.iteration for r in running.planner.reports] == [1]
    messages = [r.getMessage() for r in caplog.records]
    assert any("planner unavailable (down)" in m for m in messages)
    assert any("planner reachable again" in m for m in messages)


# ----------------------------------------------------------------------------- the clock log


def entries() -> list[LogEntry]:
    return [LogEntry("forward", 0, 0, 1200, 1200), LogEntry("backward", 0, 1, None, None)]


def test_the_clock_log_has_a_line_per_instruction_once_the_fence_is_passed(
    tmp_path: Path,
) -> None:
    settings = ClientSettings(rank=2, clock_log_dir=str(tmp_path / "log"))
    run = Running(settings, Planner(), Meter(), ManualClock())
    reporter = run.reporter
    assert reporter.logs_clocks
    fence = Stamp()
    reporter.queue_log(4, 1, "plan", entries(), fence)
    reporter.queue_log(5, 1, "plan", entries()[:1], Stamp(9.0))  # after the one not passed
    reporter.start()
    path = tmp_path / "log" / "rank2.jsonl"
    time.sleep(0.05)
    reporter.wake()
    assert path.read_text() == ""  # the controller has not passed the fence
    fence.at_s = 8.0
    run.until(lambda: path.read_text().count("\n") == 3)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {
        "iteration": 4, "instruction": "forward", "microbatch": 0, "chunk": 0,
        "frequency_mhz": 1200, "ran_mhz": 1200, "plan_version": 1, "phase": "plan",
    }  # fmt: skip
    assert (lines[1]["instruction"], lines[1]["chunk"], lines[1]["ran_mhz"]) == (
        "backward",
        1,
        None,
    )
    assert lines[2]["iteration"] == 5
    run.stop.set()
    reporter.wake()
    reporter.thread.join(5.0)
    reporter.queue_log(6, None, "baseline", entries(), Stamp())  # closing writes what is left
    reporter.close()
    assert [json.loads(line)["iteration"] for line in path.read_text().splitlines()] == [
        4, 4, 5, 6, 6,
    ]  # fmt: skip


def test_without_a_folder_there_is_no_clock_log() -> None:
    run = Running(ClientSettings(), Planner(), Meter(), ManualClock())
    assert not run.reporter.logs_clocks
    run.reporter.queue_log(0, None, "baseline", entries(), Stamp(1.0))
    run.reporter.close()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_stops_the_clock_log_not_the_reporter(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "rank0.jsonl").symlink_to("/dev/full")  # every write: no space left
    planner = Planner()
    run = Running(ClientSettings(clock_log_dir=str(tmp_path)), planner, Meter(), ManualClock())
    with caplog.at_level(logging.ERROR, logger="perseus.client"):
        run.reporter.queue_log(0, None, "baseline", entries(), Stamp(1.0))
        run.reporter.start()
        run.until(lambda: not run.reporter.logs_clocks)
    assert any("cannot write the clock log" in r.getMessage() for r in caplog.records)
    run.registered.set()
    run.reporter.queue_iteration(*iteration(0, 0.0, 1.0), None, "baseline")
    run.until(planner.sent.is_set)  # telemetry goes on
    run.stop.set()
    run.reporter.wake()
    run.reporter.thread.join(5.0)
    run.reporter.close()


# ----------------------------------------------------------------------------- profiling progress


class OlderIterationReport(WireModel):
    """The iteration report of a planner from before the profiling progress."""

    rank: int
    iteration: int
    time_s: float
    energy_j: float
    plan_version: int | None = None
    phase: IterationPhase | None = None


def _older_planner() -> tuple[TestClient, list[dict[str, Any]]]:
    """A planner from before the profiling progress: its iteration report has no such field,
    so one that carries it is refused (422), as the real planner refuses an unknown field."""
    taken: list[dict[str, Any]] = []
    app = FastAPI()
    app.add_exception_handler(RequestValidationError, _validation_error)

    @app.post(ITERATIONS_PATH)
    def report(job_id: str, body: OlderIterationReport) -> IterationAccepted:
        taken.append(body.model_dump())
        return IterationAccepted(rank=body.rank, iteration=body.iteration, version=0)

    return TestClient(app), taken


def test_an_older_planner_gets_the_reports_without_the_profiling_progress(
    caplog: pytest.LogCaptureFixture,
) -> None:
    http, taken = _older_planner()
    planner = PlannerClient(http, "a" * 32, "token")
    run = Running(ClientSettings(rank=1), planner, Meter(), ManualClock())  # type: ignore[arg-type]
    progress = ProfilingProgress(clocks_done=2, clocks_planned=110, elapsed_s=6.5)
    run.reporter.start()
    try:
        with caplog.at_level(logging.INFO, logger="perseus.client"):
            run.registered.set()
            run.reporter.queue_iteration(*iteration(0, 0.0, 1.0), None, "profiling", progress)
            run.reporter.queue_iteration(*iteration(1, 1.0, 2.0), None, "profiling", progress)
            run.until(lambda: len(taken) == 2)
    finally:
        run.stop.set()
        run.reporter.wake()
        run.reporter.thread.join(5.0)
        run.reporter.close()
    assert [(t["iteration"], t["phase"]) for t in taken] == [(0, "profiling"), (1, "profiling")]
    refused = [r.getMessage() for r in caplog.records if "profiling progress" in r.getMessage()]
    assert len(refused) == 1 and "profiling" in refused[0]  # asked once, then not sent


def test_the_profiling_progress_travels_with_the_report(running: Running) -> None:
    progress = ProfilingProgress(clocks_done=2, clocks_planned=110, elapsed_s=6.5, budget_s=600.0)
    running.registered.set()
    running.reporter.queue_iteration(*iteration(0, 0.0, 1.0), None, "profiling", progress)
    running.until(running.planner.sent.is_set)
    assert running.planner.reports[0].profiling == progress


# ----------------------------------------------------------------------------- clock latency


def _planner_app(*, advertises: bool) -> tuple[TestClient, list[tuple[str, Any]]]:
    """A planner that takes registrations and iteration reports, and (``advertises``) the
    clock-change latency, saying so in its registration answer; without, a stand-in for a
    planner from before it: no header, and the route unknown (404). Every request it gets
    is kept, ``(path, body)``."""
    seen: list[tuple[str, Any]] = []
    app = FastAPI()
    app.add_exception_handler(RequestValidationError, _validation_error)

    @app.middleware("http")
    async def keep(request: Request, call_next: Any) -> Any:
        seen.append((request.url.path, json.loads(await request.body() or b"null")))
        return await call_next(request)

    @app.post(RANKS_PATH)
    def register(job_id: str, body: RankRegistration, response: Response) -> RankRegistered:
        if advertises:
            response.headers[CLOCK_LATENCY_HEADER] = "1"
        return RankRegistered(rank=body.rank, state="registering", ranks_registered=1)

    @app.post(ITERATIONS_PATH)
    def report(job_id: str, body: IterationReport) -> IterationAccepted:
        return IterationAccepted(rank=body.rank, iteration=body.iteration, version=0)

    if advertises:

        @app.post(CLOCK_LATENCY_PATH)
        def latency(job_id: str, body: ClockLatencyReport) -> ClockLatencyAccepted:
            return ClockLatencyAccepted(
                rank=body.rank, clock_change_delay_s=body.clock_change_latency_s, planning=False
            )

    return TestClient(app), seen


@pytest.mark.parametrize("advertises", [True, False], ids=["new-planner", "older-planner"])
def test_the_latency_goes_only_to_a_planner_that_says_it_takes_it(advertises: bool) -> None:
    http, seen = _planner_app(advertises=advertises)
    planner = PlannerClient(http, "a" * 32, "token")
    planner.register(
        RankRegistration(rank=1, stage=0, data_parallel_rank=0, tensor_parallel_rank=0,
                         gpu_name="fake", supported_clocks_mhz=[1500])
    )  # fmt: skip
    assert planner.takes_clock_latency is advertises
    run = Running(ClientSettings(rank=1), planner, Meter(), ManualClock())  # type: ignore[arg-type]
    run.reporter = Reporter(
        ClientSettings(rank=1), planner, Meter(), run.registered, run.stop,  # type: ignore[arg-type]
        clock=run.clock, latency=lambda: 0.05,
    )  # fmt: skip
    run.reporter.start()
    try:
        run.registered.set()
        run.reporter.queue_iteration(*iteration(0, 0.0, 1.0), None, "plan")
        run.until(lambda: any(path.endswith("/iterations") for path, _ in seen))
        run.reporter.queue_iteration(*iteration(1, 1.0, 2.0), None, "plan")
        run.until(lambda: sum(path.endswith("/iterations") for path, _ in seen) == 2)
    finally:
        run.stop.set()
        run.reporter.wake()
        run.reporter.thread.join(5.0)
        run.reporter.close()
    sent = [body for path, body in seen if path.endswith(":clock-latency")]
    if advertises:
        assert sent == [{"rank": 1, "clock_change_latency_s": 0.05}]
    else:
        assert sent == []  # an older planner hears nothing it does not know
    # No other request carries a field an older planner does not know.
    assert all("clock_change_latency_s" not in (body or {}) for path, body in seen
               if not path.endswith(":clock-latency"))  # fmt: skip


class LatencyPlanner(Planner):
    """Keeps the latencies reported; raises the errors it is given first."""

    takes_clock_latency = True

    def __init__(self, *errors: Exception) -> None:
        super().__init__()
        self.latency_errors = list(errors)
        self.latencies: list[float] = []

    def report_clock_latency(self, rank: int, latency_s: float) -> None:
        if self.latency_errors:
            raise self.latency_errors.pop(0)
        self.latencies.append(latency_s)


def _latency_run(planner: LatencyPlanner, measured: list[float | None]) -> Running:
    run = Running(ClientSettings(rank=2), planner, Meter(), ManualClock())
    run.reporter = Reporter(
        ClientSettings(rank=2), planner, Meter(), run.registered, run.stop,  # type: ignore[arg-type]
        clock=run.clock, latency=lambda: measured[0],
    )  # fmt: skip
    return run


def test_the_latency_is_reported_once_measured_and_again_when_it_grows() -> None:
    planner = LatencyPlanner(PlannerUnavailable("down"))
    measured: list[float | None] = [None]
    run = _latency_run(planner, measured)
    run.reporter.start()
    try:
        run.registered.set()
        for _ in range(5):  # nothing measured yet: nothing sent (the planner's setting holds)
            run.reporter.wake()
            time.sleep(0.01)
        assert planner.latencies == []
        measured[0] = 0.05
        run.until(lambda: planner.latencies == [0.05], timeout_s=20)  # after the outage
        measured[0] = 0.0545  # under 10 %: the planner has it near enough
        for _ in range(5):
            run.reporter.wake()
            time.sleep(0.01)
        measured[0] = 0.07
        run.until(lambda: planner.latencies == [0.05, 0.07])
    finally:
        run.stop.set()
        run.reporter.wake()
        run.reporter.thread.join(5.0)
        run.reporter.close()


def test_a_refused_latency_is_not_sent_again(caplog: pytest.LogCaptureFixture) -> None:
    planner = LatencyPlanner(RequestRejected("body.clock_change_latency_s: too large"))
    measured: list[float | None] = [1.5]
    run = _latency_run(planner, measured)
    run.reporter.start()
    try:
        with caplog.at_level(logging.INFO, logger="perseus.client"):
            run.registered.set()
            run.until(lambda: any("refused" in r.getMessage() for r in caplog.records))
            measured[0] = 0.05
            run.reporter.queue_iteration(*iteration(0, 0.0, 1.0), None, "plan")
            run.until(planner.sent.is_set)  # the telemetry goes on
    finally:
        run.stop.set()
        run.reporter.wake()
        run.reporter.thread.join(5.0)
        run.reporter.close()
    assert planner.latencies == []
