"""What a rank measured of its stage: time and energy per instruction kind at each clock.

:class:`ClockMeasurement` is one clock's forward and backward, and the backward's halves when
the schedule splits it (:func:`split_backward` derives them; see
:mod:`perseus.client.profiling.profiler`); :class:`StageProfile` is a sweep's measurements,
rendered as
wire rows or a Zeus CSV. :func:`calibrated` scales a profile by the ratios the training
stream measured against the loops (see :mod:`perseus.client.profiling.online`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perseus.core.errors import ProfileError
from perseus.schemas import ProfileRow

__all__ = [
    "MIN_HALF_SHARE",
    "ClockMeasurement",
    "StageProfile",
    "calibrated",
    "profile_csv",
    "split_backward",
]

MIN_HALF_SHARE = 0.01
"""Each half of a split backward is reported as at least this share of the backward's time
and energy (a first stage's ``I`` is empty; see :mod:`perseus.client.profiling.profiler`)."""

_SPLIT_KINDS = ("backward_input", "backward_weight")


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
