"""SweepOrder: which clocks a sweep measures, fed known energies and times (no GPU, no loops).

The curves are the fake H200's model (``fake_model``: least energy at its 1200 MHz knee, a
backward held at its power limit above 1890 MHz), an A40-like one whose energy rises over its
top clocks before it falls, and one whose fastest clock is below the top; how plans on the
clocks chosen compare with plans on every clock is ``tests/solver/test_sweep_clocks.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from perseus.client.gpu.fake_model import FakeGpuModel, default_work
from perseus.client.profiling.sweep_order import STRIDE, SweepOrder

MODEL = FakeGpuModel()
CLOCKS = MODEL.clocks_mhz  # 1980 down to 345 in 15 MHz steps: 110 clocks
RISING_STOP = 5

Curve = Callable[[int], tuple[float, tuple[float, ...]]]


def fake_curve(f: int) -> tuple[float, tuple[float, ...]]:
    """Microbatch energy and (forward, backward) times of the fake's middle stage at ``f``."""
    work = default_work(1, 4)
    ran = {k: MODEL.running_clock_mhz(work[k], f) for k in ("forward", "backward")}
    energy = sum(MODEL.energy_j(work[k], ran[k]) for k in ran)
    return energy, tuple(MODEL.time_s(work[k], ran[k]) for k in ran)


def sweep(order: SweepOrder, curve: Curve) -> list[int]:
    """Run ``order`` on ``curve``; returns the clocks measured, in order, and checks that the
    progress it reports never promises fewer clocks than it ends up measuring."""
    while (clock := order.next_clock()) is not None:
        assert order.planned_clocks >= order.done_clocks
        energy, times = curve(clock)
        order.record(clock, energy, times)
    assert order.done and order.planned_clocks == order.done_clocks == len(order.measured)
    return list(order.measured)


def test_stride_one_measures_every_clock_until_energy_rose_at_five() -> None:
    order = SweepOrder(CLOCKS, rising_stop=RISING_STOP)
    measured = sweep(order, fake_curve)
    least = MODEL.min_energy_clock_mhz(default_work(1, 4)["backward"])
    assert measured == list(CLOCKS[: CLOCKS.index(least) + 1 + RISING_STOP])
    assert order.stopped == f"energy rose at 5 clocks in a row (down to {measured[-1]} MHz)"


def test_stride_one_without_a_rise_measures_all() -> None:
    order = SweepOrder((1980, 1500, 1005), rising_stop=RISING_STOP)
    assert order.planned_clocks == 3
    assert sweep(order, lambda f: (1.0 / f, (1.0 / f,))) == [1980, 1500, 1005]
    assert order.stopped == "all 3 clocks measured"


def test_coarse_then_fine_on_the_fake_h200() -> None:
    order = SweepOrder(CLOCKS, rising_stop=RISING_STOP, stride=STRIDE)
    measured = sweep(order, fake_curve)
    coarse = [f for f in measured if CLOCKS.index(f) % STRIDE == 0]
    # the coarse pass comes first, high to low, every 4th clock from the top
    assert measured[: len(coarse)] == coarse == list(CLOCKS[: len(coarse) * STRIDE : STRIDE])
    # it ran past the least energy (1200 MHz) until energy rose at 2 coarse clocks in a row
    assert coarse[-3:] == [1200, 1140, 1080]
    assert "energy rose at 2 clocks in a row (down to 1080 MHz)" in (order.stopped or "")
    # fine: every 2nd clock from the top to past the least energy, every clock next to 1200
    # and next to the fastest (the top: the backward runs there at every lock from 1905 up)
    assert set(CLOCKS[0 : CLOCKS.index(1140) + 1 : 2]) <= set(measured)
    assert {1980, 1965, 1215, 1200, 1185} <= set(measured)
    assert len(measured) == 33
    assert len(measured) < len(CLOCKS) / 3


def test_a_flat_top_is_not_the_rise_past_the_least_energy() -> None:
    # An A40-like curve: energy 1 % above the top's over the top 20 clocks, then falling by a
    # third to 1005 MHz, then rising. Two coarse rises at the top must not stop the sweep.
    def curve(f: int) -> tuple[float, tuple[float, ...]]:
        if f >= 1700:
            energy = 100.0 if f == 1980 else 101.0 + (1980 - f) * 1e-3
        else:
            energy = 67.0 + abs(f - 1005) * 0.05
        return energy, (1980 / f,)

    order = SweepOrder(CLOCKS, rising_stop=RISING_STOP, stride=STRIDE)
    measured = sweep(order, curve)
    assert 1005 in measured and min(measured) < 1005


def test_the_fine_pass_goes_where_the_fastest_clock_is() -> None:
    # The fastest clock is 1575 MHz (a GPU at its power limit: a lower lock runs faster), the
    # fastest coarse one 1560 MHz: the fine pass measures the clocks next to it.
    def curve(f: int) -> tuple[float, tuple[float, ...]]:
        time_s = 1.0 + (f - 1575) * 1e-3 if f >= 1575 else 1.0 + (1575 - f) * 1e-4
        return 50.0 + abs(f - 1200) * 0.02, (time_s,)

    order = SweepOrder(CLOCKS, rising_stop=RISING_STOP, stride=STRIDE)
    measured = sweep(order, curve)
    assert {1590, 1575, 1560, 1545, 1530} <= set(measured)


def test_planned_clocks_shrinks_once_energy_rises() -> None:
    order = SweepOrder(CLOCKS, rising_stop=RISING_STOP, stride=STRIDE)
    first = order.planned_clocks
    assert len(CLOCKS) / 2 < first < len(CLOCKS)  # an upper bound, far below every clock
    sweep(order, fake_curve)
    assert order.done_clocks < first


def test_only_the_clock_named_next_can_be_recorded() -> None:
    order = SweepOrder((1980, 1500), rising_stop=RISING_STOP)
    with pytest.raises(ValueError, match="1500 MHz is not the clock to measure next"):
        order.record(1500, 1.0, (1.0,))
    order.record(1980, 1.0, (1.0,))
    order.record(1500, 0.9, (1.1,))
    assert order.next_clock() is None
    with pytest.raises(ValueError, match="not the clock to measure next"):
        order.record(1500, 0.9, (1.1,))


@pytest.mark.parametrize(
    ("clocks", "stride", "stop"),
    [((), 1, 5), ((1500, 1980), 1, 5), ((1980,), 0, 5), ((1980,), 1, 0)],
)
def test_bad_arguments_are_refused(clocks: tuple[int, ...], stride: int, stop: int) -> None:
    with pytest.raises(ValueError):
        SweepOrder(clocks, rising_stop=stop, stride=stride)
