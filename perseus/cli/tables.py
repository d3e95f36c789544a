"""Plain-text tables and the one-line texts the commands' tables share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perseus.solver import Schedule

__all__ = ["format_table", "schedule_text"]


def format_table(rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """``rows`` (the first is the header) as aligned columns two spaces apart, the columns in
    ``right`` right-aligned, each line without trailing spaces and ending in a newline."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def schedule_text(schedule: Schedule) -> str:
    """``1f1b, 4 stages x 8 microbatches`` (``x 2 chunks`` when interleaved)."""
    text = f"{schedule.name}, {schedule.stages} stages x {schedule.microbatches} microbatches"
    if schedule.virtual_stages > 1:
        text += f" x {schedule.virtual_stages} chunks"
    return text
