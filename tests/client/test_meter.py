"""The energy meter against a scripted counter on a manual clock, with no real waiting."""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np
import pytest

from perseus.client.gpu.fake import FakeGpu, default_work
from perseus.client.gpu.meter import EnergyMeter
from perseus.core.errors import GpuControlError

# Helpers ----------------------------------------------------------------------------------------
from .clocks import ManualClock


class ScriptedCounter:
    """A GPU whose energy counter follows a script, on a manual clock it moves itself.

    Read ``i`` starts at ``i * READ_S`` and ends at ``(i + 1) * READ_S`` (its middle is
    ``(i + 0.5) * READ_S``); the counter ticks every ten reads and then holds the energy of
    ``watts[k]`` over each 0.1 s tick ``k`` before it. After the script the counter fails,
    which ends the meter's thread.
    """

    READ_S = 0.01

    def __init__(self, watts: list[float]) -> None:
        self.clock = ManualClock()
        self.watts = watts
        self.reads = 0
        self.done = threading.Event()
        self.tick_j = np.concatenate([[0.0], np.cumsum(np.array(watts) * 0.1)])

    # GpuControl (only what the meter uses does anything)
    index = 0
    name = "scripted"
    can_set_clocks = False

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return (1980,)

    def default_clock_mhz(self) -> int:
        return 1980

    def current_clock_mhz(self) -> int:
        return 1980

    def lock_clock(self, frequency_mhz: int) -> None:
        raise AssertionError("the meter never sets clocks")

    def reset_clock(self) -> None:
        raise AssertionError("the meter never sets clocks")

    def power_w(self) -> float:
        return 0.0

    def energy_j(self) -> float:
        i = self.reads
        if i >= 10 * len(self.watts):
            self.done.set()
            raise GpuControlError("end of script")
        self.reads += 1
        self.clock.now = (i + 1) * self.READ_S
        return float(self.tick_j[i // 10])

    def middles(self) -> np.ndarray:
        return (np.arange(self.reads) + 0.5) * self.READ_S

    def values(self) -> np.ndarray:
        return self.tick_j[np.arange(self.reads) // 10]


@pytest.fixture
def scripted() -> tuple[ScriptedCounter, EnergyMeter]:
    """A meter that has read a whole script (200 W for 1 s, 400 W for 1 s, 100 W for 1 s)."""
    gpu = ScriptedCounter([200.0] * 10 + [400.0] * 10 + [100.0] * 10)
    meter = EnergyMeter(gpu, clock=gpu.clock)
    with meter.precise():  # back to back: the manual clock moves only in reads
        meter.start()
        assert gpu.done.wait(10.0)
        meter.stop()
    assert meter.failed == "end of script"
    return gpu, meter


def test_meter_power_is_the_regression_slope_over_updates(
    scripted: tuple[ScriptedCounter, EnergyMeter],
) -> None:
    gpu, meter = scripted
    # Updates are seen by reads 10k, whose middles are 0.1 k + 0.005 s.
    first = meter.power(0.0, 0.95)
    assert first is not None
    assert first.power_w == pytest.approx(200.0)
    assert first.updates == 9
    assert first.start_s == pytest.approx(0.105) and first.end_s == pytest.approx(0.905)
    second = meter.power(1.2, 2.0)
    assert second is not None and second.power_w == pytest.approx(400.0)
    assert second.updates == 8
    # Across a change of power: the least-squares slope of the same points.
    mixed = meter.power(0.5, 2.5)
    assert mixed is not None
    k = np.arange(5, 25)
    slope = np.polyfit(0.1 * k + 0.005, gpu.tick_j[k], 1)[0]
    assert mixed.power_w == pytest.approx(slope)
    assert mixed.updates == 20


def test_meter_power_needs_enough_updates(scripted: tuple[ScriptedCounter, EnergyMeter]) -> None:
    _, meter = scripted
    assert meter.power(0.0, 0.25) is None  # updates at 0.105 and 0.205 only
    two = meter.power(0.0, 0.25, min_updates=2)
    assert two is not None and two.power_w == pytest.approx(200.0)
    assert meter.power(5.0, 6.0) is None
    assert meter.power(0.11, 0.2) is None


def test_meter_counts_updates_between(scripted: tuple[ScriptedCounter, EnergyMeter]) -> None:
    _, meter = scripted
    assert meter.updates_between(0.0, 0.95) == 9
    first = meter.power(0.0, 0.95)
    assert first is not None
    assert meter.updates_between(first.start_s, first.start_s) == 1  # inclusive bounds
    assert meter.updates_between(0.106, 0.204) == 0
    assert meter.updates_between(0.0, 10.0) == 29  # ticks 1..29; the first read is no update
    assert meter.updates_between(10.0, 11.0) == 0


def _true_energy_j(gpu: ScriptedCounter, at_s: float) -> float:
    """The scripted counter's exact energy at ``at_s``: each tick's power held over it."""
    k = min(int(at_s / 0.1), len(gpu.watts) - 1)
    return float(gpu.tick_j[k] + gpu.watts[k] * (at_s - 0.1 * k))


@pytest.mark.parametrize(("start_s", "end_s"), [(0.333, 0.777), (0.11, 0.9), (2.2, 2.9)])
def test_meter_energy_between_reads_the_updates_not_the_reads(
    scripted: tuple[ScriptedCounter, EnergyMeter], start_s: float, end_s: float
) -> None:
    # Updates are timed at the middle of the read that saw them, 5 ms after the tick: a
    # window is the true energy over the window 5 ms earlier.
    gpu, meter = scripted
    shifted = _true_energy_j(gpu, end_s - 0.005) - _true_energy_j(gpu, start_s - 0.005)
    assert meter.energy_between(start_s, end_s) == pytest.approx(shifted, rel=1e-9)


def test_meter_energy_between_splits_an_update_period_at_a_step_in_power() -> None:
    # 100 W, then a step to 500 W 30 ms into the period from 1.0 s, then 500 W until a step
    # back to 100 W 60 ms into the period from 2.1 s: the periods holding a step average
    # 380 W and 340 W. A window from step to step (each seen 5 ms late, as the updates) is
    # 500 W over 1.13 s exactly; the reads (each holding the counter as of up to 0.1 s
    # before) say over 20 J less.
    gpu = ScriptedCounter([100.0] * 10 + [380.0] + [500.0] * 10 + [340.0] + [100.0] * 8)
    meter = EnergyMeter(gpu, clock=gpu.clock)
    with meter.precise():
        meter.start()
        assert gpu.done.wait(10.0)
        meter.stop()
    assert meter.energy_between(1.035, 2.165) == pytest.approx(500.0 * 1.13)
    t, e = gpu.middles(), gpu.values()
    assert float(np.interp(2.165, t, e) - np.interp(1.035, t, e)) < 500.0 * 1.13 - 20.0
    assert meter.energy_between(0.5, 0.8) == pytest.approx(100.0 * 0.3)  # steady: the line


def test_meter_energy_between_outside_the_reads_is_none(
    scripted: tuple[ScriptedCounter, EnergyMeter],
) -> None:
    gpu, meter = scripted
    assert meter.energy_between(0.0, 1.0) is None  # the first read's middle is 0.005
    assert meter.energy_between(1.0, 3.5) is None  # the last read's middle is 2.995
    total = gpu.values()[-1] - gpu.values()[0]
    assert meter.energy_between(0.005, 2.995) == pytest.approx(total)


def test_meter_energies_between_is_energy_between_of_each_window(
    scripted: tuple[ScriptedCounter, EnergyMeter],
) -> None:
    _, meter = scripted
    windows = [(0.333, 0.5), (0.6, 1.777), (2.0, 2.9)]
    energies = meter.energies_between(windows)
    assert energies is not None
    assert energies == pytest.approx([meter.energy_between(a, b) for a, b in windows])
    assert meter.energies_between([]) == []
    # one window the reads do not cover: none at all (the caller waits for more reads)
    assert meter.energies_between([*windows, (2.9, 3.5)]) is None


def test_normal_reads_measure_a_pipeline_ranks_iterations_as_they_ran() -> None:
    # A pipeline rank's pattern on the fake GPU, in real time (about 4 s): 0.25 s blocking at
    # idle power, then six forward-backward pairs (0.36 s). The meter in normal mode learns
    # the counter's period, then reads about once per update. Each iteration's energy is
    # within 3 % of the fake's exact integral over it (the median within 1.5 %), where
    # interpolating the reads, each the counter of up to 0.1 s before, measured 5-15 % low.
    gpu = FakeGpu(work=default_work(1, 4), clock=time.perf_counter)
    meter = EnergyMeter(gpu)
    spans: list[tuple[float, float, float]] = []
    meter.start()
    try:
        time.sleep(0.6)  # the period learnt
        for _ in range(6):
            time.sleep(0.25)
            start, before = time.perf_counter(), gpu.true_energy_j()
            for kind in ("forward", "backward") * 6:
                gpu.run(kind)
            spans.append((start, time.perf_counter(), gpu.true_energy_j() - before))
        time.sleep(0.3)  # reads past the last iteration
    finally:
        meter.stop()
    assert meter.update_period_s == pytest.approx(0.1, rel=0.05)
    measured = meter.energies_between([(start, end) for start, end, _ in spans])
    assert measured is not None
    errors = [abs(m / truth - 1) for m, (_, _, truth) in zip(measured, spans, strict=True)]
    assert statistics.median(errors) < 0.015, errors
    assert max(errors) < 0.03, errors


def test_meter_without_reads_answers_none() -> None:
    gpu = ScriptedCounter([200.0])
    meter = EnergyMeter(gpu, clock=gpu.clock)
    assert meter.energy_between(0.0, 1.0) is None
    assert meter.energies_between([(0.0, 1.0)]) is None
    assert meter.power(0.0, 1.0) is None
    assert meter.updates_between(0.0, 1.0) == 0


# ClockController -----------------------------------------------------------------------------
