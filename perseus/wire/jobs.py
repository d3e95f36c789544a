"""Wire models of a job's life: its policies, its creation, its counts, the point its plans
follow, straggler changes, and the job list."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from perseus.core.defaults import RESOLUTION_S
from perseus.core.pipeline import CHUNKED_SCHEDULES, SPLIT_BACKWARD_SCHEDULES
from perseus.wire.common import (
    MAX_INSTRUCTIONS,
    MAX_WORLD_SIZE,
    JobState,
    Name,
    PositiveSeconds,
    PowerW,
    ScheduleName,
    StrictFloat,
    StrictInt,
    WireModel,
)

# ----------------------------------------------------------------------------- policies


class NoSlowdownPolicy(WireModel):
    """Least energy at the all-fastest iteration time."""

    kind: Literal["no-slowdown"]


class MaxSlowdownPolicy(WireModel):
    """Least energy with iteration time at most ``factor`` times the fastest."""

    kind: Literal["max-slowdown"]
    factor: Annotated[StrictFloat, Field(ge=1.0, le=100.0)]


class DeadlinePolicy(WireModel):
    """Least energy with iteration time at most ``seconds``."""

    kind: Literal["deadline"]
    seconds: PositiveSeconds


class MinEnergyPolicy(WireModel):
    """The least-energy point, however slow."""

    kind: Literal["min-energy"]


class ZeusCostPolicy(WireModel):
    """Zeus's cost ``eta * energy + (1 - eta) * max_power * time``."""

    kind: Literal["zeus-cost"]
    eta: Annotated[StrictFloat, Field(ge=0.0, le=1.0)]


PolicyModel = (
    NoSlowdownPolicy | MaxSlowdownPolicy | DeadlinePolicy | MinEnergyPolicy | ZeusCostPolicy
)
"""Any one policy (a plain union, for annotations)."""
PolicySpec = Annotated[PolicyModel, Field(discriminator="kind")]
"""Any one policy, told apart by ``kind`` (for validation)."""


# ----------------------------------------------------------------------------- jobs


class JobCreate(WireModel):
    """``POST /v1/jobs``: a pipeline-parallel training job to plan."""

    name: Name | None = None
    schedule: ScheduleName
    stages: Annotated[StrictInt, Field(ge=1, le=1024)]
    microbatches: Annotated[StrictInt, Field(ge=1, le=100_000)]
    virtual_stages: Annotated[StrictInt, Field(ge=1, le=64)] = 1
    data_parallel: Annotated[StrictInt, Field(ge=1, le=MAX_WORLD_SIZE)]
    tensor_parallel: Annotated[StrictInt, Field(ge=1, le=1024)]
    p_block_w: PowerW | None = Field(
        default=None,
        description="Blocking power of one GPU while it waits; overrides the profiles' value.",
    )
    policy: PolicySpec = Field(default_factory=lambda: NoSlowdownPolicy(kind="no-slowdown"))
    resolution_s: Annotated[StrictFloat, Field(ge=1e-5, le=RESOLUTION_S)] | None = Field(
        default=None, description="Time quantum of the frontier; the solver's default if unset."
    )
    auto_straggler: Annotated[bool, Field(strict=True)] = Field(
        default=False,
        description="Switch other replicas to the straggler plan when one is consistently slower.",
    )
    straggler_threshold: Annotated[StrictFloat, Field(gt=1.0, le=10.0)] = 1.05
    straggler_window: Annotated[StrictInt, Field(ge=2, le=1000)] = 5
    priority: Annotated[StrictFloat, Field(gt=0, le=1000)] = Field(
        default=1.0,
        description="Weight of the job's slowdown under a cluster power budget; changeable "
        "later (PUT /v1/jobs/{id}/priority). Left out of answers at 1.",
        # Left out at the default: ranks from before answers were read tolerantly refuse a
        # job view whose spec has a field they do not know.
        exclude_if=lambda priority: priority == 1.0,
    )

    @model_validator(mode="after")
    def _check_sizes(self) -> JobCreate:
        if self.virtual_stages > 1 and self.schedule not in CHUNKED_SCHEDULES:
            raise ValueError(
                f"virtual_stages > 1 needs one of {', '.join(sorted(CHUNKED_SCHEDULES))}"
            )
        world = self.stages * self.data_parallel * self.tensor_parallel
        if world > MAX_WORLD_SIZE:
            raise ValueError(
                f"stages x data_parallel x tensor_parallel = {world} exceeds {MAX_WORLD_SIZE}"
            )
        per_action = 3 if self.schedule in SPLIT_BACKWARD_SCHEDULES else 2
        instructions = per_action * self.stages * self.microbatches * self.virtual_stages
        if instructions > MAX_INSTRUCTIONS:
            raise ValueError(
                f"{per_action} x stages x microbatches x virtual_stages = {instructions} "
                f"exceeds {MAX_INSTRUCTIONS}"
            )
        return self

    @property
    def world_size(self) -> int:
        """Number of ranks: stages x data parallel x tensor parallel."""
        return self.stages * self.data_parallel * self.tensor_parallel


class JobCreated(WireModel):
    """Reply to ``POST /v1/jobs``. The token is shown once; the server keeps only its hash."""

    job_id: str
    token: str


class JobCounts(WireModel):
    ranks_expected: int
    ranks_registered: int
    profiles_reported: int
    stages_profiled: int
    iterations_reported: int = Field(description="Iteration reports, every rank's counted.")
    iterations: int | None = Field(
        default=None,
        description="Iterations of the job: the most iteration reports any one rank sent.",
    )


class ChosenPoint(WireModel):
    """The frontier point the plans follow now."""

    index: int
    time_s: float
    energy_j: float
    gap: float
    expected_iteration_time_s: float = Field(
        description="Iteration time once a straggler is accounted for."
    )
    expected_energy_j: float = Field(
        description="Energy of one pipeline per iteration at the expected iteration time."
    )


class StragglerSpec(WireModel):
    """``PUT /v1/jobs/{id}/straggler``: exactly one of the two fields."""

    iteration_time_s: PositiveSeconds | None = None
    slowdown: Annotated[StrictFloat, Field(ge=1.0, le=100.0)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StragglerSpec:
        if (self.iteration_time_s is None) == (self.slowdown is None):
            raise ValueError("give exactly one of iteration_time_s and slowdown")
        return self


class StragglerView(WireModel):
    iteration_time_s: float | None = None
    slowdown: float | None = None
    automatic: bool = False
    data_parallel_ranks: list[int] = Field(
        default_factory=list,
        description="Replicas detected as stragglers; they keep the policy plan.",
    )


class JobSummary(WireModel):
    job_id: str
    name: str | None
    state: JobState
    version: int
    created_at_s: float


class JobList(WireModel):
    jobs: list[JobSummary]


class PlanVersion(WireModel):
    """Reply to policy and straggler changes."""

    version: int
    state: JobState
    chosen: ChosenPoint | None
