"""Plans on the clocks the default online sweep measures lose little against plans on every clock.

Each stage's sweep (``PERSEUS_PROFILE_CLOCKS=auto``: the rank's own
:class:`~perseus.client.profiling.sweep_order.SweepOrder`) is fed the profile's own values,
so it stops and refines where it would on that GPU; the profile restricted to what it
measured is planned beside the whole profile. At 1, 1.01 and 1.05 times the all-fastest
plan's time the best plan within must use at most 0.3 % more energy. The shipped example
profile always; the shared measured profiles where ``../shared`` exists.
``benchmarks/sweep_reduction.py`` prints the same comparison, zero-bubble schedules included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.client.profiling.sweep_order import STRIDE, SweepOrder
from perseus.client.settings import ProfileBudget
from perseus.solver import Profile, compute_frontier, load_profile, make_schedule
from perseus.solver.profiles import profile_from_rows
from perseus.solver.synthetic import EXAMPLE_P_BLOCK_W, example_profile

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "profiles"
FACTORS = (1.0, 1.01, 1.05)
MAX_LOSS = 0.003


def swept(profile: Profile) -> Profile:
    """``profile`` with each stage's rows at the clocks its sweep measures."""
    rows = []
    for stage, kinds in enumerate(profile.stages):
        backward = {o.frequency_mhz: o for o in kinds["backward"]}
        microbatch = {
            f.frequency_mhz: (
                f.energy_j + backward[f.frequency_mhz].energy_j,
                (f.time_s, backward[f.frequency_mhz].time_s),
            )
            for f in kinds["forward"]
        }
        order = SweepOrder(
            sorted(microbatch, reverse=True),
            rising_stop=ProfileBudget().rising_stop,
            stride=STRIDE,
        )
        while (clock := order.next_clock()) is not None:
            order.record(clock, *microbatch[clock])
        assert len(order.measured) < len(microbatch) * 0.6
        rows += [
            (stage, kind, o.frequency_mhz, o.time_s, o.energy_j)
            for kind, options in kinds.items()
            for o in options
            if o.frequency_mhz in order.measured
        ]
    return profile_from_rows(rows, p_block_w=profile.p_block_w)


def losses(profile: Profile, p_block_w: float, stages: int, microbatches: int) -> list[float]:
    schedule = make_schedule("1f1b", stages, microbatches)
    every = compute_frontier(profile, schedule, p_block_w=p_block_w)
    some = compute_frontier(swept(profile), schedule, p_block_w=p_block_w)
    fastest = every.baselines["all_fastest"].time_s
    found = []
    for factor in FACTORS:
        deadline = factor * fastest * (1 + 1e-12)
        e_every = float(every.energies_j[every.times_s <= deadline].min())
        fits = some.energies_j[some.times_s <= deadline]
        assert fits.size, f"no plan on the swept clocks within {factor} x {fastest:.4f} s"
        found.append(float(fits.min()) / e_every - 1)
    return found


def test_the_shipped_profile_plans_as_well_on_the_swept_clocks() -> None:
    found = losses(example_profile(), EXAMPLE_P_BLOCK_W, 4, 8)
    assert max(found) <= MAX_LOSS, found


@pytest.mark.parametrize(
    ("name", "p_block_w"),
    [
        ("bloom+a100_sxm_bf16.csv", 83.64),
        ("bloom+a40_bf16.csv", 70.38),
        ("gpt3-175b+a40_bf16.csv", 70.38),
    ],
)
def test_shared_profiles_plan_as_well_on_the_swept_clocks(name: str, p_block_w: float) -> None:
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"{path} not here")
    found = losses(load_profile(path), p_block_w, 8, 16)
    assert max(found) <= MAX_LOSS, found
