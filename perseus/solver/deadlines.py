"""The deadline grid the frontier is computed on, and the work limit it implies.

The grid runs every ``resolution_s`` from the all-fastest plan's time to the relaxed optimum's,
then on to the slowest plan's time in at most :data:`TAIL_DEADLINES` more steps. Its size times
the DAG's instructions is the planning work (cells) that :data:`MAX_CELLS` bounds; the server
sizes a job's planning work with :func:`deadline_count` before it plans.
"""

from __future__ import annotations

import math

import numpy as np

from perseus.solver.planner import FloatArray

__all__ = ["MAX_CELLS", "TAIL_DEADLINES", "deadline_count", "deadline_grid", "served_deadline"]

MAX_CELLS = 400_000_000
"""compute_frontier's default limit on grid deadlines x instructions (its arrays: about
4.7 GiB), and the server's default limit on a job's planning work."""

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
