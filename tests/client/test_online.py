"""Online profiling's pieces that need no training: the stream sampler and the states."""

from __future__ import annotations

from perseus.client.controller import Stamp
from perseus.client.online import MAX_STREAM_SAMPLES, ProfilingState, StreamSampler

from .clocks import ManualClock


def sampler() -> tuple[StreamSampler, ManualClock]:
    clock = ManualClock()
    return StreamSampler(lambda: Stamp(clock())), clock


def test_each_instruction_is_one_pair_of_stamps() -> None:
    s, clock = sampler()
    s.begin("forward")
    clock.advance(0.5)
    s.end()
    s.end()  # an end without a begin records nothing
    assert [(a.at_s, b.at_s) for a, b in s.samples["forward"]] == [(0.0, 0.5)]


def test_the_first_iteration_under_calibration_is_dropped() -> None:
    s, _ = sampler()
    s.begin("backward")
    s.end()
    s.iteration_done()
    assert s.samples == {} and s.iterations == 1
    s.begin("backward")
    s.end()
    s.iteration_done()
    assert len(s.samples["backward"]) == 1


def test_samples_are_bounded_per_kind() -> None:
    s, _ = sampler()
    for _ in range(MAX_STREAM_SAMPLES + 10):
        s.begin("forward")
        s.end()
    assert len(s.samples["forward"]) == MAX_STREAM_SAMPLES


def test_the_states_are_the_documented_ones() -> None:
    assert [state.value for state in ProfilingState] == [
        "off",
        "saved",
        "pending",
        "sweeping",
        "done",
        "failed",
    ]
