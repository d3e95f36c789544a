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
import reprlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice

from perseus.core.errors import ProfileError
from perseus.core.pipeline import INSTRUCTIONS, SPLIT_INSTRUCTIONS, InstructionKind

__all__ = [
    "ALL_INSTRUCTIONS",
    "INSTRUCTIONS",
    "MAX_ENERGY_J",
    "MAX_FREQUENCY_MHZ",
    "MAX_POWER_W",
    "MAX_STAGES",
    "MAX_TIME_S",
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
    "shown",
]

ALL_INSTRUCTIONS = (*INSTRUCTIONS, *SPLIT_INSTRUCTIONS)
"""Every kind a profile may measure, in the order profiles are written."""
ROW_FIELDS = ("stage", "instruction", "frequency_mhz", "time_s", "energy_j")
"""A row's fields, in :meth:`ProfileRow.as_tuple` order (the JSON form's keys)."""

Row = tuple[int, str, int, float, float]

# Bounds on every value a profile holds, the same in a file as on the wire
# (perseus.wire.common and perseus.wire.ranks use them): a typo such as stage 999999999999 or
# a time of 1e308 is refused where it is read, never met by the solver or by an error message
# that lists every stage up to it.
MAX_STAGES = 1024
"""Stages are numbered ``0..MAX_STAGES - 1``: a job has at most this many (its ``stages``)."""
MAX_FREQUENCY_MHZ = 100_000
"""Clocks are ``1..MAX_FREQUENCY_MHZ`` MHz (a GPU's run below 3,000)."""
MAX_TIME_S = 1e7
"""Times are ``> 0`` and at most this many seconds (about 4 months per instruction)."""
MAX_ENERGY_J = 1e9
"""Energies are ``> 0`` and at most this many joules."""
MAX_POWER_W = 1e6
"""A blocking power is ``>= 0`` and at most this many watts."""


class _Shown(reprlib.Repr):
    # repr() of an integer past 4,300 digits raises; its size is what matters.
    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return (
                f"<an integer of {len(str(x)) if x.bit_length() < 14_000 else 'over 4,300'} digits>"
            )
        return super().repr_int(x, level)


_SHOWN = _Shown()
_SHOWN.maxstring = _SHOWN.maxother = _SHOWN.maxlong = 40
_SHOWN.maxlevel = 2


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
        _integer(stage, where, fields[0], minimum=0, maximum=MAX_STAGES - 1),
        _instruction(instruction, where),
        _integer(frequency, where, fields[2], minimum=1, maximum=MAX_FREQUENCY_MHZ),
        _positive(time_s, where, fields[3], maximum=MAX_TIME_S),
        _positive(energy_j, where, fields[4], maximum=MAX_ENERGY_J),
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
    expected = range(len(per_stage))
    if any(stage not in per_stage for stage in expected):
        # Name the first few and count the rest: never a list of every stage up to the last.
        last = max(per_stage)
        missing = islice((stage for stage in range(last + 1) if stage not in per_stage), 8)
        count = last + 1 - len(per_stage)
        shown_missing = ", ".join(map(str, missing))
        more = f" and {count - 8} more" if count > 8 else ""
        raise ProfileError(
            f"{source}: stage: stages must be numbered 0..{last} without gaps; "
            f"missing stage(s) {shown_missing}{more}"
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
    """A profile's ``p_block_w`` checked: None, or a finite number of watts in
    ``0..MAX_POWER_W``.

    Raises:
        ProfileError: ``source: p_block_w: what is wrong``.
    """
    if value is None:
        return None
    number = _number(value) if isinstance(value, int | float) else None
    if number is None or not math.isfinite(number):
        raise ProfileError(
            f"{source}: p_block_w: expected a finite number >= 0, got {shown(value)}"
        )
    if not 0 <= number <= MAX_POWER_W:
        raise ProfileError(
            f"{source}: p_block_w: must be in 0..{MAX_POWER_W:g}, got {shown(value)}"
        )
    return number


def shown(value: object) -> str:
    """``repr(value)`` cut to a few dozen characters (and two levels of nesting): what an
    error message quotes of a value it refuses, so that a 1 MB cell or a deeply nested
    document gives a short message."""
    return _SHOWN.repr(value)


def _number(value: object) -> float | None:
    # A number or its text as a float (inf past the float range), None if it is not one.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if abs(value) < 2**1000:
            return float(value)
        return math.inf if value > 0 else -math.inf
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _integer(value: object, where: str, field: str, *, minimum: int, maximum: int) -> int:
    number = _number(value)
    if number is None or not math.isfinite(number) or not number.is_integer():
        raise ProfileError(f"{where}: {field}: expected an integer, got {shown(value)}")
    if not minimum <= number <= maximum:
        raise ProfileError(f"{where}: {field}: must be in {minimum}..{maximum}, got {shown(value)}")
    return int(number)


def _positive(value: object, where: str, field: str, *, maximum: float) -> float:
    number = _number(value)
    if number is None:
        raise ProfileError(f"{where}: {field}: expected a number, got {shown(value)}")
    if not math.isfinite(number):
        raise ProfileError(f"{where}: {field}: must be finite, got {shown(value)}")
    if number <= 0:
        raise ProfileError(f"{where}: {field}: must be > 0, got {shown(value)}")
    if number > maximum:
        raise ProfileError(f"{where}: {field}: must be at most {maximum:g}, got {shown(value)}")
    return number


def _instruction(value: object, where: str) -> InstructionKind:
    if not isinstance(value, str) or value.strip() not in ALL_INSTRUCTIONS:
        raise ProfileError(
            f"{where}: instruction: unknown instruction {shown(value)}; expected one of "
            f"{', '.join(ALL_INSTRUCTIONS)}"
        )
    return InstructionKind(value.strip())
