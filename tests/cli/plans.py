"""Helpers for the command tests: reading what ``perseus plan`` wrote and printed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from perseus.core.baselines import baseline_label, reference_key
from perseus.formats.plan_files import FrontierFile
from perseus.solver import Frontier

MICROBATCHES = "4"


def frontier_of(path: Path) -> Frontier:
    """The frontier of a ``perseus.frontier/1`` file."""
    return FrontierFile.model_validate_json(path.read_text()).to_frontier()


def reference_label(path: Path) -> str:
    """The label of the baseline a frontier file's savings are against."""
    key = reference_key(json.loads(path.read_text())["baselines"])
    assert key is not None
    return baseline_label(key)


def number_after(text: str, label: str) -> float:
    """The number after ``label`` at the start of a line of ``text``."""
    found = re.search(rf"^{label}\s+([0-9.]+)", text, re.MULTILINE)
    assert found, f"no {label!r} line in:\n{text}"
    return float(found.group(1))
