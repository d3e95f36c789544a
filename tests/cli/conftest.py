"""Fixtures of the command tests: the shipped example profile and one planning run."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from perseus.cli import main

from .plans import MICROBATCHES


@pytest.fixture(scope="module")
def example() -> Iterator[Path]:
    with resources.as_file(resources.files("perseus") / "data" / "example_profile.csv") as path:
        yield path


@pytest.fixture(scope="module")
def planned(
    example: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, Path, str]:
    """One planning run shared by the tests that read its files: frontier, plan, dir, stdout."""
    out = tmp_path_factory.mktemp("planned")
    frontier, plan = out / "frontier.json", out / "plan.json"
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdout", stdout)
        status = main(
            [
                "plan",
                str(example),
                "--microbatches",
                MICROBATCHES,
                "--p-block",
                "100",
                "--output",
                str(frontier),
                "--plan-output",
                str(plan),
            ]
        )
    assert status == 0
    return frontier, plan, out, stdout.getvalue()
