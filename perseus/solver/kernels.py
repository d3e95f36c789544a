"""Compiled kernels for the refill and the longest path: plain loops over nodes and plans.

The refill's passes (see :meth:`perseus.solver.planner.Planner.refill_evaluated`) walk the DAG
level by level; as vectorised numpy over ``(level, plans)`` slices each level costs a dozen
array calls, which on pipeline DAGs (thousands of narrow levels) is most of the planning time.
Here each pass is one loop over the nodes in level order, compiled by numba (``cache=True``:
compiled once per installation, then loaded). The results equal the numpy passes' exactly: the
same float operations in the same order per element.

Rows are nodes in level order (``Planner._order``); row ``n`` is "none" (finishes at 0, and in
the backward pass is the ceiling). ``pred`` and ``succ`` hold rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt

__all__ = ["longest_path", "refill"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
_F = TypeVar("_F", bound=Callable[..., Any])

# Compiled on first use, cached beside this file (numba's cache) for later processes.
_compiled = cast(Callable[[_F], _F], numba.njit(cache=True, nogil=True))
_inlined = cast(Callable[[_F], _F], numba.njit(cache=True, nogil=True, inline="always"))


@_inlined
def _fit(
    room: float,
    first: int,
    scale: float,
    offset: float,
    low: float,
    high: float,
    table: IntArray,
    table_time: FloatArray,
    table_next: FloatArray,
    padded: FloatArray,
    one_step: bool,
) -> tuple[int, float]:
    """Slowest option that takes at most ``room`` (the fastest if none does), and its time:
    ``Planner.fit_times`` for one element."""
    position = room * scale
    position += offset
    position = max(position, low)
    position = min(position, high)
    row = int(position)
    found = table[row]
    if one_step:
        after = table_next[row]
        if after <= room:
            return found + 1, after
        return found, table_time[row]
    while padded[first + 1 + found] <= room:
        found += 1
    taken = padded[first + found]
    while taken > room and found > 0:
        found -= 1
        taken = padded[first + found]
    return found, taken


@_compiled
def refill(
    chosen: IntArray,
    pred: IntArray,
    succ: IntArray,
    first: IntArray,
    scale: FloatArray,
    offset: FloatArray,
    low: FloatArray,
    high: FloatArray,
    table: IntArray,
    table_time: FloatArray,
    table_next: FloatArray,
    padded: FloatArray,
    one_step: bool,
    ceiling: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """The refill's three passes over ``chosen`` ``(n, P)`` (rows in level order), in place.
    A node's plans side by side: their fits read the same stretch of its class's table.

    Returns:
        The refilled plans' durations ``(n, P)`` and iteration times ``(P,)``.
    """
    n, plans = chosen.shape
    durations = np.empty((n, plans))
    finish = np.empty((n + 1, plans))
    finish[n] = 0.0
    begin = np.empty((n, plans))
    for r in range(n):
        a, b = pred[r, 0], pred[r, 1]
        for p in range(plans):
            d = padded[first[r] + chosen[r, p]]
            durations[r, p] = d
            end = max(finish[a, p], finish[b, p]) + d
            finish[r, p] = end
            begin[r, p] = end - d
    latest = np.empty((n + 1, plans))
    latest[n] = ceiling
    finish_by = np.empty((n, plans))
    for r in range(n - 1, -1, -1):
        a, b = succ[r, 0], succ[r, 1]
        for p in range(plans):
            bound = min(latest[a, p], latest[b, p])
            finish_by[r, p] = bound
            found, taken = _fit(
                bound - begin[r, p],
                first[r],
                scale[r],
                offset[r],
                low[r],
                high[r],
                table,
                table_time,
                table_next,
                padded,
                one_step,
            )
            chosen[r, p] = found
            durations[r, p] = taken
            latest[r, p] = bound - taken
    earliest = finish
    total = np.zeros(plans)
    for r in range(n):
        a, b = pred[r, 0], pred[r, 1]
        for p in range(plans):
            start = max(earliest[a, p], earliest[b, p])
            found, taken = _fit(
                finish_by[r, p] - start,
                first[r],
                scale[r],
                offset[r],
                low[r],
                high[r],
                table,
                table_time,
                table_next,
                padded,
                one_step,
            )
            if found > chosen[r, p]:
                chosen[r, p] = found
            if taken > durations[r, p]:
                durations[r, p] = taken
            end = start + durations[r, p]
            earliest[r, p] = end
            if r == 0 or end > total[p]:
                total[p] = end
    return durations, total


@_compiled
def longest_path(durations: FloatArray, pred: IntArray) -> FloatArray:
    """Iteration time ``(P,)`` of durations ``(n, P)`` (rows in level order)."""
    n, plans = durations.shape
    finish = np.empty((n + 1, plans))
    finish[n] = 0.0
    total = np.zeros(plans)
    for r in range(n):
        a, b = pred[r, 0], pred[r, 1]
        for p in range(plans):
            end = max(finish[a, p], finish[b, p]) + durations[r, p]
            finish[r, p] = end
            if r == 0 or end > total[p]:
                total[p] = end
    return total
