"""Wire models the planner shows of a job: its view (telemetry, measured and predicted
savings), the frontier, and the ranks' recent activity."""

from __future__ import annotations

from pydantic import Field

from perseus.core.baselines import Baseline as CoreBaseline
from perseus.core.points import Point
from perseus.wire.cluster import JobBudget
from perseus.wire.common import JobState, WireModel, core_fields
from perseus.wire.jobs import ChosenPoint, JobCounts, JobCreate, PolicySpec, StragglerView
from perseus.wire.ranks import IterationPhase, PlanInstruction, ProfilingProgress


class ReplicaTelemetry(WireModel):
    data_parallel_rank: int
    time_s: float
    energy_j: float
    predicted_time_s: float | None


class Telemetry(WireModel):
    """Predicted against measured, per pipeline and iteration, over the recent window."""

    predicted_time_s: float | None
    predicted_energy_j: float | None
    measured_time_s: float | None
    measured_energy_j: float | None
    replicas: list[ReplicaTelemetry]


class SampleStats(WireModel):
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


class SavingsView(WireModel):
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


class RankGaveUp(WireModel):
    """A rank that stopped planning (training goes on there at default clocks)."""

    rank: int
    reason: str
    at_s: float = Field(description="When the server heard it (Unix time, seconds).")


class JobView(WireModel):
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
    planned_from_s: float | None = Field(
        default=None,
        description="When the planning behind the current frontier began (Unix time); null "
        "before the first planning.",
    )
    profiles_since_plan: int | None = Field(
        default=None,
        description="Profiles reported after planned_from_s: a re-run of the training "
        "re-profiles, and the job replans on the new profiles once every rank's is in "
        "(or at once with 'perseus job replan'); null before the first planning.",
    )
    gave_up: list[RankGaveUp] = Field(
        default_factory=list,
        description="Ranks that stopped planning and run at default clocks, with why and "
        "when (the latest report of each rank); empty while every rank follows the job.",
    )
    profiling: list[RankProfiling] = Field(
        default_factory=list,
        description="Ranks sweeping their clocks, with how far each got and the time left "
        "(as the server process answering last heard it); empty once none does, and then "
        "left out of the answer.",
        # Left out while empty: ranks from before answers were read tolerantly refuse a job
        # view with a field they do not know, and read this one before they profile.
        exclude_if=lambda ranks: not ranks,
    )
    priority: float = Field(
        default=1.0,
        description="Weight of the job's slowdown under a cluster power budget; left out of "
        "the answer at 1.",
        exclude_if=lambda priority: priority == 1.0,
    )
    budget: JobBudget | None = Field(
        default=None,
        description="What the cluster's power budget does to the job; null while none "
        "moves it from its policy's point, and then left out of the answer.",
        # Left out while unset, as profiling is: ranks from before answers were read
        # tolerantly refuse a job view with a field they do not know.
        exclude_if=lambda budget: budget is None,
    )


class JobViews(WireModel):
    """``GET /v1/overview``: a page of the jobs' views (the admin token, if the server has
    one)."""

    jobs: list[JobView]
    total: int | None = Field(
        default=None,
        description="How many jobs the server holds, on every page: the page's jobs are "
        "`limit` of them from `offset`.",
    )


# ----------------------------------------------------------------------------- frontier


class FrontierPoint(WireModel):
    # A perseus.core.points.Point on the wire, without its clocks.

    time_s: float
    energy_j: float
    gap: float

    @classmethod
    def from_point(cls, point: Point) -> FrontierPoint:
        return cls.model_validate(core_fields(cls, point))


class Baseline(WireModel):
    # A perseus.core.baselines.Baseline on the wire, without its clocks.

    time_s: float
    energy_j: float
    label: str | None = Field(
        default=None,
        description="How the command line names it ('default (max clock)', 'global clock'); "
        "null from older servers.",
    )

    @classmethod
    def from_baseline(cls, baseline: CoreBaseline, label: str | None = None) -> Baseline:
        return cls.model_validate({**core_fields(cls, baseline), "label": label})


class FrontierView(WireModel):
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
    budget_index: int | None = Field(
        default=None,
        description="The point a cluster power budget holds the job at (never faster than "
        "policy_index); null while none does.",
    )
    clock_change_delay_s: float = Field(
        default=0.0,
        description="The clock-change delay the plans assume: no run of one clock on a GPU "
        "is shorter than its changes need to land in turn (0: none assumed).",
    )
    clock_change_delay_rank: int | None = Field(
        default=None,
        description="Where the delay comes from: the rank whose measured clock-change "
        "latency it is (the largest its ranks reported); null: the server's setting "
        "(PERSEUS_CLOCK_CHANGE_DELAY_S), while no rank has reported one.",
    )


# ----------------------------------------------------------------------------- activity


class RankProfiling(WireModel):
    """One rank's online profiling as its last report told it."""

    rank: int
    clocks_done: int = Field(description="Clocks measured so far.")
    clocks_planned: int = Field(
        description="Clocks the sweep means to measure; it may stop earlier (energy rising "
        "at several clocks in a row, or its time budget spent)."
    )
    seconds_per_clock: float | None = Field(
        description="Seconds per clock so far, the training between clocks included; null "
        "before the first clock is measured."
    )
    time_left_s: float | None = Field(
        description="Seconds per clock so far times the clocks left (at most what is left "
        "of the sweep's time budget), as of the report; null before the first clock."
    )
    report_age_s: float = Field(description="Seconds since that report reached this process.")

    @classmethod
    def from_progress(cls, rank: int, progress: ProfilingProgress, age_s: float) -> RankProfiling:
        """The view of a rank's reported progress, ``age_s`` seconds after it arrived."""
        done, planned = progress.clocks_done, progress.clocks_planned
        per_clock = progress.elapsed_s / done if done else None
        left = None if per_clock is None else per_clock * (planned - done)
        if left is not None and progress.budget_s is not None:
            left = min(left, max(0.0, progress.budget_s - progress.elapsed_s))
        return cls(
            rank=rank,
            clocks_done=done,
            clocks_planned=planned,
            seconds_per_clock=per_clock,
            time_left_s=left,
            report_age_s=age_s,
        )


class RankStatus(WireModel):
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
    profiling: RankProfiling | None = Field(
        default=None,
        description="How far its clock sweep got, while its last report was a profiling one "
        "that said (null otherwise, and for older ranks).",
    )


class IterationPoint(WireModel):
    """One iteration of the job: its ranks' reports combined (time: the median over ranks;
    energy: the sum over ranks, every replica)."""

    iteration: int
    received_s: float = Field(description="When its last report arrived (Unix seconds).")
    time_s: float
    energy_j: float
    ranks: int
    phase: IterationPhase | None
    plan_version: int | None


class TimelineInstruction(PlanInstruction):
    """One instruction of the running plan with when it runs in the replayed iteration."""

    start_s: float
    finish_s: float
    critical: bool = Field(description="On a longest path through the iteration.")


class TimelineView(WireModel):
    """``GET /v1/jobs/{id}/timeline``: the plan the ranks run (the chosen point: the
    straggler's while one is set, else the policy's), replayed on the profile it was planned
    on: per GPU (stage), its instructions in execution order with their clocks and times."""

    version: int
    point: int = Field(description="The frontier point (FrontierView.chosen_index).")
    time_s: float
    energy_j: float
    clock_change_margin_s: float
    clock_change_delay_s: float = Field(
        default=0.0,
        description="The clock-change delay the plan assumes (FrontierView's).",
    )
    clock_change_delay_rank: int | None = Field(
        default=None,
        description="The rank whose measured latency the delay is; null: the server's "
        "setting (FrontierView's).",
    )
    min_frequency_mhz: int = Field(description="The profile's lowest clock (colour scale).")
    max_frequency_mhz: int = Field(description="The profile's highest clock.")
    gpus: list[list[TimelineInstruction]]
    p_block_w: float | None = Field(
        default=None,
        description="The blocking power of one stage the plan was made with (W): energy_j "
        "counts it on every GPU for the whole iteration, outside its instructions.",
    )


class ActivityView(WireModel):
    """``GET /v1/jobs/{id}/activity``: the ranks and the recent iterations, for the web page.

    Kept in the memory of the server process that received the reports (the last few
    hundred iterations); a restart starts it afresh.
    """

    version: int
    ranks: list[RankStatus]
    iterations: list[IterationPoint]
