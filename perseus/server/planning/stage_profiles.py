"""How a stage's profile combines its ranks' profiles, and what a planning run takes in.

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
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perseus.core.errors import ProfileError
from perseus.server.planning.work import ProfileRowTuple

if TYPE_CHECKING:
    from perseus.solver import Profile

__all__ = [
    "NO_P_BLOCK",
    "PlanningInput",
    "RankProfile",
    "StoredProfile",
    "combine_profiles",
    "merged_profile",
    "stage_p_block_w",
    "unprofiled_stages",
]

NO_P_BLOCK = "no blocking power: set p_block_w on the job or report it with the profiles"
"""The reason a job without any blocking power cannot be planned."""


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
    max_cells: int | None = None  # refuse (PlanningTooLarge) when the estimate is over
    clock_change_delay_s: float = 0.0  # how long a clock change takes to land on the ranks
    # The largest clock-change latency the job's ranks reported, and whose (None: none yet).
    measured_delay: tuple[int, float] | None = None


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
        raise ProfileError(NO_P_BLOCK)
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
