"""The wire's common ground: URL paths, size limits, strict field types, the base model and
the error bodies.

Everything that crosses the network is a pydantic v2 model built on :class:`WireModel`.
Units are in the field names (``time_s``, ``energy_j``, ``frequency_mhz``, ``power_w``).
Bounds here are the first line of input validation; checks that need the job (a stage
within the job's stages, a rank within its world size) are done by the server's job logic.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from perseus.core import jobs
from perseus.core.profiles import MAX_FREQUENCY_MHZ, MAX_STAGES

API_PREFIX = "/v1"
JOBS_PATH = f"{API_PREFIX}/jobs"
JOB_PATH = f"{JOBS_PATH}/{{job_id}}"
RANKS_PATH = f"{JOB_PATH}/ranks"
GAVE_UP_PATH = f"{JOB_PATH}/ranks:gave-up"
CLOCK_LATENCY_PATH = f"{JOB_PATH}/ranks:clock-latency"
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
TIMELINE_PATH = f"{JOB_PATH}/timeline"
OVERVIEW_PATH = f"{API_PREFIX}/overview"
HEALTHZ_PATH = "/healthz"
METRICS_PATH = "/metrics"

MAX_WORLD_SIZE = 131_072
"""Most ranks (stages x data parallel x tensor parallel) one job may have."""
MAX_INSTRUCTIONS = 262_144
"""Most instructions (stages x microbatches x virtual stages x 2) in one iteration."""
MAX_PROFILE_ROWS = 10_000
MAX_CLOCKS = 1_000

# The wire names of the solver's schedules (tests/wire/test_common.py keeps them equal).
ScheduleName = Literal[
    "1f1b", "gpipe", "interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev", "looped-bfs"
]
InstructionName = Literal["forward", "backward", "backward_input", "backward_weight"]
"""The values of :class:`perseus.core.pipeline.InstructionKind` as a type (kept for old imports; the
models use the enum, so the OpenAPI document names it)."""
JobState = Literal[
    jobs.JobState.REGISTERING,
    jobs.JobState.PROFILING,
    jobs.JobState.PLANNING,
    jobs.JobState.READY,
    jobs.JobState.FAILED,
]
"""A job's state: :class:`perseus.core.jobs.JobState`'s members, read from and written as
their values (tests/wire/test_common.py keeps the two equal)."""
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
FrequencyMhz = Annotated[StrictInt, Field(ge=1, le=MAX_FREQUENCY_MHZ)]
RankNumber = Annotated[StrictInt, Field(ge=0, lt=MAX_WORLD_SIZE)]
StageNumber = Annotated[StrictInt, Field(ge=0, lt=MAX_STAGES)]


def _storable(text: str) -> str:
    # Both databases store UTF-8 text; PostgreSQL refuses NUL characters outright.
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text") from None
    return text


_SURROGATE = re.compile("[\ud800-\udfff]")


def _cleaned(value: object) -> object:
    # Free text a rank did not choose (an exception's message): kept, less what no database
    # stores. NULs are dropped; a lone surrogate (a file name decoded with surrogateescape)
    # becomes U+FFFD, one character for one, so text cut to the limit stays within it.
    if not isinstance(value, str):
        return value  # the str validator says what is wrong
    return _SURROGATE.sub("\ufffd", value.replace("\x00", ""))


Name = Annotated[str, Field(max_length=200), AfterValidator(_storable)]
GpuName = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_storable)]


FreeText = Annotated[str, BeforeValidator(_cleaned), AfterValidator(_storable)]
"""Free text a client did not choose (why a rank gave up): stored as sent but for NUL
characters, dropped (PostgreSQL cannot store them), and lone surrogates, each replaced by
U+FFFD. Identifiers a user chose (:data:`Name`, :data:`GpuName`) refuse both (422)."""


class WireModel(BaseModel):
    """Base: unknown fields are errors, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def core_fields(model: type[BaseModel], value: object) -> dict[str, Any]:
    """The values of ``model``'s fields, read by name from ``value`` (a :mod:`perseus.core`
    dataclass the model renders; an enum as its value).

    A wire model that renders a core type lists its fields once, in the model: each is one of
    the core type's, but for what the wire adds for its readers (a baseline's label), which
    the caller gives (``tests/wire/test_core_renderings.py`` checks it).
    """
    values = {name: getattr(value, name) for name in model.model_fields if hasattr(value, name)}
    return {name: v.value if isinstance(v, Enum) else v for name, v in values.items()}


# ----------------------------------------------------------------------------- errors and health


class Health(WireModel):
    status: Literal["ok", "storage-fault"]
    storage: str | None = Field(
        default=None,
        description="Why the job database cannot be written now (503 meanwhile); null "
        "while it can.",
    )


class ErrorBody(WireModel):
    detail: str
    error: str
    state: JobState | None = None


class FieldError(WireModel):
    """One rejected field of a request: its path (``["body", "rows", 3, "time_s"]``) and why."""

    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorBody(WireModel):
    """A 422 answer: every rejected field, in the shape FastAPI uses for validation errors."""

    detail: list[FieldError]
    error: str
