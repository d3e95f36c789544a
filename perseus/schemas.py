"""Wire models shared by the planner server and its client, and the URL paths.

Everything that crosses the network is one of these pydantic v2 models. Units are in the
field names (``time_s``, ``energy_j``, ``frequency_mhz``, ``power_w``). Bounds here are the
first line of input validation; checks that need the job (a stage within the job's stages,
a rank within its world size) are done by the server's job logic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from perseus.defaults import RESOLUTION_S
from perseus.solver.profiles import ProfileRow as MeasuredRow
from perseus.solver.schedules import InstructionKind

if TYPE_CHECKING:
    from perseus.solver import Baseline as SolverBaseline
    from perseus.solver import Point

__all__ = [
    "ACTIVITY_PATH",
    "API_PREFIX",
    "FRONTIER_FILE_PATH",
    "FRONTIER_PATH",
    "HEALTHZ_PATH",
    "ITERATIONS_PATH",
    "JOBS_PATH",
    "JOB_PATH",
    "JOB_STATES",
    "MAX_CLOCKS",
    "MAX_INSTRUCTIONS",
    "MAX_PROFILE_ROWS",
    "MAX_WORLD_SIZE",
    "METRICS_PATH",
    "OVERVIEW_PATH",
    "PLAN_COMPUTE_PATH",
    "PLAN_PATH",
    "POLICY_PATH",
    "PROFILES_PATH",
    "PROFILE_CSV_PATH",
    "PROFILE_JSON_PATH",
    "RANKS_PATH",
    "STRAGGLER_PATH",
    "ActivityView",
    "Baseline",
    "ChosenPoint",
    "DeadlinePolicy",
    "ErrorBody",
    "FieldError",
    "FrontierPoint",
    "FrontierView",
    "Health",
    "IterationAccepted",
    "IterationPhase",
    "IterationPoint",
    "IterationReport",
    "JobCounts",
    "JobCreate",
    "JobCreated",
    "JobList",
    "JobState",
    "JobSummary",
    "JobView",
    "JobViews",
    "MaxSlowdownPolicy",
    "MinEnergyPolicy",
    "NoSlowdownPolicy",
    "PlanInstruction",
    "PlanQuery",
    "PlanResponse",
    "PlanVersion",
    "PolicyModel",
    "PolicySpec",
    "ProfileAccepted",
    "ProfileReport",
    "ProfileRow",
    "RankRegistered",
    "RankRegistration",
    "RankStatus",
    "ReplicaTelemetry",
    "SampleStats",
    "SavingsView",
    "StragglerSpec",
    "StragglerView",
    "Telemetry",
    "ValidationErrorBody",
    "ZeusCostPolicy",
]

API_PREFIX = "/v1"
JOBS_PATH = f"{API_PREFIX}/jobs"
JOB_PATH = f"{JOBS_PATH}/{{job_id}}"
RANKS_PATH = f"{JOB_PATH}/ranks"
PROFILES_PATH = f"{JOB_PATH}/profiles"
PLAN_COMPUTE_PATH = f"{JOB_PATH}/plan:compute"
FRONTIER_PATH = f"{JOB_PATH}/frontier"
POLICY_PATH = f"{JOB_PATH}/policy"
STRAGGLER_PATH = f"{JOB_PATH}/straggler"
PLAN_PATH = f"{JOB_PATH}/plan"
ITERATIONS_PATH = f"{JOB_PATH}/iterations"
PROFILE_CSV_PATH = f"{JOB_PATH}/profile.csv"
PROFILE_JSON_PATH = f"{JOB_PATH}/profile.json"
FRONTIER_FILE_PATH = f"{JOB_PATH}/frontier.json"
ACTIVITY_PATH = f"{JOB_PATH}/activity"
OVERVIEW_PATH = f"{API_PREFIX}/overview"
HEALTHZ_PATH = "/healthz"
METRICS_PATH = "/metrics"

MAX_WORLD_SIZE = 131_072
"""Most ranks (stages x data parallel x tensor parallel) one job may have."""
MAX_INSTRUCTIONS = 262_144
"""Most instructions (stages x microbatches x virtual stages x 2) in one iteration."""
MAX_PROFILE_ROWS = 10_000
MAX_CLOCKS = 1_000

# The wire names of the solver's schedules (tests/server/test_schemas.py keeps them equal).
ScheduleName = Literal["1f1b", "gpipe", "interleaved-1f1b"]
InstructionName = Literal["forward", "backward"]
"""The values of :class:`perseus.solver.InstructionKind` as a type (kept for old imports; the
models use the enum, so the OpenAPI document names it)."""
JobState = Literal["registering", "profiling", "planning", "ready", "failed"]
JOB_STATES: tuple[JobState, ...] = get_args(JobState)
"""Every job state, in lifecycle order."""

MAX_WAIT_QUERY_S = 3600.0
"""Longest ``wait_s`` a plan fetch may ask for (the server caps it further)."""

# Request numbers are strict: a JSON boolean, a numeric string or 2.0 for an integer is an
# error, never silently converted (an integer is fine where a float is expected).
StrictInt = Annotated[int, Field(strict=True)]
StrictFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]
PositiveSeconds = Annotated[StrictFloat, Field(gt=0, le=1e7)]
PowerW = Annotated[StrictFloat, Field(gt=0, le=1e6)]
FrequencyMhz = Annotated[StrictInt, Field(ge=1, le=100_000)]
RankNumber = Annotated[StrictInt, Field(ge=0, lt=MAX_WORLD_SIZE)]
StageNumber = Annotated[StrictInt, Field(ge=0, lt=1024)]


def _storable(text: str) -> str:
    # Both databases store UTF-8 text; PostgreSQL refuses NUL characters outright.
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text") from None
    return text


Name = Annotated[str, Field(max_length=200), AfterValidator(_storable)]
GpuName = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_storable)]


class _Model(BaseModel):
    """Base: unknown fields are errors, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# ----------------------------------------------------------------------------- policies


class NoSlowdownPolicy(_Model):
    """Least energy at the all-fastest iteration time."""

    kind: Literal["no-slowdown"]


class MaxSlowdownPolicy(_Model):
    """Least energy with iteration time at most ``factor`` times the fastest."""

    kind: Literal["max-slowdown"]
    factor: Annotated[StrictFloat, Field(ge=1.0, le=100.0)]


class DeadlinePolicy(_Model):
    """Least energy with iteration time at most ``seconds``."""

    kind: Literal["deadline"]
    seconds: PositiveSeconds


class MinEnergyPolicy(_Model):
    """The least-energy point, however slow."""

    kind: Literal["min-energy"]


class ZeusCostPolicy(_Model):
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


class JobCreate(_Model):
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

    @model_validator(mode="after")
    def _check_sizes(self) -> JobCreate:
        if self.virtual_stages > 1 and self.schedule != "interleaved-1f1b":
            raise ValueError("virtual_stages > 1 needs schedule 'interleaved-1f1b'")
        world = self.stages * self.data_parallel * self.tensor_parallel
        if world > MAX_WORLD_SIZE:
            raise ValueError(
                f"stages x data_parallel x tensor_parallel = {world} exceeds {MAX_WORLD_SIZE}"
            )
        instructions = 2 * self.stages * self.microbatches * self.virtual_stages
        if instructions > MAX_INSTRUCTIONS:
            raise ValueError(
                f"2 x stages x microbatches x virtual_stages = {instructions} "
                f"exceeds {MAX_INSTRUCTIONS}"
            )
        return self

    @property
    def world_size(self) -> int:
        """Number of ranks: stages x data parallel x tensor parallel."""
        return self.stages * self.data_parallel * self.tensor_parallel


class JobCreated(_Model):
    """Reply to ``POST /v1/jobs``. The token is shown once; the server keeps only its hash."""

    job_id: str
    token: str


class JobCounts(_Model):
    ranks_expected: int
    ranks_registered: int
    profiles_reported: int
    stages_profiled: int
    iterations_reported: int = Field(description="Iteration reports, every rank's counted.")
    iterations: int | None = Field(
        default=None,
        description="Iterations of the job: the most iteration reports any one rank sent.",
    )


class ChosenPoint(_Model):
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


class StragglerSpec(_Model):
    """``PUT /v1/jobs/{id}/straggler``: exactly one of the two fields."""

    iteration_time_s: PositiveSeconds | None = None
    slowdown: Annotated[StrictFloat, Field(ge=1.0, le=100.0)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StragglerSpec:
        if (self.iteration_time_s is None) == (self.slowdown is None):
            raise ValueError("give exactly one of iteration_time_s and slowdown")
        return self


class StragglerView(_Model):
    iteration_time_s: float | None = None
    slowdown: float | None = None
    automatic: bool = False
    data_parallel_ranks: list[int] = Field(
        default_factory=list,
        description="Replicas detected as stragglers; they keep the policy plan.",
    )


class ReplicaTelemetry(_Model):
    data_parallel_rank: int
    time_s: float
    energy_j: float
    predicted_time_s: float | None


class Telemetry(_Model):
    """Predicted against measured, per pipeline and iteration, over the recent window."""

    predicted_time_s: float | None
    predicted_energy_j: float | None
    measured_time_s: float | None
    measured_energy_j: float | None
    replicas: list[ReplicaTelemetry]


class SampleStats(_Model):
    """Measured iterations of one phase (the baseline, or the current plan), over ranks.

    Each rank's own statistics are over its most recent samples; across ranks, times take
    the median of the ranks' values (a pipeline iteration's time as its ranks see it) and
    energies their sum (the energy of one iteration of the whole job, every replica).
    """

    iterations: int = Field(description="Iterations reported in this phase, every rank.")
    ranks: int = Field(description="Ranks with samples in this phase.")
    samples: int = Field(description="Recent samples the statistics are over, every rank.")
    time_s: float = Field(description="Median over ranks of each rank's median time.")
    time_p10_s: float
    time_p90_s: float
    energy_j: float = Field(description="Sum over ranks of each rank's median energy.")
    energy_p10_j: float
    energy_p90_j: float


class SavingsView(_Model):
    """The saving measured (plan against baseline) beside the saving predicted.

    Slowdowns and savings are fractions (0.01: 1 %). Realized ones compare the ranks that
    have both baseline and plan samples; predicted ones the chosen point with the
    frontier's default plan (every instruction at the highest clock).
    """

    baseline: SampleStats | None = Field(description="Iterations at default clocks.")
    plan: SampleStats | None = Field(description="Iterations under the current plan version.")
    plan_version: int
    realized_slowdown: float | None
    realized_saving: float | None
    predicted_slowdown: float | None
    predicted_saving: float | None
    energy_j: float = Field(description="Energy of every iteration reported, every phase.")
    energy_saved_j: float = Field(
        description="Sum over plan iterations (every version) of the rank's baseline median "
        "energy when the iteration was recorded minus the iteration's energy."
    )
    energy_saved_kwh: float
    warning: str | None = Field(
        description="Set when realized and predicted slowdown or saving differ by more than "
        "3 points."
    )


class JobView(_Model):
    """``GET /v1/jobs/{id}``."""

    job_id: str
    name: str | None
    state: JobState
    reason: str | None = Field(description="Why the job failed; null unless state is 'failed'.")
    spec: JobCreate
    policy: PolicySpec
    straggler: StragglerView | None
    version: int = Field(description="Plan version; 0 until the first plan exists.")
    counts: JobCounts
    frontier_points: int | None
    planning_s: float | None
    chosen: ChosenPoint | None
    telemetry: Telemetry | None
    savings: SavingsView | None = Field(
        default=None, description="Measured against predicted saving; null before any report."
    )
    p_block_w: float | None = Field(
        default=None,
        description="Blocking power of one stage (W) that planning uses: the frontier's, else "
        "the job's p_block_w times the tensor-parallel size, else the ranks' reported mean "
        "times it; null while neither the job nor any profile gives one.",
    )


class JobViews(_Model):
    """``GET /v1/overview``: every job's view (the admin token, if the server has one)."""

    jobs: list[JobView]


class JobSummary(_Model):
    job_id: str
    name: str | None
    state: JobState
    version: int
    created_at_s: float


class JobList(_Model):
    jobs: list[JobSummary]


# ----------------------------------------------------------------------------- ranks


class RankRegistration(_Model):
    """``POST /v1/jobs/{id}/ranks``."""

    rank: RankNumber
    stage: StageNumber
    data_parallel_rank: RankNumber
    tensor_parallel_rank: StageNumber
    gpu_name: GpuName
    supported_clocks_mhz: Annotated[list[FrequencyMhz], Field(min_length=1, max_length=MAX_CLOCKS)]


class RankRegistered(_Model):
    rank: int
    state: JobState
    ranks_registered: int


class ProfileRow(_Model):
    # One measurement on the wire: the solver's perseus.solver.ProfileRow without its stage,
    # which the ProfileReport carries once. (No docstring: it would change the OpenAPI text.)
    # `instruction` stays the Literal of InstructionKind's values while ranks still build rows
    # from plain strings (a typed __init__ would refuse them); to_row() gives the enum.

    instruction: InstructionName
    frequency_mhz: FrequencyMhz
    time_s: PositiveSeconds
    energy_j: Annotated[StrictFloat, Field(gt=0, le=1e9)]

    @classmethod
    def from_row(cls, row: MeasuredRow) -> ProfileRow:
        """The wire form of the solver's row (validated: out-of-range values raise
        pydantic's ValidationError)."""
        return cls.model_validate(
            {
                "instruction": row.instruction.value,
                "frequency_mhz": row.frequency_mhz,
                "time_s": row.time_s,
                "energy_j": row.energy_j,
            }
        )

    def to_row(self, stage: int) -> MeasuredRow:
        """The solver's row of this measurement on ``stage``."""
        kind = InstructionKind(self.instruction)
        return MeasuredRow(stage, kind, self.frequency_mhz, self.time_s, self.energy_j)


class ProfileReport(_Model):
    """``POST /v1/jobs/{id}/profiles``: one rank's measured profile of its stage."""

    rank: RankNumber
    stage: StageNumber
    rows: Annotated[list[ProfileRow], Field(min_length=2, max_length=MAX_PROFILE_ROWS)]
    p_block_w: PowerW | None = Field(default=None, description="Measured idle power of this GPU.")


class ProfileAccepted(_Model):
    rank: int
    state: JobState
    profiles_reported: int
    planning: bool = Field(
        description="True when this report completed the job and started planning."
    )


IterationPhase = Literal["baseline", "profiling", "plan", "default"]
"""What a rank's GPU ran during one reported iteration (see :class:`IterationReport`)."""


class IterationReport(_Model):
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


class IterationAccepted(_Model):
    rank: int
    iteration: int
    version: int


# ----------------------------------------------------------------------------- frontier and plans


class FrontierPoint(_Model):
    # A perseus.solver.Point on the wire, without its clocks.

    time_s: float
    energy_j: float
    gap: float

    @classmethod
    def from_point(cls, point: Point) -> FrontierPoint:
        return cls(time_s=point.time_s, energy_j=point.energy_j, gap=point.gap)


class Baseline(_Model):
    # A perseus.solver.Baseline on the wire, without its clocks.

    time_s: float
    energy_j: float

    @classmethod
    def from_baseline(cls, baseline: SolverBaseline) -> Baseline:
        return cls(time_s=baseline.time_s, energy_j=baseline.energy_j)


class FrontierView(_Model):
    """``GET /v1/jobs/{id}/frontier``: energies are of one pipeline (one replica)."""

    version: int
    points: list[FrontierPoint]
    baselines: dict[str, Baseline]
    policy_index: int
    chosen_index: int
    policy: PolicySpec | None = Field(
        default=None, description="The policy that chose policy_index."
    )
    straggler_time_s: float | None = Field(
        default=None,
        description="The iteration time a straggler imposes (chosen_index is its point), if any.",
    )


class PlanVersion(_Model):
    """Reply to policy and straggler changes."""

    version: int
    state: JobState
    chosen: ChosenPoint | None


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


class PlanInstruction(_Model):
    instruction: InstructionKind
    microbatch: int
    chunk: int | None = None
    frequency_mhz: int
    time_s: float | None = Field(
        default=None,
        description="The instruction's expected duration at its clock, from the profile: the "
        "rank predicts the next boundary from it to issue the next clock change early.",
    )


class PlanResponse(_Model):
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


class RankStatus(_Model):
    """One rank as the planner last heard from it (this server process's memory)."""

    rank: int
    stage: int
    data_parallel_rank: int
    tensor_parallel_rank: int
    host: str | None
    iterations: int = Field(description="Iteration reports this rank sent.")
    phase: IterationPhase | None = Field(description="The phase of its last report.")
    plan_version: int | None = Field(description="The plan version of its last report.")
    following: bool = Field(description="Its last report ran the job's current plan version.")
    last_report_age_s: float | None = Field(
        description="Seconds since its last report reached this server process; null if none."
    )


class IterationPoint(_Model):
    """One iteration of the job: its ranks' reports combined (time: the median over ranks;
    energy: the sum over ranks, every replica)."""

    iteration: int
    received_s: float = Field(description="When its last report arrived (Unix seconds).")
    time_s: float
    energy_j: float
    ranks: int
    phase: IterationPhase | None
    plan_version: int | None


class ActivityView(_Model):
    """``GET /v1/jobs/{id}/activity``: the ranks and the recent iterations, for the web page.

    Kept in the memory of the server process that received the reports (the last few
    hundred iterations); a restart starts it afresh.
    """

    version: int
    ranks: list[RankStatus]
    iterations: list[IterationPoint]


class Health(_Model):
    status: Literal["ok"]


class ErrorBody(_Model):
    detail: str
    error: str
    state: JobState | None = None


class FieldError(_Model):
    """One rejected field of a request: its path (``["body", "rows", 3, "time_s"]``) and why."""

    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorBody(_Model):
    """A 422 answer: every rejected field, in the shape FastAPI uses for validation errors."""

    detail: list[FieldError]
    error: str
