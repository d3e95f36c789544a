"""Fixtures of the solver tests: the real profiles (``$PERSEUS_TEST_PROFILES``, else
``../shared/data/profiles``; skipped cleanly when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .cases import SHARED_PROFILES

# name -> blocking power (BACKGROUND.md)
REAL_PROFILES = {
    "bloom+a100_sxm_bf16.csv": 83.64,
    "bloom+a40_bf16.csv": 70.38,
    "gpt3-175b+a40_bf16.csv": 70.38,
}


@pytest.fixture(params=sorted(REAL_PROFILES))
def real_profile(request: pytest.FixtureRequest) -> tuple[Path, float]:
    """(path, blocking power) of one real profile; skips when it is not there."""
    path = SHARED_PROFILES / request.param
    if not path.is_file():
        pytest.skip(
            f"real profile {path} not present; set PERSEUS_TEST_PROFILES to their directory"
        )
    return path, REAL_PROFILES[request.param]
