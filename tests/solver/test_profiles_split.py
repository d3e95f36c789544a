"""Profiles with a split backward: backward_input and backward_weight rows (their cost tables:
test_costs.py)."""

from __future__ import annotations

import pytest

from perseus.errors import ProfileError
from perseus.solver import load_profile, profile_from_rows
from perseus.solver.profiles import profile_to_csv, profile_to_json

CLOCKS = (1400, 1000)


def rows(stages: int = 2, split: bool = True, skip: tuple[int, str] | None = None) -> list:
    out = []
    for s in range(stages):
        for kind, t in (("forward", 1.0), ("backward", 2.0)):
            out += [(s, kind, f, t * 1400 / f, 100 * t) for f in CLOCKS]
        if split:
            for kind, share in (("backward_input", 0.55), ("backward_weight", 0.45)):
                if (s, kind) != skip:
                    out += [(s, kind, f, 2.0 * share * 1400 / f, 200 * share) for f in CLOCKS]
    return out


def test_split_rows_are_read_and_written_back(tmp_path) -> None:
    profile = profile_from_rows(rows())
    assert set(profile.stages[1]) == {"forward", "backward", "backward_input", "backward_weight"}
    path = tmp_path / "p.csv"
    path.write_text(profile_to_csv(profile))
    assert load_profile(path).stages == profile.stages
    kinds = {row["instruction"] for row in profile_to_json(profile)["rows"]}
    assert kinds == {"forward", "backward", "backward_input", "backward_weight"}


def test_half_a_split_backward_is_refused() -> None:
    with pytest.raises(ProfileError, match="stage 1: instruction: backward_input rows without"):
        profile_from_rows(rows(skip=(1, "backward_weight")))
