"""Online profiling: a rank measures its own stage, between training iterations.

A state machine (:class:`ProfilingState`) stepped by the training thread at each iteration
boundary from the second iteration on (the first one captures a real microbatch for the
profiling loops)::

    PENDING --start--> SWEEPING --sweep done, calibrated--> DONE
       |                  |
       +------------------+--> FAILED   (nothing to profile, an error, or perseus gave up)

    SAVED   a saved profile (PERSEUS_PROFILE) is uploaded instead; OFF: perseus is off

Starting measures the blocking power (a collective every rank joins) and the loops at the
clock the GPU picks by itself; then :class:`~perseus.client.profiler.ClockSweep` measures one
clock per boundary while training goes on between clocks. While SWEEPING, a
:class:`StreamSampler` stamps the training stream's own instructions, so that the loop times
can be scaled to what the stream really takes. The finished profile goes to the session
thread for upload.
"""

from __future__ import annotations

import enum
import logging
import statistics
import time
from collections.abc import Callable

from perseus.client.controller import ClockController, Stamp
from perseus.client.gpu import GpuControl
from perseus.client.meter import EnergyMeter
from perseus.client.profiler import (
    ClockMeasurement,
    ClockSweep,
    StageProfile,
    Workload,
    calibrated,
    device_work,
    measure_idle_power,
)
from perseus.client.state import RankState
from perseus.client.torch_env import distributed
from perseus.schemas import ProfileRow

__all__ = ["OnlineProfiling", "ProfilingState", "StreamSampler", "WorkloadSource"]

_log = logging.getLogger("perseus.client")

MIN_STREAM_SAMPLES = 5
"""In-stream samples per kind needed to calibrate."""
MAX_STREAM_SAMPLES = 256
CALIBRATION_ITERATIONS = 3
"""Iterations a finished sweep waits for in-stream samples before it reports uncalibrated."""

WorkloadSource = Workload | Callable[[], Workload | None] | None
"""A workload, or a callable returning it once the first iteration has run."""


class ProfilingState(enum.Enum):
    """Where a rank's profile comes from, and how far it got."""

    OFF = "off"
    """Perseus is off on this rank."""
    SAVED = "saved"
    """A saved profile (``PERSEUS_PROFILE``) is uploaded; nothing is measured."""
    PENDING = "pending"
    """Waits for the second iteration to start."""
    SWEEPING = "sweeping"
    """Measures one clock per iteration boundary."""
    DONE = "done"
    """Measured and handed over for upload."""
    FAILED = "failed"
    """Stopped; training goes on at default clocks."""


class StreamSampler:
    """Device stamps around the training stream's instructions while the sweep runs.

    The training thread calls :meth:`begin`/:meth:`end` around each instruction and
    :meth:`iteration_done` at each iteration's end. Bounded: at most
    :data:`MAX_STREAM_SAMPLES` per kind.
    """

    __slots__ = ("_mark", "_start", "iterations", "samples")

    def __init__(self, mark: Callable[[], Stamp]) -> None:
        self._mark = mark
        self._start: tuple[str, Stamp] | None = None
        self.samples: dict[str, list[tuple[Stamp, Stamp]]] = {}
        self.iterations = 0

    def begin(self, kind: str) -> None:
        """An instruction of ``kind`` starts."""
        self._start = (kind, self._mark())

    def end(self) -> None:
        """The instruction begun last ends."""
        if self._start is not None:
            kind, start = self._start
            samples = self.samples.setdefault(kind, [])
            if len(samples) < MAX_STREAM_SAMPLES:
                samples.append((start, self._mark()))
            self._start = None

    def iteration_done(self) -> None:
        """An iteration under calibration ended."""
        self.iterations += 1
        if self.iterations == 1:
            # The first iteration under calibration still warms up (allocator, kernel
            # autotuning) and runs slower than the rest: its times would inflate the ratio.
            self.samples.clear()


class OnlineProfiling:
    """Online profiling of one rank; every method runs on the training thread.

    Args:
        state: The rank's shared state (settings, scale, failure).
        gpu: The rank's GPU.
        meter: Its energy meter.
        controller: Its clock controller (reset when profiling stops, stamps for calibration).
        workload: What to profile (:data:`WorkloadSource`).
        report: Takes the finished rows and blocking power (the session thread uploads them).
        initial: :attr:`ProfilingState.PENDING`, or ``SAVED``/``OFF`` when nothing is measured.
        clock: The meter's clock.
    """

    def __init__(
        self,
        state: RankState,
        gpu: GpuControl,
        meter: EnergyMeter,
        controller: ClockController,
        workload: WorkloadSource,
        report: Callable[[list[ProfileRow], float | None], None],
        *,
        initial: ProfilingState,
        clock: Callable[[], float],
    ) -> None:
        self._rank = state
        self._gpu = gpu
        self._meter = meter
        self._controller = controller
        self.workload = workload
        self._report = report
        self._clock = clock
        self.state = initial
        self.profile: StageProfile | None = None
        self.p_block_w: float | None = None
        self.sampler: StreamSampler | None = None
        """Set while SWEEPING: the training thread stamps its instructions into it."""
        self._sweep: ClockSweep | None = None
        self._reference: ClockMeasurement | None = None
        self._calibration_waits = 0

    def step(self) -> None:
        """One step between iterations (PENDING or SWEEPING only); never raises."""
        if self.state is not ProfilingState.PENDING and self.state is not ProfilingState.SWEEPING:
            return
        try:
            if self.state is ProfilingState.SWEEPING and self._rank.failure is not None:
                # perseus gave up meanwhile (the planner refused this rank, say): training goes
                # on at default clocks, so the sweep stops lowering them
                self._stop(ProfilingState.FAILED)
                self._controller.reset()
                return
            if self.state is ProfilingState.PENDING:
                self._start()
            if self._sweep is not None:
                measured = self._sweep.step()
                if measured is not None:
                    _log.debug(
                        "perseus: %d MHz: forward %.4f s %.3f J, backward %.4f s %.3f J",
                        measured.frequency_mhz,
                        measured.forward_time_s,
                        measured.forward_energy_j,
                        measured.backward_time_s,
                        measured.backward_energy_j,
                    )
                if self._sweep.done and self._calibration_ready():
                    self._finish(self._sweep.result())
        except Exception as err:  # profiling must never take training down
            self._stop(ProfilingState.FAILED)
            self._controller.reset("profiling failed")
            self._rank.give_up(f"online profiling failed: {type(err).__name__}: {err}")

    def _stop(self, state: ProfilingState) -> None:
        self.state = state
        self._sweep = None
        self.sampler = None

    def _start(self) -> None:
        workload = self.workload
        if workload is not None and not hasattr(workload, "forward"):
            workload = workload()
        # Every rank takes part in the blocking-power collective, even one that has given
        # up: a rank that skipped it would leave its peers waiting in the barrier.
        self.p_block_w = self._measure_blocking_power()
        if self._rank.failure is not None:
            self.state = ProfilingState.FAILED
            return
        if workload is None:
            self.state = ProfilingState.FAILED
            self._rank.give_up(
                "nothing to profile: instrument a framework "
                "(perseus.client.integrations.torch_pipelining) "
                "or pass a workload or a saved profile (PERSEUS_PROFILE)"
            )
            return
        lock = self._gpu.can_set_clocks
        settings = self._rank.settings
        sweep = ClockSweep(
            self._gpu,
            self._meter,
            workload,  # type: ignore[arg-type]
            settings.budget,
            device_work(self._gpu),
            clock=self._clock,
            lock=lock,
        )
        _log.warning(
            "perseus: rank %d profiling %d clocks (%d-%d MHz) online: %s%s",
            settings.rank,
            len(sweep.clocks),
            sweep.clocks[-1],
            sweep.clocks[0],
            settings.budget.describe(),
            "" if lock else "; this GPU's clocks may not be changed: only the current clock",
        )
        # The reference for the in-stream calibration: the loops at the clock the GPU picks
        # by itself, the clock the training iterations during the sweep run at.
        self._reference = sweep.measure_unlocked() if lock else None
        self._sweep = sweep
        self.state = ProfilingState.SWEEPING
        self.sampler = StreamSampler(self._controller.mark)

    def _finish(self, profile: StageProfile) -> None:
        sampler = self.sampler
        self._stop(ProfilingState.DONE)
        rank = self._rank.settings.rank
        reference = self._reference or (profile.measurements[0] if profile.measurements else None)
        ratios = (
            self._stream_ratios(sampler, reference)
            if reference is not None and sampler is not None
            else {}
        )
        if ratios:
            _log.warning(
                "perseus: rank %d in the training stream: forward x%.3f, backward x%.3f of the "
                "loop times at the default clock; profile scaled",
                rank,
                ratios["forward"],
                ratios["backward"],
            )
            profile = calibrated(profile, ratios)
        self.profile = profile
        _log.warning(
            "perseus: rank %d profiled %d clocks (%s); blocking power %s",
            rank,
            len(profile.measurements),
            profile.stopped,
            "unknown" if self.p_block_w is None else f"{self.p_block_w:.1f} W",
        )
        if len(profile.measurements) == 0:
            self._rank.give_up("online profiling measured nothing")
            return
        for inverted in profile.inversions():
            # reported all the same: the planner has nothing better, and the operator is told
            _log.warning(
                "perseus: rank %d: %s; a lower clock never runs faster, so the measurement was "
                "disturbed (another process on this GPU?)",
                rank,
                inverted,
            )
        self._report(profile.rows(), self.p_block_w)

    def _calibration_ready(self) -> bool:
        """True once each kind has enough in-stream samples, or after a few more iterations.

        A short sweep (one clock on a GPU whose clocks may not change) ends before training
        ran any instruction under calibration; up to three more iterations give it some.
        """
        samples = self.sampler.samples if self.sampler is not None else {}
        if all(len(samples.get(k, ())) >= MIN_STREAM_SAMPLES for k in ("forward", "backward")):
            return True
        self._calibration_waits += 1
        return self._calibration_waits > CALIBRATION_ITERATIONS

    def _stream_ratios(
        self, sampler: StreamSampler, reference: ClockMeasurement
    ) -> dict[str, float]:
        """In-stream over loop time per kind, at the default clock; {} without enough data.

        Each instruction run during the sweep's training iterations was bracketed by two
        device stamps (:meth:`ClockController.mark`); a chunk of an interleaved stage costs
        its share of the stage.
        """
        scale = self._rank.scale
        loop = {
            "forward": reference.forward_time_s * scale,
            "backward": reference.backward_time_s * scale,
        }
        ratios: dict[str, float] = {}
        for kind, samples in sampler.samples.items():
            durations = [
                end.at_s - start.at_s
                for start, end in samples
                if start.at_s is not None and end.at_s is not None
            ]
            if len(durations) < MIN_STREAM_SAMPLES:
                return {}
            ratio = statistics.median(durations) / loop[kind]
            # Outside this range the stream is not what the loops measured (a different
            # workload, a rank waiting inside its instructions): leave the profile alone.
            if not 0.5 <= ratio <= 2.0:
                _log.warning(
                    "perseus: rank %d %s takes %.2f x its loop time in the stream; not calibrating",
                    self._rank.settings.rank,
                    kind,
                    ratio,
                )
                return {}
            ratios[kind] = ratio
        return ratios if len(ratios) == 2 else {}

    def _measure_blocking_power(self) -> float | None:
        """Power while this rank waits on its peers in a real collective.

        Every rank of the default process group takes part (they all reach this iteration
        boundary): in round ``r`` rank ``r`` holds the others up for ``blocking_s`` while
        they wait in a barrier, so each waiting rank's GPU draws what it draws blocked in
        communication. Two rounds let every rank be measured. Without a process group the
        rank measures its GPU idle (a sleep), which is the blocking power of the fake GPU
        and a lower bound on a real one.
        """
        seconds = self._rank.settings.budget.blocking_s
        dist = distributed()
        if dist is None:
            return measure_idle_power(self._meter, time.sleep, seconds, self._clock)
        me = dist.get_rank()
        readings: list[float] = []
        for holder in range(min(2, dist.get_world_size())):
            dist.barrier()
            if me == holder:
                time.sleep(seconds)
                dist.barrier()
            else:
                reading = measure_idle_power(
                    self._meter, lambda _s: dist.barrier(), seconds, self._clock
                )
                if reading is not None:
                    readings.append(reading)
        return sum(readings) / len(readings) if readings else None
