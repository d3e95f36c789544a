"""Online profiling: a rank measures its own stage, between training iterations.

A state machine (:class:`ProfilingState`) stepped by the training thread at each iteration
boundary from the second iteration on (the first one captures a real microbatch for the
profiling loops)::

    PENDING --start--> SWEEPING --sweep done, calibrated--> DONE
       |                  |
       +------------------+--> FAILED   (nothing to profile, an error, or perseus gave up)

    SAVED   a saved profile (PERSEUS_PROFILE) is uploaded instead; OFF: perseus is off

Starting measures the blocking power (a collective every rank joins) and the loops at the
clock the GPU picks by itself; then :class:`~perseus.client.profiling.profiler.ClockSweep` measures
one
clock per boundary while training goes on between clocks (with the backward's halves when the
workload's schedule splits it: :func:`~perseus.client.profiling.profiler.splits_backward`). While
SWEEPING, a
:class:`~perseus.client.profiling.stream_sampling.StreamSampler` stamps the training stream's own
instructions, so that the loop times can be scaled to what the stream really takes. The
finished profile goes to the session thread for upload.

Calibrating the blocking power with the training stream. The power measured in a long
collective wait is what an idle GPU draws; the short waits inside a pipeline draw far more on a
real GPU (BACKGROUND.md), so a profile with the idle power predicts too little iteration energy
(docs/validation.md, section 4: 12.4 % on two H200s). So before the first clock of the sweep,
training runs at the default clock with no loops between its iterations until the sampler
holds at least :data:`CALIBRATION_S` seconds of iteration spans (each from its first
instruction's device stamp to the iteration's end), leaving out the first iteration and any
span within :data:`CALIBRATION_GUARD_S` of the loops (the counter lags). Then a short-lived
thread reads the meter over those spans (:meth:`EnergyMeter.energies_between`: the training
thread never reads the meter), and once the sweep is done the rank solves for the power of its
waits against the profile at the default clock
(:func:`~perseus.client.profiling.wait_power.in_pipeline_wait_power`) and reports that as its
blocking
power. Anything that goes wrong (too little waiting, as on a pipeline's last stage; the meter
gone) falls back to the idle-measured power, with one log line. Ranks decide when to stop
collecting on their own: nothing here is collective.
"""

from __future__ import annotations

import enum
import logging
import statistics
import time
from collections.abc import Callable

from perseus.client.clocks.controller import ClockController
from perseus.client.gpu.control import GpuControl
from perseus.client.gpu.meter import EnergyMeter
from perseus.client.profiling.measurements import ClockMeasurement, StageProfile, calibrated
from perseus.client.profiling.profiler import ClockSweep, Workload, device_work, splits_backward
from perseus.client.profiling.stream_sampling import (
    MAX_CALIBRATION_SPANS,
    IterationSpan,
    StreamEnergy,
    StreamSampler,
)
from perseus.client.profiling.stream_sampling import MAX_STREAM_SAMPLES as MAX_STREAM_SAMPLES
from perseus.client.profiling.wait_power import (
    WaitPower,
    in_pipeline_wait_power,
    measure_idle_power,
)
from perseus.client.state import RankState
from perseus.client.torch_env import distributed
from perseus.core.errors import ProfileError
from perseus.schemas import ProfileRow, ProfilingProgress

__all__ = [
    "IterationSpan",
    "OnlineProfiling",
    "ProfilingState",
    "StreamEnergy",
    "StreamSampler",
    "WorkloadSource",
]

_log = logging.getLogger("perseus.client")

MIN_STREAM_SAMPLES = 5
"""In-stream samples per kind needed to calibrate."""
CALIBRATION_ITERATIONS = 3
"""Iterations a finished sweep waits for in-stream samples before it reports uncalibrated."""
CALIBRATION_S = 2.0
"""Seconds of iteration spans at the default clock the blocking power is calibrated over."""
CALIBRATION_GUARD_S = 0.3
"""Spans starting this soon after the profiling loops, or ending this close to the last span
resolved, are left out: the counter's lag would carry the loops' energy into them."""
MAX_CALIBRATION_WALL_S = 30.0
"""Collecting stops after this long even with too few spans (then the idle power is kept)."""
METER_WAIT_S = 30.0
"""How long the calibration thread waits for the meter to read past the spans."""

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
        """The blocking power to report: the in-pipeline wait power once calibrated, else
        the idle-measured one."""
        self.p_block_idle_w: float | None = None
        """The blocking power measured in a long collective wait (or idle)."""
        self.wait_power: WaitPower | None = None
        """The in-pipeline wait power solved from the training stream, when it was."""
        self.stream_energy: StreamEnergy | None = None
        self._collect_from_s = 0.0
        self._calibration_error: str | None = None
        self.sampler: StreamSampler | None = None
        """Set while SWEEPING: the training thread stamps its instructions into it."""
        self._sweep: ClockSweep | None = None
        self._reference: ClockMeasurement | None = None
        self._calibration_waits = 0
        self._split = False

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
                if self.sampler is not None and self.sampler.collecting and not self._collect():
                    return  # training runs on at the default clock, with no loops in between
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

    def progress(self) -> ProfilingProgress | None:
        """How far the clock sweep got (clocks measured of planned, seconds so far); None
        unless SWEEPING, and never raises. A sweep that ended early counts its measured
        clocks as planned."""
        sweep = self._sweep
        if self.state is not ProfilingState.SWEEPING or sweep is None:
            return None
        done = sweep.done_clocks
        try:
            return ProfilingProgress(
                clocks_done=done,
                clocks_planned=max(done, 1) if sweep.done else sweep.planned_clocks,
                elapsed_s=sweep.elapsed_s,
                budget_s=min(self._rank.settings.budget.max_s, 1e7),
            )
        except ValueError:  # out of the wire's range (over MAX_CLOCKS clocks): not shown
            return None

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
        self.p_block_w = self.p_block_idle_w = self._measure_blocking_power()
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
        # A zero-bubble schedule runs the backward's halves: the sweep measures them too.
        self._split = splits_backward(workload)  # type: ignore[arg-type]
        sweep = ClockSweep(
            self._gpu,
            self._meter,
            workload,  # type: ignore[arg-type]
            settings.budget,
            device_work(self._gpu),
            clock=self._clock,
            lock=lock,
            split=self._split,
        )
        _log.warning(
            "perseus: rank %d profiling %s online%s: %s%s",
            settings.rank,
            sweep.describe(),
            ", the backward's halves too" if self._split else "",
            settings.budget.describe(),
            "" if lock else "; this GPU's clocks may not be changed: only the current clock",
        )
        # The reference for the in-stream calibration: the loops at the clock the GPU picks
        # by itself, the clock the training iterations during the sweep run at.
        self._reference = sweep.measure_unlocked() if lock else None
        self._sweep = sweep
        self.state = ProfilingState.SWEEPING
        sampler = StreamSampler(self._controller.mark)
        sampler.collecting = True
        self.sampler = sampler
        self._collect_from_s = self._clock()

    def _usable_spans(self, spans: list[IterationSpan]) -> list[IterationSpan]:
        """The spans to calibrate over: resolved, not the first, clear of the loops."""
        resolved = [s for s in spans[1:] if s.seconds is not None]
        if not resolved:
            return []
        last_end = max(s.end.at_s or 0.0 for s in resolved)
        lo = self._collect_from_s + CALIBRATION_GUARD_S
        hi = last_end - CALIBRATION_GUARD_S
        return [s for s in resolved if (s.start.at_s or 0.0) >= lo and (s.end.at_s or 0.0) <= hi]

    def _collect(self) -> bool:
        """Whether collecting iteration spans is over (then the sweep may start).

        Cheap (the stamps only): the meter is read by :class:`StreamEnergy`'s thread.
        """
        sampler = self.sampler
        assert sampler is not None
        spans = self._usable_spans(sampler.spans)
        total = sum(s.seconds or 0.0 for s in spans)
        if total >= CALIBRATION_S:
            sampler.collecting = False
            self.stream_energy = StreamEnergy(self._meter, spans, METER_WAIT_S)
            return True
        waited = self._clock() - self._collect_from_s
        if waited > MAX_CALIBRATION_WALL_S or len(sampler.spans) >= MAX_CALIBRATION_SPANS:
            sampler.collecting = False
            self._calibration_error = (
                f"only {total:.2f} s of iteration spans in {waited:.0f} s and "
                f"{len(sampler.spans)} iterations (needs {CALIBRATION_S:g} s)"
            )
            return True
        return False

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
                "perseus: rank %d in the training stream: %s of the loop times at the default "
                "clock; profile scaled",
                rank,
                ", ".join(f"{kind} x{ratio:.3f}" for kind, ratio in ratios.items()),
            )
            profile = calibrated(profile, ratios)
        self.profile = profile
        default = (
            None
            if reference is None
            else calibrated(StageProfile((reference,), ""), ratios).measurements[0]
        )
        self.p_block_w = self._blocking_power(default)
        _log.warning(
            "perseus: rank %d profiled %d clocks (%s); blocking power %s (%s)",
            rank,
            len(profile.measurements),
            profile.stopped,
            "unknown" if self.p_block_w is None else f"{self.p_block_w:.1f} W",
            "in-pipeline waits" if self.wait_power is not None else "idle-measured",
        )
        if len(profile.measurements) == 0:
            self._rank.give_up("online profiling measured nothing")
            return
        for inverted in profile.inversions():
            # reported all the same: the planner has nothing better, and the operator is told
            _log.warning(
                "perseus: rank %d: %s; a lower clock never runs faster, so the measurement was "
                "disturbed (%s)",
                rank,
                inverted,
                "CPU load: the fake GPU runs its work on the CPU"
                if self._rank.settings.gpu == "fake"
                else "another process on this GPU?",
            )
        self._report(profile.rows(), self.p_block_w)

    def _blocking_power(self, default: ClockMeasurement | None) -> float | None:
        """The in-pipeline wait power, solved from the calibration spans against ``default``
        (the profile at the default clock, as the stream ran); the idle-measured power, with
        one log line, when that fails."""
        idle = self.p_block_idle_w
        rank = self._rank.settings.rank
        energy = self.stream_energy
        try:
            if self._calibration_error is not None:
                raise ProfileError(self._calibration_error)
            if energy is None or not energy.done.is_set():
                raise ProfileError("the meter had not read the iterations in time")
            if energy.window is None:
                raise ProfileError(energy.error or "no energy over the iterations")
            if default is None:
                raise ProfileError("no measurement at the default clock")
            wait = in_pipeline_wait_power(
                energy.window, default, scale=self._rank.scale, idle_w=idle
            )
        except Exception as err:  # the idle power is still a blocking power
            _log.warning(
                "perseus: rank %d blocking power %s, as measured in a long wait (not calibrated "
                "with the training stream: %s)",
                rank,
                "unknown" if idle is None else f"{idle:.1f} W",
                err,
            )
            return idle
        self.wait_power = wait
        assert energy.window is not None
        _log.warning(
            "perseus: rank %d blocking power %.1f W, from the training stream at the default "
            "clock (%s; in a long wait: %s)",
            rank,
            wait.power_w,
            wait.describe(energy.window),
            "unknown" if idle is None else f"{idle:.1f} W",
        )
        return wait.power_w

    def _calibration_ready(self) -> bool:
        """True once each kind has enough in-stream samples and the calibration thread is
        done, or after a few more iterations.

        A short sweep (one clock on a GPU whose clocks may not change) ends before training
        ran any instruction under calibration; up to three more iterations give it some.
        """
        samples = self.sampler.samples if self.sampler is not None else {}
        energy_done = self.stream_energy is None or self.stream_energy.done.is_set()
        if energy_done and all(
            len(samples.get(k, ())) >= MIN_STREAM_SAMPLES for k in self._stream_kinds()
        ):
            return True
        self._calibration_waits += 1
        return self._calibration_waits > CALIBRATION_ITERATIONS

    def _stream_kinds(self) -> tuple[str, ...]:
        """The kinds the training stream must have sampled to calibrate: a split schedule
        runs the backward's halves (and maybe full backwards too, as DualPipeV does)."""
        if self._split:
            return ("forward", "backward_input", "backward_weight")
        return ("forward", "backward")

    def _stream_ratios(
        self, sampler: StreamSampler, reference: ClockMeasurement
    ) -> dict[str, float]:
        """In-stream over loop time per kind, at the default clock; {} without enough data.

        Each instruction run during the sweep's training iterations was bracketed by two
        device stamps (:meth:`ClockController.mark`); a chunk of an interleaved stage costs
        its share of the stage. A kind the stream ran but the loops did not measure leaves
        the profile alone.
        """
        scale = self._rank.scale
        loop = {kind: reference.time_s(kind) * scale for kind in reference.kinds}
        ratios: dict[str, float] = {}
        for kind, samples in sampler.samples.items():
            if kind not in loop:
                return {}
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
        return ratios if all(kind in ratios for kind in self._stream_kinds()) else {}

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
