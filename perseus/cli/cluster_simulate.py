"""``perseus cluster simulate``: a cluster's power against its throughput, offline.

A folder of job files (``*.json``), each naming a saved profile and the job's shape::

    {"profile": "gpt3.csv", "schedule": "1f1b", "microbatches": 12, "replicas": 8}

(optional: ``virtual_stages``, ``priority`` (default 1), ``policy`` (default no-slowdown),
``p_block_w`` where the profile carries none; ``profile`` is relative to the folder). Every
job's frontier is planned once; then at each budget three ways of shedding power are compared,
by the throughput they keep (each job's default iteration time over the one it runs,
priority-weighted):

- ``frontiers``: each job's point chosen on its frontier under the budget, the least total
  weighted slowdown (:func:`perseus.solver.cluster.choose_under_budget`);
- ``power limit``: one power limit on every GPU, the highest that fits, each instruction at
  the highest clock whose power fits under it (what operators do today);
- ``per-job``: every job on its own frontier at one common slowdown limit, the least that
  fits (per-job Perseus, no coordination).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perseus.cli.tables import format_table
from perseus.core.errors import PerseusError, PlanError
from perseus.core.pipeline import SPLIT_BACKWARD_SCHEDULES
from perseus.core.profiles import MAX_POWER_W, shown
from perseus.wire.common import MAX_INSTRUCTIONS, MAX_WORLD_SIZE

if TYPE_CHECKING:
    from perseus.solver import Frontier, Profile, Schedule

__all__ = [
    "ClusterJob",
    "Curve",
    "default_budgets",
    "load_jobs",
    "plan_jobs",
    "power_text",
    "simulate",
    "table",
]

_FIELDS = {
    "profile",
    "schedule",
    "microbatches",
    "virtual_stages",
    "replicas",
    "priority",
    "policy",
    "p_block_w",
}
_STEPS = 60  # bisection steps of the power limit and of the common slowdown
# A job file's shape within what the planner takes for a job (perseus.wire.jobs.JobCreate),
# checked before its schedule is built: 10**9 microbatches would fill the memory first.
_MAX_JOB_FILE_BYTES = 1024 * 1024
_MAX_MICROBATCHES = 100_000
_MAX_VIRTUAL_STAGES = 64
_MAX_PRIORITY = 1e6


@dataclass(frozen=True)
class ClusterJob:
    """One job of the folder, planned."""

    name: str
    profile: Profile
    schedule: Schedule
    frontier: Frontier
    replicas: int
    priority: float
    policy_index: int
    p_block_w: float

    @property
    def default_time_s(self) -> float:
        """The iteration time at default clocks: the throughput reference."""
        return self.frontier.reference_time_s

    def power_w(self, index: int) -> float:
        """The whole job's power at frontier point ``index``."""
        f = self.frontier
        return self.replicas * float(f.energies_j[index]) / float(f.times_s[index])

    def at_power_limit(self, cap_w: float) -> tuple[float, float]:
        """(iteration time, whole job's power) where every GPU has the limit ``cap_w``."""
        from perseus.solver import replay
        from perseus.solver.cluster import clocks_under_power_limit

        clocks = clocks_under_power_limit(self.profile, self.schedule, cap_w)
        run = replay(
            self.profile,
            self.schedule,
            self.p_block_w,
            clocks,
            clock_change_margin_s=self.frontier.clock_change_margin_s,
        )
        return run.time_s, self.replicas * run.energy_j / run.time_s


@dataclass(frozen=True)
class Curve:
    """One budget's outcome for the three ways."""

    budget_w: float
    frontiers_kept: float | None
    frontiers_power_w: float
    limit_kept: float | None
    per_job_kept: float | None


def load_jobs(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every ``*.json`` job file of ``folder``, sorted by name, checked field by field.

    Raises:
        PlanError: No job file, or a file that is not a job (which file, which field).
    """
    if not folder.is_dir():
        raise PlanError(f"{folder}: not a folder of job files")
    jobs = []
    for path in sorted(folder.glob("*.json")):
        where = str(path)
        try:
            with path.open("rb") as stream:
                raw = stream.read(_MAX_JOB_FILE_BYTES + 1)
            if len(raw) > _MAX_JOB_FILE_BYTES:
                raise PlanError(f"{where}: larger than {_MAX_JOB_FILE_BYTES // 1024} KiB")
            data = json.loads(raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise PlanError(f"{where}: not a JSON job file ({err})") from None
        except RecursionError:
            raise PlanError(f"{where}: not a JSON job file (nested too deeply)") from None
        except ValueError:  # what int() refuses to read
            raise PlanError(
                f"{where}: not a JSON job file (a number of over 4,300 digits)"
            ) from None
        if not isinstance(data, dict):
            raise PlanError(f"{where}: expected a JSON object")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise PlanError(f"{where}: unknown field {shown(unknown[0])}")
        for name in ("profile", "schedule", "microbatches", "replicas"):
            if name not in data:
                raise PlanError(f"{where}: {name}: missing")
        for name in ("profile", "schedule", "policy"):
            if not isinstance(data.get(name, ""), str):
                raise PlanError(f"{where}: {name}: expected a string, got {shown(data[name])}")
        jobs.append((path.stem, data))
    if not jobs:
        raise PlanError(f"{folder}: no job files (*.json)")
    return jobs


def plan_jobs(folder: Path, files: Sequence[tuple[str, dict[str, Any]]]) -> list[ClusterJob]:
    """Plan every job's frontier.

    Raises:
        PerseusError: A job whose profile, shape or policy is wrong (which job and why).
    """
    from perseus.solver import Policy, choose_point, compute_frontier, load_profile, make_schedule

    planned = []
    for name, data in files:
        try:
            microbatches = _whole(data["microbatches"], "microbatches", 1, _MAX_MICROBATCHES)
            replicas = _whole(data["replicas"], "replicas", 1, MAX_WORLD_SIZE)
            priority = _number(data.get("priority", 1.0), "priority", _MAX_PRIORITY)
            virtual = _whole(
                data.get("virtual_stages", 1), "virtual_stages", 1, _MAX_VIRTUAL_STAGES
            )
            profile = load_profile(folder / data["profile"])
            per_action = 3 if data["schedule"] in SPLIT_BACKWARD_SCHEDULES else 2
            instructions = per_action * profile.num_stages * microbatches * virtual
            if instructions > MAX_INSTRUCTIONS:
                raise PlanError(
                    f"microbatches: {per_action} x stages x microbatches x virtual_stages = "
                    f"{instructions} exceeds {MAX_INSTRUCTIONS}"
                )
            schedule = make_schedule(data["schedule"], profile.num_stages, microbatches, virtual)
            p_block = data.get("p_block_w", profile.p_block_w)
            if p_block is None:
                raise PlanError("p_block_w: the profile carries none; give it in the job file")
            p_block_w = _number(p_block, "p_block_w", MAX_POWER_W)
            frontier = compute_frontier(profile, schedule, p_block_w=p_block_w)
            policy = Policy.parse(str(data.get("policy", "no-slowdown")))
            planned.append(
                ClusterJob(
                    name,
                    profile,
                    schedule,
                    frontier,
                    replicas,
                    priority,
                    choose_point(frontier, policy),
                    p_block_w,
                )
            )
        except PerseusError as err:
            raise type(err)(f"job {name}: {err}") from None
    return planned


def simulate(jobs: Sequence[ClusterJob], budgets_w: Sequence[float]) -> list[Curve]:
    """The three ways at each budget."""
    from perseus.solver.cluster import JobPoints, choose_under_budget

    points = [
        JobPoints(
            job.name,
            tuple(float(t) for t in job.frontier.times_s),
            tuple(job.power_w(k) for k in range(len(job.frontier))),
            job.policy_index,
            job.priority,
        )
        for job in jobs
    ]
    limits = _PowerLimits(jobs)
    curves = []
    for budget in budgets_w:
        choice = choose_under_budget(points, budget)
        chosen = zip(jobs, choice.indices, strict=True)
        kept = _kept(jobs, [float(job.frontier.times_s[k]) for job, k in chosen])
        curves.append(
            Curve(
                budget,
                kept if choice.meetable else None,
                choice.power_w,
                _power_limit_kept(limits, budget),
                _per_job_kept(jobs, budget),
            )
        )
    return curves


def default_budgets(jobs: Sequence[ClusterJob], count: int = 8) -> list[float]:
    """From the least power every job can draw to what they draw at their policies."""
    least = sum(min(job.power_w(k) for k in range(len(job.frontier))) for job in jobs)
    most = sum(job.power_w(job.policy_index) for job in jobs)
    return [least + (most - least) * i / (count - 1) for i in range(count)]


def table(jobs: Sequence[ClusterJob], curves: Sequence[Curve]) -> str:
    """The curves as the command prints them."""
    rows = [["budget", "frontiers", "power limit", "per-job", "frontiers' power"]]
    for c in curves:
        rows.append(
            [
                power_text(c.budget_w),
                _percent(c.frontiers_kept),
                _percent(c.limit_kept),
                _percent(c.per_job_kept),
                power_text(c.frontiers_power_w),
            ]
        )
    gpus = sum(job.replicas * job.schedule.stages for job in jobs)
    head = (
        f"{len(jobs)} jobs, {gpus} GPUs; throughput kept (priority-weighted, against default "
        "clocks) at each budget; '-' where a way cannot meet it\n"
    )
    return head + format_table(rows, right=range(5))


def power_text(watts: float) -> str:
    """``2.40 MW``, ``812.5 kW``, ``950 W``."""
    if watts >= 1e6:
        return f"{watts / 1e6:.2f} MW"
    if watts >= 1e3:
        return f"{watts / 1e3:.1f} kW"
    return f"{watts:.0f} W"


def _kept(jobs: Sequence[ClusterJob], times_s: Sequence[float]) -> float:
    weights = math.fsum(job.priority for job in jobs)
    return (
        math.fsum(
            job.priority * job.default_time_s / t for job, t in zip(jobs, times_s, strict=True)
        )
        / weights
    )


class _PowerLimits:
    """Each job's (iteration time, power) under a common power limit, replayed once per
    distinct set of clocks (many limits leave a job's clocks alike)."""

    def __init__(self, jobs: Sequence[ClusterJob]) -> None:
        from perseus.solver.cluster import clocks_under_power_limit

        self.jobs = jobs
        self._clocks = clocks_under_power_limit
        self._runs: dict[tuple[int, tuple[tuple[int, ...], ...]], tuple[float, float]] = {}
        # the limits at which some instruction's clock changes, ascending
        self.caps = sorted(
            {
                o.energy_j / o.time_s
                for job in jobs
                for stage in job.profile.stages
                for options in stage.values()
                for o in options
            }
        )

    def outcome(self, cap_w: float) -> tuple[list[float], float]:
        """Every job's iteration time, and the cluster's power, under ``cap_w``."""
        times, powers = [], []
        for j, job in enumerate(self.jobs):
            key = (j, self._clocks(job.profile, job.schedule, cap_w))
            if key not in self._runs:
                self._runs[key] = job.at_power_limit(cap_w)
            time_s, power_w = self._runs[key]
            times.append(time_s)
            powers.append(power_w)
        return times, math.fsum(powers)


def _power_limit_kept(limits: _PowerLimits, budget_w: float) -> float | None:
    """The highest power limit (of those where a clock changes) whose cluster power fits:
    power rises with the limit, so bisected."""
    caps = limits.caps
    if limits.outcome(caps[0])[1] > budget_w:
        return None
    low, high = 0, len(caps) - 1  # caps[low] fits; find the last that does
    if limits.outcome(caps[high])[1] <= budget_w:
        low = high
    while high - low > 1:
        mid = (low + high) // 2
        if limits.outcome(caps[mid])[1] <= budget_w:
            low = mid
        else:
            high = mid
    return _kept(limits.jobs, limits.outcome(caps[low])[0])


def _per_job_kept(jobs: Sequence[ClusterJob], budget_w: float) -> float | None:
    """The least common slowdown limit whose points (least energy within it) fit."""
    import numpy as np

    def indices(factor: float) -> list[int]:
        chosen = []
        for job in jobs:
            f = job.frontier
            limit = float(f.times_s[job.policy_index]) * factor
            within = np.flatnonzero(f.times_s <= limit * (1 + 1e-12))
            chosen.append(int(within[-1]))  # energy falls along the frontier
        return chosen

    def power(factor: float) -> float:
        return math.fsum(job.power_w(k) for job, k in zip(jobs, indices(factor), strict=True))

    high = max(float(j.frontier.times_s[-1] / j.frontier.times_s[j.policy_index]) for j in jobs)
    if power(high) > budget_w:
        return None
    low = 1.0
    if power(low) <= budget_w:
        high = low
    for _ in range(_STEPS):
        mid = (low + high) / 2
        if power(mid) <= budget_w:
            high = mid
        else:
            low = mid
    chosen = indices(high)
    return _kept(jobs, [float(j.frontier.times_s[k]) for j, k in zip(jobs, chosen, strict=True)])


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _whole(value: object, field: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise PlanError(f"{field}: expected an integer in {minimum}..{maximum}, got {shown(value)}")
    return value


def _number(value: object, field: str, maximum: float) -> float:
    # an int is compared as it is: float() of one past 1e308 raises
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= maximum
        or not math.isfinite(value)
    ):
        raise PlanError(
            f"{field}: expected a finite number in (0, {maximum:g}], got {shown(value)}"
        )
    return float(value)
