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
import math
import multiprocessing
import multiprocessing.connection
import os
import resource
import threading
import traceback
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from perseus.defaults import CLOCK_CHANGE_MARGIN_S
from perseus.errors import PerseusError, PlanningTooLarge, ProfileError
from perseus.solver.deadlines import MAX_CELLS, MIN_DEADLINES, deadline_count, default_resolution
from perseus.solver.schedules import SPLIT_BACKWARD_SCHEDULES

if TYPE_CHECKING:
    from perseus.solver import Frontier, Profile

__all__ = [
    "DEFAULT_MAX_CELLS",
    "InstructionTimes",
    "PlanningFailure",
    "PlanningInput",
    "PlanningResult",
    "PlanningWork",
    "RankProfile",
    "StoredProfile",
    "check_planning_work",
    "combine_profiles",
    "estimate_planning_work",
    "failure_reason",
    "init_worker",
    "instruction_times",
    "merged_profile",
    "plan_frontier",
    "planning_process",
    "sample_planning_work",
    "stage_p_block_w",
    "unprofiled_stages",
    "warm_up",
]

ProfileRowTuple = tuple[str, int, float, float]
_NO_P_BLOCK = "no blocking power: set p_block_w on the job or report it with the profiles"

DEFAULT_MAX_CELLS = MAX_CELLS
"""Default limit on a job's planning work, instructions x deadlines: the solver's
:data:`perseus.solver.MAX_CELLS` (an alias kept for old imports), about 4.7 GiB and 8 minutes
(a shared 2-core host) at most; 16 stages x 128 microbatches interleaved is 1.5e8."""

# Calibrated with benchmarks/planning_work.py (issue 26, after the refill in level order and
# the large-DAG relaxation path): a worker's data segment after imports (~215 MiB), and per
# cell its peak memory (9-12.6 bytes measured, rounded up) and time (0.8-1.0 us on a shared
# 2-core host; 1.9 on a 2 x 2 job's 4e6-deadline grid), plus a fixed time per job (the local
# search's work, 5-10 s from 8 x 32 up).
_BASE_BYTES = 256 * 2**20
_BYTES_PER_CELL = 12.0
_SECONDS_PER_CELL = 1.2e-6
_SECONDS_FIXED = 5.0
# The relaxation's LP solves, which grow faster than the cells on large DAGs: ~15 s of
# interleaved 16 x 128 (8,192 instructions, 29 s whole), ~115 s of 1F1B 32 x 128 (8,192, 135 s)
# and ~700 s of 1F1B 32 x 256 (16,384; 20 solves of ~36 s): about _LP_SECONDS x
# (instructions / 8,192)^2 x (stages / 16)^3. Only the estimate's seconds: the limit is on cells.
_LP_SECONDS = 15.0


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


@dataclass(frozen=True, slots=True)
class InstructionTimes:
    """The measured range of one instruction type on one stage (whole stage, every chunk).

    Attributes:
        stage: the pipeline stage.
        instruction: ``forward`` or ``backward``.
        fastest_s: its shortest measured time.
        slowest_s: its longest measured time.
        clocks: how many clocks were measured.
    """

    stage: int
    instruction: str
    fastest_s: float
    slowest_s: float
    clocks: int


@dataclass(frozen=True, slots=True)
class PlanningWork:
    """What computing one job's frontier implies, estimated before it runs.

    Attributes:
        instructions: DAG nodes, ``2 x stages x microbatches x virtual_stages`` (3 x where
            the profile has the split backward's halves, for zero-bubble schedules).
        deadlines: frontier deadlines the solver sweeps (its grid), at most.
        options: (instruction, clock) pairs the linear programs choose among.
        cells: ``instructions x deadlines``, the size of the solver's main table and of its
            O(n * G) rounding passes: the number the limit applies to.
        memory_bytes: the worker's likely peak memory.
        seconds: the likely computing time (``polish_s`` included), for ordering the queue
            and for messages; the limit is on ``cells``, which decides the same way on a
            busy machine as on an idle one.
    """

    instructions: int
    deadlines: int
    options: int
    cells: int
    memory_bytes: int
    seconds: float


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


def instruction_times(stage: int, rows: Iterable[ProfileRowTuple]) -> list[InstructionTimes]:
    """The range of each instruction type in one stage's rows (one rank's, or combined).

    Complexity: O(rows).
    """
    ranges: dict[str, tuple[float, float, int]] = {}
    for name, _freq, time_s, _energy in rows:
        low, high, count = ranges.get(name, (math.inf, 0.0, 0))
        ranges[name] = (min(low, time_s), max(high, time_s), count + 1)
    return [
        InstructionTimes(stage, name, low, high, count)
        for name, (low, high, count) in sorted(ranges.items())
    ]


def estimate_planning_work(
    *,
    stages: int,
    microbatches: int,
    virtual_stages: int,
    times: Iterable[InstructionTimes],
    resolution_s: float | None,
    polish_s: float = 0.0,
    schedule: str | None = None,
) -> PlanningWork:
    """Estimate the work of a frontier computation from the job's shape and profile ranges.

    The solver (``perseus.solver.frontier``, fast mode) sweeps ``G`` deadlines spaced
    ``resolution_s`` apart from the all-fastest iteration time to the relaxed optimum's, plus
    a bounded tail (``G`` at most :func:`perseus.solver.deadline_count` of the span); it
    keeps an ``n x G`` table of choices and makes a few passes over the ``n`` instructions per
    1,024 deadlines. The span is ``(microbatches x virtual_stages + stages - 1) x (slowest -
    fastest)`` of the stage with the widest forward-plus-backward range, per model chunk: the
    length of a 1F1B (or GPipe, or interleaved) pipeline's critical path. That bounds the real
    span from above when the stages are alike, and the relaxed optimum is usually well before
    the slowest plan, so the estimate errs large; the memory and time coefficients are measured
    (``benchmarks/planning_work.py``).

    The schedule's name does not matter: the schedules share the critical-path length (the
    zero-bubble ones are shorter), and a split backward counts as the wider of the whole
    backward and its two halves.
    Ranges from a subset of the stages (or of the ranks) never give a larger estimate than
    all of them, so a rank's own profile can be checked on arrival.

    Args:
        stages: pipeline stages.
        microbatches: microbatches per iteration.
        virtual_stages: model chunks per GPU (1 unless interleaved).
        times: measured ranges, any number per (stage, instruction): several ranks of a
            stage, or several clocks, combine by the widest range.
        resolution_s: the job's deadline spacing; None: the solver's default, which follows
            the job (:func:`perseus.solver.default_resolution` of the span and the
            instructions), so the default grid never holds many more than
            ``max(MIN_DEADLINES, GRID_CELLS / instructions)`` deadlines.
        polish_s: seconds the worker may spend polishing the no-slowdown point.
        schedule: the job's schedule name; one that splits the backward counts 3
            instructions per (stage, microbatch, chunk), not 2 (None: not split).

    Returns:
        The estimate. O(len(times)).
    """
    low: dict[tuple[int, str], float] = {}
    high: dict[tuple[int, str], float] = {}
    clocks: dict[tuple[int, str], int] = {}
    for t in times:
        key = (t.stage, t.instruction)
        low[key] = min(low.get(key, math.inf), t.fastest_s)
        high[key] = max(high.get(key, 0.0), t.slowest_s)
        clocks[key] = max(clocks.get(key, 0), t.clocks)
    ranges: dict[int, dict[str, float]] = defaultdict(dict)
    for (stage, instruction), fastest_s in low.items():
        ranges[stage][instruction] = max(high[stage, instruction] - fastest_s, 0.0)
    # A split backward's halves run in place of the whole one: the wider of the two counts.
    widest = {
        stage: r.get("forward", 0.0)
        + max(r.get("backward", 0.0), r.get("backward_input", 0.0) + r.get("backward_weight", 0.0))
        for stage, r in ranges.items()
    }
    spread_s = max(widest.values(), default=0.0) / virtual_stages
    span_s = (microbatches * virtual_stages + stages - 1) * spread_s
    # a schedule that splits the backward runs up to 3 instructions per (stage, microbatch,
    # chunk) instead of 2 (DualPipeV keeps some whole: errs large)
    split = schedule in SPLIT_BACKWARD_SCHEDULES
    instructions = (3 if split else 2) * stages * microbatches * virtual_stages
    resolution = default_resolution(span_s, instructions) if resolution_s is None else resolution_s
    deadlines = deadline_count(span_s, resolution)
    per_gpu = max(clocks.values(), default=1)
    cells = instructions * deadlines
    return PlanningWork(
        instructions=instructions,
        deadlines=deadlines,
        options=instructions * per_gpu,
        cells=cells,
        memory_bytes=int(_BASE_BYTES + _BYTES_PER_CELL * cells),
        seconds=_SECONDS_FIXED
        + _SECONDS_PER_CELL * cells
        + _LP_SECONDS * (instructions / 8192) ** 2 * (stages / 16) ** 3
        + polish_s,
    )


def check_planning_work(
    *,
    stages: int,
    microbatches: int,
    virtual_stages: int,
    times: Sequence[InstructionTimes],
    resolution_s: float | None,
    max_cells: int,
    schedule: str | None = None,
) -> PlanningWork:
    """Estimate a job's planning work and refuse it when over ``max_cells``.

    Args:
        stages, microbatches, virtual_stages, times, resolution_s, schedule: as for
            :func:`estimate_planning_work`.
        max_cells: the planner's limit on ``instructions x deadlines``
            (the ``planning_max_cells`` setting).

    Returns:
        The estimate, within the limit.

    Raises:
        PlanningTooLarge: over the limit; the message names the limit, the setting and what
            would fit (microbatches, ``resolution_s``).

    Complexity: O(len(times) + log(microbatches)) (a bisection over microbatches).
    """

    def work(microbatches: int, resolution_s: float | None) -> PlanningWork:
        return estimate_planning_work(
            stages=stages,
            microbatches=microbatches,
            virtual_stages=virtual_stages,
            times=times,
            resolution_s=resolution_s,
            schedule=schedule,
        )

    estimate = work(microbatches, resolution_s)
    if estimate.cells <= max_cells:
        return estimate
    step = stages if virtual_stages > 1 else 1  # interleaved: a multiple of stages
    fits, lo, hi = 0, 1, microbatches // step
    while lo <= hi:
        mid = (lo + hi) // 2
        if work(mid * step, resolution_s).cells <= max_cells:
            fits, lo = mid * step, mid + 1
        else:
            hi = mid - 1
    knobs = [f"at most {fits:,} microbatches fit" if fits else "no number of microbatches fits"]
    if resolution_s is not None:
        by_default = work(microbatches, None)
        knobs.append(
            f"the default resolution_s (following the job) would need {by_default.cells:.3g} cells"
            if by_default.cells > max_cells
            else f"a coarser resolution_s (now {resolution_s:g} s; or leave it to the default, "
            "which follows the job) helps"
        )
    else:
        knobs.append(
            "resolution_s follows the job (the default): a coarser one gives fewer deadlines, "
            f"but never fewer than {MIN_DEADLINES:,} across the span by default"
        )
    if not fits:
        slowest_s = max((t.slowest_s for t in times), default=0.0)
        knobs.append(
            f"the profile's instruction times (up to {slowest_s:.3g} s) are too long to plan "
            "at this resolution"
        )
    raise PlanningTooLarge(
        f"planning this job needs about {estimate.cells:.3g} cells "
        f"({estimate.instructions:,} instructions x {estimate.deadlines:,} deadlines, "
        f"about {_gib(estimate.memory_bytes)} and {estimate.seconds:,.0f} s), over the "
        f"planner's limit of {max_cells:.3g} (setting planning_max_cells); " + "; ".join(knobs),
        cells=estimate.cells,
        max_cells=max_cells,
    )


def _gib(size_bytes: float) -> str:
    return (
        f"{size_bytes / 2**30:,.1f} GiB"
        if size_bytes >= 2**30
        else f"{size_bytes / 2**20:,.0f} MiB"
    )


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
        The frontier and its ``perseus.frontier/1`` text (``perseus.files.frontier_to_json``).

    Raises:
        ProfileError, ScheduleError: the profiles or schedule are unusable.
        PlanningTooLarge: the work estimate is over ``inp.max_cells``.
    """
    from perseus.solver import compute_frontier, make_schedule

    profile = merged_profile(inp)
    p_block_w = profile.p_block_w
    if p_block_w is None:
        raise ProfileError(_NO_P_BLOCK)
    if inp.max_cells is not None:
        # Again here, on every rank's rows combined: the job may have been admitted by
        # another server, or planned on request (plan:compute) with the profiles in so far.
        check_planning_work(
            stages=inp.stages,
            microbatches=inp.microbatches,
            virtual_stages=inp.virtual_stages,
            times=[
                InstructionTimes(
                    stage,
                    name,
                    min(o.time_s for o in options),
                    max(o.time_s for o in options),
                    len(options),
                )
                for stage, by_name in enumerate(profile.stages)
                for name, options in by_name.items()
                if options
            ],
            resolution_s=inp.resolution_s,
            max_cells=inp.max_cells,
            schedule=inp.schedule,
        )
    schedule = make_schedule(inp.schedule, inp.stages, inp.microbatches, inp.virtual_stages)
    frontier = compute_frontier(
        profile,
        schedule,
        p_block_w=p_block_w,
        resolution_s=inp.resolution_s,  # None: the solver's default, following the job
        polish_s=inp.polish_s,
        max_cells=inp.max_cells,  # the server's own limit (checked above), or none
        # ranks aim every clock change this far ahead of its boundary: plan with its tails
        clock_change_margin_s=CLOCK_CHANGE_MARGIN_S,
    )
    from perseus.files import frontier_to_json

    return PlanningResult(frontier_to_json(frontier), frontier)


def sample_planning_work(inp: PlanningInput) -> PlanningWork:
    """A quick estimate from one profile per stage, for ordering the planning queue.

    Decodes ``stages`` profiles rather than every rank's: cheap enough for the server
    process. Ranks of one stage measure alike, so this is close to the full estimate
    (:func:`plan_frontier` checks the limit on all of them).

    Complexity: O(stages x rows of one profile).
    """
    first: dict[int, StoredProfile] = {}
    for stored in inp.profiles:
        first.setdefault(stored.stage, stored)
    return estimate_planning_work(
        stages=inp.stages,
        microbatches=inp.microbatches,
        virtual_stages=inp.virtual_stages,
        times=[
            t
            for stored in first.values()
            for t in instruction_times(stored.stage, stored.decode().rows)
        ],
        resolution_s=inp.resolution_s,
        polish_s=inp.polish_s,
        schedule=inp.schedule,
    )


@dataclass(frozen=True, slots=True)
class PlanningFailure:
    """Why a planning run failed, as the job's ``reason`` says it.

    Attributes:
        reason: one line for people: what failed and what to change.
        internal: a bug (not the job's inputs): the server logs it as an error.
        details: for an internal error, the traceback (logged, never shown to callers).
    """

    reason: str
    internal: bool = False
    details: str = ""


def failure_reason(exc: BaseException, memory_limit_bytes: int | None) -> PlanningFailure:
    """The readable reason for an exception a planning run raised (never numpy's text)."""
    if isinstance(exc, MemoryError):
        limit = (
            f"its memory limit of {_gib(memory_limit_bytes)} (setting planning_memory_mb)"
            if memory_limit_bytes is not None
            else "the memory available"
        )
        return PlanningFailure(
            f"planning ran out of memory: it needed more than {limit}; use fewer "
            "microbatches or a coarser resolution_s"
        )
    if isinstance(exc, PerseusError):
        return PlanningFailure(f"{type(exc).__name__}: {exc}")
    return PlanningFailure(
        f"internal error while planning: {type(exc).__name__}: {str(exc)[:200]}",
        internal=True,
        details="".join(traceback.format_exception(exc)),
    )


def planning_process(conn: Connection, niceness: int, memory_limit_bytes: int | None) -> None:
    """Body of a planning process: set up, then plan each job that arrives on ``conn``.

    Answers each job with ``(PlanningResult or PlanningFailure, peak memory in bytes)``;
    exits when the server closes the connection (or dies). The server kills the process to
    stop a run. ``memory_limit_bytes`` caps its data segment (``RLIMIT_DATA``: heap and
    anonymous mappings, what numpy allocates), so a run over it gets a MemoryError,
    reported as such, rather than the host's OOM killer.
    """
    init_worker(niceness)
    warm_up()
    if memory_limit_bytes is not None:
        resource.setrlimit(resource.RLIMIT_DATA, (memory_limit_bytes, memory_limit_bytes))
    while True:
        try:
            inp = conn.recv()
        except EOFError:  # the server stopped, or retired this process
            return
        outcome: PlanningResult | PlanningFailure
        try:
            outcome = plan_frontier(inp)
        except Exception as exc:  # reported to the server, which logs it
            outcome = failure_reason(exc, memory_limit_bytes)
            del exc  # free what the failed run allocated before pickling the answer
        peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        try:
            conn.send((outcome, peak_bytes))
        except MemoryError:
            conn.send((failure_reason(MemoryError(), memory_limit_bytes), peak_bytes))
        del inp, outcome


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
