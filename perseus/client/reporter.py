"""The reporter thread: iteration telemetry to the planner, and the clock log.

The training thread only appends to two queues and wakes the thread; everything slow is
here. Telemetry waits until the planner knows the rank, the device has passed the
iteration's end and the meter has read past it; the queue is bounded, so while the planner
is down old reports are dropped, never the training thread blocked. The clock log goes to
``rank<N>.jsonl`` under ``PERSEUS_CLOCK_LOG``, one JSON line per instruction::

    {"iteration": 12, "instruction": "forward", "microbatch": 3, "chunk": 0,
     "frequency_mhz": 1200, "ran_mhz": 1200, "plan_version": 1, "phase": "plan"}

``instruction`` is the kind's name: ``forward``, ``backward``, and for schedules that split the
backward (zero-bubble) ``backward_input`` and ``backward_weight``. ``frequency_mhz`` is the
clock the plan asked for (null: the default), ``ran_mhz`` the clock
the instruction really started at (the fake GPU's latched clock, or the GPU's SM clock read
once the instruction started; null where not read). An iteration's lines are written once
the clock controller has passed them (its fence), so ``ran_mhz`` is known. A write error
stops the log, not the thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO

from perseus.client.api.client import PlannerClient
from perseus.client.api.retry import Backoff
from perseus.client.clocks.controller import LogEntry, Stamp
from perseus.client.gpu.meter import EnergyMeter
from perseus.client.session import Outage
from perseus.client.settings import ClientSettings
from perseus.core.errors import PerseusError, PlannerUnavailable, RequestRejected
from perseus.schemas import IterationPhase, IterationReport, ProfilingProgress

__all__ = ["LATENCY_STEP", "LATENCY_STEP_S", "Reporter"]

_log = logging.getLogger("perseus.client")

LATENCY_STEP_S = 0.001
LATENCY_STEP = 0.1
"""A measured clock-change latency is reported again once it grew by more than both of these
(1 ms and 10 % of the one reported): the planner keeps each rank's largest, and replans only
for a material growth."""


class Reporter:
    """Runs the reporter thread of one rank.

    Args:
        settings: The rank's settings (its rank number and clock log folder).
        planner: Where the reports go.
        meter: The energy meter the reports read.
        registered: Set once the planner knows the rank; reports wait for it.
        stop: Set when the rank closes.
        clock: The clock of the meter and the boundary stamps.
        latency: The GPU's measured clock-change latency, in seconds (None while not
            measured): reported to a planner that takes it, when first measured and
            whenever it grows by more than :data:`LATENCY_STEP_S` or :data:`LATENCY_STEP`.
    """

    def __init__(
        self,
        settings: ClientSettings,
        planner: PlannerClient,
        meter: EnergyMeter,
        registered: threading.Event,
        stop: threading.Event,
        *,
        clock: Callable[[], float],
        latency: Callable[[], float | None] | None = None,
    ) -> None:
        self._rank = settings.rank
        self._latency = latency
        self._latency_sent: float | None = None  # the latency the planner has
        self._latency_off = False  # the planner refused a report: none is sent again
        self._planner = planner
        self._meter = meter
        self._registered = registered
        self._stop = stop
        self._clock = clock
        self._reports: deque[
            tuple[int, Stamp, Stamp, int | None, IterationPhase, ProfilingProgress | None]
        ] = deque(maxlen=settings.telemetry_queue)
        # False once a planner refused the profiling progress (an older one): not sent again.
        self._send_progress = True
        self._logs: deque[tuple[int, int | None, IterationPhase, list[LogEntry], Stamp]] = deque()
        self._log_lock = threading.Lock()
        self._log_file: IO[str] | None = None
        if settings.clock_log_dir:
            os.makedirs(settings.clock_log_dir, exist_ok=True)
            path = os.path.join(settings.clock_log_dir, f"rank{settings.rank}.jsonl")
            self._log_file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perseus-report", daemon=True)

    @property
    def thread(self) -> threading.Thread:
        """The reporter thread."""
        return self._thread

    @property
    def logs_clocks(self) -> bool:
        """Whether the clock log is being written (False once a write failed)."""
        return self._log_file is not None

    def start(self) -> None:
        """Start the reporter thread."""
        self._thread.start()

    # ------------------------------------------------------------------ training thread

    def queue_iteration(
        self,
        iteration: int,
        start: Stamp,
        end: Stamp,
        plan_version: int | None,
        phase: IterationPhase,
        progress: ProfilingProgress | None = None,
    ) -> None:
        """Queue one iteration's telemetry (the oldest is dropped when the queue is full);
        ``progress``: how far the clock sweep got, while profiling."""
        self._reports.append((iteration, start, end, plan_version, phase, progress))

    def queue_log(
        self,
        iteration: int,
        plan_version: int | None,
        phase: IterationPhase,
        entries: list[LogEntry],
        fence: Stamp,
    ) -> None:
        """Queue one iteration's clock log entries, written once ``fence`` is reached."""
        self._logs.append((iteration, plan_version, phase, entries, fence))

    def wake(self) -> None:
        """Let the thread look at its queues now."""
        self._wake.set()

    def close(self) -> None:
        """Write what is queued and close the clock log (after the thread was joined)."""
        self._drain_logs(final=True)
        with self._log_lock:
            if self._log_file is not None:
                with contextlib.suppress(OSError):  # reported by _write_logs already
                    self._log_file.close()

    # ------------------------------------------------------------------ reporter thread

    def _run(self) -> None:
        rng = random.Random()
        backoff = Backoff()
        outage = Outage()
        attempt = 0
        retry_at = 0.0
        while True:
            self._wake.wait(0.5)
            self._wake.clear()
            self._drain_logs()
            if self._stop.is_set():
                return
            if not self._registered.is_set() or time.monotonic() < retry_at:
                continue
            try:
                self._report_latency()
            except PlannerUnavailable as err:
                outage.failed(err)
                retry_at = time.monotonic() + backoff.delay_s(attempt, rng)
                attempt += 1
                continue
            while self._reports and not self._stop.is_set():
                iteration, start_stamp, end_stamp, version, phase, progress = self._reports[0]
                start, end = start_stamp.at_s, end_stamp.at_s
                if start is None or end is None:
                    break  # the device has not reached the iteration's end yet
                energy = self._meter.energy_between(start, end)
                if energy is None:
                    if self._clock() - end < 1.0 and self._meter.failed is None:
                        break  # the meter has not read past the end yet
                    self._reports.popleft()
                    continue
                report = IterationReport(
                    rank=self._rank,
                    iteration=iteration,
                    time_s=max(end - start, 1e-6),
                    energy_j=max(energy, 0.0),
                    plan_version=version,
                    phase=phase,
                    profiling=progress if self._send_progress else None,
                )
                try:
                    self._report(report)
                except PlannerUnavailable as err:
                    outage.failed(err)
                    retry_at = time.monotonic() + backoff.delay_s(attempt, rng)
                    attempt += 1
                    break
                except PerseusError as err:
                    _log.debug("perseus: iteration report refused: %s", err)
                self._reports.popleft()
                outage.ok()
                attempt = 0

    def _report_latency(self) -> None:
        """Report the measured clock-change latency if it is new to the planner.

        Only to a planner whose registration answer said it takes one (an older planner
        refuses the route); nothing while none is measured (the planner plans for its own
        setting meanwhile). A refusal stops the reports, never the thread.

        Raises:
            PlannerUnavailable: The planner is down (tried again later).
        """
        if self._latency is None or self._latency_off or not self._planner.takes_clock_latency:
            return
        measured = self._latency()
        sent = self._latency_sent
        if measured is None or (
            sent is not None and measured <= sent + max(LATENCY_STEP_S, LATENCY_STEP * sent)
        ):
            return
        try:
            self._planner.report_clock_latency(self._rank, measured)
        except PlannerUnavailable:
            raise
        except PerseusError as err:
            self._latency_off = True
            _log.info("perseus: the planner refused the clock-change latency (%s); not sent", err)
            return
        self._latency_sent = measured
        _log.info("perseus: clock-change latency %.1f ms reported to the planner", 1e3 * measured)

    def _report(self, report: IterationReport) -> None:
        """Send ``report``; a planner that refuses its profiling progress (an older one, which
        knows no such field) gets it again without, and no progress from then on."""
        try:
            self._planner.report_iteration(report)
        except RequestRejected as err:
            if report.profiling is None or "profiling" not in str(err):
                raise
            self._send_progress = False
            _log.info("perseus: the planner takes no profiling progress (%s); not sent", err)
            self._planner.report_iteration(report.model_copy(update={"profiling": None}))

    def _drain_logs(self, *, final: bool = False) -> None:
        with self._log_lock:
            self._write_logs(final)

    def _write_logs(self, final: bool) -> None:
        if self._log_file is None or self._log_file.closed:
            self._logs.clear()
            return
        wrote = False
        while self._logs:
            iteration, version, phase, entries, fence = self._logs[0]
            if fence.at_s is None and not final:
                break  # the controller has not read every clock of it yet
            self._logs.popleft()
            lines = [
                json.dumps(
                    {
                        "iteration": iteration,
                        "instruction": str(e.kind),
                        "microbatch": e.microbatch,
                        "chunk": e.chunk,
                        "frequency_mhz": e.frequency_mhz,
                        "ran_mhz": e.ran_mhz,
                        "plan_version": version,
                        "phase": phase,
                    }
                )
                for e in entries
            ]
            try:
                self._log_file.write("\n".join(lines) + "\n")
            except OSError as err:
                self._stop_logging(err)
                return
            wrote = True
        if wrote:
            try:
                self._log_file.flush()
            except OSError as err:
                self._stop_logging(err)

    def _stop_logging(self, err: OSError) -> None:
        # A full disk must not kill the reporter thread (and its telemetry) nor fail close().
        file = self._log_file
        _log.error(
            "perseus: cannot write the clock log %s (%s); clock logging stops",
            getattr(file, "name", "?"),
            err,
        )
        self._log_file = None
        self._logs.clear()
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()
