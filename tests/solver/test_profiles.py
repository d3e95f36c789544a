"""Profiles: every bad input is rejected naming file, row and field; valid forms load equal."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
from hypothesis import given

from perseus.core.errors import ProfileError
from perseus.solver import (
    INSTRUCTIONS,
    Option,
    load_profile,
    profile_from_rows,
    profile_to_json,
)
from perseus.solver.profiles import profile_from_json, profile_to_csv

from . import reference as ref
from .cases import cases, examples

HEADER = ["stage", "instruction", "frequency", "time", "energy"]
JSON_FIELDS = ["stage", "instruction", "frequency_mhz", "time_s", "energy_j"]
GOOD: list[list[object]] = [
    [0, "forward", 1410, 0.05, 24.1],  # CSV row 2, JSON / in-memory row 1
    [0, "forward", 1395, 0.051, 24.0],
    [0, "backward", 1410, 0.1, 46.0],
    [0, "backward", 1395, 0.101, 45.5],
    [1, "forward", 1410, 0.06, 25.1],
    [1, "forward", 1395, 0.061, 25.0],
    [1, "backward", 1410, 0.12, 47.0],
    [1, "backward", 1395, 0.121, 46.5],  # CSV row 9, JSON row 8
]


def write_csv(path: Path, rows: list[list[object]], header: list[str] = HEADER) -> Path:
    lines = [",".join(header)] + [",".join(map(str, r)) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_json(path: Path, rows: list[list[object]], **extra: object) -> Path:
    data = {"format": "perseus.profile/1", **extra,
            "rows": [dict(zip(JSON_FIELDS, r, strict=True)) for r in rows]}  # fmt: skip
    path.write_text(json.dumps(data))
    return path


def expect_error(call, where: str, row: int | None, field: str | None) -> str:
    with pytest.raises(ProfileError) as info:
        call()
    message = str(info.value)
    assert where in message, message
    if row is not None:
        assert re.search(rf"\brow {row}\b", message), message
    if field is not None:
        assert field in message, message
    return message


# ----------------------------------------------------------------------------- valid input


def test_valid_csv_and_json_load_to_equal_profiles(tmp_path: Path) -> None:
    from_csv = load_profile(write_csv(tmp_path / "p.csv", GOOD))
    from_json = load_profile(write_json(tmp_path / "p.json", GOOD))
    from_rows = profile_from_rows([tuple(r) for r in GOOD])  # type: ignore[misc]
    assert from_csv.stages == from_json.stages == from_rows.stages
    assert from_csv.num_stages == 2
    assert from_csv.p_block_w is None
    assert from_rows.source == "request"
    assert from_csv.stages[1]["backward"] == (Option(1410, 0.12, 47.0), Option(1395, 0.121, 46.5))
    assert tuple(from_csv.stages[0]) == INSTRUCTIONS or set(from_csv.stages[0]) == set(INSTRUCTIONS)


def test_json_carries_blocking_power_and_round_trips(tmp_path: Path) -> None:
    profile = load_profile(write_json(tmp_path / "p.json", GOOD, p_block_w=83.64))
    assert profile.p_block_w == 83.64
    data = profile_to_json(profile)
    assert data["format"] == "perseus.profile/1"
    assert data["p_block_w"] == 83.64
    again = tmp_path / "again.json"
    again.write_text(json.dumps(data))
    loaded = load_profile(again)
    assert loaded.stages == profile.stages
    assert loaded.p_block_w == 83.64
    assert profile_from_rows([tuple(r) for r in GOOD], p_block_w=70.0).p_block_w == 70.0


def test_profile_from_json_reads_text_bytes_and_documents() -> None:
    data = {"format": "perseus.profile/1", "p_block_w": 70.0,
            "rows": [dict(zip(JSON_FIELDS, r, strict=True)) for r in GOOD]}  # fmt: skip
    expected = profile_from_rows([tuple(r) for r in GOOD], p_block_w=70.0)  # type: ignore[misc]
    for form in (data, json.dumps(data), json.dumps(data).encode()):
        read = profile_from_json(form, source="server")
        assert (read.stages, read.p_block_w, read.source) == (expected.stages, 70.0, "server")
    assert profile_from_json(profile_to_json(expected)).stages == expected.stages
    expect_error(lambda: profile_from_json("{", source="server"), "server", None, "not valid JSON")
    expect_error(lambda: profile_from_json({"format": "x"}, source="s"), "s", None, "format")


def test_csv_carries_blocking_power_in_a_column_and_round_trips(tmp_path: Path) -> None:
    """profile_to_csv writes p_block_w as a last column; load_profile reads it back, so a
    written CSV plans as it is. Without it the five Zeus columns stay as they were."""
    profile = load_profile(write_json(tmp_path / "p.json", GOOD, p_block_w=83.64))
    text = profile_to_csv(profile)
    assert text.splitlines()[0] == "stage,instruction,frequency,time,energy,p_block_w"
    assert all(line.endswith(",83.64") for line in text.splitlines()[1:])
    again = tmp_path / "again.csv"
    again.write_text(text)
    loaded = load_profile(again)
    assert loaded.stages == profile.stages
    assert loaded.p_block_w == 83.64
    assert profile_to_csv(loaded) == text
    plain = profile_to_csv(profile_from_rows([tuple(r) for r in GOOD]))  # type: ignore[misc]
    assert plain.splitlines()[0] == ",".join(HEADER)


def test_csv_blocking_power_may_be_left_empty_but_never_disagree(tmp_path: Path) -> None:
    header = [*HEADER, "p_block_w"]
    watts: list[object] = ["", 70.38, "", 70.38, "", "", "", ""]
    path = write_csv(tmp_path / "sparse.csv", [[*r, w] for r, w in zip(GOOD, watts, strict=True)],
                     header)  # fmt: skip
    assert load_profile(path).p_block_w == 70.38
    empty = write_csv(tmp_path / "empty.csv", [[*r, ""] for r in GOOD], header)
    assert load_profile(empty).p_block_w is None
    watts[5] = 80
    path = write_csv(tmp_path / "two.csv", [[*r, w] for r, w in zip(GOOD, watts, strict=True)],
                     header)  # fmt: skip
    message = expect_error(lambda: load_profile(path), "two.csv", 7, "p_block_w")
    assert "differs from row 3's 70.38" in message
    for bad in ("nan", "-1", "watts"):
        rows = [[*r, bad if i == 2 else ""] for i, r in enumerate(GOOD)]
        path = write_csv(tmp_path / "bad.csv", rows, header)
        expect_error(lambda path=path: load_profile(path), "bad.csv", 4, "p_block_w")


def test_csv_with_column_order_shuffled_and_blank_line(tmp_path: Path) -> None:
    header = ["energy", "time", "stage", "frequency", "instruction"]
    perm = [HEADER.index(h) for h in header]
    rows = [[r[i] for i in perm] for r in GOOD]
    path = write_csv(tmp_path / "p.csv", rows, header)
    path.write_text(path.read_text() + "\n")
    assert load_profile(path).stages == profile_from_rows([tuple(r) for r in GOOD]).stages


@examples(25)
@given(cases(ragged=True))
def test_generated_profiles_load_raw_and_equal_in_every_form(case) -> None:
    import tempfile

    rows = [list(r) for r in case.rows]
    random.Random(len(rows)).shuffle(rows)
    with tempfile.TemporaryDirectory() as tmp:
        csv_rows = [[s, k, f, repr(t), repr(e)] for s, k, f, t, e in rows]
        from_csv = load_profile(write_csv(Path(tmp) / "gen.csv", csv_rows))
        from_json = load_profile(write_json(Path(tmp) / "gen.json", rows))
    from_rows = profile_from_rows([tuple(r) for r in rows])  # type: ignore[misc]
    assert from_csv.stages == from_json.stages == from_rows.stages
    assert from_rows.num_stages == case.stages
    for stage in range(case.stages):
        for kind in INSTRUCTIONS:
            # raw: every measured option kept, frequency descending
            expected = [Option(f, t, e) for f, t, e in ref.options_of(case.table, stage, kind)]
            assert list(from_rows.stages[stage][kind]) == expected


# ----------------------------------------------------------------------------- bad CSV

BAD_VALUES = [
    ("time", "nan"),
    ("time", "NaN"),
    ("time", "inf"),
    ("time", "-inf"),
    ("time", "0"),
    ("time", "0.0"),
    ("time", "-0.05"),
    ("time", "abc"),
    ("time", ""),
    ("energy", "nan"),
    ("energy", "inf"),
    ("energy", "0"),
    ("energy", "-3"),
    ("energy", "1e"),
    ("energy", ""),
    ("frequency", "abc"),
    ("frequency", "nan"),
    ("frequency", ""),
    ("frequency", "0"),  # a clock is a positive number of MHz
    ("frequency", "-1410"),
    ("stage", "x"),
    ("stage", "-1"),
    ("stage", "0.5"),
    ("stage", ""),
    ("instruction", "sideways"),
    ("instruction", "optimizer"),
    ("instruction", ""),
]


@pytest.mark.parametrize("data_row", [1, 4, 8])
@pytest.mark.parametrize(("field", "value"), BAD_VALUES)
def test_csv_bad_value(tmp_path: Path, data_row: int, field: str, value: str) -> None:
    rows = [list(r) for r in GOOD]
    rows[data_row - 1][HEADER.index(field)] = value
    path = write_csv(tmp_path / "bad.csv", rows)
    expect_error(lambda: load_profile(path), "bad.csv", data_row + 1, field)


@pytest.mark.parametrize("missing", HEADER)
def test_csv_missing_column(tmp_path: Path, missing: str) -> None:
    keep = [i for i, h in enumerate(HEADER) if h != missing]
    rows = [[r[i] for i in keep] for r in GOOD]
    path = write_csv(tmp_path / "cols.csv", rows, [HEADER[i] for i in keep])
    expect_error(lambda: load_profile(path), "cols.csv", 1, missing)


def test_csv_truncated_row(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "short.csv", GOOD)
    lines = path.read_text().splitlines()
    lines[5] = "1,forward,1410,0.06"
    path.write_text("\n".join(lines) + "\n")
    expect_error(lambda: load_profile(path), "short.csv", 6, None)


def test_csv_row_with_a_value_no_column_names(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "long.csv", GOOD)
    lines = path.read_text().splitlines()
    lines[5] += ",12.5"
    path.write_text("\n".join(lines) + "\n")
    message = expect_error(lambda: load_profile(path), "long.csv", 6, None)
    assert "expected 5 fields, got 6" in message


def test_csv_trailing_commas_and_a_byte_order_mark_are_fine(tmp_path: Path) -> None:
    """Spreadsheets save "CSV UTF-8" with a byte-order mark, and some writers end rows with a
    comma: neither is a mistake in the profile."""
    path = write_csv(tmp_path / "excel.csv", GOOD)
    lines = [line + "," for line in path.read_text().splitlines()]
    path.write_bytes(b"\xef\xbb\xbf" + ("\r\n".join(lines) + "\r\n").encode())
    assert load_profile(path).stages == profile_from_rows([tuple(r) for r in GOOD]).stages
    lines[1:] = [line[:-1] for line in lines[1:]]  # only the header ends in a comma
    path.write_text("\n".join(lines) + "\n")
    assert load_profile(path).stages == profile_from_rows([tuple(r) for r in GOOD]).stages


def test_csv_duplicate(tmp_path: Path) -> None:
    rows = [*GOOD, [1, "forward", 1395, 0.07, 30.0]]  # same stage, instruction, clock as row 7
    path = write_csv(tmp_path / "dup.csv", rows)
    message = expect_error(lambda: load_profile(path), "dup.csv", 10, None)
    assert "duplicate" in message.lower()


@pytest.mark.parametrize("renumber", [{1: 2}, {0: 1, 1: 2}, {0: 5}])
def test_csv_stages_not_numbered_from_zero(tmp_path: Path, renumber: dict[int, int]) -> None:
    rows = [[renumber.get(r[0], r[0]), *r[1:]] for r in GOOD]  # type: ignore[call-overload]
    path = write_csv(tmp_path / "gap.csv", rows)
    expect_error(lambda: load_profile(path), "gap.csv", None, "stage")


@pytest.mark.parametrize("kind", INSTRUCTIONS)
def test_csv_stage_without_an_instruction(tmp_path: Path, kind: str) -> None:
    rows = [r for r in GOOD if not (r[0] == 1 and r[1] == kind)]
    path = write_csv(tmp_path / "lack.csv", rows)
    message = expect_error(lambda: load_profile(path), "lack.csv", None, "stage")
    assert kind in message


def test_csv_empty_and_header_only(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    expect_error(lambda: load_profile(empty), "empty.csv", None, None)
    header = write_csv(tmp_path / "header.csv", [])
    expect_error(lambda: load_profile(header), "header.csv", None, None)


def test_missing_file(tmp_path: Path) -> None:
    expect_error(lambda: load_profile(tmp_path / "nope.csv"), "nope.csv", None, None)


# ----------------------------------------------------------------------------- bad JSON


JSON_BAD_VALUES = [
    ("time_s", math.nan),
    ("time_s", math.inf),
    ("time_s", 0),
    ("time_s", -0.5),
    ("time_s", "abc"),
    ("time_s", None),
    ("time_s", True),
    ("time_s", [0.1]),
    ("energy_j", -math.inf),
    ("energy_j", 0.0),
    ("energy_j", "x"),
    ("energy_j", None),
    ("frequency_mhz", "abc"),
    ("frequency_mhz", None),
    ("frequency_mhz", 1410.5),
    ("frequency_mhz", 0),  # a clock is a positive number of MHz
    ("frequency_mhz", -1410),
    ("stage", -1),
    ("stage", "zero"),
    ("stage", 0.5),
    ("stage", None),
    ("instruction", "sideways"),
    ("instruction", 3),
    ("instruction", None),
]


@pytest.mark.parametrize("data_row", [1, 8])
@pytest.mark.parametrize(("field", "value"), JSON_BAD_VALUES)
def test_json_bad_value(tmp_path: Path, data_row: int, field: str, value: object) -> None:
    rows = [list(r) for r in GOOD]
    rows[data_row - 1][JSON_FIELDS.index(field)] = value
    path = write_json(tmp_path / "bad.json", rows)
    expect_error(lambda: load_profile(path), "bad.json", data_row, field)


@pytest.mark.parametrize("missing", JSON_FIELDS)
def test_json_missing_field(tmp_path: Path, missing: str) -> None:
    path = write_json(tmp_path / "miss.json", GOOD)
    data = json.loads(path.read_text())
    del data["rows"][2][missing]
    path.write_text(json.dumps(data))
    expect_error(lambda: load_profile(path), "miss.json", 3, missing)


def test_json_duplicate_gap_and_missing_instruction(tmp_path: Path) -> None:
    dup = write_json(tmp_path / "dup.json", [*GOOD, [0, "backward", 1395, 0.2, 50.0]])
    assert "duplicate" in expect_error(lambda: load_profile(dup), "dup.json", 9, None).lower()
    gap = write_json(tmp_path / "gap.json", [[2 if r[0] == 1 else r[0], *r[1:]] for r in GOOD])
    expect_error(lambda: load_profile(gap), "gap.json", None, "stage")
    lack = write_json(tmp_path / "lack.json", [r for r in GOOD if r[1] != "forward" or r[0] == 1])
    assert "forward" in expect_error(lambda: load_profile(lack), "lack.json", None, "stage")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        "null",
        '{"rows": []}',
        '{"format": "perseus.profile/1"}',
        '{"format": "perseus.profile/1", "rows": []}',
        '{"format": "perseus.profile/1", "rows": {}}',
        '{"format": "perseus.profile/1", "rows": [1, 2]}',
        '{"format": "perseus.frontier/1", "rows": [{"stage": 0, "instruction": "forward", '
        '"frequency_mhz": 1, "time_s": 1, "energy_j": 1}]}',
    ],
)
def test_json_malformed_document(tmp_path: Path, text: str) -> None:
    path = tmp_path / "doc.json"
    path.write_text(text)
    expect_error(lambda: load_profile(path), "doc.json", None, None)


@pytest.mark.parametrize("p_block", [-1.0, "abc", math.nan, math.inf])
def test_json_bad_blocking_power(tmp_path: Path, p_block: object) -> None:
    path = write_json(tmp_path / "pb.json", GOOD, p_block_w=p_block)
    expect_error(lambda: load_profile(path), "pb.json", None, "p_block_w")


# ----------------------------------------------------------------------------- bad rows


ROW_FIELDS = ["stage", "instruction", "frequency", "time", "energy"]  # substrings of either name


@pytest.mark.parametrize("data_row", [1, 5])
@pytest.mark.parametrize(("field", "value"), JSON_BAD_VALUES)
def test_rows_bad_value(data_row: int, field: str, value: object) -> None:
    rows = [list(r) for r in GOOD]
    column = JSON_FIELDS.index(field)
    rows[data_row - 1][column] = value
    expect_error(
        lambda: profile_from_rows([tuple(r) for r in rows]),  # type: ignore[misc]
        "request",
        data_row,
        ROW_FIELDS[column],
    )


def test_rows_structural_errors_and_source() -> None:
    rows = [tuple(r) for r in GOOD]
    expect_error(lambda: profile_from_rows([*rows, rows[3]], source="rank 3"), "rank 3", 9, None)
    expect_error(
        lambda: profile_from_rows([(r[0] + 1, *r[1:]) for r in rows]), "request", None, "stage"
    )
    expect_error(
        lambda: profile_from_rows([r for r in rows if r[1] == "forward"]), "request", None, "stage"
    )
    expect_error(lambda: profile_from_rows([]), "request", None, None)
    expect_error(lambda: profile_from_rows([(0, "forward", 1410, 0.1)]), "request", 1, None)  # type: ignore[list-item]


def test_json_without_format_says_what_it_needs(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_text('{"rows": []}')
    message = expect_error(lambda: load_profile(path), "doc.json", None, "format")
    assert "missing" in message and "perseus.profile/1" in message and "None" not in message


def test_profile_rows_and_tuples_build_the_same_profile() -> None:
    """The solver's one row type is accepted wherever the five-field tuples are, and
    the instruction names become InstructionKind members."""
    from perseus.solver import InstructionKind, ProfileRow

    tuples = [(g, kind, f, t * (2 if kind == "backward" else 1), e)
              for g in range(2) for kind in ("forward", "backward")
              for f, t, e in ((1980, 0.05, 12.0), (1500, 0.07, 10.0))]  # fmt: skip
    rows = [ProfileRow(s, InstructionKind(k), f, t, e) for s, k, f, t, e in tuples]
    assert [row.as_tuple() for row in rows] == tuples
    from_rows, from_tuples = profile_from_rows(rows), profile_from_rows(tuples)
    assert from_rows == from_tuples
    assert all(type(k) is InstructionKind for stage in from_rows.stages for k in stage)
