"""The blocking power of a rank's GPU: measured at rest, and solved from the training stream.

The blocking power (what a GPU draws while it waits on a peer) is measured separately by the
caller, while the rank really waits in a collective (:func:`measure_idle_power`; see
:mod:`perseus.client.profiling.online`). That is a long wait; the short waits inside a pipeline
draw far
more on a real GPU (BACKGROUND.md: about 200-400 W against about 125 W at rest on an H200), so
the caller also measures the training stream itself over at least two seconds of iterations at
the default clock (a :class:`StreamWindow`) and solves for the power of its waits
(:func:`in_pipeline_wait_power`)::

    P_wait = (E_measured - sum_i e_i) / (T_spans - sum_i t_i)

with ``e_i``, ``t_i`` the profiled energy and time of each instruction run, at the default clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from perseus.client.gpu.meter import EnergyMeter
from perseus.client.profiling.measurements import ClockMeasurement
from perseus.core.errors import ProfileError

__all__ = [
    "MIN_WAIT_S",
    "MIN_WAIT_SHARE",
    "StreamWindow",
    "WaitPower",
    "in_pipeline_wait_power",
    "measure_idle_power",
]


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
