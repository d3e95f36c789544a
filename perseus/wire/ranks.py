"""Wire models a rank sends and fetches: its registration, its measured profile, its
iteration reports, and its plan."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perseus.core.pipeline import InstructionKind
from perseus.core.profiles import ProfileRow as MeasuredRow
from perseus.wire.common import (
    MAX_CLOCKS,
    MAX_PROFILE_ROWS,
    MAX_WAIT_QUERY_S,
    MAX_WORLD_SIZE,
    FreeText,
    FrequencyMhz,
    GpuName,
    InstructionName,
    JobState,
    PositiveSeconds,
    PowerW,
    RankNumber,
    StageNumber,
    StrictFloat,
    StrictInt,
    WireModel,
    core_fields,
)

# ----------------------------------------------------------------------------- ranks


class RankRegistration(WireModel):
    """``POST /v1/jobs/{id}/ranks``."""

    rank: RankNumber
    stage: StageNumber
    data_parallel_rank: RankNumber
    tensor_parallel_rank: StageNumber
    gpu_name: GpuName
    supported_clocks_mhz: Annotated[list[FrequencyMhz], Field(min_length=1, max_length=MAX_CLOCKS)]
    instance: Annotated[str, Field(pattern=r"^[0-9A-Za-z_-]{1,64}$")] | None = Field(
        default=None,
        description="The registering process's own id (one per process): the same rank "
        "registered again by another process while the first is live is refused (409).",
    )


class RankRegistered(WireModel):
    rank: int
    state: JobState
    ranks_registered: int


MAX_REASON_CHARS = 2000
"""The longest reason a rank reports for giving up (the client cuts it to this)."""


class GaveUpReport(WireModel):
    """``POST /v1/jobs/{id}/ranks:gave-up``: a rank stopped planning and runs at default clocks
    (it rejected the job, the planner refused it, a plan could not be followed)."""

    rank: RankNumber
    reason: Annotated[FreeText, Field(min_length=1, max_length=MAX_REASON_CHARS)]


class GaveUpAccepted(WireModel):
    rank: int
    at_s: float


CLOCK_LATENCY_HEADER = "X-Perseus-Clock-Latency"
"""Header of a rank's registration answer: present (``1``) where the planner takes the
rank's measured clock-change latency (:class:`ClockLatencyReport`). A rank sends it to no
other planner: an older one refuses the route and knows nothing to plan with it."""

MAX_CLOCK_LATENCY_S = 1.0
"""A reported clock-change latency is below this (seconds): a change that takes longer is
a broken measurement, not a GPU to plan for."""


class ClockLatencyReport(WireModel):
    """``POST /v1/jobs/{id}/ranks:clock-latency``: how long a clock change takes to land on a
    rank's GPU, as its clock controller measured it (a request to the clock in effect,
    through the GPU's driver or daemon). The planner keeps each rank's largest and plans the
    job for the largest of its ranks'."""

    rank: RankNumber
    clock_change_latency_s: Annotated[StrictFloat, Field(ge=0, lt=MAX_CLOCK_LATENCY_S)] = Field(
        description="The measured clock-change latency, in seconds (0 <= x < 1)."
    )


class ClockLatencyAccepted(WireModel):
    rank: int
    clock_change_delay_s: float = Field(
        description="The delay the job is planned for from now on: the largest latency its "
        "ranks reported."
    )
    planning: bool = Field(
        description="True when this report started planning again: the job's frontier was "
        "planned for a materially shorter delay."
    )


class ProfileRow(WireModel):
    # One measurement on the wire: perseus.core.profiles.ProfileRow without its stage,
    # which the ProfileReport carries once. (No docstring: it would change the OpenAPI text.)
    # `instruction` stays the Literal of InstructionKind's values while ranks still build rows
    # from plain strings (a typed __init__ would refuse them); to_row() gives the enum.

    instruction: InstructionName
    frequency_mhz: FrequencyMhz
    time_s: PositiveSeconds
    energy_j: Annotated[StrictFloat, Field(gt=0, le=1e9)]

    @classmethod
    def from_row(cls, row: MeasuredRow) -> ProfileRow:
        """The wire form of the core row (validated: out-of-range values raise pydantic's
        ValidationError)."""
        return cls.model_validate(core_fields(cls, row))

    def to_row(self, stage: int) -> MeasuredRow:
        """The core row of this measurement on ``stage``."""
        values = {**self.model_dump(), "instruction": InstructionKind(self.instruction)}
        return MeasuredRow(stage=stage, **values)


class ProfileReport(WireModel):
    """``POST /v1/jobs/{id}/profiles``: one rank's measured profile of its stage."""

    rank: RankNumber
    stage: StageNumber
    rows: Annotated[list[ProfileRow], Field(min_length=2, max_length=MAX_PROFILE_ROWS)]
    p_block_w: PowerW | None = Field(default=None, description="Measured idle power of this GPU.")


class ProfileAccepted(WireModel):
    rank: int
    state: JobState
    profiles_reported: int
    planning: bool = Field(
        description="True when this report completed the job and started planning."
    )


IterationPhase = Literal["baseline", "profiling", "plan", "default"]
"""What a rank's GPU ran during one reported iteration (see :class:`IterationReport`)."""


class ProfilingProgress(WireModel):
    """How far a rank's online clock sweep got by the end of a reported iteration."""

    clocks_done: Annotated[StrictInt, Field(ge=0, le=MAX_CLOCKS)] = Field(
        description="Clocks measured so far."
    )
    clocks_planned: Annotated[StrictInt, Field(ge=1, le=MAX_CLOCKS)] = Field(
        description="Clocks the sweep means to measure (it stops earlier once a microbatch's "
        "energy rises at several clocks in a row, or its time budget is spent)."
    )
    elapsed_s: Annotated[StrictFloat, Field(ge=0, le=1e7)] = Field(
        description="Seconds since the first clock's measurement began, the training "
        "iterations between clocks included (0 before the first clock)."
    )
    budget_s: Annotated[StrictFloat, Field(gt=0, le=1e7)] | None = Field(
        default=None, description="The sweep's time budget: it stops after this long."
    )

    @model_validator(mode="after")
    def _done_within_planned(self) -> ProfilingProgress:
        if self.clocks_done > self.clocks_planned:
            raise ValueError(
                f"clocks_done ({self.clocks_done}) exceeds clocks_planned ({self.clocks_planned})"
            )
        return self


class IterationReport(WireModel):
    """``POST /v1/jobs/{id}/iterations``: one rank's measured iteration.

    ``time_s`` is the rank's own pipeline time (its first instruction to its last), not
    counting the wait at the data-parallel gradient synchronization.
    """

    rank: RankNumber
    iteration: Annotated[StrictInt, Field(ge=0, le=2**62)]
    time_s: PositiveSeconds
    energy_j: Annotated[StrictFloat, Field(ge=0, le=1e12)]
    plan_version: Annotated[StrictInt, Field(ge=0, le=2**62)] | None = Field(
        default=None,
        description="The plan version the iteration ran; samples of other versions are kept "
        "out of the comparison with the current plan.",
    )
    phase: IterationPhase | None = Field(
        default=None,
        description="What the GPU ran: 'baseline' (default clocks, a sample of the baseline "
        "the realized saving is measured against), 'profiling' (clocks being swept), 'plan' "
        "(following plan_version) or 'default' (default clocks, not a baseline sample: the "
        "plan was stopped). Null from older ranks.",
    )
    profiling: ProfilingProgress | None = Field(
        default=None,
        description="While the rank sweeps its clocks (phase 'profiling'): how far it got. "
        "Null otherwise, and from older ranks.",
    )


class IterationAccepted(WireModel):
    rank: int
    iteration: int
    version: int


# ----------------------------------------------------------------------------- plans


class PlanQuery(BaseModel):
    """The query of ``GET /v1/jobs/{id}/plan``: ``?rank=R&wait_s=S``.

    One model for both readers of the query, the FastAPI route and the server's fast path.
    Query values are text, so numbers parse from it; an unknown parameter is an error (a
    misspelt ``wait_s`` would otherwise turn a long poll into a busy loop).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: Annotated[int, Field(ge=0, lt=MAX_WORLD_SIZE)]
    wait_s: Annotated[
        float,
        Field(
            ge=0,
            le=MAX_WAIT_QUERY_S,
            allow_inf_nan=False,
            description="Long poll: wait up to this long "
            "for a plan newer than If-None-Match (capped by the server).",
        ),
    ] = 0.0


class PlanInstruction(WireModel):
    instruction: InstructionKind
    microbatch: int
    chunk: int | None = None
    frequency_mhz: int
    time_s: float | None = Field(
        default=None,
        description="The instruction's expected duration at its clock, from the profile: the "
        "rank predicts the next boundary from it to issue the next clock change early.",
    )


class PlanResponse(WireModel):
    """``GET /v1/jobs/{id}/plan?rank=R``: the rank's clocks in execution order.

    ``time_s`` and ``energy_j`` are of the whole pipeline at the chosen point. ``chunk`` is
    present only for interleaved schedules. The ``ETag`` header carries the version.
    """

    job_id: str
    version: int
    stage: int
    time_s: float
    energy_j: float
    instructions: list[PlanInstruction]
    clock_change_margin_s: float = Field(
        default=0.0,
        description="How long before each boundary the plan assumes a clock change takes "
        "effect (the stated time and energy include it); the rank aims its changes at it.",
    )
