"""What a rank measured of its stage: ClockMeasurement, StageProfile (wire rows, the Zeus CSV,
inversions), split_backward and calibrated."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perseus.client.profiling.measurements import (
    MIN_HALF_SHARE,
    ClockMeasurement,
    StageProfile,
    calibrated,
    profile_csv,
    split_backward,
)
from perseus.core.errors import ProfileError
from perseus.solver import load_profile


def measurement(frequency_mhz: int, scale: float) -> ClockMeasurement:
    """Forward 20 ms and 10 J, backward 40 ms and 25 J at ``scale`` 1; a lower clock is a
    larger ``scale``: slower and, here, cheaper."""
    return ClockMeasurement(
        frequency_mhz=frequency_mhz,
        forward_time_s=0.02 * scale,
        forward_energy_j=10.0 / scale,
        backward_time_s=0.04 * scale,
        backward_energy_j=25.0 / scale,
        forward_loop_power_w=500.0,
        forward_backward_loop_power_w=600.0,
    )


# ClockMeasurement and StageProfile ------------------------------------------------------------


def test_stage_profile_rows_and_csv() -> None:
    profile = StageProfile(
        measurements=(measurement(1980, 1.0), measurement(1200, 1.5)), stopped="done"
    )
    rows = profile.rows()
    assert [(r.instruction, r.frequency_mhz) for r in rows] == [
        ("forward", 1980),
        ("backward", 1980),
        ("forward", 1200),
        ("backward", 1200),
    ]
    assert rows[0].time_s == 0.02 and rows[0].energy_j == 10.0
    assert rows[3].time_s == pytest.approx(0.06) and rows[3].energy_j == pytest.approx(25.0 / 1.5)
    assert profile.measurements[1].microbatch_energy_j == pytest.approx(35.0 / 1.5)
    csv_text = profile_csv({1: profile, 0: StageProfile((measurement(1980, 1.0),), "x")})
    lines = csv_text.splitlines()
    assert lines[0] == "stage,instruction,frequency,time,energy"
    assert lines[1:3] == ["0,forward,1980,0.02,10", "0,backward,1980,0.04,25"]
    assert len(lines) == 1 + 2 + 4 and lines[3].startswith("1,forward,1980,")


def test_inversions_name_a_lower_clock_that_ran_faster() -> None:
    """Times that do not follow the clocks (a busy machine) are named, worst pair per kind;
    noise within the tolerance and times that follow the clocks are not."""
    follows = StageProfile((measurement(1980, 1.0), measurement(1500, 1.05),
                            measurement(900, 1.5)), "done")  # fmt: skip
    assert follows.inversions() == []
    slow_top = replace(measurement(1500, 1.0), backward_time_s=0.5658)
    disturbed = StageProfile((measurement(1980, 1.0), slow_top, measurement(900, 1.5)), "done")
    assert disturbed.inversions() == ["backward took 565.8 ms at 1500 MHz but 60.0 ms at 900 MHz"]


def test_inversions_find_the_worst_pair_as_every_pair_would() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        clocks = rng.choice(np.arange(300, 2000, 15), size=int(rng.integers(1, 12)), replace=False)
        times = rng.uniform(0.5, 1.5, size=len(clocks))
        profile = StageProfile(
            tuple(replace(measurement(int(c), 1.0), forward_time_s=float(t))
                  for c, t in zip(clocks, times, strict=True)), "done")  # fmt: skip
        pairs = [(th / tl, ch, cl) for ch, th in zip(clocks, times, strict=True)
                 for cl, tl in zip(clocks, times, strict=True) if ch > cl]  # fmt: skip
        worst = max(pairs, default=(0.0, 0, 0))
        forward = [line for line in profile.inversions() if line.startswith("forward")]
        if worst[0] > 1.1:
            assert forward and f"at {worst[1]} MHz but" in forward[0]
            assert forward[0].endswith(f"at {worst[2]} MHz")
        else:
            assert not forward


def test_the_zeus_csv_reads_back_as_the_solver_reads_profiles(tmp_path: Path) -> None:
    profiles = {
        0: StageProfile((measurement(1980, 1.0), measurement(1200, 1.5)), "done"),
        1: StageProfile((measurement(1980, 1.1), measurement(1200, 1.7)), "budget"),
    }
    path = tmp_path / "profile.csv"
    path.write_text(profile_csv(profiles))
    loaded = load_profile(path)
    assert loaded.num_stages == 2
    for stage, profile in profiles.items():
        for m in profile.measurements:
            for kind in m.kinds:
                (option,) = [
                    o for o in loaded.stages[stage][kind] if o.frequency_mhz == m.frequency_mhz
                ]
                assert option.time_s == pytest.approx(m.time_s(kind), rel=1e-8)
                assert option.energy_j == pytest.approx(m.energy_j(kind), rel=1e-8)


def test_an_unsplit_measurement_has_no_halves() -> None:
    m = measurement(1980, 1.0)
    assert not m.split and m.kinds == ("forward", "backward")
    assert m.time_s("backward") == 0.04 and m.energy_j("forward") == 10.0
    for kind in ("backward_input", "backward_weight", "optimizer"):
        with pytest.raises(ProfileError, match=f"1980 MHz: no {kind} measured"):
            m.energy_j(kind)


# split_backward -------------------------------------------------------------------------------


def test_each_half_keeps_a_share_of_the_backward() -> None:
    # A first stage's input needs no gradient: its I is empty (noise around zero) and its W is
    # the whole backward; both stay positive so the planner gets a usable profile.
    m = measurement(1980, 1.0)
    empty = split_backward(m, -0.0001, -0.5, 500.0)
    assert empty.time_s("backward_input") == pytest.approx(MIN_HALF_SHARE * 0.04)
    assert empty.energy_j("backward_input") == pytest.approx(MIN_HALF_SHARE * 25.0)
    assert empty.time_s("backward_weight") == pytest.approx((1 - MIN_HALF_SHARE) * 0.04)
    even = split_backward(m, 0.02, 12.5, 500.0)
    assert even.time_s("backward_weight") == pytest.approx(0.02)
    assert even.energy_j("backward_weight") == pytest.approx(12.5)
    assert not m.split and m.kinds == ("forward", "backward")
    with pytest.raises(ProfileError, match="no backward_input"):
        m.time_s("backward_input")


@given(
    input_time_s=st.floats(-1.0, 1.0, allow_nan=False),
    input_energy_j=st.floats(-100.0, 100.0, allow_nan=False),
)
def test_the_halves_add_up_and_each_keeps_its_share(
    input_time_s: float, input_energy_j: float
) -> None:
    m = split_backward(measurement(1500, 1.2), input_time_s, input_energy_j, 480.0)
    assert m.split and m.kinds[2:] == ("backward_input", "backward_weight")
    assert m.forward_input_loop_power_w == 480.0
    for unit in ("time_s", "energy_j"):
        whole = getattr(m, f"backward_{unit}")
        halves = [getattr(m, unit)(kind) for kind in ("backward_input", "backward_weight")]
        assert sum(halves) == pytest.approx(whole)
        assert all(h >= MIN_HALF_SHARE * whole * (1 - 1e-9) for h in halves)


# calibrated -----------------------------------------------------------------------------------


def test_calibrating_scales_time_and_energy_by_the_kinds_ratio() -> None:
    profile = StageProfile((measurement(1980, 1.0), measurement(1200, 1.5)), "budget")
    out = calibrated(profile, {"forward": 1.25})
    assert out.stopped == "budget"
    for before, after in zip(profile.measurements, out.measurements, strict=True):
        assert after.forward_time_s == pytest.approx(1.25 * before.forward_time_s)
        assert after.forward_energy_j == pytest.approx(1.25 * before.forward_energy_j)
        # a kind without a ratio keeps its values, and the loops' power is kept
        assert after.backward_time_s == before.backward_time_s
        assert after.forward_loop_power_w == before.forward_loop_power_w
    assert calibrated(profile, {}) == profile


def test_calibrating_a_split_profile_scales_each_half() -> None:
    m = split_backward(measurement(1980, 1.0), 0.015, 10.0, 500.0)  # W: 25 ms, 15 J
    ratios = {"forward": 1.1, "backward_input": 1.2, "backward_weight": 0.9}
    out = calibrated(StageProfile((m,), "done"), ratios).measurements[0]
    assert out.forward_time_s == pytest.approx(0.022)
    assert out.time_s("backward_input") == pytest.approx(0.018)
    assert out.energy_j("backward_weight") == pytest.approx(13.5)
    # the stream ran no full backward: it stays the sum of its halves
    assert out.backward_time_s == pytest.approx(0.018 + 0.0225)
    assert out.backward_energy_j == pytest.approx(12.0 + 13.5)
    # a stream that ran full backwards too (DualPipeV) scales them by their own ratio
    both = calibrated(StageProfile((m,), "done"), {"backward": 2.0}).measurements[0]
    assert both.backward_time_s == pytest.approx(0.08)
    assert both.time_s("backward_input") == pytest.approx(0.015)
