"""Wire models of the cluster's power budget: setting it, a job's priority, and what the
budget does to each job and to the cluster."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from perseus.wire.common import API_PREFIX, JOB_PATH, JobState, StrictFloat, WireModel

__all__ = [
    "CLUSTER_BUDGET_PATH",
    "PRIORITY_PATH",
    "BudgetSet",
    "BudgetWindow",
    "ClusterBudgetView",
    "JobBudget",
    "JobPower",
    "Priority",
    "PrioritySet",
]

CLUSTER_BUDGET_PATH = f"{API_PREFIX}/cluster/budget"
PRIORITY_PATH = f"{JOB_PATH}/priority"

Priority = Annotated[StrictFloat, Field(gt=0, le=1000)]
"""The weight of a job's slowdown under a cluster power budget."""
ClusterPowerW = Annotated[StrictFloat, Field(gt=0, le=1e10)]
UnixSeconds = Annotated[StrictFloat, Field(ge=0, le=1e11)]


class BudgetSet(WireModel):
    """``PUT /v1/cluster/budget``: without ``from_s`` and ``to_s``, the standing budget;
    with either, the scheduled window (a demand-response event), which overrides the
    standing budget while it lasts. Setting one replaces the earlier one of its kind."""

    power_w: ClusterPowerW = Field(description="The most the cluster's jobs may draw, watts.")
    from_s: UnixSeconds | None = Field(
        default=None, description="When the window starts (Unix time); null: at once."
    )
    to_s: UnixSeconds | None = Field(
        default=None, description="When the window ends (Unix time); null: never."
    )

    @model_validator(mode="after")
    def _ordered(self) -> BudgetSet:
        if self.from_s is not None and self.to_s is not None and self.to_s <= self.from_s:
            raise ValueError("to_s must be after from_s")
        return self

    @property
    def is_window(self) -> bool:
        return self.from_s is not None or self.to_s is not None


class PrioritySet(WireModel):
    """``PUT /v1/jobs/{id}/priority``."""

    priority: Priority


class BudgetWindow(WireModel):
    power_w: float
    from_s: float | None
    to_s: float | None
    active: bool = Field(description="Whether the window holds now.")
    ended: bool = Field(description="Whether its end has passed.")


class JobBudget(WireModel):
    """What a cluster power budget does to one job (in its view)."""

    index: int = Field(description="The frontier point the budget holds the job at.")
    policy_index: int = Field(description="The point the job's own policy chooses.")
    slowdown: float = Field(description="Iteration time against the policy point's, less 1.")
    power_w: float = Field(description="The job's predicted power at the budget's point.")
    policy_power_w: float = Field(description="Its predicted power at its policy's point.")
    reason: str = Field(description="Why the job runs slower than its policy, and how much.")


class JobPower(WireModel):
    """One job's share of the cluster's power."""

    job_id: str
    name: str | None
    state: JobState
    priority: float
    counted: Literal["plan", "measured", "default"] = Field(
        description="How its power is predicted: at its plan's point; from its ranks' "
        "reported iterations (no plan yet); or its GPUs at the default power per GPU."
    )
    predicted_w: float
    measured_w: float | None = Field(description="From its ranks' recent iterations.")
    share: float = Field(description="Its fraction of the cluster's predicted power.")
    slowdown: float = Field(description="Slower than its policy under the budget (0.018: 1.8 %).")
    policy_w: float = Field(description="What it would draw at its own policy.")
    least_w: float = Field(description="The least it can draw (never faster than its policy).")
    energy_saved_j: float = Field(description="Measured energy saved against default clocks.")


class ClusterBudgetView(WireModel):
    """``GET /v1/cluster/budget``: the budget, the cluster's power, each job's share."""

    budget_w: float | None = Field(description="The budget in force now; null: none.")
    standing_w: float | None
    window: BudgetWindow | None
    predicted_w: float = Field(description="Every job at its current point, summed.")
    measured_w: float | None = Field(
        description="From the ranks' recent iterations (energy over time, every live rank)."
    )
    policy_w: float = Field(description="What the jobs would draw at their own policies.")
    least_w: float = Field(description="The least the jobs can draw.")
    met: bool | None = Field(description="Predicted power within the budget; null: no budget.")
    meetable: bool | None = Field(
        description="Whether the jobs can meet the budget at all; null: no budget."
    )
    shortfall_w: float = Field(description="How far the predicted power exceeds the budget.")
    weighted_slowdown: float = Field(description="Sum of priority times slowdown, every job.")
    message: str | None = Field(description="Why the budget is not met, when it is not.")
    default_gpu_w: float = Field(
        description="The power a GPU of a job without plan or telemetry is counted at."
    )
    applied_w: float | None = Field(description="The budget the jobs' points were chosen for.")
    balanced_at_s: float | None
    changed_at_s: float | None
    jobs: list[JobPower]
