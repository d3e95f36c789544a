"""The files ``perseus plan`` writes and ``perseus simulate`` reads, one pydantic model each;
and torch's schedule CSV that ``perseus plan --schedule-file`` reads.

- :class:`FrontierFile`, ``perseus.frontier/1``: every frontier point, the run's baselines and
  the fingerprint of the profile it was planned on (``--output``).
- :class:`PlanFile`, ``perseus.plan/1``: one plan, its stated time and energy and the same
  fingerprint (``--plan-output``).

Both are rendered from and parsed into these models only, so what is read is what was written.
Parsing checks types, finiteness and ranges (the models) and then shapes against the schedule
(:meth:`FrontierFile.to_frontier`, :meth:`PlanFile.to_schedule`); every error is a
:class:`~perseus.core.errors.PlanError` that names the file and the field.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perseus.core.baselines import BASELINE_LABELS, Baseline, BaselineKey
from perseus.core.errors import PerseusError, PlanError, ScheduleError
from perseus.core.pipeline import SCHEDULE_NAMES
from perseus.core.points import Point
from perseus.core.profiles import Profile
from perseus.solver.frontier import FRONTIER_FORMAT, Frontier
from perseus.solver.schedules import Schedule, make_schedule

__all__ = [
    "FRONTIER_FORMAT",
    "PLAN_FORMAT",
    "FileBaseline",
    "FilePoint",
    "FrontierFile",
    "PlanFile",
    "ProfileFingerprint",
    "frontier_from_json",
    "frontier_to_json",
    "profile_fingerprint",
    "read_plan_or_frontier",
    "read_torch_schedule",
    "read_torch_schedule_file",
]

PLAN_FORMAT = "perseus.plan/1"
# Every run has these; "default" may be absent from files written before it existed.
_REQUIRED_BASELINES = (
    BaselineKey.ALL_FASTEST,
    BaselineKey.GLOBAL_CLOCK,
    BaselineKey.PER_STAGE_CLOCK,
)

Finite = Annotated[float, Field(allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Margin = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1)]
ClockMhz = Annotated[int, Field(ge=1, lt=65536)]
Clocks = list[list[ClockMhz]]


class _Model(BaseModel):
    # Strict: a JSON true is not 1, a string is not a number. Unknown keys are ignored so that
    # a newer file with more fields still reads.
    model_config = ConfigDict(strict=True, frozen=True)


class ProfileFingerprint(_Model):
    """Which profile a plan was made on.

    Attributes:
        source: The profile's file name (informative only).
        sha256: SHA-256 of its measurements (stage, instruction, clock, time, energy; not the
            file's bytes, so a CSV and its JSON form agree), in hex.
        stages: Its number of stages.
    """

    source: str
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    stages: Count


def _core_fields(model: type[BaseModel], value: object) -> dict[str, Any]:
    """The values of ``model``'s fields read by name from ``value`` (a :mod:`perseus.core`
    dataclass the model renders), clocks as lists: the model lists its fields once, each one of
    the core type's (``tests/wire/test_core_renderings.py`` checks it)."""
    values = {name: getattr(value, name) for name in model.model_fields}
    return {name: _lists(v) for name, v in values.items()}


def _lists(value: object) -> object:
    return [_lists(v) for v in value] if isinstance(value, tuple) else value


def _tuples(value: object) -> object:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


class FileBaseline(_Model):
    """A :class:`perseus.core.baselines.Baseline` in a file: iteration time, energy and
    (optionally, in older files) its clocks."""

    time_s: Finite
    energy_j: Finite
    frequencies_mhz: Clocks = Field(default_factory=list)

    @classmethod
    def from_baseline(cls, baseline: Baseline) -> FileBaseline:
        return cls.model_validate(_core_fields(cls, baseline))

    def to_baseline(self) -> Baseline:
        values = {f.name: _tuples(getattr(self, f.name)) for f in dataclasses.fields(Baseline)}
        return Baseline(**values)  # type: ignore[arg-type]


class FilePoint(_Model):
    """A :class:`perseus.core.points.Point` in a file."""

    time_s: Finite
    energy_j: Finite
    gap: Finite
    frequencies_mhz: Clocks

    @classmethod
    def from_point(cls, point: Point) -> FilePoint:
        return cls.model_validate(_core_fields(cls, point))


class FrontierFile(_Model):
    """A ``perseus.frontier/1`` file.

    Attributes:
        schedule, stages, microbatches, virtual_stages: The schedule (``virtual_stages`` may be
            left out: then it follows from ``order``).
        p_block_w: Blocking power of the energy model.
        profile: Fingerprint of the profile it was planned on (absent in older files).
        order: ``order[g]``: GPU ``g``'s instructions, ``[kind, microbatch(, chunk)]``.
        baselines: The run's baselines by key (see :data:`perseus.core.baselines.BASELINE_LABELS`).
        baselines_deadline_s: The deadline the global and per-stage baselines were fitted to.
        points: Time strictly ascending, energy strictly descending.
        clock_change_margin_s: How long before an instruction boundary the plans assume a
            raise takes effect, and after it a lowering (see
            :mod:`perseus.solver.transitions`); the stated times and energies include it (0
            in files written before it existed).
        resolution_s: The spacing of the deadline grid the points were found on (by default
            it follows the job's length: :func:`perseus.solver.deadlines.default_resolution`);
            absent in files written before it was recorded.
        clock_change_delay_s: The clock-change delay the plans were merged for (see
            :mod:`perseus.solver.changes`); absent where none was assumed.
    """

    format: Literal["perseus.frontier/1"]
    schedule: str
    stages: Count
    microbatches: Count
    virtual_stages: Count | None = None
    p_block_w: NonNegative
    profile: ProfileFingerprint | None = None
    order: list[list[list[str | int]]]
    baselines: dict[str, FileBaseline]
    baselines_deadline_s: Positive | None = None
    points: Annotated[list[FilePoint], Field(min_length=1)]
    clock_change_margin_s: Margin = 0.0
    resolution_s: Positive | None = None
    clock_change_delay_s: Margin | None = None

    @classmethod
    def of_run(
        cls,
        frontier: Frontier,
        baselines: Mapping[str, Baseline],
        *,
        profile: ProfileFingerprint | None,
        baselines_deadline_s: float | None,
    ) -> FrontierFile:
        """The file of a planning run: its frontier and the baselines the run showed."""
        return cls.model_validate(
            {
                "format": FRONTIER_FORMAT,
                **_run_fields(frontier, profile),
                "order": _order_of(frontier.schedule),
                "baselines": {
                    str(key): FileBaseline.from_baseline(b) for key, b in baselines.items()
                },
                "baselines_deadline_s": baselines_deadline_s,
                "points": [FilePoint.from_point(frontier.point(i)) for i in range(len(frontier))],
                "resolution_s": (
                    None if frontier.resolution_s is None else float(frontier.resolution_s)
                ),
                "clock_change_delay_s": float(frontier.clock_change_delay_s) or None,
            }
        )

    def render(self) -> bytes:
        """The file's bytes: one JSON line (frontiers are large)."""
        return self.model_dump_json(exclude_none=True).encode() + b"\n"

    def to_frontier(self) -> Frontier:
        """The frontier this file holds, checked against its schedule.

        Raises:
            PlanError: Unknown schedule, an order that is not the schedule's, clocks that do
                not fit it, points not strictly ascending in time and descending in energy.
        """
        chunks = [e[2] for seq in self.order for e in seq if len(e) == 3 and isinstance(e[2], int)]
        virtual = self.virtual_stages or (max(chunks) + 1 if chunks else 1)
        schedule = _schedule(self.schedule, self.stages, self.microbatches, virtual)
        if self.order != _order_of(schedule):
            raise PlanError(f"order: does not match the {_schedule_text(schedule)} schedule")
        sizes = [len(seq) for seq in schedule.order]
        unknown = sorted(set(self.baselines) - set(BASELINE_LABELS))
        if unknown:
            raise PlanError(
                f"baselines: unknown {', '.join(unknown)}; expected some of "
                f"{', '.join(BASELINE_LABELS)}"
            )
        missing = [key for key in _REQUIRED_BASELINES if key not in self.baselines]
        if missing:
            raise PlanError(f"baselines: missing {', '.join(missing)}")
        baselines = {}
        for key, b in self.baselines.items():
            if b.frequencies_mhz:
                _check_clocks(b.frequencies_mhz, sizes, f"baselines.{key}.frequencies_mhz")
            baselines[key] = b.to_baseline()
        flat = []
        for i, point in enumerate(self.points):
            _check_clocks(point.frequencies_mhz, sizes, f"points[{i}].frequencies_mhz")
            flat.append([f for row in point.frequencies_mhz for f in row])
            if i and not (
                point.time_s > self.points[i - 1].time_s
                and point.energy_j < self.points[i - 1].energy_j
            ):
                raise PlanError(
                    f"points[{i}]: time_s must rise and energy_j fall from one point to the next"
                )
        return Frontier(
            schedule=schedule,
            p_block_w=self.p_block_w,
            times_s=np.asarray([p.time_s for p in self.points], dtype=np.float64),
            energies_j=np.asarray([p.energy_j for p in self.points], dtype=np.float64),
            gaps=np.asarray([p.gap for p in self.points], dtype=np.float64),
            frequencies_mhz=np.asarray(flat, dtype=np.uint16),
            baselines=baselines,
            clock_change_margin_s=self.clock_change_margin_s,
            resolution_s=self.resolution_s,
            clock_change_delay_s=self.clock_change_delay_s or 0.0,
        )


class PlanFile(_Model):
    """A ``perseus.plan/1`` file: one plan.

    Attributes:
        schedule, stages, microbatches, virtual_stages: The schedule.
        p_block_w: Blocking power of the energy model.
        profile: Fingerprint of the profile it was planned on (absent in older files).
        time_s, energy_j: What the plan takes on that profile (absent in older files).
        frequencies_mhz: ``frequencies_mhz[g][k]``: clock of GPU ``g``'s ``k``-th instruction.
        clock_change_margin_s: The clock-change margin ``time_s`` and ``energy_j`` include (0
            in files written before it existed).
    """

    format: Literal["perseus.plan/1"]
    schedule: str
    stages: Count
    microbatches: Count
    virtual_stages: Count
    p_block_w: Positive
    profile: ProfileFingerprint | None = None
    time_s: Finite | None = None
    energy_j: Finite | None = None
    frequencies_mhz: Clocks
    clock_change_margin_s: Margin = 0.0

    @classmethod
    def of_point(
        cls, frontier: Frontier, index: int, *, profile: ProfileFingerprint | None
    ) -> PlanFile:
        """The file of frontier point ``index``."""
        point = frontier.point(index)
        return cls.model_validate(
            {
                "format": PLAN_FORMAT,
                **_run_fields(frontier, profile),
                "time_s": point.time_s,
                "energy_j": point.energy_j,
                "frequencies_mhz": [list(row) for row in point.frequencies_mhz],
            }
        )

    def render(self) -> bytes:
        """The file's bytes: one line per field, one per GPU for the clocks."""
        data = self.model_dump(mode="json", exclude_none=True)
        clocks = data.pop("frequencies_mhz")
        lines = [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in data.items()]
        per_gpu = ",\n".join(f"    {json.dumps(row)}" for row in clocks)
        text = "{\n" + "\n".join(lines) + '\n  "frequencies_mhz": [\n' + per_gpu + "\n  ]\n}\n"
        return text.encode()

    def to_schedule(self) -> Schedule:
        """The plan's schedule, with its clocks checked against it.

        Raises:
            PlanError: Unknown schedule or clocks that do not fit it.
        """
        schedule = _schedule(self.schedule, self.stages, self.microbatches, self.virtual_stages)
        _check_clocks(self.frequencies_mhz, [len(seq) for seq in schedule.order], "frequencies_mhz")
        return schedule

    @property
    def clocks(self) -> tuple[tuple[int, ...], ...]:
        """``frequencies_mhz`` as tuples."""
        return tuple(tuple(row) for row in self.frequencies_mhz)


def profile_fingerprint(profile: Profile) -> ProfileFingerprint:
    """Fingerprint of a profile's measurements (not of its blocking power or file format).

    O(number of measurements).
    """
    digest = hashlib.sha256()
    for stage, kinds in enumerate(profile.stages):
        for kind in sorted(kinds):
            for option in sorted(kinds[kind], key=lambda o: o.frequency_mhz):
                digest.update(
                    f"{stage},{kind},{option.frequency_mhz},{option.time_s!r},"
                    f"{option.energy_j!r}\n".encode()
                )
    return ProfileFingerprint(
        source=Path(profile.source).name, sha256=digest.hexdigest(), stages=profile.num_stages
    )


def read_plan_or_frontier(path: str) -> FrontierFile | PlanFile:
    """Read a ``perseus.frontier/1`` or ``perseus.plan/1`` file.

    Raises:
        PlanError: Unreadable, not JSON, another kind of file, or a field that is wrong; the
            message names the file and the field.
    """
    expected = (
        f"expected a {FRONTIER_FORMAT} or {PLAN_FORMAT} JSON file, as perseus plan writes with "
        "--output or --plan-output"
    )
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PlanError(f"{path}: not a text file; {expected}") from None
    except OSError as err:
        raise PlanError(f"{path}: cannot read: {err.strerror}") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        first = text.lstrip().split("\n", 1)[0].lower()
        kind = " (it looks like a CSV profile)" if "," in first and "stage" in first else ""
        raise PlanError(f"{path}: not JSON{kind}; {expected}") from err
    if not isinstance(data, dict):
        raise PlanError(f"{path}: a JSON {type(data).__name__}; {expected}")
    fmt = data.get("format")
    model: type[FrontierFile | PlanFile]
    if fmt == FRONTIER_FORMAT:
        model = FrontierFile
    elif fmt == PLAN_FORMAT:
        model = PlanFile
    else:
        got = "no format field" if fmt is None else f"format {fmt!r}"
        raise PlanError(f"{path}: {got}; {expected}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise PlanError(f"{path}: {validation_message(err)}") from None


def frontier_to_json(frontier: Frontier) -> str:
    """``frontier`` as one line of ``perseus.frontier/1`` JSON, with its own baselines.

    How the server stores a job's frontier: the same model as ``perseus plan --output``.
    """
    file = FrontierFile.of_run(
        frontier, frontier.baselines, profile=None, baselines_deadline_s=None
    )
    return file.render().decode().rstrip("\n")


def frontier_from_json(data: str | bytes | object) -> Frontier:
    """Read ``perseus.frontier/1`` JSON (text, or a decoded document) back into a frontier.

    Raises:
        PlanError: Not a frontier document, or a field that is wrong (the message names it).
    """
    try:
        if isinstance(data, str | bytes):
            file = FrontierFile.model_validate_json(data)
        else:
            file = FrontierFile.model_validate(data)
    except ValidationError as err:
        raise PlanError(f"frontier: {validation_message(err)}") from None
    return file.to_frontier()


def validation_message(err: ValidationError) -> str:
    """The first error of a pydantic validation as ``field.path: what, got VALUE``."""
    first = err.errors()[0]
    where = "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]
    ).lstrip(".")
    what = first["msg"][0].lower() + first["msg"][1:]
    if first["type"] == "missing":
        return f"{where}: missing"
    shown = first["input"]
    text = repr(shown) if not isinstance(shown, dict | list) else type(shown).__name__
    return f"{where or 'document'}: {what}, got {text}"


def _schedule(name: str, stages: int, microbatches: int, virtual_stages: int) -> Schedule:
    if name not in SCHEDULE_NAMES:
        raise PlanError(f"schedule: expected one of {', '.join(SCHEDULE_NAMES)}, got {name!r}")
    try:
        return make_schedule(name, stages, microbatches, virtual_stages)
    except PerseusError as err:
        raise PlanError(f"schedule: {err}") from None


def _check_clocks(clocks: Sequence[Sequence[int]], sizes: Sequence[int], where: str) -> None:
    if len(clocks) != len(sizes):
        raise PlanError(f"{where}: expected {len(sizes)} lists (one per GPU), got {len(clocks)}")
    for gpu, (row, size) in enumerate(zip(clocks, sizes, strict=True)):
        if len(row) != size:
            raise PlanError(
                f"{where}[{gpu}]: expected {size} clocks (one per instruction), got {len(row)}"
            )


def _order_of(schedule: Schedule) -> list[list[list[str | int]]]:
    interleaved = schedule.virtual_stages > 1
    return [
        [[i.kind, i.microbatch, i.chunk] if interleaved else [i.kind, i.microbatch] for i in seq]
        for seq in schedule.order
    ]


def _schedule_text(schedule: Schedule) -> str:
    text = f"{schedule.name}, {schedule.stages} stages x {schedule.microbatches} microbatches"
    if schedule.virtual_stages > 1:
        text += f" x {schedule.virtual_stages} chunks"
    return text


def _run_fields(frontier: Frontier, profile: ProfileFingerprint | None) -> dict[str, Any]:
    """The fields a frontier file and a plan file share: the schedule, P_block, the profile,
    the clock-change margin."""
    schedule = frontier.schedule
    return {
        "schedule": schedule.name,
        "stages": schedule.stages,
        "microbatches": schedule.microbatches,
        "virtual_stages": schedule.virtual_stages,
        "p_block_w": float(frontier.p_block_w),
        "profile": profile,
        "clock_change_margin_s": float(frontier.clock_change_margin_s),
    }


# ----------------------------------------------------------------------------- torch schedules

# torch.distributed.pipelining's printed actions (``_Action.__repr__``, torch 2.13):
# ``[stage][type][microbatch]`` such as ``2F0``, and ``(0F3;3B1)OVERLAP_F_B`` for a forward
# and a full backward issued together. Communication and FSDP actions carry no compute.
_TORCH_ACTION = re.compile(
    r"(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)"
)
_TORCH_KINDS = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}


def read_torch_schedule(path: str | Path) -> list[list[tuple[int, Any, int]]]:
    """Every rank's compute actions from torch's ``compute_only`` schedule CSV: the actions
    of :func:`read_torch_schedule_file`."""
    return read_torch_schedule_file(path)[0]


def read_torch_schedule_file(
    path: str | Path,
) -> tuple[list[list[tuple[int, Any, int]]], list[tuple[int, int]]]:
    """Every rank's compute actions from torch's ``compute_only`` schedule CSV, and where its
    overlapped actions are.

    The CSV is what ``PipelineScheduleMulti._dump_csv`` writes (and ``_load_csv`` reads): one
    row per rank, one printed action per cell (``2F0``, ``1I3``, ``0W1``, ``0B2``,
    ``(0F3;3B1)OVERLAP_F_B``), an empty cell for a bubble. An overlapped action becomes its
    halves in order; communication and FSDP actions (``SEND_F``, ``UNSHARD``, ...) are
    skipped.

    Returns:
        ``actions[rank]``: ``(stage, kind, microbatch)`` in order, and ``(rank, position)``
        of each ``OVERLAP_F_B`` whose halves are a forward then a full backward (the
        forward's position), both for :func:`perseus.solver.schedule_from_actions`.

    Raises:
        ScheduleError: Unreadable file or a cell that is no action; the message names the
            file, the row (rank + 1) and the column.
    """
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise ScheduleError(f"{path}: cannot read the schedule: {err}") from None
    actions: list[list[tuple[int, Any, int]]] = []
    overlapped: list[tuple[int, int]] = []
    for number, row in enumerate(csv.reader(text.splitlines()), start=1):
        if not any(cell.strip() for cell in row):
            continue
        seq: list[tuple[int, Any, int]] = []
        for column, cell in enumerate(row, start=1):
            where = f"{path}: row {number}, column {column}"
            cell = cell.strip()
            if cell in ("", "None"):
                continue
            parts = [cell]
            first = len(seq)
            if cell.startswith("("):
                inner, _, kind = cell[1:].partition(")")
                if kind != "OVERLAP_F_B":
                    raise ScheduleError(f"{where}: {cell!r} is not a torch action")
                parts = [part.strip() for part in inner.split(";") if part.strip()]
            for part in parts:
                match = _TORCH_ACTION.fullmatch(part)
                if match is None:
                    raise ScheduleError(
                        f"{where}: {part!r} is not a torch action (such as 2F0, 1I3, 0W1)"
                    )
                stage, kind, microbatch = match.groups()
                if kind not in _TORCH_KINDS:
                    continue
                if not microbatch:
                    raise ScheduleError(f"{where}: {part!r} has no microbatch")
                seq.append((int(stage), _TORCH_KINDS[kind], int(microbatch)))
            halves = [kind for _u, kind, _j in seq[first:]]
            if len(parts) > 1 and halves == ["forward", "backward"]:
                overlapped.append((len(actions), first))
        actions.append(seq)
    if not actions:
        raise ScheduleError(f"{path}: the schedule has no rows")
    return actions, overlapped
