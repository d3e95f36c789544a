"""The README's commands and outputs are what the current code does (see ``tests/readme.py``).

A block whose output changed on purpose is regenerated with ``python -m tests.readme --update``.
"""

from __future__ import annotations

import difflib

import pytest
import readme

CHECKED = [
    block
    for block in readme.blocks(readme.README.read_text())
    if block.marker not in (None, "recorded") or block.language == "sh"
]


@pytest.fixture(scope="module")
def outcomes() -> dict[int, readme.Outcome]:
    """Every block checked once, in README order (later transcripts use earlier files)."""
    return {outcome.block.start: outcome for outcome in readme.check()}


@pytest.mark.parametrize(
    "block", CHECKED, ids=[f"line{b.start}-{b.marker or b.language}" for b in CHECKED]
)
def test_readme_block(outcomes: dict[int, readme.Outcome], block: readme.Block) -> None:
    outcome = outcomes[block.start]
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    assert not outcome.problems, "\n".join(outcome.problems)
    if outcome.stale:
        assert outcome.actual is not None
        diff = difflib.unified_diff(block.lines, outcome.actual, "README.md", "now", lineterm="")
        pytest.fail(
            f"{block.where}: the README shows other output than the code prints; "
            "regenerate with python -m tests.readme --update\n" + "\n".join(diff)
        )


def test_every_prompt_is_marked() -> None:
    unmarked = [
        block.where
        for block in readme.blocks(readme.README.read_text())
        if block.marker is None and any(line.startswith("$ perseus") for line in block.lines)
    ]
    assert not unmarked, f"blocks with a '$ perseus' prompt but no readme marker: {unmarked}"
