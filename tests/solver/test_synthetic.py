"""The synthetic GPU model and the example profile shipped with the package."""

from __future__ import annotations

from importlib import resources

import pytest

from perseus.solver import load_profile
from perseus.solver.synthetic import H200_CLOCKS_MHZ, synthetic_profile, to_csv

SHIPPED = resources.files("perseus") / "data" / "example_profile.csv"


def test_shipped_csv_equals_the_regenerated_one() -> None:
    assert SHIPPED.read_bytes() == to_csv(synthetic_profile()).encode(), (
        "regenerate it with the command in the docstring of perseus/solver/synthetic.py"
    )


def test_shipped_csv_loads() -> None:
    with resources.as_file(SHIPPED) as path:
        profile = load_profile(path)
    assert profile.num_stages == 4
    assert profile.p_block_w is None
    for stage in profile.stages:
        for options in stage.values():
            assert [o.frequency_mhz for o in options] == list(H200_CLOCKS_MHZ)


def test_same_seed_same_rows_other_seed_other_noise() -> None:
    assert synthetic_profile(seed=3) == synthetic_profile(seed=3)
    assert synthetic_profile(seed=3) != synthetic_profile(seed=4)


def test_shape_of_the_model() -> None:
    rows = synthetic_profile(stages=4)

    def series(stage: int, kind: str) -> list[tuple[int, float, float]]:
        return [(f, t, e) for s, k, f, t, e in rows if s == stage and k == kind]

    for stage in range(4):
        for kind in ("forward", "backward"):
            points = series(stage, kind)
            # Time grows as the clock drops (beyond the noise, over a few steps).
            assert points[-1][1] > 1.5 * points[0][1]
            # Energy is lowest somewhere in the middle: voltage floor vs static power.
            lowest = min(range(len(points)), key=lambda i: points[i][2])
            assert 0 < lowest < len(points) - 1
    # Imbalance: the last stage (LM head, loss) is the slowest, the middle ones are alike.
    total = {
        s: sum(t for _, t, _ in series(s, "forward") + series(s, "backward")) for s in range(4)
    }
    assert total[3] > total[0] > total[1]
    assert total[1] == pytest.approx(total[2], rel=1e-3)


@pytest.mark.parametrize("stages", [0, -1])
def test_rejects_bad_stage_counts(stages: int) -> None:
    with pytest.raises(ValueError, match="stages"):
        synthetic_profile(stages=stages)


def test_rejects_clocks_above_the_top() -> None:
    with pytest.raises(ValueError, match="clocks"):
        synthetic_profile(clocks_mhz=[2100])
