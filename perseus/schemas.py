"""Wire models shared by the planner server and its client, and the URL paths.

Everything that crosses the network is one of these pydantic v2 models. Units are in the
field names (``time_s``, ``energy_j``, ``frequency_mhz``, ``power_w``). Bounds here are the
first line of input validation; checks that need the job (a stage within the job's stages,
a rank within its world size) are done by the server's job logic.

The models live in :mod:`perseus.wire`, one module per concern (:mod:`~perseus.wire.common`:
paths, limits, field types, the base model and error bodies; :mod:`~perseus.wire.jobs`:
policies, job creation, stragglers; :mod:`~perseus.wire.ranks`: registration, profiles,
iterations, plans; :mod:`~perseus.wire.views`: the job view, savings, frontier, activity).
This module re-exports them all, so ``from perseus.schemas import X`` keeps working.
"""

from __future__ import annotations

from perseus.wire.cluster import (
    CLUSTER_BUDGET_PATH,
    PRIORITY_PATH,
    BudgetSet,
    BudgetWindow,
    ClusterBudgetView,
    JobBudget,
    JobPower,
    PrioritySet,
)
from perseus.wire.common import (
    ACTIVITY_PATH,
    API_PREFIX,
    CLOCK_LATENCY_PATH,
    FRONTIER_FILE_PATH,
    FRONTIER_PATH,
    GAVE_UP_PATH,
    HEALTHZ_PATH,
    ITERATIONS_PATH,
    JOB_PATH,
    JOB_STATES,
    JOBS_PATH,
    MAX_CLOCKS,
    MAX_INSTRUCTIONS,
    MAX_PROFILE_ROWS,
    MAX_WORLD_SIZE,
    METRICS_PATH,
    OVERVIEW_PATH,
    PLAN_COMPUTE_PATH,
    PLAN_PATH,
    POLICY_PATH,
    PROFILE_CSV_PATH,
    PROFILE_JSON_PATH,
    PROFILES_PATH,
    RANKS_PATH,
    STRAGGLER_PATH,
    TIMELINE_PATH,
    ErrorBody,
    FieldError,
    Health,
    JobState,
    ValidationErrorBody,
)
from perseus.wire.common import (
    MAX_WAIT_QUERY_S as MAX_WAIT_QUERY_S,
)

# Not in __all__, but importable from here as before.
from perseus.wire.common import (
    FrequencyMhz as FrequencyMhz,
)
from perseus.wire.common import (
    GpuName as GpuName,
)
from perseus.wire.common import (
    InstructionName as InstructionName,
)
from perseus.wire.common import (
    Name as Name,
)
from perseus.wire.common import (
    PositiveSeconds as PositiveSeconds,
)
from perseus.wire.common import (
    PowerW as PowerW,
)
from perseus.wire.common import (
    RankNumber as RankNumber,
)
from perseus.wire.common import (
    ScheduleName as ScheduleName,
)
from perseus.wire.common import (
    StageNumber as StageNumber,
)
from perseus.wire.common import (
    StrictFloat as StrictFloat,
)
from perseus.wire.common import (
    StrictInt as StrictInt,
)
from perseus.wire.jobs import (
    ChosenPoint,
    DeadlinePolicy,
    JobCounts,
    JobCreate,
    JobCreated,
    JobList,
    JobSummary,
    MaxSlowdownPolicy,
    MinEnergyPolicy,
    NoSlowdownPolicy,
    PlanVersion,
    PolicyModel,
    PolicySpec,
    StragglerSpec,
    StragglerView,
    ZeusCostPolicy,
)
from perseus.wire.ranks import (
    CLOCK_LATENCY_HEADER,
    ClockLatencyAccepted,
    ClockLatencyReport,
    GaveUpAccepted,
    GaveUpReport,
    IterationAccepted,
    IterationPhase,
    IterationReport,
    PlanInstruction,
    PlanQuery,
    PlanResponse,
    ProfileAccepted,
    ProfileReport,
    ProfileRow,
    ProfilingProgress,
    RankRegistered,
    RankRegistration,
)
from perseus.wire.views import (
    ActivityView,
    Baseline,
    FrontierPoint,
    FrontierView,
    IterationPoint,
    JobView,
    JobViews,
    RankGaveUp,
    RankProfiling,
    RankStatus,
    ReplicaTelemetry,
    SampleStats,
    SavingsView,
    Telemetry,
    TimelineInstruction,
    TimelineView,
)

__all__ = [
    "ACTIVITY_PATH",
    "API_PREFIX",
    "CLOCK_LATENCY_HEADER",
    "CLOCK_LATENCY_PATH",
    "CLUSTER_BUDGET_PATH",
    "FRONTIER_FILE_PATH",
    "FRONTIER_PATH",
    "GAVE_UP_PATH",
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
    "PRIORITY_PATH",
    "PROFILES_PATH",
    "PROFILE_CSV_PATH",
    "PROFILE_JSON_PATH",
    "RANKS_PATH",
    "STRAGGLER_PATH",
    "TIMELINE_PATH",
    "ActivityView",
    "Baseline",
    "BudgetSet",
    "BudgetWindow",
    "ChosenPoint",
    "ClockLatencyAccepted",
    "ClockLatencyReport",
    "ClusterBudgetView",
    "DeadlinePolicy",
    "ErrorBody",
    "FieldError",
    "FrontierPoint",
    "FrontierView",
    "GaveUpAccepted",
    "GaveUpReport",
    "Health",
    "IterationAccepted",
    "IterationPhase",
    "IterationPoint",
    "IterationReport",
    "JobBudget",
    "JobCounts",
    "JobCreate",
    "JobCreated",
    "JobList",
    "JobPower",
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
    "PrioritySet",
    "ProfileAccepted",
    "ProfileReport",
    "ProfileRow",
    "ProfilingProgress",
    "RankGaveUp",
    "RankProfiling",
    "RankRegistered",
    "RankRegistration",
    "RankStatus",
    "ReplicaTelemetry",
    "SampleStats",
    "SavingsView",
    "StragglerSpec",
    "StragglerView",
    "Telemetry",
    "TimelineInstruction",
    "TimelineView",
    "ValidationErrorBody",
    "ZeusCostPolicy",
]
