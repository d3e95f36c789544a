"""The training stream while a rank profiles: StreamSampler's device stamps and iteration spans
(on a manual clock), and StreamEnergy's reading of the meter over them (scripted meters)."""

from __future__ import annotations

import pytest

from perseus.client.clocks.boundary import Stamp
from perseus.client.profiling.stream_sampling import (
    MAX_CALIBRATION_SPANS,
    MAX_STREAM_SAMPLES,
    IterationSpan,
    StreamEnergy,
    StreamSampler,
)
from perseus.client.profiling.wait_power import StreamWindow

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


# Iteration spans, for calibrating with the training stream ----------------------------------


def test_spans_are_kept_only_while_collecting_with_their_instructions() -> None:
    s, clock = sampler()
    for collecting in (False, True, True):
        s.collecting = collecting
        clock.advance(1.0)  # before the first instruction: not in the span
        for kind in ("forward", "forward", "backward"):
            s.begin(kind)
            clock.advance(0.1)
            s.end()
            clock.advance(0.05)  # a wait between instructions: in the span
        s.iteration_done()
    assert [(span.start.at_s, span.end.at_s) for span in s.spans] == [
        (pytest.approx(2.45), pytest.approx(2.9)),
        (pytest.approx(3.9), pytest.approx(4.35)),
    ]
    assert [span.counts for span in s.spans] == [{"forward": 2, "backward": 1}] * 2
    assert s.spans[0].seconds == pytest.approx(0.45)
    # still sampled per kind while collecting, and nothing carries over into a new iteration
    assert len(s.samples["forward"]) == 4
    s.iteration_done()
    assert len(s.spans) == 2


def test_spans_are_bounded() -> None:
    s, _ = sampler()
    s.collecting = True
    for _ in range(MAX_CALIBRATION_SPANS + 5):
        s.begin("forward")
        s.end()
        s.iteration_done()
    assert len(s.spans) == MAX_CALIBRATION_SPANS


class ScriptedMeter:
    """What StreamEnergy uses of a meter: reads cover the spans from the ``covered``-th call."""

    def __init__(self, energies: list[float], covered: int = 0, failed: str | None = None):
        self.energies = energies
        self.covered = covered
        self.failed = failed
        self.calls = 0

    def energies_between(self, windows: list[tuple[float, float]]) -> list[float] | None:
        self.calls += 1
        return self.energies if self.calls > self.covered else None


def spans(*kinds: dict[str, int]) -> list[IterationSpan]:
    return [
        IterationSpan(Stamp(float(i)), Stamp(i + 0.5), counts) for i, counts in enumerate(kinds)
    ]


def test_stream_energy_sums_the_spans_once_the_meter_covers_them() -> None:
    meter = ScriptedMeter([100.0, 120.0], covered=2)
    energy = StreamEnergy(meter, spans({"forward": 2}, {"forward": 1, "backward": 3}), 10.0)  # type: ignore[arg-type]
    assert energy.done.wait(5.0)
    assert energy.error is None and meter.calls == 3
    assert energy.window == StreamWindow(
        iterations=2, time_s=1.0, energy_j=220.0, forwards=3, backwards=3
    )


def test_stream_energy_counts_the_backward_halves() -> None:
    meter = ScriptedMeter([100.0])
    counts = {"forward": 2, "backward_input": 2, "backward_weight": 1}
    energy = StreamEnergy(meter, spans(counts), 10.0)  # type: ignore[arg-type]
    assert energy.done.wait(5.0)
    assert energy.window == StreamWindow(
        iterations=1, time_s=0.5, energy_j=100.0, forwards=2, backwards=0,
        backward_inputs=2, backward_weights=1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("meter", "counts", "error"),
    [
        (
            ScriptedMeter([1.0], covered=10**9, failed="gone"),
            {"forward": 1},
            "counter failed: gone",
        ),
        (ScriptedMeter([1.0], covered=10**9), {"forward": 1}, "did not read past"),
        (ScriptedMeter([1.0]), {"recompute": 1}, "the profile lacks"),
    ],
)
def test_stream_energy_says_why_it_has_nothing(
    meter: ScriptedMeter, counts: dict[str, int], error: str
) -> None:
    energy = StreamEnergy(meter, spans(counts), 0.0)  # type: ignore[arg-type]
    assert energy.done.wait(5.0)
    assert energy.window is None and error in (energy.error or "")


def test_a_span_has_no_duration_until_both_stamps_are_resolved() -> None:
    start, end = Stamp(), Stamp()
    span = IterationSpan(start, end, {"forward": 1})
    assert span.seconds is None
    start.at_s = 2.0
    assert span.seconds is None
    end.at_s = 2.25
    assert span.seconds == 0.25


class BrokenMeter:
    failed = None

    def energies_between(self, windows: list[tuple[float, float]]) -> list[float] | None:
        raise ValueError("no reads")


def test_a_meter_that_raises_is_an_error_not_a_dead_thread() -> None:
    energy = StreamEnergy(BrokenMeter(), spans({"forward": 1}), 10.0)  # type: ignore[arg-type]
    assert energy.done.wait(5.0)
    energy.join(5.0)
    assert energy.window is None and energy.error == "ValueError: no reads"
