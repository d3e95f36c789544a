"""The planning work of a job, estimated before it runs, and the planner's limit on it.

:func:`estimate_planning_work` sizes a frontier computation (instructions x deadlines, the
worker's memory and time) from the job's shape and each stage's measured time ranges;
:func:`check_planning_work` refuses a job over the planner's ``planning_max_cells`` with a
message that says what would fit. The coefficients are measured by
``benchmarks/planning_work.py``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from perseus.core.errors import PlanningTooLarge
from perseus.solver.deadlines import MAX_CELLS, MIN_DEADLINES, deadline_count, default_resolution
from perseus.solver.knots import extended_microbatches
from perseus.solver.schedules import SPLIT_BACKWARD_SCHEDULES

__all__ = [
    "DEFAULT_MAX_CELLS",
    "InstructionTimes",
    "PlanningWork",
    "ProfileRowTuple",
    "check_planning_work",
    "estimate_planning_work",
    "instruction_times",
    "size_text",
]

ProfileRowTuple = tuple[str, int, float, float]

DEFAULT_MAX_CELLS = MAX_CELLS
"""Default limit on a job's planning work, instructions x deadlines: the solver's
:data:`perseus.solver.MAX_CELLS` (an alias kept for old imports), about 4.7 GiB and 8 minutes
(a shared 2-core host) at most; 16 stages x 128 microbatches interleaved is 2.5e7 on the
default grid (:data:`perseus.solver.deadlines.GRID_CELLS`)."""

# Calibrated with benchmarks/planning_work.py (issue 26, after the refill in level order and
# the large-DAG relaxation path): a worker's data segment after imports (~215 MiB), and per
# cell its peak memory (9-12.6 bytes measured, rounded up) and time (0.8-1.0 us on a shared
# 2-core host; 1.9 on a 2 x 2 job's 4e6-deadline grid), plus a fixed time per job (the local
# search's work, 5-10 s from 8 x 32 up).
_BASE_BYTES = 272 * 2**20
_BYTES_PER_CELL = 12.0
# The relaxation's two HiGHS models and their solutions grow with the instructions, not the
# cells: peaks over the cells' estimate of 25 MiB on 8 x 32 (512 instructions), 91 MiB on
# 16 x 128 (4,096), 191-197 MiB on 16 x 128 interleaved and 32 x 128 (8,192): up to 32 KiB
# an instruction.
_BYTES_PER_INSTRUCTION = 32 * 2**10
_SECONDS_PER_CELL = 1.2e-6
_SECONDS_FIXED = 5.0
# The relaxation's LP solves, which grow faster than the cells on large DAGs (two models side
# by side, at most 8 knots): ~5 s of interleaved 16 x 128 (8,192 instructions, 11 s whole),
# ~25 s of 1F1B 32 x 128 (8,192, 39 s) and ~120 s of 1F1B 32 x 256 (16,384, 167 s): about
# _LP_SECONDS x (instructions / 8,192)^2 x (stages / 16)^3. Only the estimate's seconds (the
# queue's order): the limit is on cells. Checked on 2026-12-03 (the 20 Mi-cell grid, the
# coarse path from 1,536 instructions): estimated against measured seconds 31 / 19 (8 x 96),
# 34 / 18 (16 x 128), 39 / 22 (16 x 128 interleaved), 67 / 61 (32 x 128), 30 / 75 (2 x 2 on
# 2.6 million deadlines, the one under). Peak memory then ran up to 197 MiB over the cells'
# estimate on large DAGs (hence _BYTES_PER_INSTRUCTION, added that day). Large 1F1B DAGs
# solve a miniature's relaxation instead (32 x 129 for 32 x 256: 38.6 s whole, 73.7 s with the
# full relaxation, 2026-12-04): their LP term counts the miniature's instructions.
_LP_SECONDS = 4.0


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
    # 1F1B's large DAGs solve a miniature's relaxation instead (perseus.solver.miniature)
    small = extended_microbatches(schedule or "", stages, microbatches, instructions)
    lp_instructions = instructions if small is None else 2 * stages * small
    return PlanningWork(
        instructions=instructions,
        deadlines=deadlines,
        options=instructions * per_gpu,
        cells=cells,
        memory_bytes=int(
            _BASE_BYTES + _BYTES_PER_CELL * cells + _BYTES_PER_INSTRUCTION * instructions
        ),
        seconds=_SECONDS_FIXED
        + _SECONDS_PER_CELL * cells
        + _LP_SECONDS * (lp_instructions / 8192) ** 2 * (stages / 16) ** 3
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
        f"about {size_text(estimate.memory_bytes)} and {estimate.seconds:,.0f} s), over the "
        f"planner's limit of {max_cells:.3g} (setting planning_max_cells); " + "; ".join(knobs),
        cells=estimate.cells,
        max_cells=max_cells,
    )


def size_text(size_bytes: float) -> str:
    """A size in bytes for messages: ``1.5 GiB``, or ``300 MiB`` under a GiB."""
    return (
        f"{size_bytes / 2**30:,.1f} GiB"
        if size_bytes >= 2**30
        else f"{size_bytes / 2**20:,.0f} MiB"
    )
