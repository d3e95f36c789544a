"""The fake H200's model: how the SM clock changes a unit of work's time and power.

Nothing here is measured; the model is small enough to read in one go and shaped like the
H200 facts in ``docs/BACKGROUND.md`` (and like :mod:`perseus.solver.synthetic`, whose example
profile uses the same knee and voltage). A unit of work (:class:`FakeWork`) is described by its
time and its power at the top clock ``F_MAX``. At SM clock ``f`` (MHz):

    time_s(f)  = time_at_max_s * (c * F_MAX / f + (1 - c))        c = compute_fraction

    v(f)       = v_min                                              f <= knee
               = v_min + (1 - v_min) * (f - knee) / (F_MAX - knee)  above the knee
    power_w(f) = P_idle + (power_at_max_w - P_idle) * (f / F_MAX) * v(f)**2

    energy_j(f) = time_s(f) * power_w(f)

``c`` is the compute-bound share of the time at ``F_MAX`` (it scales with the clock; the rest is
memory-bound and does not). ``v`` is the voltage relative to its value at ``F_MAX``: flat below
the knee, rising linearly above it, so dynamic power ``~ f V^2`` falls steeply from ``F_MAX`` to
the knee and only linearly below it. Energy per instruction therefore falls from ``F_MAX`` down to
about the knee and rises again below it, where the idle (static) power is paid over an ever
longer time. With the defaults, :func:`default_work`'s forward and backward both use the least
energy at 1200 MHz (27 % and 32 % less than at 1980 MHz) and take 1.55 times as long there.

Power limit: a work runs at the highest supported clock whose busy power stays within
``power_limit_w`` (the lowest clock if none does), its *unlocked* clock, or at the locked
clock when a lock in effect is lower: as on a real GPU, power capping throttles a locked clock
too, so a lock above the unlocked clock runs exactly as no lock. With the defaults,
:func:`default_work`'s forward (620 W at ``F_MAX``) runs unlocked at 1980 MHz and its backward
(760 W at ``F_MAX``) throttles to 1890 MHz, also when locked at 1905-1980 MHz. The clock a work
ran at (``end``'s answer, the clock log's ``ran_mhz``) is the throttled one, as NVML's SM clock
reading would show.

Split backward (zero-bubble schedules): :func:`default_work` also models the two halves of a
backward, ``backward_input`` (torch's ``I``, the input gradient) and ``backward_weight``
(``W``, the weight gradients), each half of the backward's time at the backward's power
(:data:`BACKWARD_INPUT_SHARE`), so ``I + W`` equals the full backward exactly in time and
energy at every clock. The even split follows the zero-bubble paper's transformer cost model
(Qi et al., ICLR 2024: the input and weight halves of a layer's backward cost about the same).

Defaults (:class:`FakeGpuModel`):

=========================  ===============================  =====================================
field                      default                          why
=========================  ===============================  =====================================
``clocks_mhz``             1980 down to 345, step 15 (110)  the H200's supported SM clocks
``power_limit_w``          700                              the H200's top power limit
``idle_power_w``           150                              drawn outside work (idle, blocking)
``knee_clock_mhz``         1200                             voltage flat below this clock
``min_voltage``            0.70                             voltage at the knee, relative
``compute_fraction``       0.85                             share of time that scales with 1/f
``counter_period_s``       0.1                              the energy counter's update period
``read_cost_s``            0.003                            one energy read (real: ~3.6 ms)
``power_time_constant_s``  1.0                              smoothing of the power reading
``clock_change_delay_s``   0.02                             a lock takes effect this much later
=========================  ===============================  =====================================

:class:`~perseus.client.gpu.fake.FakeGpu` runs this model as a GPU.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

__all__ = [
    "BACKWARD_INPUT_SHARE",
    "FakeGpuModel",
    "FakeWork",
    "default_throttled_clocks_mhz",
    "default_work",
]

BACKWARD_INPUT_SHARE = 0.5
"""Share of a backward's time that its input half (``backward_input``) takes; the weight half
(``backward_weight``) takes the rest. Both run at the backward's power."""


@dataclass(frozen=True, slots=True)
class FakeWork:
    """One kind of instruction on one stage, described at the top clock.

    Attributes:
        time_at_max_s: Its time at the highest supported clock, in seconds (> 0).
        power_at_max_w: Its busy power at the highest clock, in watts, if not throttled; may
            exceed the model's power limit (then it throttles when the clock is not locked).
    """

    time_at_max_s: float
    power_at_max_w: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time_at_max_s) and self.time_at_max_s > 0):
            raise ValueError(f"time_at_max_s must be finite and > 0, got {self.time_at_max_s}")
        if not (math.isfinite(self.power_at_max_w) and self.power_at_max_w > 0):
            raise ValueError(f"power_at_max_w must be finite and > 0, got {self.power_at_max_w}")


def _default_clocks() -> tuple[int, ...]:
    return tuple(range(1980, 344, -15))


@dataclass(frozen=True, slots=True)
class FakeGpuModel:
    """How the SM clock changes an instruction's time and power; see the module docstring.

    Attributes:
        name: The name the fake GPU reports.
        clocks_mhz: Supported SM clocks, strictly descending.
        power_limit_w: Busy power an unlocked clock must stay within.
        idle_power_w: Power outside work (idle or blocking), and the static part of busy power.
        knee_clock_mhz: Below this clock the voltage stays flat.
        min_voltage: Voltage at and below the knee, relative to the voltage at the top clock.
        compute_fraction: Share of the time at the top clock that scales with ``1 / f``.
        counter_period_s: The energy counter and the power reading move this often.
        read_cost_s: How long one :meth:`FakeGpu.energy_j` call takes.
        power_time_constant_s: Time constant of the power reading's moving average.
        clock_change_delay_s: A lock or reset takes effect this long after it is requested.
    """

    name: str = "perseus fake H200"
    clocks_mhz: tuple[int, ...] = field(default_factory=_default_clocks)
    power_limit_w: float = 700.0
    idle_power_w: float = 150.0
    knee_clock_mhz: int = 1200
    min_voltage: float = 0.70
    compute_fraction: float = 0.85
    counter_period_s: float = 0.1
    read_cost_s: float = 0.003
    power_time_constant_s: float = 1.0
    clock_change_delay_s: float = 0.02

    def __post_init__(self) -> None:
        clocks = self.clocks_mhz
        if not clocks or any(f <= 0 for f in clocks):
            raise ValueError(f"clocks_mhz must be positive and non-empty, got {clocks}")
        if any(a <= b for a, b in itertools.pairwise(clocks)):
            raise ValueError("clocks_mhz must be strictly descending")
        if not 0 < self.knee_clock_mhz < clocks[0]:
            raise ValueError(
                f"knee_clock_mhz must lie in (0, {clocks[0]}), got {self.knee_clock_mhz}"
            )
        if not 0 < self.min_voltage <= 1:
            raise ValueError(f"min_voltage must lie in (0, 1], got {self.min_voltage}")
        if not 0 <= self.compute_fraction <= 1:
            raise ValueError(f"compute_fraction must lie in [0, 1], got {self.compute_fraction}")
        if not 0 < self.idle_power_w < self.power_limit_w:
            raise ValueError("need 0 < idle_power_w < power_limit_w")
        if self.counter_period_s <= 0 or self.power_time_constant_s <= 0:
            raise ValueError("counter_period_s and power_time_constant_s must be > 0")
        if self.read_cost_s < 0 or self.clock_change_delay_s < 0:
            raise ValueError("read_cost_s and clock_change_delay_s must be >= 0")

    @property
    def max_clock_mhz(self) -> int:
        """The highest supported clock, ``F_MAX``."""
        return self.clocks_mhz[0]

    def time_s(self, work: FakeWork, frequency_mhz: float) -> float:
        """Time of ``work`` at ``frequency_mhz`` (any positive clock), in seconds."""
        c = self.compute_fraction
        return work.time_at_max_s * (c * self.max_clock_mhz / frequency_mhz + (1.0 - c))

    def voltage(self, frequency_mhz: float) -> float:
        """Voltage at ``frequency_mhz``, relative to the voltage at the top clock."""
        if frequency_mhz <= self.knee_clock_mhz:
            return self.min_voltage
        rise = (frequency_mhz - self.knee_clock_mhz) / (self.max_clock_mhz - self.knee_clock_mhz)
        return self.min_voltage + (1.0 - self.min_voltage) * rise

    def power_w(self, work: FakeWork, frequency_mhz: float) -> float:
        """Busy power of ``work`` at ``frequency_mhz``, in watts, ignoring the power limit.

        Raises:
            ValueError: ``work.power_at_max_w`` is below the model's idle power.
        """
        dynamic_w = work.power_at_max_w - self.idle_power_w
        if dynamic_w < 0:
            raise ValueError(
                f"power_at_max_w {work.power_at_max_w} W is below the idle power "
                f"{self.idle_power_w} W"
            )
        v = self.voltage(frequency_mhz)
        return self.idle_power_w + dynamic_w * (frequency_mhz / self.max_clock_mhz) * v * v

    def energy_j(self, work: FakeWork, frequency_mhz: float) -> float:
        """Energy of one ``work`` at ``frequency_mhz``, in joules: time times busy power."""
        return self.time_s(work, frequency_mhz) * self.power_w(work, frequency_mhz)

    def unlocked_clock_mhz(self, work: FakeWork) -> int:
        """The clock ``work`` runs at with no lock: the highest one within the power limit.

        Complexity: O(number of clocks).
        """
        for f in self.clocks_mhz:
            if self.power_w(work, f) <= self.power_limit_w:
                return f
        return self.clocks_mhz[-1]

    def running_clock_mhz(self, work: FakeWork, locked_mhz: int | None) -> int:
        """The clock ``work`` runs at under a lock at ``locked_mhz`` (None: no lock): the lock,
        but never above the unlocked clock, as a real GPU's power capping throttles a locked
        clock too.

        Complexity: O(number of clocks).
        """
        unlocked = self.unlocked_clock_mhz(work)
        return unlocked if locked_mhz is None else min(locked_mhz, unlocked)

    def min_energy_clock_mhz(self, work: FakeWork) -> int:
        """The supported clock at which ``work`` uses the least energy (the highest on a tie)."""
        return min(self.clocks_mhz, key=lambda f: (self.energy_j(work, f), -f))


def default_work(stage: int, stages: int) -> dict[str, FakeWork]:
    """Forward and backward of one stage of a GPT-like pipeline on the default model.

    A middle stage's forward takes 20 ms at 620 W and its backward 40 ms at 760 W at the top
    clock (so the backward throttles when unlocked). The backward's halves of a zero-bubble
    schedule, ``backward_input`` and ``backward_weight``, take :data:`BACKWARD_INPUT_SHARE` and
    the rest of the backward's time at its power: they sum to the backward exactly. Stage 0
    takes 1.1 times as long (the embedding), the last stage 1.3 times (LM head and loss), both
    with one stage; powers do not change. The pipeline is therefore imbalanced, like real ones.

    Args:
        stage: The stage, ``0 <= stage < stages``.
        stages: Number of pipeline stages, >= 1.

    Returns:
        ``{"forward": ..., "backward": ..., "backward_input": ..., "backward_weight": ...}``.

    Raises:
        ValueError: ``stage`` or ``stages`` is out of range.
    """
    if stages < 1 or not 0 <= stage < stages:
        raise ValueError(f"need 0 <= stage < stages, got stage={stage}, stages={stages}")
    scale = (1.1 if stage == 0 else 1.0) * (1.3 if stage == stages - 1 else 1.0)
    backward_s = 0.040 * scale
    return {
        "forward": FakeWork(time_at_max_s=0.020 * scale, power_at_max_w=620.0),
        "backward": FakeWork(time_at_max_s=backward_s, power_at_max_w=760.0),
        "backward_input": FakeWork(
            time_at_max_s=backward_s * BACKWARD_INPUT_SHARE, power_at_max_w=760.0
        ),
        "backward_weight": FakeWork(
            time_at_max_s=backward_s * (1.0 - BACKWARD_INPUT_SHARE), power_at_max_w=760.0
        ),
    }


def default_throttled_clocks_mhz(model: FakeGpuModel | None = None) -> dict[str, int]:
    """The clock each kind of :func:`default_work` runs at under a lock at or above it (its
    unlocked clock, the same on every stage: only times differ between stages): a clock log's
    ``ran_mhz`` is ``min(frequency_mhz, this)`` for a plan followed on time."""
    model = model if model is not None else FakeGpuModel()
    return {kind: model.unlocked_clock_mhz(work) for kind, work in default_work(0, 1).items()}
