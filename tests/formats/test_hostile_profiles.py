"""Profile files under attack: generated bad files either load or give one short
:class:`ProfileError` naming where, within memory bounded by the file's size.

Each case mutates a valid profile (CSV or JSON) the way a typo, a broken disk or a hostile
writer would: huge, negative, NaN, infinite, 1e308 and tiny numbers, huge stages and clocks,
missing and extra columns or fields, duplicated rows, wrong kinds, binary garbage, empty
files, very long lines, deep JSON nesting. ``tracemalloc`` measures the reader's peak
allocation, which must stay within a small multiple of the file's size plus a constant (a
row at stage 999999999999 once built a list of every stage up to it: 20 GB).
"""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from perseus.core.errors import ProfileError
from perseus.core.profiles import (
    MAX_ENERGY_J,
    MAX_FREQUENCY_MHZ,
    MAX_STAGES,
    MAX_TIME_S,
    Profile,
    profile_from_rows,
)
from perseus.formats.profiles import load_profile, profile_from_json

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    # each example writes its file anew: tmp_path needs no reset between them
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
MESSAGE_CHARS = 300
"""The longest an error may be beyond the file name it starts with."""
MEMORY_FACTOR = 40
MEMORY_CONSTANT = 512 * 1024
"""Peak allocation of a read: at most MEMORY_FACTOR x the file's size + MEMORY_CONSTANT.

The factor covers Python's objects per row (a float is 24 bytes, a row tuple 80, a JSON
object over 200: a 3-byte ``{},`` decodes to 64 bytes); nothing in the reader allocates per
stage number, clock or digit."""

HEADER = ["stage", "instruction", "frequency", "time", "energy"]
VALID_ROWS = [
    [str(stage), kind, str(mhz), repr(0.01 * (stage + 1) * 1980 / mhz), repr(5.0 * mhz / 1980)]
    for stage in range(2)
    for kind in ("forward", "backward")
    for mhz in (1980, 1500, 1005)
]
HOSTILE_TEXT = [
    "999999999999", "-1", "-0", "0", "nan", "NaN", "inf", "-inf", "Infinity", "1e308",
    "-1e308", "1e309", "1e-320", "5e-324", "1e-300", "1" * 5000, "9" * 400 + ".5", "0x10",
    "1_0", "", " ", "forward", "backward_weight", "true", "\x00", "\udcff", "1,2",
    "x" * 100_000, str(MAX_STAGES), str(MAX_FREQUENCY_MHZ + 1), repr(MAX_TIME_S * 1.01),
    repr(MAX_ENERGY_J * 1.01), "1.5", "2.0",
]  # fmt: skip
HOSTILE_JSON: list[Any] = [
    999999999999, 10**30, -1, 0, -0.0, math.nan, math.inf, -math.inf, 1e308, 5e-324, 1e-300,
    True, False, None, "", "1", "forward", [], [1], {}, {"a": 1}, "x" * 100_000, 1.5, 2**63,
    MAX_STAGES, MAX_FREQUENCY_MHZ + 1, MAX_TIME_S * 1.01, MAX_ENERGY_J * 1.01,
]  # fmt: skip
# Text injected in place of a JSON value: what json.dumps cannot write.
RAW_JSON = [
    "9" * 5000, "-" + "9" * 5000, "1e999999", "[" * 100_000 + "]" * 100_000,
    "{" * 50_000, '"\\ud800"', "NaN", "-Infinity",
]  # fmt: skip


def _csv_text(rows: list[list[str]]) -> str:
    return "".join(",".join(row) + "\n" for row in rows)


@st.composite
def csv_files(draw: st.DrawFn) -> bytes:
    """A valid CSV profile, mutated one to three times."""
    rows = [list(HEADER), *(list(r) for r in VALID_ROWS)]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(
                ["cell", "cell", "text", "drop column", "extra column", "duplicate row",
                 "drop row", "long line", "commas"]
            )
        )  # fmt: skip
        row = draw(st.integers(0, len(rows) - 1))
        if kind == "cell" and rows[row]:
            column = draw(st.integers(0, len(rows[row]) - 1))
            rows[row][column] = draw(st.sampled_from(HOSTILE_TEXT))
        elif kind == "text" and rows[row]:
            column = draw(st.integers(0, len(rows[row]) - 1))
            rows[row][column] = draw(st.text(max_size=20))
        elif kind == "drop column":
            column = draw(st.integers(0, len(HEADER) - 1))
            rows = [[c for i, c in enumerate(r) if i != column] for r in rows]
        elif kind == "extra column":
            rows = [
                [*r, draw(st.sampled_from(["p_block_w", "x", "", "80", "-1", "nan"]))] for r in rows
            ]
        elif kind == "duplicate row":
            rows.insert(row, list(rows[row]))
        elif kind == "drop row" and len(rows) > 1:
            del rows[row]
        elif kind == "long line":
            rows.insert(row, ["0"] * draw(st.sampled_from([6, 1000, 50_000])))
        elif kind == "commas":
            rows[row] = [*rows[row], *[""] * 100_000]
    data = _csv_text(rows).encode("utf-8", errors="surrogateescape")
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    if cut is not None:
        data = data[:cut]
    garbage = draw(st.one_of(st.none(), st.binary(min_size=1, max_size=64)))
    if garbage is not None:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + garbage + data[at:]
    return data


@st.composite
def json_documents(draw: st.DrawFn) -> bytes:
    """A valid JSON profile, mutated one to three times (as text where json cannot write it)."""
    rows: list[Any] = [dict(zip(("stage", "instruction", "frequency_mhz", "time_s", "energy_j"),
                                (int(r[0]), r[1], int(r[2]), float(r[3]), float(r[4])),
                                strict=True))
                       for r in VALID_ROWS]  # fmt: skip
    document: dict[str, Any] = {"format": "perseus.profile/1", "p_block_w": 80.0, "rows": rows}
    raw: str | None = None
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(
                ["value", "value", "raw value", "drop field", "extra field", "duplicate row",
                 "rows", "format", "p_block_w"]
            )
        )  # fmt: skip
        index = draw(st.integers(0, len(rows) - 1)) if rows else 0
        field = draw(
            st.sampled_from(["stage", "instruction", "frequency_mhz", "time_s", "energy_j"])
        )
        if kind == "value" and rows and isinstance(rows[index], dict):
            rows[index][field] = draw(st.sampled_from(HOSTILE_JSON))
        elif kind == "raw value" and rows and isinstance(rows[index], dict):
            rows[index][field] = "@RAW@"
            raw = draw(st.sampled_from(RAW_JSON))
        elif kind == "drop field" and rows and isinstance(rows[index], dict):
            rows[index].pop(field, None)
        elif kind == "extra field" and rows and isinstance(rows[index], dict):
            rows[index]["extra"] = draw(st.sampled_from(HOSTILE_JSON))
        elif kind == "duplicate row" and rows:
            rows.insert(index, json.loads(json.dumps(rows[index])))
        elif kind == "rows":
            document["rows"] = draw(st.sampled_from([[], {}, None, "rows", [1, 2], [[]], [None]]))
        elif kind == "format":
            document["format"] = draw(st.sampled_from(HOSTILE_JSON))
        elif kind == "p_block_w":
            document["p_block_w"] = draw(st.sampled_from(HOSTILE_JSON))
    text = json.dumps(document)
    if raw is not None:
        text = text.replace('"@RAW@"', raw, 1)
    data = text.encode("utf-8", errors="surrogatepass")
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return data if cut is None else data[:cut]


def _read(path: Path, data: bytes) -> tuple[Profile | ProfileError, int]:
    """Read ``data`` from ``path``: the profile or the error, and the peak allocation."""
    path.write_bytes(data)
    tracemalloc.start()
    try:
        outcome: Profile | ProfileError = load_profile(path)
    except ProfileError as err:
        outcome = err
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return outcome, peak


def _check(path: Path, data: bytes, outcome: Profile | ProfileError, peak: int) -> None:
    assert peak <= MEMORY_FACTOR * len(data) + MEMORY_CONSTANT, (peak, len(data))
    if isinstance(outcome, ProfileError):
        message = str(outcome)
        assert message.startswith(f"{path}: "), message[:200]
        assert len(message) <= len(str(path)) + MESSAGE_CHARS, message[:400]
        assert "\n" not in message
    else:
        assert 1 <= outcome.num_stages <= MAX_STAGES
        for stage in outcome.stages:
            for options in stage.values():
                for o in options:
                    assert 1 <= o.frequency_mhz <= MAX_FREQUENCY_MHZ
                    assert 0 < o.time_s <= MAX_TIME_S and 0 < o.energy_j <= MAX_ENERGY_J


@SETTINGS
@given(data=csv_files())
@example(data=(_csv_text([HEADER, *VALID_ROWS]) + "999999999999,forward,1410,0.05,24\n").encode())
@example(data=(_csv_text([HEADER, *VALID_ROWS]) + "1000000,forward,1410,0.05,24\n").encode())
@example(data=_csv_text([HEADER, ["0", "forward", "1980", "1e308", "1"], *VALID_ROWS]).encode())
@example(data=_csv_text([HEADER, ["0", "forward", "1" * 5000, "1", "1"], *VALID_ROWS]).encode())
@example(data=b"")
@example(data=b"\xff\xfe\x00garbage")
def test_a_mutated_csv_loads_or_is_one_short_profile_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "mutated.csv"
    _check(path, data, *_read(path, data))


@SETTINGS
@given(data=json_documents())
@example(data=b'{"format": "perseus.profile/1", "rows": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
@example(data=b'{"format": "perseus.profile/1", "rows": [{"stage": ' + b"9" * 5000 + b"}]}")
@example(data=b'{"format": ' + b"[" * 900 + b"]" * 900 + b', "rows": []}')
@example(data=b"")
def test_a_mutated_json_loads_or_is_one_short_profile_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "mutated.json"
    _check(path, data, *_read(path, data))


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        (999_999_999_999, f"row 14: stage: must be in 0..{MAX_STAGES - 1}, got '999999999999'"),
        (MAX_STAGES, f"row 14: stage: must be in 0..{MAX_STAGES - 1}"),
        (40, "missing stage(s) 2, 3, 4, 5, 6, 7, 8, 9 and 30 more"),
    ],
)
def test_a_stage_far_past_the_others_is_named_in_one_line(
    tmp_path: Path, stage: int, message: str
) -> None:
    path = tmp_path / "typo.csv"
    data = (_csv_text([HEADER, *VALID_ROWS]) + f"{stage},forward,1410,0.05,24\n").encode()
    outcome, peak = _read(path, data)
    assert isinstance(outcome, ProfileError)
    assert str(outcome).startswith(f"{path}: ") and message in str(outcome)
    assert peak <= MEMORY_FACTOR * len(data) + MEMORY_CONSTANT


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("time", "1e308", "time: must be at most 1e+07"),
        ("time", "1e-320", None),  # tiny but > 0: a valid (if odd) measurement
        ("energy", "1e300", "energy: must be at most 1e+09"),
        ("frequency", "100000000000000000000000", f"frequency: must be in 1..{MAX_FREQUENCY_MHZ}"),
    ],
)
def test_numbers_past_the_profile_bounds_are_refused_where_they_are(
    tmp_path: Path, field: str, value: str, message: str | None
) -> None:
    rows = [list(HEADER), *(list(r) for r in VALID_ROWS)]
    rows[1][HEADER.index(field)] = value
    path = tmp_path / "p.csv"
    path.write_text(_csv_text(rows))
    if message is None:
        load_profile(path)
        return
    with pytest.raises(ProfileError) as raised:
        load_profile(path)
    assert str(raised.value) == f"{path}: row 2: {message}, got {value!r}"[: len(str(raised.value))]
    assert message in str(raised.value)


def test_a_file_that_never_ends_is_read_only_so_far(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import perseus.formats.profiles as formats

    monkeypatch.setattr(formats, "MAX_PROFILE_BYTES", 1024)
    path = tmp_path / "big.csv"
    path.write_text(_csv_text([HEADER, *VALID_ROWS * 40]))
    with pytest.raises(ProfileError, match="cannot read profile: larger than"):
        load_profile(path)
    with pytest.raises(ProfileError, match="/dev/zero: cannot read profile: larger than"):
        load_profile("/dev/zero")


@SETTINGS
@given(
    value=st.one_of(
        st.sampled_from(HOSTILE_JSON),
        st.integers(),
        st.floats(),
        st.text(max_size=30),
        st.binary(max_size=10),
        st.lists(st.integers(), max_size=3),
    ),
    field=st.integers(0, 4),
)
@example(value=10**5000, field=0)
@example(value=10**400, field=3)
def test_rows_given_as_values_check_every_field(value: object, field: int) -> None:
    rows: list[list[object]] = [
        [int(r[0]), r[1], int(r[2]), float(r[3]), float(r[4])] for r in VALID_ROWS
    ]
    rows[3][field] = value
    try:
        profile_from_rows([tuple(r) for r in rows], source="request")  # type: ignore[misc]
    except ProfileError as err:
        assert str(err).startswith("request: ") and len(str(err)) <= MESSAGE_CHARS


def test_profile_from_json_of_a_hostile_document_is_a_profile_error() -> None:
    document = {"format": "perseus.profile/1", "rows": [{"stage": 10**30}], "p_block_w": 10**400}
    with pytest.raises(ProfileError, match="request: row 1: instruction: missing"):
        profile_from_json(document)
    deep = '{"format": "perseus.profile/1", "rows": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(ProfileError, match="request: not valid JSON: nested too deeply"):
        profile_from_json(deep)
