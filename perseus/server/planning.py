"""What a planning worker process runs: plain data in, frontier JSON out.

The server hands :func:`compute_frontier_json` a :class:`PlanningInput` (every rank's
profile rows and the schedule) through a process pool, so the frontier never runs on the
event loop and a crash in the solver cannot take the server down.

How a stage's profile combines its ranks (for each instruction and clock):

- only clocks that every reporting rank of the stage measured are kept;
- time is the slowest rank's: a stage finishes when its last GPU does;
- energy sums the tensor-parallel group (every GPU of the stage draws power) and averages
  the data-parallel replicas that reported (they run the same work; averaging smooths noise);
- blocking power is per GPU (the job's ``p_block_w``, else the mean the ranks reported)
  times the tensor-parallel size, since a stage is a whole tensor-parallel group.

Frontier energies are therefore those of one pipeline (one data-parallel replica).
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import os
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perseus.errors import ProfileError

if TYPE_CHECKING:
    from perseus.solver import Frontier, Profile

__all__ = [
    "PlanningInput",
    "PlanningResult",
    "RankProfile",
    "StoredProfile",
    "combine_profiles",
    "init_worker",
    "merged_profile",
    "plan_frontier",
    "stage_p_block_w",
    "unprofiled_stages",
    "warm_up",
]

ProfileRowTuple = tuple[str, int, float, float]
_NO_P_BLOCK = "no blocking power: set p_block_w on the job or report it with the profiles"


@dataclass(frozen=True, slots=True)
class RankProfile:
    """One rank's profile of its stage: rows ``(instruction, frequency_mhz, time_s, energy_j)``."""

    stage: int
    data_parallel_rank: int
    tensor_parallel_rank: int
    rows: tuple[ProfileRowTuple, ...]
    p_block_w: float | None = None


@dataclass(frozen=True, slots=True)
class StoredProfile:
    """A rank's profile as the store holds it: rows as JSON text.

    The worker process decodes the rows, so that the server process, which has requests to
    answer meanwhile, does not spend its time on 1,024 ranks x 100 rows.
    """

    stage: int
    data_parallel_rank: int
    tensor_parallel_rank: int
    rows_json: str
    p_block_w: float | None = None

    def decode(self) -> RankProfile:
        rows = tuple(
            (str(r[0]), int(r[1]), float(r[2]), float(r[3])) for r in json.loads(self.rows_json)
        )
        return RankProfile(
            self.stage, self.data_parallel_rank, self.tensor_parallel_rank, rows, self.p_block_w
        )


@dataclass(frozen=True, slots=True)
class PlanningInput:
    """Everything one frontier computation needs, picklable for a worker process."""

    job_id: str
    schedule: str
    stages: int
    microbatches: int
    virtual_stages: int
    tensor_parallel: int
    p_block_w: float | None
    resolution_s: float | None
    profiles: tuple[StoredProfile, ...]
    polish_s: float = 0.0


@dataclass(frozen=True)
class PlanningResult:
    """The frontier, as JSON text (stored) and as an object (cached; numpy pickles fast)."""

    frontier_json: str
    frontier: Frontier


def combine_profiles(
    profiles: Sequence[RankProfile], stages: int, tensor_parallel: int
) -> list[tuple[int, str, int, float, float]]:
    """Combine rank profiles into one profile row per (stage, instruction, clock).

    Args:
        profiles: every reported rank profile.
        stages: number of pipeline stages.
        tensor_parallel: tensor-parallel group size.

    Returns:
        Rows ``(stage, instruction, frequency_mhz, time_s, energy_j)`` sorted by stage,
        instruction and clock (descending).

    Raises:
        ProfileError: a stage or tensor-parallel rank has no profile, or the ranks of a
            stage share no clock.

    Complexity: O(total rows).
    """
    # stage -> tp rank -> list of {(instruction, frequency): (time, energy)} over replicas
    by_stage: dict[int, dict[int, list[dict[tuple[str, int], tuple[float, float]]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for profile in profiles:
        table = {(name, freq): (time_s, energy_j) for name, freq, time_s, energy_j in profile.rows}
        by_stage[profile.stage][profile.tensor_parallel_rank].append(table)

    combined: list[tuple[int, str, int, float, float]] = []
    for stage in range(stages):
        groups = by_stage.get(stage)
        if not groups:
            raise ProfileError(f"stage {stage}: no rank reported a profile")
        missing = [tp for tp in range(tensor_parallel) if tp not in groups]
        if missing:
            raise ProfileError(f"stage {stage}: no profile from tensor-parallel ranks {missing}")
        tables = [table for replicas in groups.values() for table in replicas]
        common = set(tables[0]).intersection(*tables[1:])
        names = {name for name, _ in common}
        for table in tables:
            lacking = {name for name, _ in table} - names
            if lacking:
                raise ProfileError(
                    f"stage {stage}: its ranks share no clock for {', '.join(sorted(lacking))}"
                )
        for key in sorted(common, key=lambda k: (k[0], -k[1])):
            time_s = max(table[key][0] for table in tables)
            energy_j = sum(
                sum(table[key][1] for table in replicas) / len(replicas)
                for replicas in groups.values()
            )
            combined.append((stage, key[0], key[1], time_s, energy_j))
    return combined


def stage_p_block_w(
    p_block_w: float | None, profiles: Sequence[RankProfile], tensor_parallel: int
) -> float:
    """Blocking power of one stage (a tensor-parallel group), in watts.

    Args:
        p_block_w: the job's blocking power per GPU, if set.
        profiles: the rank profiles, some with a measured blocking power.
        tensor_parallel: GPUs per stage.

    Raises:
        ProfileError: neither the job nor any profile gives a blocking power.
    """
    stage_w = _stage_p_block_w(p_block_w, profiles, tensor_parallel)
    if stage_w is None:
        raise ProfileError(_NO_P_BLOCK)
    return stage_w


def _stage_p_block_w(
    p_block_w: float | None, profiles: Sequence[RankProfile], tensor_parallel: int
) -> float | None:
    if p_block_w is not None:
        return p_block_w * tensor_parallel
    reported = [p.p_block_w for p in profiles if p.p_block_w is not None]
    if not reported:
        return None
    return sum(reported) / len(reported) * tensor_parallel


def unprofiled_stages(inp: PlanningInput) -> list[int]:
    """Stages that lack a profile from some tensor-parallel rank, ascending.

    Complexity: O(ranks + stages x tensor_parallel).
    """
    covered = {(p.stage, p.tensor_parallel_rank) for p in inp.profiles}
    return [
        stage
        for stage in range(inp.stages)
        if not all((stage, tp) in covered for tp in range(inp.tensor_parallel))
    ]


def merged_profile(inp: PlanningInput) -> Profile:
    """The job's profile as planning sees it: every stage's ranks combined.

    See :func:`combine_profiles` for how ranks combine. The result's ``p_block_w`` is the
    blocking power of one stage (:func:`stage_p_block_w`), or None when neither the job nor
    any rank gives one.

    Raises:
        ProfileError: a stage lacks profiles, or its ranks share no clock.

    Complexity: O(total rows).
    """
    from perseus.solver import profile_from_rows

    profiles = [stored.decode() for stored in inp.profiles]
    rows = combine_profiles(profiles, inp.stages, inp.tensor_parallel)
    p_block_w = _stage_p_block_w(inp.p_block_w, profiles, inp.tensor_parallel)
    return profile_from_rows(rows, source=f"job {inp.job_id}", p_block_w=p_block_w)


def plan_frontier(inp: PlanningInput) -> PlanningResult:
    """Compute the job's time-energy frontier; runs in a worker process.

    Returns:
        The frontier and its ``Frontier.to_json()`` as compact JSON text.

    Raises:
        ProfileError, ScheduleError: the profiles or schedule are unusable.
    """
    from perseus.solver import compute_frontier, make_schedule
    from perseus.solver.frontier import RESOLUTION_S

    profile = merged_profile(inp)
    p_block_w = profile.p_block_w
    if p_block_w is None:
        raise ProfileError(_NO_P_BLOCK)
    schedule = make_schedule(inp.schedule, inp.stages, inp.microbatches, inp.virtual_stages)
    frontier = compute_frontier(
        profile,
        schedule,
        p_block_w=p_block_w,
        resolution_s=RESOLUTION_S if inp.resolution_s is None else inp.resolution_s,
        polish_s=inp.polish_s,
    )
    return PlanningResult(json.dumps(frontier.to_json(), separators=(",", ":")), frontier)


def init_worker(niceness: int) -> None:
    """Set up a planning worker process (runs once in each, first thing).

    Lowers the worker's CPU priority by ``niceness``: a frontier is background work, and
    requests (plan fetches, telemetry) must keep their latency while one is computed on a
    machine with few cores. And exits when the server process dies, even killed with
    SIGKILL, so that no orphaned workers linger.
    """
    if niceness > 0:
        os.nice(niceness)
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def exit_with_parent() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=exit_with_parent, name="exit with server", daemon=True).start()


def warm_up() -> None:
    """Import the solver so the first real computation does not pay for it."""
    import perseus.solver  # noqa: F401
