"""Profiles as values: measured rows, the options of an instruction, a validated profile.

A profile says, for every pipeline stage and instruction kind (``forward``, ``backward``, and
optionally the split backward's ``backward_input`` and ``backward_weight``), how long one
instruction takes and how much energy it draws at each measured SM clock. A stage measures both
halves of the split backward or neither; schedules that split the backward (zero-bubble ones)
need them on every stage.

:func:`profile_from_rows` is the one way to build a :class:`Profile`: from a rank's rows, the
wire's, or a file's (:mod:`perseus.formats.profiles` reads and writes the CSV and JSON forms).
Every error names where it is: ``source: row N: field: what is wrong``.

Imports nothing but the standard library: a rank builds and checks profiles without the solver.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from perseus.core.errors import ProfileError
from perseus.core.pipeline import INSTRUCTIONS, SPLIT_INSTRUCTIONS, InstructionKind

__all__ = [
    "ALL_INSTRUCTIONS",
    "INSTRUCTIONS",
    "ROW_FIELDS",
    "SPLIT_INSTRUCTIONS",
    "Option",
    "Profile",
    "ProfileRow",
    "Row",
    "blocking_power",
    "checked_row",
    "profile_from_checked_rows",
    "profile_from_rows",
]

ALL_INSTRUCTIONS = (*INSTRUCTIONS, *SPLIT_INSTRUCTIONS)
"""Every kind a profile may measure, in the order profiles are written."""
ROW_FIELDS = ("stage", "instruction", "frequency_mhz", "time_s", "energy_j")
"""A row's fields, in :meth:`ProfileRow.as_tuple` order (the JSON form's keys)."""

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

    def rows(self) -> list[ProfileRow]:
        """Every measurement as a row: by stage, then kind (forward, backward, the split
        backward's halves), then clock descending."""
        return [
            ProfileRow(stage, InstructionKind(kind), opt.frequency_mhz, opt.time_s, opt.energy_j)
            for stage, per_instruction in enumerate(self.stages)
            for kind in ALL_INSTRUCTIONS
            for opt in per_instruction.get(kind, ())
        ]


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
        checked.append((number, checked_row(row, where)))
    if not checked:
        raise ProfileError(f"{source}: row 1: no rows; a profile needs forward and backward rows")
    return profile_from_checked_rows(checked, source, blocking_power(p_block_w, source))


def checked_row(row: Sequence[object], where: str, fields: Sequence[str] = ROW_FIELDS) -> Row:
    """One row's five values checked and converted (text such as a CSV's cells included).

    Args:
        row: ``(stage, instruction, frequency, time, energy)``.
        where: What the errors name first (``file: row N``).
        fields: The names the errors give the five fields (a CSV's columns, say).

    Raises:
        ProfileError: ``where: field: what is wrong``.
    """
    if len(row) != 5:
        raise ProfileError(f"{where}: expected 5 fields, got {len(row)}")
    stage, instruction, frequency, time_s, energy_j = row
    return (
        _integer(stage, where, fields[0], minimum=0),
        _instruction(instruction, where),
        _integer(frequency, where, fields[2], minimum=1),
        _positive(time_s, where, fields[3]),
        _positive(energy_j, where, fields[4]),
    )


def profile_from_checked_rows(
    checked: Iterable[tuple[int, Row]], source: str, p_block_w: float | None
) -> Profile:
    """The profile of rows :func:`checked_row` passed, each with the number errors give it.

    Raises:
        ProfileError: A duplicate (stage, kind, clock), stages not numbered ``0..S-1``, a stage
            without forward or backward rows, or with one half of a split backward only.
    """
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
                for instruction in ALL_INSTRUCTIONS
                if instruction in found
            }
        )
    return Profile(tuple(stages), p_block_w, source)


def blocking_power(value: object, source: str) -> float | None:
    """A profile's ``p_block_w`` checked: None, or a finite number of watts >= 0.

    Raises:
        ProfileError: ``source: p_block_w: what is wrong``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(f"{source}: p_block_w: expected a finite number >= 0, got {value!r}")
    if value < 0:
        raise ProfileError(f"{source}: p_block_w: must be >= 0, got {value!r}")
    return float(value)


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


def _instruction(value: object, where: str) -> InstructionKind:
    if not isinstance(value, str) or value.strip() not in ALL_INSTRUCTIONS:
        raise ProfileError(
            f"{where}: instruction: unknown instruction {value!r}; expected one of "
            f"{', '.join(ALL_INSTRUCTIONS)}"
        )
    return InstructionKind(value.strip())
