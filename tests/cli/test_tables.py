"""Aligned plain-text tables."""

from __future__ import annotations

from perseus.cli.tables import format_table, schedule_text
from perseus.solver import make_schedule


def test_columns_align_and_lines_carry_no_trailing_spaces() -> None:
    rows = [["plan", "time (s)", "note"], ["default", "1.7463", ""], ["no-slowdown", "1.75", "x"]]
    assert format_table(rows, right=[1]) == (
        "plan         time (s)  note\ndefault        1.7463\nno-slowdown      1.75  x\n"
    )


def test_schedule_text_names_chunks_only_when_interleaved() -> None:
    assert schedule_text(make_schedule("1f1b", 4, 8, 1)) == "1f1b, 4 stages x 8 microbatches"
    interleaved = make_schedule("interleaved-1f1b", 2, 4, 2)
    assert schedule_text(interleaved) == "interleaved-1f1b, 2 stages x 4 microbatches x 2 chunks"
