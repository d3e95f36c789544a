"""The README's and the docs' commands and outputs are what the current code does.

See ``tests/readme.py`` for the block markers. A block whose output changed on purpose is
regenerated with ``python -m tests.readme --update``.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
import readme

CHECKED = [
    block
    for document in readme.documents()
    for block in readme.blocks(document.read_text(), document)
    if block.marker not in (None, "recorded") or block.language == "sh"
]

_checked: dict[Path, dict[int, readme.Outcome]] = {}


def outcome_of(block: readme.Block) -> readme.Outcome:
    """Every block of the block's document checked once, in order (later transcripts use
    earlier files)."""
    if block.document not in _checked:
        _checked[block.document] = {
            outcome.block.start: outcome for outcome in readme.check(block.document)
        }
    return _checked[block.document][block.start]


@pytest.mark.parametrize(
    "block", CHECKED, ids=[f"{b.where}-{b.marker or b.language}" for b in CHECKED]
)
def test_readme_block(block: readme.Block) -> None:
    outcome = outcome_of(block)
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    assert not outcome.problems, "\n".join(outcome.problems)
    if outcome.stale:
        assert outcome.actual is not None
        diff = difflib.unified_diff(block.lines, outcome.actual, block.where, "now", lineterm="")
        pytest.fail(
            f"{block.where}: the document shows other output than the code prints; "
            "regenerate with python -m tests.readme --update\n" + "\n".join(diff)
        )


def test_every_prompt_is_marked() -> None:
    unmarked = [
        block.where
        for document in readme.documents()
        for block in readme.blocks(document.read_text(), document)
        if block.marker is None and any(line.startswith("$ perseus") for line in block.lines)
    ]
    assert not unmarked, f"blocks with a '$ perseus' prompt but no readme marker: {unmarked}"


def test_docs_site_lists_every_page() -> None:
    """Every page under docs/ is in mkdocs.yml's nav, and every page the nav names exists."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((readme.REPO / "mkdocs.yml").read_text())

    def pages(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [page for item in nav for page in pages(item)]
        if isinstance(nav, dict):
            return [page for item in nav.values() for page in pages(item)]
        return []

    listed = set(pages(config["nav"]))
    present = {path.relative_to(readme.DOCS).as_posix() for path in readme.DOCS.rglob("*.md")}
    assert listed - present == set(), "mkdocs.yml lists pages that docs/ lacks"
    assert present - listed == set(), "pages in docs/ that mkdocs.yml's nav leaves out"
