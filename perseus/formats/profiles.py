"""Profile files: the Zeus-compatible CSV and the project's JSON form, read and written.

Two on-disk forms are accepted:

- the Zeus-compatible CSV ``stage,instruction,frequency,time,energy`` (MHz, s, J), with an
  optional ``p_block_w`` column after them: the stage's blocking power in watts, the same on
  every row that fills it (rows may leave it empty). A column, not a comment line, so the file
  stays a plain table for Zeus, pandas, ``csv.DictReader`` and spreadsheets, which read the
  columns they know by name; CSVs without it stay valid and carry no blocking power;
- the project's JSON form ``{"format": "perseus.profile/1", "p_block_w": 83.6,
  "rows": [{"stage": 0, "instruction": "forward", "frequency_mhz": 1410, "time_s": 0.05,
  "energy_j": 24.1}, ...]}``.

Both read into a :class:`perseus.core.profiles.Profile` through
:func:`~perseus.core.profiles.profile_from_rows`'s checks. Every error names where it is:
``file: row N: field: what is wrong``. CSV rows are numbered as a spreadsheet shows them (the
header is row 1); JSON rows by their 1-based position.

Imports nothing but the standard library and :mod:`perseus.core`: a rank reads a saved profile
without the solver.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perseus.core.errors import ProfileError
from perseus.core.profiles import (
    MAX_POWER_W,
    ROW_FIELDS,
    Profile,
    Row,
    checked_row,
    profile_from_checked_rows,
    profile_from_rows,
    shown,
)

__all__ = [
    "MAX_PROFILE_BYTES",
    "PROFILE_FORMAT",
    "load_profile",
    "profile_from_json",
    "profile_to_csv",
    "profile_to_json",
]

PROFILE_FORMAT = "perseus.profile/1"
MAX_PROFILE_BYTES = 256 * 1024 * 1024
"""The largest profile file read (256 MiB): well above the largest real profile (1,024 stages x
4 kinds x 200 clocks is about 40 MB of JSON), and a bound on what a file that never ends
(``/dev/zero``, a pipe) makes the reader hold."""
_CSV_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
_CSV_P_BLOCK = "p_block_w"


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Load a profile from a CSV or JSON file.

    Args:
        path: A ``.csv`` (Zeus columns) or ``.json`` (``perseus.profile/1``) file.

    Returns:
        The validated profile.

    Raises:
        ProfileError: The file is unreadable or malformed; the message names file, row, field.
    """
    file = Path(path)
    name = str(path)
    try:
        data = _bounded_read(file, name)
        # utf-8-sig: spreadsheets save "CSV UTF-8" with a byte-order mark before the header
        text = data.decode("utf-8-sig")
        del data
    except (OSError, UnicodeDecodeError) as err:
        raise ProfileError(f"{name}: cannot read profile: {err}") from err
    if file.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        return _load_json(text, name)
    return _load_csv(text, name)


def _bounded_read(file: Path, name: str) -> bytes:
    # In pieces: read(MAX_PROFILE_BYTES + 1) would set aside the whole bound at once.
    chunks: list[bytes] = []
    size = 0
    with file.open("rb") as stream:
        while chunk := stream.read(64 * 1024):
            size += len(chunk)
            if size > MAX_PROFILE_BYTES:
                raise ProfileError(
                    f"{name}: cannot read profile: larger than {MAX_PROFILE_BYTES // 2**20} MiB"
                )
            chunks.append(chunk)
    return b"".join(chunks)


def profile_from_json(data: str | bytes | Mapping[str, Any], *, source: str = "request") -> Profile:
    """Read the ``perseus.profile/1`` JSON form (text, or a decoded document): what
    :func:`profile_to_json` returns and the server's ``profile.json`` answers.

    Raises:
        ProfileError: Not that form, or a row that is invalid; the message names ``source``.
    """
    if isinstance(data, Mapping):
        return _profile_of_document(data, source)
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    return _load_json(text, source)


def profile_to_json(profile: Profile) -> dict[str, Any]:
    """Return the ``perseus.profile/1`` JSON form of ``profile``."""
    rows = [
        {
            "stage": row.stage,
            "instruction": row.instruction,
            "frequency_mhz": row.frequency_mhz,
            "time_s": row.time_s,
            "energy_j": row.energy_j,
        }
        for row in profile.rows()
    ]
    data: dict[str, Any] = {"format": PROFILE_FORMAT}
    if profile.p_block_w is not None:
        data["p_block_w"] = profile.p_block_w
    data["rows"] = rows
    return data


def profile_to_csv(profile: Profile) -> str:
    """Return the Zeus CSV form of ``profile`` (what :func:`load_profile` reads back).

    Rows go by stage, then ``forward``, ``backward``, ``backward_input``, ``backward_weight``
    (those a stage measures), then clock descending. Numbers are
    written in Python's shortest round-trip form, so reading the text back gives equal floats.
    A profile with ``p_block_w`` gets a last column ``p_block_w`` holding it on every row
    (one value per row keeps the file a plain table any CSV reader takes); one without has
    the five Zeus columns only.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    p_block = () if profile.p_block_w is None else (repr(profile.p_block_w),)
    writer.writerow(_CSV_COLUMNS + ((_CSV_P_BLOCK,) if p_block else ()))
    for row in profile.rows():
        writer.writerow(
            (
                row.stage,
                row.instruction,
                row.frequency_mhz,
                repr(row.time_s),
                repr(row.energy_j),
                *p_block,
            )
        )
    return out.getvalue()


def _load_csv(text: str, name: str) -> Profile:
    reader = csv.reader(text.splitlines())
    try:
        return _read_csv(reader, name)
    except csv.Error as err:  # a NUL, a cell over the csv module's field size limit
        raise ProfileError(f"{name}: row {reader.line_num}: not a CSV row: {err}") from None


def _read_csv(reader: Any, name: str) -> Profile:
    header = next(reader, None)
    if header is None or not any(cell.strip() for cell in header):
        raise ProfileError(f"{name}: row 1: the file is empty; expected the header {_header()}")
    columns = [cell.strip().lower() for cell in header]
    while columns and not columns[-1]:
        columns.pop()  # a header ending in a comma
    missing = [col for col in _CSV_COLUMNS if col not in columns]
    if missing:
        raise ProfileError(
            f"{name}: row 1: missing column(s) {', '.join(missing)}; expected {_header()}"
        )
    index = [columns.index(col) for col in _CSV_COLUMNS]
    p_block_at = columns.index(_CSV_P_BLOCK) if _CSV_P_BLOCK in columns else None
    p_block: tuple[int, float] | None = None  # (row, watts) of the first row that fills it
    checked: list[tuple[int, Row]] = []
    for number, cells in enumerate(reader, start=2):
        if not cells or not any(cell.strip() for cell in cells):
            continue
        where = f"{name}: row {number}"
        # a row may end in empty fields (a trailing comma), not in values no column names
        if len(cells) < len(columns) or any(c.strip() for c in cells[len(columns) :]):
            raise ProfileError(f"{where}: expected {len(columns)} fields, got {len(cells)}")
        values = [cells[at].strip() for at in index]
        checked.append((number, checked_row(values, where, _CSV_COLUMNS)))
        watts_text = "" if p_block_at is None else cells[p_block_at].strip()
        if watts_text:
            watts = _csv_blocking_power(watts_text, where)
            if p_block is None:
                p_block = (number, watts)
            elif watts != p_block[1]:
                raise ProfileError(
                    f"{where}: {_CSV_P_BLOCK}: {shown(watts_text)} differs from row {p_block[0]}'s "
                    f"{p_block[1]!r}; a profile has one blocking power"
                )
    if not checked:
        raise ProfileError(f"{name}: row 2: the file has a header but no data rows")
    return profile_from_checked_rows(checked, name, None if p_block is None else p_block[1])


def _load_json(text: str, name: str) -> Profile:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileError(f"{name}: line {err.lineno}: not valid JSON: {err.msg}") from err
    except RecursionError:
        raise ProfileError(f"{name}: not valid JSON: nested too deeply") from None
    except ValueError:  # what int() refuses to read
        raise ProfileError(f"{name}: not valid JSON: a number of over 4,300 digits") from None
    return _profile_of_document(data, name)


def _profile_of_document(data: object, name: str) -> Profile:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{name}: expected a JSON object with 'format' and 'rows'")
    if "format" not in data:
        raise ProfileError(
            f"{name}: format: missing; a perseus JSON profile has "
            f'"format": "{PROFILE_FORMAT}" (or give a Zeus CSV profile)'
        )
    if data.get("format") != PROFILE_FORMAT:
        raise ProfileError(
            f"{name}: format: expected {PROFILE_FORMAT!r}, got {shown(data.get('format'))}"
        )
    raw_rows = data.get("rows")
    if not isinstance(raw_rows, list) or not raw_rows:
        raise ProfileError(f"{name}: rows: expected a non-empty list")
    rows: list[Row] = []
    for number, item in enumerate(raw_rows, start=1):
        where = f"{name}: row {number}"
        if not isinstance(item, Mapping):
            raise ProfileError(f"{where}: expected an object")
        for field in ROW_FIELDS:
            if field not in item:
                raise ProfileError(f"{where}: {field}: missing")
        rows.append(tuple(item[field] for field in ROW_FIELDS))
    return profile_from_rows(rows, source=name, p_block_w=data.get("p_block_w"))


def _header() -> str:
    return ",".join(_CSV_COLUMNS)


def _csv_blocking_power(text: str, where: str) -> float:
    try:
        watts = float(text)
    except ValueError:
        raise ProfileError(
            f"{where}: {_CSV_P_BLOCK}: expected a number of watts, got {shown(text)}"
        ) from None
    if not math.isfinite(watts) or not 0 <= watts <= MAX_POWER_W:
        raise ProfileError(
            f"{where}: {_CSV_P_BLOCK}: expected a finite number in 0..{MAX_POWER_W:g}, "
            f"got {shown(text)}"
        )
    return watts
