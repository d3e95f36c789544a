"""Online profiling of one pipeline stage: time and energy per instruction and clock.

Why loops, not the training stream. The energy counter moves every ~100 ms and lags, so an
instruction's energy cannot be read per instruction; and regressing counter intervals of a
real pipeline stream on the time spent in forwards, backwards and waits was 10-15 % off on an
H200, partly because an unlocked GPU near its power limit runs faster and hotter when its work
has gaps (BACKGROUND.md). Steady back-to-back loops of one kind of work are additive within
0.14 % on the same GPU. So, at each clock, the profiler runs the stage's own forward on a
real microbatch back to back for ``settle_s`` and then a window of at least ``window_s``
seconds and :data:`MIN_WINDOW_INSTRUCTIONS` runs, then forward+backward the same way, and
reads the average power of each loop between two counter updates caught inside its window
(:class:`~perseus.client.gpu.meter.EnergyMeter` in quiet mode, off the training thread: no NVML
read competes with the loop's kernel launches in between). Then, per instruction::

    t_F = loop time / forwards             e_F = P_F-loop * t_F
    t_B = t_FB - t_F                        e_B = P_FB-loop * t_FB - e_F

Time is taken around whole loops between two device synchronizations, so it needs no CUDA
events and the same code times the CPU. Which clocks are measured, and in what order, is
:class:`~perseus.client.profiling.sweep_order.SweepOrder`'s decision from the energy of a
microbatch (``e_F + e_B``) and the times measured so far: by default every 4th clock from the
top until energy rises past its least, then finer where plans go (about 33 of an H200's 110
clocks); with an explicit list, each in turn from high to low until energy rose at
``rising_stop`` clocks in a row. The sweep also stops when its time budget is spent. A caller
can run one clock per call (:meth:`ClockSweep.step`) so that training goes on between clocks.

Split backward (zero-bubble schedules, ``split=True``). The schedule runs each backward as two
instructions, ``backward_input`` (``I``: the gradient sent to the previous stage) and
``backward_weight`` (``W``: the weight gradients), so each clock gets a third loop, forward
followed by the input half alone (:meth:`SplitWorkload.backward_input`)::

    t_I = t_FI - t_F                        e_I = P_FI-loop * t_FI - e_F
    t_W = t_B - t_I                         e_W = e_B - e_I

The weight half is the full backward less the input half: autograd computes only what the
input gradient needs in ``I``, and torch's ``W`` is the rest of the same backward, so their
sum is the full backward (torch's split adds only bookkeeping). A first stage, whose input
needs no gradient, has an empty ``I`` in torch (its ``W`` runs the whole backward); both halves
are kept to at least :data:`MIN_HALF_SHARE` of the backward so that every instruction of the
profile has a positive time and energy. The full backward's rows stay in the profile (a
schedule may run both, as DualPipeV does).

The values measured are :mod:`perseus.client.profiling.measurements`'s (:class:`ClockMeasurement`,
:class:`StageProfile`); the blocking power, measured at rest and solved from the training
stream, is :mod:`perseus.client.profiling.wait_power`'s. Both are re-exported here.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

from perseus.client.gpu.control import GpuControl, work_observer
from perseus.client.gpu.meter import CounterEdge, EnergyMeter
from perseus.client.profiling.measurements import (
    MIN_HALF_SHARE,
    ClockMeasurement,
    StageProfile,
    calibrated,
    profile_csv,
    split_backward,
)
from perseus.client.profiling.sweep_order import AUTO, STRIDE, SweepOrder
from perseus.client.profiling.wait_power import (
    MIN_WAIT_S,
    MIN_WAIT_SHARE,
    StreamWindow,
    WaitPower,
    in_pipeline_wait_power,
    measure_idle_power,
)
from perseus.client.settings import ProfileBudget
from perseus.core.errors import ProfileError

__all__ = [
    "MAX_WINDOW_FACTOR",
    "MIN_HALF_SHARE",
    "MIN_WAIT_S",
    "MIN_WAIT_SHARE",
    "MIN_WINDOW_INSTRUCTIONS",
    "ClockMeasurement",
    "ClockSweep",
    "DeviceWork",
    "SplitWorkload",
    "StageProfile",
    "StreamWindow",
    "WaitPower",
    "Workload",
    "calibrated",
    "device_work",
    "in_pipeline_wait_power",
    "measure_idle_power",
    "profile_csv",
    "split_backward",
    "splits_backward",
]

_log = logging.getLogger("perseus.client")

_MIN_RUNS = 10
"""Whole bodies a window holds at least (an average over few long bodies depends on where
the counter's updates cut them)."""

MIN_WINDOW_INSTRUCTIONS = 100
"""Bodies a window holds unless that would make it longer than ``MAX_WINDOW_FACTOR`` times
``window_s``: a window sized by instruction count, so that short instructions are averaged
over many launches and many counter updates."""

MAX_WINDOW_FACTOR = 2.0
"""How long a window of long bodies may last, in ``window_s``: 1.2 s at the default window
holds 100 bodies up to 12 ms and at least :data:`_MIN_RUNS` up to 120 ms. Against the fake
GPU's ground truth (``benchmarks/profiler_accuracy.py`` on a quiet 16-core host) the errors at
2 and at 4 were the same (at most 0.8 % time and 0.6 % energy off the throttled top clock), and
the sweep took 67 s against 95 s: most of a rank's profiling time is these windows."""

DeviceWork = Callable[[str], AbstractContextManager[object]]
"""Brackets one unit of device work of a kind (``"forward"``, ``"backward"``,
``"backward_input"``); a simulated GPU uses it to model the work, a real GPU needs nothing."""


def device_work(gpu: GpuControl) -> DeviceWork:
    """The bracket for units of work on ``gpu``: its work observer's (a simulated GPU models
    them), else a no-op."""
    observer = work_observer(gpu)
    if observer is not None:
        return observer.working
    return lambda kind: nullcontext()


class Workload(Protocol):
    """The stage's real work on a captured microbatch, for profiling loops.

    Implementations must leave training unchanged: no gradients accumulated into
    parameters, random state and buffers restored.
    """

    def forward(self) -> object:
        """Run one forward; return what :meth:`backward` needs."""
        ...

    def backward(self, handle: object) -> None:
        """Run the backward of a forward's result."""
        ...

    def synchronize(self) -> None:
        """Wait until the device has finished all queued work.

        Called only by the profiling loops (between iterations), never by the hooks.
        """
        ...


class SplitWorkload(Workload, Protocol):
    """A workload whose schedule splits the backward (zero-bubble): it also runs the input
    half alone."""

    splits_backward: bool
    """True when the schedule that runs splits the backward (then the sweep measures it)."""

    def backward_input(self, handle: object) -> None:
        """Run only the input-gradient half of the backward of a forward's result."""
        ...


def splits_backward(workload: Workload) -> bool:
    """Whether ``workload`` is a :class:`SplitWorkload` whose schedule splits the backward."""
    return bool(getattr(workload, "splits_backward", False)) and callable(
        getattr(workload, "backward_input", None)
    )


class ClockSweep:
    """Measures a stage clock by clock, from the highest down.

    Args:
        gpu: The GPU; its clock is locked for each measurement and reset after each step.
        meter: A started meter on the same GPU.
        workload: The stage's work.
        budget: Window, settling time, clocks, time budget and early stop.
        device_work: Brackets each unit of work (the fake GPU models it; else a no-op).
        clock: Time base shared with ``meter``.
        lock: When False (a GPU whose clocks may not be changed), only the current clock
            is measured.
        min_instructions: Bodies each window holds (see :data:`MIN_WINDOW_INSTRUCTIONS`).
        split: Also measure the backward's halves (a third loop per clock); ``workload``
            must then be a :class:`SplitWorkload`.

    Raises:
        ProfileError: ``split`` with a workload that cannot run the input half alone.
    """

    def __init__(
        self,
        gpu: GpuControl,
        meter: EnergyMeter,
        workload: Workload,
        budget: ProfileBudget,
        device_work: DeviceWork,
        *,
        clock: Callable[[], float] = time.perf_counter,
        lock: bool = True,
        min_instructions: int = MIN_WINDOW_INSTRUCTIONS,
        split: bool = False,
    ) -> None:
        if split and not callable(getattr(workload, "backward_input", None)):
            raise ProfileError(
                f"the schedule splits the backward, but the workload {type(workload).__name__} "
                "cannot run its input half alone (backward_input)"
            )
        self._split = split
        self._gpu = gpu
        self._min_instructions = min_instructions
        self._meter = meter
        self._workload = workload
        self._budget = budget
        self._work = device_work
        self._clock = clock
        self._lock = lock
        stride = 1
        if lock:
            self.clocks = budget.select(gpu.supported_clocks_mhz())
            stride = STRIDE if budget.clocks.strip() == AUTO else 1
        else:
            # The clock this GPU runs by itself, whatever it reads at this instant: the
            # plan can only mean "the default" on a GPU whose clocks may not change.
            self.clocks = (gpu.default_clock_mhz(),)
        """The clocks the sweep may measure, high to low (the default sweep measures some)."""
        self._order = SweepOrder(self.clocks, rising_stop=budget.rising_stop, stride=stride)
        self._measured: list[ClockMeasurement] = []
        self._started_s: float | None = None
        self._stopped: str | None = None

    @property
    def done(self) -> bool:
        """True once the sweep has ended (all its clocks, early stop, or budget)."""
        return self._stopped is not None

    @property
    def done_clocks(self) -> int:
        """Clocks measured so far."""
        return len(self._measured)

    @property
    def planned_clocks(self) -> int:
        """Clocks measured plus those still to measure as things stand (an upper bound while
        the default sweep's coarse pass runs; exact afterwards, and for a list of clocks
        until energy rises): :attr:`SweepOrder.planned_clocks`. Equals :attr:`done_clocks`
        once the sweep is over."""
        return self.done_clocks if self.done else self._order.planned_clocks

    def describe(self) -> str:
        """What the sweep measures, for the log: ``"coarse then fine among 110 clocks
        (1980-345 MHz)"`` or ``"14 clocks (1980-1005 MHz)"``."""
        span = f"{len(self.clocks)} clocks ({self.clocks[-1]}-{self.clocks[0]} MHz)"
        return f"coarse then fine among {span}" if self._order.stride > 1 else span

    @property
    def elapsed_s(self) -> float:
        """Seconds since the first clock's measurement began (0 before it)."""
        return 0.0 if self._started_s is None else self._clock() - self._started_s

    def run(self) -> StageProfile:
        """Measure every remaining clock now."""
        while not self.done:
            self.step()
        return self.result()

    def step(self) -> ClockMeasurement | None:
        """Measure the next clock; None when the sweep is over.

        Raises:
            GpuControlError: Locking or resetting the clock failed.
            ProfileError: The counter gave no usable reading (see the message).
        """
        if self._stopped is not None:
            return None
        now = self._clock()
        if self._started_s is None:
            self._started_s = now
        elif now - self._started_s > self._budget.max_s:
            self._stopped = f"time budget of {self._budget.max_s:g} s spent"
            return None
        frequency = self._order.next_clock()
        if frequency is None:
            self._stopped = self._order.stopped
            return None
        try:
            if self._lock:
                self._gpu.lock_clock(frequency)
            measured = self._measure(frequency)
        finally:
            if self._lock:
                self._gpu.reset_clock()
        self._note(measured)
        return measured

    def measure_unlocked(self) -> ClockMeasurement:
        """The loops at the clock the GPU picks by itself (no lock), as training runs.

        The reference that in-stream instruction times are compared with (see
        :func:`calibrated`); labelled with the default clock.
        """
        return self._measure(self._gpu.default_clock_mhz())

    def result(self) -> StageProfile:
        """The measurements so far (sorted high to low)."""
        return StageProfile(
            measurements=tuple(sorted(self._measured, key=lambda m: -m.frequency_mhz)),
            stopped=self._stopped or "not finished",
        )

    def _note(self, measured: ClockMeasurement) -> None:
        self._measured.append(measured)
        self._order.record(
            measured.frequency_mhz,
            measured.microbatch_energy_j,
            [measured.time_s(kind) for kind in measured.kinds],
        )
        self._stopped = self._order.stopped

    def _measure(self, frequency_mhz: int) -> ClockMeasurement:
        def forward() -> None:
            with self._work("forward"):
                self._workload.forward()

        def forward_backward() -> None:
            with self._work("forward"):
                handle = self._workload.forward()
            with self._work("backward"):
                self._workload.backward(handle)

        def forward_input() -> None:
            with self._work("forward"):
                handle = self._workload.forward()
            with self._work("backward_input"):
                self._workload.backward_input(handle)  # type: ignore[attr-defined]

        with self._meter.quiet():
            t_f, p_f = self._loop(forward, frequency_mhz, "forward")
            t_fb, p_fb = self._loop(forward_backward, frequency_mhz, "forward+backward")
            if self._split:
                t_fi, p_fi = self._loop(forward_input, frequency_mhz, "forward+backward_input")
        e_f = p_f * t_f
        t_b = t_fb - t_f
        e_b = p_fb * t_fb - e_f
        if not (t_b > 0 and e_b > 0 and e_f > 0):
            raise ProfileError(
                f"{frequency_mhz} MHz: backward came out as {t_b:.6g} s and {e_b:.6g} J "
                f"(forward {t_f:.6g} s at {p_f:.1f} W, forward+backward {t_fb:.6g} s at "
                f"{p_fb:.1f} W); the measurement is too noisy: raise PERSEUS_PROFILE_WINDOW_S"
            )
        measured = ClockMeasurement(
            frequency_mhz=frequency_mhz,
            forward_time_s=t_f,
            forward_energy_j=e_f,
            backward_time_s=t_b,
            backward_energy_j=e_b,
            forward_loop_power_w=p_f,
            forward_backward_loop_power_w=p_fb,
        )
        if not self._split:
            return measured
        return split_backward(measured, t_fi - t_f, p_fi * t_fi - e_f, p_fi)

    def _loop(self, body: Callable[[], None], frequency_mhz: int, what: str) -> tuple[float, float]:
        """``(seconds per body, average watts)`` of ``body`` run back to back.

        The window starts after ``settle_s`` (a synchronization), and ends once it has
        lasted ``window_s`` and held :data:`MIN_WINDOW_INSTRUCTIONS` bodies (or, for long
        bodies, lasted ``MAX_WINDOW_FACTOR * window_s`` with ``_MIN_RUNS``). Its energy is
        the counter's difference between two updates the meter catches inside it, one just
        after it starts and one just after its end condition holds, and nothing else reads
        the counter meanwhile (the meter is quiet). Between bodies the loop only reads the
        clock and two flags: on a launch-bound stage every host-side instruction beside the
        launches slows the work measured.
        """
        budget = self._budget
        workload = self._workload
        meter = self._meter
        clock = self._clock
        min_runs = max(_MIN_RUNS, self._min_instructions)
        long_s = MAX_WINDOW_FACTOR * budget.window_s
        workload.synchronize()
        start = clock()
        mark_s: float | None = None
        mark_n = 0
        n = 0
        first: CounterEdge | None = None
        last: CounterEdge | None = None
        # Give up waiting for counter updates after a generous grace (a dead counter).
        deadline = start + budget.settle_s + long_s + 5.0
        while True:
            body()
            n += 1
            now = clock()
            if mark_s is None:
                if now - start >= budget.settle_s:
                    workload.synchronize()
                    mark_s = clock()
                    mark_n = n
                    first = meter.catch_update(mark_s)
            elif last is None:
                elapsed = now - mark_s
                runs = n - mark_n
                if (
                    elapsed >= budget.window_s
                    and (runs >= min_runs or (elapsed >= long_s and runs >= _MIN_RUNS))
                    and first is not None
                    and first.caught()
                ):
                    last = meter.catch_update(now)
            elif last.caught():
                break
            if now > deadline:
                break
        workload.synchronize()
        end = clock()
        assert mark_s is not None and first is not None  # the loop sets them before it can break
        runs = n - mark_n
        if runs < 1:
            raise ProfileError(
                f"{frequency_mhz} MHz {what}: one instruction took longer than the whole "
                f"window of {budget.window_s:g} s; raise PERSEUS_PROFILE_WINDOW_S"
            )
        if (
            last is None
            or first.at_s is None
            or last.at_s is None
            or first.energy_j is None
            or last.energy_j is None
            or last.at_s <= first.at_s
        ):
            failed = meter.failed
            raise ProfileError(
                f"{frequency_mhz} MHz {what}: the energy counter did not move within "
                f"{end - mark_s:.2f} s" + (f" ({failed})" if failed else "")
            )
        power_w = (last.energy_j - first.energy_j) / (last.at_s - first.at_s)
        seconds = (end - mark_s) / runs
        if not math.isfinite(power_w) or power_w <= 0:
            raise ProfileError(f"{frequency_mhz} MHz {what}: the energy counter gave {power_w} W")
        return seconds, power_w
