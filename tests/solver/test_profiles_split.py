"""Profiles with a split backward: backward_input and backward_weight rows (their cost tables:
test_costs.py)."""

from __future__ import annotations

import pytest

from perseus.core.errors import ProfileError
from perseus.solver import load_profile, profile_from_rows
from perseus.solver.profiles import profile_to_csv, profile_to_json

from .cases import split_rows


def test_split_rows_are_read_and_written_back(tmp_path) -> None:
    profile = profile_from_rows(split_rows())
    assert set(profile.stages[1]) == {"forward", "backward", "backward_input", "backward_weight"}
    path = tmp_path / "p.csv"
    path.write_text(profile_to_csv(profile))
    assert load_profile(path).stages == profile.stages
    kinds = {row["instruction"] for row in profile_to_json(profile)["rows"]}
    assert kinds == {"forward", "backward", "backward_input", "backward_weight"}


def test_half_a_split_backward_is_refused() -> None:
    with pytest.raises(ProfileError, match="stage 1: instruction: backward_input rows without"):
        profile_from_rows(split_rows(skip=(1, "backward_weight")))
