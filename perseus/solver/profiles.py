"""Per-stage time and energy profiles: loading, validation and dominance filtering.

A profile says, for every pipeline stage and instruction type (``forward``, ``backward``, and
optionally the split backward's ``backward_input`` and ``backward_weight``), how long one
instruction takes and how much energy it draws at each measured SM clock. A stage measures both
halves of the split backward or neither; schedules that split the backward (zero-bubble ones)
need them on every stage. Two on-disk forms are accepted:

- the Zeus-compatible CSV ``stage,instruction,frequency,time,energy`` (MHz, s, J), with an
  optional ``p_block_w`` column after them: the stage's blocking power in watts, the same on
  every row that fills it (rows may leave it empty). A column, not a comment line, so the file
  stays a plain table for Zeus, pandas, ``csv.DictReader`` and spreadsheets, which read the
  columns they know by name; CSVs without it stay valid and carry no blocking power;
- the project's JSON form ``{"format": "perseus.profile/1", "p_block_w": 83.6,
  "rows": [{"stage": 0, "instruction": "forward", "frequency_mhz": 1410, "time_s": 0.05,
  "energy_j": 24.1}, ...]}``.

Every error names where it is: ``file: row N: field: what is wrong``. CSV rows are numbered as a
spreadsheet shows them (the header is row 1); JSON and in-memory rows by their 1-based position.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus.core.errors import ProfileError
from perseus.solver.schedules import InstructionKind

__all__ = [
    "INSTRUCTIONS",
    "SPLIT_INSTRUCTIONS",
    "Option",
    "Profile",
    "ProfileRow",
    "effective_options",
    "load_profile",
    "profile_from_json",
    "profile_from_rows",
    "profile_to_csv",
    "profile_to_json",
]

INSTRUCTIONS: tuple[InstructionKind, ...] = (InstructionKind.FORWARD, InstructionKind.BACKWARD)
"""The instruction kinds every profile measures (strings: ``("forward", "backward")``)."""
SPLIT_INSTRUCTIONS: tuple[InstructionKind, ...] = (
    InstructionKind.BACKWARD_INPUT,
    InstructionKind.BACKWARD_WEIGHT,
)
"""The halves of a split backward: optional, both or neither on a stage."""
_ALL = (*INSTRUCTIONS, *SPLIT_INSTRUCTIONS)
PROFILE_FORMAT = "perseus.profile/1"
_CSV_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
_CSV_P_BLOCK = "p_block_w"

Row = tuple[int, str, int, float, float]


@dataclass(frozen=True, slots=True)
class Option:
    """One measured operating point of an instruction type."""

    frequency_mhz: int
    time_s: float
    energy_j: float


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One measurement: ``instruction`` of ``stage`` at ``frequency_mhz`` took ``time_s``
    seconds and ``energy_j`` joules (the whole stage: every model chunk of it).

    The one row type between a rank's profiler and the solver: the wire's
    ``perseus.schemas.ProfileRow`` (which leaves the stage to its report) converts from and to
    it, and :func:`profile_from_rows` takes it (or the same five fields as a tuple).
    """

    stage: int
    instruction: InstructionKind
    frequency_mhz: int
    time_s: float
    energy_j: float

    def as_tuple(self) -> Row:
        """``(stage, instruction, frequency_mhz, time_s, energy_j)``."""
        return (self.stage, self.instruction, self.frequency_mhz, self.time_s, self.energy_j)


@dataclass(frozen=True, slots=True)
class Profile:
    """Validated measurements of every stage.

    Attributes:
        stages: Per stage, instruction name -> every measured option, frequency descending.
        p_block_w: Blocking power from the file (JSON's ``p_block_w``, the CSV's
            ``p_block_w`` column), if it carried one.
        source: Where the profile came from (file name or ``"request"``).
    """

    stages: tuple[dict[str, tuple[Option, ...]], ...]
    p_block_w: float | None = None
    source: str = "request"

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages."""
        return len(self.stages)

    @property
    def clock_range_mhz(self) -> tuple[int, int]:
        """The lowest and highest clock measured anywhere in the profile."""
        clocks = [o.frequency_mhz for stage in self.stages for opts in stage.values() for o in opts]
        return min(clocks), max(clocks)

    def option(self, stage: int, instruction: str, frequency_mhz: int) -> Option:
        """Return the option measured at ``frequency_mhz``.

        Raises:
            KeyError: The clock was not measured for that stage and instruction.
        """
        for opt in self.stages[stage][instruction]:
            if opt.frequency_mhz == frequency_mhz:
                return opt
        raise KeyError(frequency_mhz)

    def options(self, stage: int, instruction: str) -> tuple[Option, ...]:
        """Every measured option of ``instruction`` on ``stage``, frequency descending.

        Raises:
            ProfileError: The profile does not measure that instruction (a split backward's
                half, say) on that stage.
        """
        found = self.stages[stage].get(instruction)
        if found is None:
            extra = ""
            if instruction in SPLIT_INSTRUCTIONS:
                extra = (
                    "; schedules that split the backward need backward_input and "
                    "backward_weight rows on every stage"
                )
            raise ProfileError(
                f"{self.source}: stage {stage}: instruction: no {instruction} rows{extra}"
            )
        return found


def effective_options(options: Iterable[Option], p_block_w: float) -> tuple[Option, ...]:
    """Drop options that are dominated once blocking power is counted.

    A GPU that finishes early idles at ``p_block_w`` until the time a slower option would have
    taken, so option ``a`` dominates ``b`` when ``a.time_s <= b.time_s`` and
    ``a.energy_j - p_block_w * a.time_s <= b.energy_j - p_block_w * b.time_s``.

    Args:
        options: Measured options of one instruction type.
        p_block_w: Blocking power in watts.

    Returns:
        The non-dominated options, time ascending (so effective energy strictly descending).
        Complexity O(k log k) for k options.
    """
    kept: list[Option] = []
    best = math.inf
    for opt in sorted(options, key=lambda o: (o.time_s, o.energy_j - p_block_w * o.time_s)):
        effective = opt.energy_j - p_block_w * opt.time_s
        if effective < best:
            kept.append(opt)
            best = effective
    return tuple(kept)


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
        # utf-8-sig: spreadsheets save "CSV UTF-8" with a byte-order mark before the header
        text = file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise ProfileError(f"{name}: cannot read profile: {err}") from err
    if file.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        return _load_json(text, name)
    return _load_csv(text, name)


def profile_from_rows(
    rows: Iterable[ProfileRow | Row], *, source: str = "request", p_block_w: float | None = None
) -> Profile:
    """Build a profile from :class:`ProfileRow` values or tuples of the same five fields
    ``(stage, instruction, frequency_mhz, time_s, energy_j)``.

    Raises:
        ProfileError: A row is invalid; the message says ``source: row N: field: ...``.
    """
    checked: list[tuple[int, Row]] = []
    for number, row in enumerate(rows, start=1):
        where = f"{source}: row {number}"
        if isinstance(row, ProfileRow):
            row = row.as_tuple()
        if len(row) != 5:
            raise ProfileError(f"{where}: expected 5 fields, got {len(row)}")
        stage, instruction, frequency, time_s, energy_j = row
        checked.append(
            (
                number,
                (
                    _integer(stage, where, "stage", minimum=0),
                    _instruction(instruction, where),
                    _integer(frequency, where, "frequency_mhz", minimum=1),
                    _positive(time_s, where, "time_s"),
                    _positive(energy_j, where, "energy_j"),
                ),
            )
        )
    if not checked:
        raise ProfileError(f"{source}: row 1: no rows; a profile needs forward and backward rows")
    return _assemble(checked, source, _blocking_power(p_block_w, source))


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
            "stage": stage,
            "instruction": instruction,
            "frequency_mhz": opt.frequency_mhz,
            "time_s": opt.time_s,
            "energy_j": opt.energy_j,
        }
        for stage, per_instruction in enumerate(profile.stages)
        for instruction in _ALL
        for opt in per_instruction.get(instruction, ())
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
    for stage, per_instruction in enumerate(profile.stages):
        for instruction in _ALL:
            for opt in per_instruction.get(instruction, ()):
                writer.writerow(
                    (
                        stage,
                        instruction,
                        opt.frequency_mhz,
                        repr(opt.time_s),
                        repr(opt.energy_j),
                        *p_block,
                    )
                )
    return out.getvalue()


def _load_csv(text: str, name: str) -> Profile:
    reader = csv.reader(text.splitlines())
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
    index = {col: columns.index(col) for col in _CSV_COLUMNS}
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

        def cell(col: str, cells: list[str] = cells) -> str:
            return cells[index[col]].strip()

        checked.append(
            (
                number,
                (
                    _integer(cell("stage"), where, "stage", minimum=0),
                    _instruction(cell("instruction"), where),
                    _integer(cell("frequency"), where, "frequency", minimum=1),
                    _positive(cell("time"), where, "time"),
                    _positive(cell("energy"), where, "energy"),
                ),
            )
        )
        watts_text = "" if p_block_at is None else cells[p_block_at].strip()
        if watts_text:
            watts = _csv_blocking_power(watts_text, where)
            if p_block is None:
                p_block = (number, watts)
            elif watts != p_block[1]:
                raise ProfileError(
                    f"{where}: {_CSV_P_BLOCK}: {watts_text} differs from row {p_block[0]}'s "
                    f"{p_block[1]!r}; a profile has one blocking power"
                )
    if not checked:
        raise ProfileError(f"{name}: row 2: the file has a header but no data rows")
    return _assemble(checked, name, None if p_block is None else p_block[1])


def _load_json(text: str, name: str) -> Profile:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileError(f"{name}: line {err.lineno}: not valid JSON: {err.msg}") from err
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
            f"{name}: format: expected {PROFILE_FORMAT!r}, got {data.get('format')!r}"
        )
    raw_rows = data.get("rows")
    if not isinstance(raw_rows, list) or not raw_rows:
        raise ProfileError(f"{name}: rows: expected a non-empty list")
    rows: list[Row] = []
    for number, item in enumerate(raw_rows, start=1):
        where = f"{name}: row {number}"
        if not isinstance(item, Mapping):
            raise ProfileError(f"{where}: expected an object")
        fields = ("stage", "instruction", "frequency_mhz", "time_s", "energy_j")
        for field in fields:
            if field not in item:
                raise ProfileError(f"{where}: {field}: missing")
        rows.append(tuple(item[field] for field in fields))
    return profile_from_rows(rows, source=name, p_block_w=data.get("p_block_w"))


def _assemble(checked: list[tuple[int, Row]], source: str, p_block_w: float | None) -> Profile:
    seen: dict[tuple[int, str, int], int] = {}
    per_stage: dict[int, dict[str, list[Option]]] = {}
    for number, (stage, instruction, frequency, time_s, energy_j) in checked:
        key = (stage, instruction, frequency)
        if key in seen:
            raise ProfileError(
                f"{source}: row {number}: frequency: duplicate of row {seen[key]} "
                f"(stage {stage}, {instruction}, {frequency} MHz)"
            )
        seen[key] = number
        per_stage.setdefault(stage, {}).setdefault(instruction, []).append(
            Option(frequency, time_s, energy_j)
        )
    expected = list(range(len(per_stage)))
    if sorted(per_stage) != expected:
        missing = sorted(set(range(max(per_stage) + 1)) - set(per_stage))
        raise ProfileError(
            f"{source}: stage: stages must be numbered 0..{max(per_stage)} without gaps; "
            f"missing stage(s) {', '.join(map(str, missing))}"
        )
    stages: list[dict[str, tuple[Option, ...]]] = []
    for stage in expected:
        found = per_stage[stage]
        for instruction in INSTRUCTIONS:
            if instruction not in found:
                raise ProfileError(f"{source}: stage {stage}: instruction: no {instruction} rows")
        halves = [kind for kind in SPLIT_INSTRUCTIONS if kind in found]
        if len(halves) == 1:
            other = next(kind for kind in SPLIT_INSTRUCTIONS if kind not in found)
            raise ProfileError(
                f"{source}: stage {stage}: instruction: {halves[0]} rows without {other} rows; "
                f"a split backward needs both"
            )
        stages.append(
            {
                instruction: tuple(sorted(found[instruction], key=lambda o: -o.frequency_mhz))
                for instruction in _ALL
                if instruction in found
            }
        )
    return Profile(tuple(stages), p_block_w, source)


def _header() -> str:
    return ",".join(_CSV_COLUMNS)


def _integer(value: object, where: str, field: str, *, minimum: int) -> int:
    number: float
    if isinstance(value, bool):
        raise ProfileError(f"{where}: {field}: expected an integer, got {value!r}")
    if isinstance(value, int | float):
        number = value
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ProfileError(f"{where}: {field}: expected an integer, got {value!r}") from None
    else:
        raise ProfileError(f"{where}: {field}: expected an integer, got {value!r}")
    if not math.isfinite(number) or number != int(number):
        raise ProfileError(f"{where}: {field}: expected an integer, got {value!r}")
    if number < minimum:
        raise ProfileError(f"{where}: {field}: must be >= {minimum}, got {value!r}")
    return int(number)


def _positive(value: object, where: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ProfileError(f"{where}: {field}: expected a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ProfileError(f"{where}: {field}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ProfileError(f"{where}: {field}: must be finite, got {value!r}")
    if number <= 0:
        raise ProfileError(f"{where}: {field}: must be > 0, got {value!r}")
    return number


def _csv_blocking_power(text: str, where: str) -> float:
    try:
        watts = float(text)
    except ValueError:
        raise ProfileError(
            f"{where}: {_CSV_P_BLOCK}: expected a number of watts, got {text!r}"
        ) from None
    if not math.isfinite(watts) or watts < 0:
        raise ProfileError(f"{where}: {_CSV_P_BLOCK}: expected a finite number >= 0, got {text!r}")
    return watts


def _instruction(value: object, where: str) -> InstructionKind:
    if not isinstance(value, str) or value.strip() not in _ALL:
        raise ProfileError(
            f"{where}: instruction: unknown instruction {value!r}; expected one of "
            f"{', '.join(_ALL)}"
        )
    return InstructionKind(value.strip())


def _blocking_power(value: object, source: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(f"{source}: p_block_w: expected a finite number >= 0, got {value!r}")
    if value < 0:
        raise ProfileError(f"{source}: p_block_w: must be >= 0, got {value!r}")
    return float(value)
