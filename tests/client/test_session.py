"""The session's pure parts: reading a saved profile and its rows for one stage."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from perseus.client.session import read_saved_profile, saved_profile_rows
from perseus.client.settings import ClientSettings, SettingsError
from perseus.core.errors import ProfileError

EXAMPLE_PROFILE = Path(str(resources.files("perseus") / "data" / "example_profile.csv"))


def test_no_saved_profile_without_the_setting() -> None:
    assert read_saved_profile(ClientSettings()) is None


def test_a_saved_profile_gives_each_stage_its_rows() -> None:
    profile = read_saved_profile(ClientSettings(profile_path=str(EXAMPLE_PROFILE)))
    assert profile is not None
    rows, p_block_w = saved_profile_rows(profile, 0, str(EXAMPLE_PROFILE))
    # every row keeps its kind: the split backward's halves are not sent as more backwards
    kinds = {"forward", "backward", "backward_input", "backward_weight"}
    assert {r.instruction for r in rows} == kinds
    for kind in kinds:
        sent = [(r.frequency_mhz, r.time_s, r.energy_j) for r in rows if r.instruction == kind]
        saved = [(o.frequency_mhz, o.time_s, o.energy_j) for o in profile.stages[0][kind]]
        assert sent == saved
    assert p_block_w == profile.p_block_w
    with pytest.raises(ProfileError, match=f"this rank is stage {profile.num_stages}"):
        saved_profile_rows(profile, profile.num_stages, str(EXAMPLE_PROFILE))


def test_a_bad_saved_profile_is_a_settings_error(tmp_path: Path) -> None:
    bad = tmp_path / "profile.csv"
    bad.write_text("not,a,profile\n")
    with pytest.raises(SettingsError, match="PERSEUS_PROFILE"):
        read_saved_profile(ClientSettings(profile_path=str(bad)))
    with pytest.raises(SettingsError, match="this rank is stage 99"):
        read_saved_profile(ClientSettings(profile_path=str(EXAMPLE_PROFILE), stage=99))
