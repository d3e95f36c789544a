"""The deadline grid the frontier is computed on, and the work limit it implies.

The grid runs every ``resolution_s`` from the all-fastest plan's time to the relaxed optimum's,
then on to the slowest plan's time in at most :data:`TAIL_DEADLINES` more steps. Its size times
the DAG's instructions is the planning work (cells) that :data:`MAX_CELLS` bounds; the server
sizes a job's planning work with :func:`deadline_count` before it plans.

By default the spacing follows the job (:func:`default_resolution`): 1 ms where that grid is
small, else a bounded number of deadlines across the span of plan times. A 1 ms step is right
for a 3 s iteration and pointless for a 45 s one of 16,384 instructions, whose 1 ms grid (and
every array over it) would be twelve times larger than its relative precision needs.
"""

from __future__ import annotations

import math

import numpy as np

from perseus.core.defaults import MAX_CELLS  # the server's default limit too
from perseus.solver.planner import FloatArray

__all__ = [
    "GRID_CELLS",
    "MAX_CELLS",
    "MAX_RESOLUTION_S",
    "MIN_DEADLINES",
    "MIN_RESOLUTION_S",
    "TAIL_DEADLINES",
    "deadline_count",
    "deadline_grid",
    "default_resolution",
    "served_deadline",
]

MIN_RESOLUTION_S = 1e-3
"""The finest spacing :func:`default_resolution` picks: the grid every job of today's sizes
has always been planned on (the demo, 8 x 12 up to 8 x 96 keep it exactly)."""

GRID_CELLS = 5 << 22
"""The default grid's size: about this many (instruction, deadline) cells before its tail
(its table of choices: 40 MiB), unless the span needs no more than :data:`MIN_DEADLINES`
deadlines or 1 ms steps take fewer. 20 Mi: the least that keeps 1 ms on every 8 x 96 job of
the shared profiles (1,536 instructions, spans up to 13.4 s). 2^25 gave 16 x 128 interleaved
(8,192 instructions) 4,096 deadlines and 1,300 points in 21.8-23.0 s; this, 2,560 deadlines,
984 points in 17.1-18.5 s, the same gaps at 1-1.05 x within 0.05 points and the same
largest gap (1.07-1.08 %)."""

MIN_DEADLINES = 2048
"""The default grid has at least this many deadlines across the span of plan times (where 1 ms
steps would take more): steps under 0.05 % of the span, however large the DAG."""

MAX_RESOLUTION_S = 1.0
"""The coarsest spacing a caller may ask for, in seconds."""

TAIL_DEADLINES = 512
"""Most deadlines past the relaxed optimum (the minimum-energy plan can be slower than it)."""


def deadline_count(span_s: float, resolution_s: float) -> int:
    """Most deadlines :func:`perseus.solver.compute_frontier` uses for a span of plan times.

    Args:
        span_s: The slowest plan's time minus the all-fastest plan's, in seconds (>= 0).
        resolution_s: Spacing of the grid, in seconds (> 0).

    Returns:
        An upper bound: every ``resolution_s`` across the span, both ends, and the tail.
        O(1).
    """
    return math.ceil(span_s / resolution_s) + TAIL_DEADLINES + 2


def default_resolution(span_s: float, instructions: int) -> float:
    """The default spacing of the deadline grid for a job, in seconds.

    ``span_s / max(MIN_DEADLINES, GRID_CELLS // instructions)``, at least
    :data:`MIN_RESOLUTION_S`: the grid's work (deadlines x instructions) stays near
    :data:`GRID_CELLS` whatever the job's length and size, and jobs whose 1 ms grid is smaller
    than that keep it (every job up to 8 x 96 of the shared profiles). On a 32 x 256 job
    (16,384 instructions, plan times spanning 26 s) that is 2,048 deadlines 13 ms apart, 0.03 %
    of its 46 s iteration.

    Args:
        span_s: The slowest plan's time minus the all-fastest plan's (>= 0), or an estimate.
        instructions: The DAG's instructions (>= 1).

    Returns:
        The spacing. O(1).
    """
    deadlines = max(MIN_DEADLINES, GRID_CELLS // max(instructions, 1))
    return max(MIN_RESOLUTION_S, span_s / deadlines)


def deadline_grid(t_fast: float, t_end: float, t_slowest: float, resolution_s: float) -> FloatArray:
    """Deadlines every ``resolution_s`` from ``t_fast`` up to the relaxed optimum's time
    ``t_end``, then on to the slowest plan's time ``t_slowest`` (at most
    :data:`TAIL_DEADLINES` more, evenly spread: the minimum-energy plan can be slower than the
    relaxed optimum)."""
    steps = math.ceil((t_end - t_fast) / resolution_s - 1e-9)
    grid = t_fast + resolution_s * np.arange(steps + 1)
    extra = math.floor((t_slowest - grid[-1]) / resolution_s + 1e-9)
    if extra > 0:
        tail = grid[-1] + resolution_s * np.arange(1, extra + 1)
        if extra > TAIL_DEADLINES:
            tail = np.linspace(tail[0], t_slowest, TAIL_DEADLINES)
        grid = np.concatenate([grid, tail, [t_slowest]] if tail[-1] < t_slowest else [grid, tail])
    return np.asarray(grid, dtype=np.float64)


def served_deadline(times: FloatArray, grid: FloatArray) -> FloatArray:
    """Largest grid deadline each point answers (the next point's time, exclusive)."""
    served = np.empty(len(times))
    for i in range(len(times)):
        if i + 1 == len(times):
            served[i] = math.inf
            continue
        g = int(np.searchsorted(grid, times[i + 1], side="left")) - 1
        served[i] = max(float(grid[max(g, 0)]), float(times[i]))
    return served
