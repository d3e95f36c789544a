"""The blocking power of a rank's GPU: measure_idle_power over a wait, and
in_pipeline_wait_power solved from a window of the training stream (StreamWindow, WaitPower)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pytest

from perseus.client.profiling.measurements import ClockMeasurement, split_backward
from perseus.client.profiling.wait_power import (
    MIN_WAIT_S,
    MIN_WAIT_SHARE,
    StreamWindow,
    in_pipeline_wait_power,
    measure_idle_power,
)
from perseus.core.errors import ProfileError

from .clocks import ManualClock

# At the default clock: forward 10 ms at 500 W, backward 20 ms at 600 W; their loops drew
# 500 W and (5 + 12) J / 30 ms = 566.7 W.
DEFAULT = ClockMeasurement(
    frequency_mhz=1980,
    forward_time_s=0.010,
    forward_energy_j=5.0,
    backward_time_s=0.020,
    backward_energy_j=12.0,
    forward_loop_power_w=500.0,
    forward_backward_loop_power_w=17.0 / 0.030,
)


def stream(wait_w: float, *, iterations: int = 20, waits_s: float = 0.04) -> StreamWindow:
    """``iterations`` of 4 forwards and 4 backwards (120 ms busy at DEFAULT) and ``waits_s``
    of waiting at ``wait_w``: what the meter would measure."""
    busy_s, busy_j = 4 * 0.030, 4 * 17.0
    return StreamWindow(
        iterations=iterations,
        time_s=iterations * (busy_s + waits_s),
        energy_j=iterations * (busy_j + waits_s * wait_w),
        forwards=4 * iterations,
        backwards=4 * iterations,
    )


def test_wait_power_is_what_the_stream_spent_beyond_its_busy_energy() -> None:
    # 20 iterations of 160 ms (3.2 s), 0.8 s of it waiting at 330 W: the estimate is 330 W,
    # not the 125 W measured at rest.
    wait = in_pipeline_wait_power(stream(330.0), DEFAULT, idle_w=125.0)
    assert wait.power_w == pytest.approx(330.0) and wait.raw_w == pytest.approx(330.0)
    assert wait.wait_s == pytest.approx(0.8) and wait.busy_s == pytest.approx(2.4)
    assert wait.busy_energy_j == pytest.approx(20 * 68.0)
    assert wait.wait_energy_j == pytest.approx(0.8 * 330.0)
    assert wait.clamped is None
    # The planner's model then reproduces the measured energy of these iterations.
    window = stream(330.0)
    assert wait.busy_energy_j + wait.power_w * (window.time_s - wait.busy_s) == pytest.approx(
        window.energy_j
    )


def test_wait_power_of_interleaved_chunks_costs_their_share() -> None:
    # Two virtual stages: each instruction is half the stage's profile (4 + 4 per iteration:
    # 60 ms busy, 40 ms waiting).
    window = StreamWindow(
        iterations=10,
        time_s=10 * 0.1,
        energy_j=10 * (34.0 + 0.04 * 250.0),
        forwards=40,
        backwards=40,
    )
    wait = in_pipeline_wait_power(window, DEFAULT, scale=0.5, idle_w=125.0)
    assert wait.power_w == pytest.approx(250.0) and wait.wait_s == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("wait_w", "expected_w", "clamped"),
    [(60.0, 125.0, "idle"), (900.0, 17.0 / 0.030, "loop"), (566.0, 566.0, None)],
)
def test_wait_power_is_clamped_between_the_idle_and_the_loop_power(
    wait_w: float, expected_w: float, clamped: str | None
) -> None:
    wait = in_pipeline_wait_power(stream(wait_w), DEFAULT, idle_w=125.0)
    assert wait.power_w == pytest.approx(expected_w)
    assert wait.raw_w == pytest.approx(wait_w)
    assert wait.clamped == clamped
    assert ("clamped from" in wait.describe(stream(wait_w))) == (clamped is not None)


def test_wait_power_without_an_idle_power_is_clamped_only_above() -> None:
    assert in_pipeline_wait_power(stream(60.0), DEFAULT, idle_w=None).power_w == pytest.approx(60)


def test_too_little_waiting_is_not_solved_for() -> None:
    # The last stage of a pipeline: 3 ms of waits per 123 ms iteration (2.4 %).
    with pytest.raises(ProfileError, match="too little waiting"):
        in_pipeline_wait_power(stream(330.0, waits_s=0.003), DEFAULT, idle_w=125.0)
    # Enough share, too little time in all.
    with pytest.raises(ProfileError, match="too little waiting"):
        in_pipeline_wait_power(stream(330.0, iterations=1), DEFAULT, idle_w=125.0)
    with pytest.raises(ProfileError, match="no usable energy"):
        in_pipeline_wait_power(replace(stream(330.0), energy_j=0.0), DEFAULT, idle_w=125.0)


def test_wait_power_counts_the_backward_halves() -> None:
    reference = split_backward(DEFAULT, 0.008, 5.0, 500.0)  # I 8 ms 5 J, W 12 ms 7 J
    busy_s, busy_j = 4 * (0.010 + 0.008 + 0.012), 4 * (5.0 + 5.0 + 7.0)
    window = StreamWindow(
        iterations=20,
        time_s=20 * (busy_s + 0.04),
        energy_j=20 * (busy_j + 0.04 * 300.0),
        forwards=80,
        backwards=0,
        backward_inputs=80,
        backward_weights=80,
    )
    wait = in_pipeline_wait_power(window, reference, idle_w=125.0)
    assert wait.power_w == pytest.approx(300.0)
    assert wait.busy_s == pytest.approx(20 * busy_s)
    with pytest.raises(ProfileError, match="no backward_input"):
        in_pipeline_wait_power(window, DEFAULT, idle_w=125.0)


# measure_idle_power ---------------------------------------------------------------------------


@dataclass
class Reading:
    power_w: float


class PowerLog:
    """A meter that answers a constant power over any span, and records what it was asked."""

    def __init__(self, power_w: float | None) -> None:
        self.power_w = power_w
        self.asked: list[tuple[float, float]] = []
        self.precise_spans = 0
        self.inside = False

    @contextmanager
    def precise(self) -> Iterator[None]:
        self.inside = True
        self.precise_spans += 1
        try:
            yield
        finally:
            self.inside = False

    def power(self, start_s: float, end_s: float) -> Reading | None:
        self.asked.append((start_s, end_s))
        return None if self.power_w is None else Reading(self.power_w)


@pytest.mark.parametrize(("seconds", "skipped_s"), [(2.0, 0.2), (0.4, 0.1)])
def test_idle_power_is_read_over_the_wait_past_its_first_moments(
    seconds: float, skipped_s: float
) -> None:
    clock = ManualClock()
    clock.advance(100.0)
    meter = PowerLog(123.5)
    waited: list[float] = []

    def wait(s: float) -> None:
        assert meter.inside  # the meter reads precisely while the GPU waits
        waited.append(s)
        clock.advance(s)

    power = measure_idle_power(meter, wait, seconds, clock)  # type: ignore[arg-type]
    assert power == 123.5
    assert waited == [seconds] and meter.precise_spans == 1
    assert meter.asked == [(pytest.approx(100.0 + skipped_s), pytest.approx(100.0 + seconds))]


def test_idle_power_without_a_usable_reading_is_none() -> None:
    clock = ManualClock()
    meter = PowerLog(None)
    assert measure_idle_power(meter, clock.advance, 1.0, clock) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("share", "solves"), [(MIN_WAIT_SHARE * 1.01, True), (MIN_WAIT_SHARE * 0.99, False)]
)
def test_waits_below_the_minimum_share_are_not_solved_for(share: float, solves: bool) -> None:
    waits_s = 4 * 0.030 * share / (1 - share)  # per iteration of 120 ms busy
    window = stream(330.0, waits_s=waits_s)
    assert 20 * waits_s > MIN_WAIT_S  # the share decides, not the total
    if solves:
        assert in_pipeline_wait_power(window, DEFAULT, idle_w=None).power_w == pytest.approx(330.0)
    else:
        with pytest.raises(ProfileError, match="too little waiting"):
            in_pipeline_wait_power(window, DEFAULT, idle_w=None)
