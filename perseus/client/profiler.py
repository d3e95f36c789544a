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
(:class:`~perseus.client.meter.EnergyMeter` in quiet mode, off the training thread: no NVML
read competes with the loop's kernel launches in between). Then, per instruction::

    t_F = loop time / forwards             e_F = P_F-loop * t_F
    t_B = t_FB - t_F                        e_B = P_FB-loop * t_FB - e_F

Time is taken around whole loops between two device synchronizations, so it needs no CUDA
events and the same code times the CPU. The clocks are swept from high to low; the sweep
stops early once the energy of a microbatch (``e_F + e_B``) rose at ``rising_stop`` clocks in
a row (below the most efficient clock, slower is only costlier), or when its time budget is
spent. A caller can run one clock per call (:meth:`ClockSweep.step`) so that training goes on
between clocks.

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

The blocking power (what a GPU draws while it waits on a peer) is measured separately by the
caller, while the rank really waits in a collective (see :mod:`perseus.client.rank`). That is
a long wait; the short waits inside a pipeline draw far more on a real GPU (BACKGROUND.md: about
200-400 W against about 125 W at rest on an H200), so the caller also measures the training
stream itself over at least two seconds of iterations at the default clock and solves for the
power of its waits (:func:`in_pipeline_wait_power`)::

    P_wait = (E_measured - sum_i e_i) / (T_spans - sum_i t_i)

with ``e_i``, ``t_i`` the profiled energy and time of each instruction run, at the default clock.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Protocol

from perseus.client.gpu import GpuControl, work_observer
from perseus.client.meter import CounterEdge, EnergyMeter
from perseus.client.settings import ProfileBudget
from perseus.errors import ProfileError
from perseus.schemas import ProfileRow

__all__ = [
    "MAX_WINDOW_FACTOR",
    "MIN_HALF_SHARE",
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

MAX_WINDOW_FACTOR = 4.0

MIN_HALF_SHARE = 0.01
"""Each half of a split backward is reported as at least this share of the backward's time
and energy (a first stage's ``I`` is empty; see the module docstring)."""

_SPLIT_KINDS = ("backward_input", "backward_weight")

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


@dataclass(frozen=True, slots=True)
class ClockMeasurement:
    """Time and energy of one forward and one backward at one clock, and of the backward's
    halves when the schedule splits it (else None)."""

    frequency_mhz: int
    forward_time_s: float
    forward_energy_j: float
    backward_time_s: float
    backward_energy_j: float
    forward_loop_power_w: float
    forward_backward_loop_power_w: float
    backward_input_time_s: float | None = None
    backward_input_energy_j: float | None = None
    backward_weight_time_s: float | None = None
    backward_weight_energy_j: float | None = None
    forward_input_loop_power_w: float | None = None

    @property
    def microbatch_energy_j(self) -> float:
        """Energy of one forward and its backward."""
        return self.forward_energy_j + self.backward_energy_j

    @property
    def split(self) -> bool:
        """Whether the backward's halves were measured."""
        return self.backward_input_time_s is not None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The instruction kinds measured: forward, backward, and the halves when split."""
        return ("forward", "backward", *_SPLIT_KINDS) if self.split else ("forward", "backward")

    def time_s(self, kind: str) -> float:
        """Time of one instruction of ``kind`` (one of :attr:`kinds`).

        Raises:
            ProfileError: ``kind`` was not measured.
        """
        return self._value(kind, "time_s")

    def energy_j(self, kind: str) -> float:
        """Energy of one instruction of ``kind`` (one of :attr:`kinds`).

        Raises:
            ProfileError: ``kind`` was not measured.
        """
        return self._value(kind, "energy_j")

    def _value(self, kind: str, unit: str) -> float:
        value = getattr(self, f"{kind}_{unit}", None) if kind in self.kinds else None
        if not isinstance(value, float):
            raise ProfileError(f"{self.frequency_mhz} MHz: no {kind} measured")
        return value


@dataclass(frozen=True, slots=True)
class StageProfile:
    """What one rank measured: clocks high to low, and why the sweep ended."""

    measurements: tuple[ClockMeasurement, ...]
    stopped: str

    def inversions(self, tolerance: float = 0.1) -> list[str]:
        """Where a lower clock ran an instruction faster than a higher one by more than
        ``tolerance``: a GPU never does that, so the measurement was disturbed (another
        process on the GPU or, for the fake GPU, on the CPU). One line per instruction kind,
        naming its worst pair; empty when the times follow the clocks."""
        found = []
        ascending = sorted(self.measurements, key=lambda m: m.frequency_mhz)
        kinds = self.measurements[0].kinds if self.measurements else ()
        for kind in kinds:
            worst: tuple[float, ClockMeasurement, ClockMeasurement] | None = None
            fastest_below: ClockMeasurement | None = None  # quickest at a lower clock so far
            for high in ascending:
                if fastest_below is not None:
                    low = fastest_below
                    ratio = getattr(high, f"{kind}_time_s") / getattr(low, f"{kind}_time_s")
                    if ratio > 1 + tolerance and (worst is None or ratio > worst[0]):
                        worst = (ratio, high, low)
                if fastest_below is None or getattr(high, f"{kind}_time_s") < getattr(
                    fastest_below, f"{kind}_time_s"
                ):
                    fastest_below = high
            if worst is not None:
                ratio, high, low = worst
                found.append(
                    f"{kind} took {getattr(high, f'{kind}_time_s') * 1e3:.1f} ms at "
                    f"{high.frequency_mhz} MHz but {getattr(low, f'{kind}_time_s') * 1e3:.1f} ms "
                    f"at {low.frequency_mhz} MHz"
                )
        return found

    def rows(self) -> list[ProfileRow]:
        """The measurements as wire rows (forward and backward per clock, then the
        backward's halves when split)."""
        return [
            ProfileRow(
                instruction=kind,  # type: ignore[arg-type]
                frequency_mhz=m.frequency_mhz,
                time_s=m.time_s(kind),
                energy_j=m.energy_j(kind),
            )
            for m in self.measurements
            for kind in m.kinds
        ]


def profile_csv(profiles: dict[int, StageProfile]) -> str:
    """Zeus-compatible CSV (``stage,instruction,frequency,time,energy``) of stage profiles."""
    lines = ["stage,instruction,frequency,time,energy"]
    for stage in sorted(profiles):
        for row in profiles[stage].rows():
            lines.append(
                f"{stage},{row.instruction},{row.frequency_mhz},{row.time_s:.9g},{row.energy_j:.9g}"
            )
    return "\n".join(lines) + "\n"


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
        if lock:
            self.clocks = budget.select(gpu.supported_clocks_mhz())
        else:
            # The clock this GPU runs by itself, whatever it reads at this instant: the
            # plan can only mean "the default" on a GPU whose clocks may not change.
            self.clocks = (gpu.default_clock_mhz(),)
        self._next = 0
        self._measured: list[ClockMeasurement] = []
        self._rising = 0
        self._started_s: float | None = None
        self._stopped: str | None = None

    @property
    def done(self) -> bool:
        """True once the sweep has ended (all clocks, early stop, or budget)."""
        return self._stopped is not None

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
        frequency = self.clocks[self._next]
        self._next += 1
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
        if self._measured and (
            measured.microbatch_energy_j > self._measured[-1].microbatch_energy_j
        ):
            self._rising += 1
        else:
            self._rising = 0
        self._measured.append(measured)
        if self._rising >= self._budget.rising_stop:
            self._stopped = (
                f"energy rose at {self._rising} clocks in a row "
                f"(down to {measured.frequency_mhz} MHz)"
            )
        elif self._next >= len(self.clocks):
            self._stopped = f"all {len(self.clocks)} clocks measured"

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


def split_backward(
    measured: ClockMeasurement, input_time_s: float, input_energy_j: float, loop_power_w: float
) -> ClockMeasurement:
    """``measured`` with the backward's halves: the input half as given, each half kept to
    at least :data:`MIN_HALF_SHARE` of the backward, the weight half the rest."""
    lo, hi = MIN_HALF_SHARE, 1.0 - MIN_HALF_SHARE
    t_b, e_b = measured.backward_time_s, measured.backward_energy_j
    t_i = min(max(input_time_s, lo * t_b), hi * t_b)
    e_i = min(max(input_energy_j, lo * e_b), hi * e_b)
    return replace(
        measured,
        backward_input_time_s=t_i,
        backward_input_energy_j=e_i,
        backward_weight_time_s=t_b - t_i,
        backward_weight_energy_j=e_b - e_i,
        forward_input_loop_power_w=loop_power_w,
    )


def calibrated(profile: StageProfile, ratios: dict[str, float]) -> StageProfile:
    """The profile with each kind's time and energy scaled by ``ratios[kind]``.

    In a training stream an instruction can take longer than in a loop of its own (the
    framework's work around the module: gradient accumulation into ``.grad``, a loss;
    communication kernels sharing the GPU); the rank measures the ratio at the default
    clock and applies it at every clock, keeping the loop's power (so energy scales too).
    A kind without a ratio keeps its values, except a split backward's full backward, which
    the stream may never run: without its own ratio it stays the sum of its scaled halves.
    """
    return StageProfile(
        measurements=tuple(_calibrated(m, ratios) for m in profile.measurements),
        stopped=profile.stopped,
    )


def _calibrated(m: ClockMeasurement, ratios: dict[str, float]) -> ClockMeasurement:
    f = ratios.get("forward", 1.0)
    b = ratios.get("backward", 1.0)
    out = replace(
        m,
        forward_time_s=m.forward_time_s * f,
        forward_energy_j=m.forward_energy_j * f,
        backward_time_s=m.backward_time_s * b,
        backward_energy_j=m.backward_energy_j * b,
    )
    if not m.split:
        return out
    i = ratios.get("backward_input", 1.0)
    w = ratios.get("backward_weight", 1.0)
    t_i, e_i = m.time_s("backward_input") * i, m.energy_j("backward_input") * i
    t_w, e_w = m.time_s("backward_weight") * w, m.energy_j("backward_weight") * w
    out = replace(
        out,
        backward_input_time_s=t_i,
        backward_input_energy_j=e_i,
        backward_weight_time_s=t_w,
        backward_weight_energy_j=e_w,
    )
    if "backward" not in ratios:
        out = replace(out, backward_time_s=t_i + t_w, backward_energy_j=e_i + e_w)
    return out


def measure_idle_power(
    meter: EnergyMeter, wait: Callable[[float], None], seconds: float, clock: Callable[[], float]
) -> float | None:
    """Average power while ``wait(seconds)`` runs (the GPU waiting), skipping the first 0.2 s.

    Returns None when the counter gave no usable reading.
    """
    with meter.precise():
        start = clock()
        wait(seconds)
        end = clock()
    reading = meter.power(start + min(0.2, seconds / 4), end)
    return None if reading is None else reading.power_w


@dataclass(frozen=True, slots=True)
class StreamWindow:
    """What the energy meter saw over some training iterations at the default clock.

    Attributes:
        iterations: Iteration spans summed (each from its first instruction to its end).
        time_s: Their total duration.
        energy_j: The energy the meter measured over them.
        forwards: Forward instructions they ran.
        backwards: Backward instructions they ran.
        backward_inputs: Input halves of split backwards they ran.
        backward_weights: Weight halves of split backwards they ran.
    """

    iterations: int
    time_s: float
    energy_j: float
    forwards: int
    backwards: int
    backward_inputs: int = 0
    backward_weights: int = 0

    @property
    def counts(self) -> dict[str, int]:
        """Instructions run per kind."""
        return {
            "forward": self.forwards,
            "backward": self.backwards,
            "backward_input": self.backward_inputs,
            "backward_weight": self.backward_weights,
        }


@dataclass(frozen=True, slots=True)
class WaitPower:
    """The power of a rank's in-pipeline waits, solved from a :class:`StreamWindow`.

    Attributes:
        power_w: The estimate to report as the blocking power (``raw_w`` clamped).
        raw_w: ``wait_energy_j / wait_s`` before clamping.
        wait_s: Span time not covered by the profiled instruction times.
        wait_energy_j: Measured energy beyond the profiled busy energy.
        busy_s: Profiled time of the instructions run.
        busy_energy_j: Profiled energy of the instructions run.
        clamped: ``"idle"`` or ``"loop"`` when ``raw_w`` fell outside the bounds, else None.
    """

    power_w: float
    raw_w: float
    wait_s: float
    wait_energy_j: float
    busy_s: float
    busy_energy_j: float
    clamped: str | None

    def describe(self, window: StreamWindow) -> str:
        """One clause for the log."""
        clamp = "" if self.clamped is None else f", clamped from {self.raw_w:.1f} W"
        return (
            f"{self.wait_s * 1e3:.0f} ms of waits in {window.time_s:.2f} s of "
            f"{window.iterations} iterations carried {self.wait_energy_j:.1f} J beyond the "
            f"profiled busy energy{clamp}"
        )


MIN_WAIT_SHARE = 0.1
"""Waits must be at least this share of the spans to be solved for: the estimate's error is
the busy energy's error times ``busy / wait`` (3 % of a 600 W busy power at 90 % busy is
160 W on the wait power); a stage with fewer waits (a pipeline's last stage, ~2 % on two
H200s) is too noisy and keeps the idle-measured power."""

MIN_WAIT_S = 0.05
"""And at least this much wait time in all."""


def in_pipeline_wait_power(
    window: StreamWindow,
    reference: ClockMeasurement,
    *,
    scale: float = 1.0,
    idle_w: float | None,
    min_wait_share: float = MIN_WAIT_SHARE,
    min_wait_s: float = MIN_WAIT_S,
) -> WaitPower:
    """The power of the waits inside the spans of ``window``, clamped to sensible bounds.

    ``reference`` is the profile at the clock the spans ran at (the default, calibrated to
    the stream); each instruction costs ``scale`` of it (a chunk of an interleaved stage). The
    waits are what the spans hold beyond the profiled times, and their energy what the meter
    measured beyond the profiled energies, so the planner's model
    ``E = sum e_i + P_block * (T - sum t_i)`` reproduces the measured energy of these
    iterations with ``P_block = power_w``. The estimate is clamped between ``idle_w`` (a
    wait never draws less than the GPU at rest) and the reference's loop power (nor more than
    the work itself).

    Raises:
        ProfileError: The window cannot give an estimate (too few waits, no energy, a kind
            the reference lacks); the message says why.
    """
    if not (window.time_s > 0 and math.isfinite(window.energy_j) and window.energy_j > 0):
        raise ProfileError(
            f"no usable energy over the iterations ({window.energy_j:.6g} J in "
            f"{window.time_s:.6g} s)"
        )
    ran = {kind: n for kind, n in window.counts.items() if n}
    busy_s = scale * sum(n * reference.time_s(kind) for kind, n in ran.items())
    busy_j = scale * sum(n * reference.energy_j(kind) for kind, n in ran.items())
    wait_s = window.time_s - busy_s
    if wait_s < max(min_wait_s, min_wait_share * window.time_s):
        raise ProfileError(
            f"too little waiting to solve for: {max(wait_s, 0.0) * 1e3:.0f} ms of waits in "
            f"{window.time_s:.2f} s of {window.iterations} iterations (needs "
            f"{min_wait_share:.0%} and {min_wait_s * 1e3:.0f} ms)"
        )
    wait_j = window.energy_j - busy_j
    raw = wait_j / wait_s
    loop_w = max(reference.forward_loop_power_w, reference.forward_backward_loop_power_w)
    power, clamped = raw, None
    if idle_w is not None and raw < idle_w:
        power, clamped = idle_w, "idle"
    elif raw > loop_w and (idle_w is None or loop_w > idle_w):
        power, clamped = loop_w, "loop"
    if not (math.isfinite(power) and power > 0):
        raise ProfileError(f"the waits came out at {raw:.6g} W")
    return WaitPower(
        power_w=power,
        raw_w=raw,
        wait_s=wait_s,
        wait_energy_j=wait_j,
        busy_s=busy_s,
        busy_energy_j=busy_j,
        clamped=clamped,
    )
