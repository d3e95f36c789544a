"""Compiled kernels for the refill and the longest path: plain loops over nodes and plans.

The refill's passes (see :meth:`perseus.solver.planner.Planner.refill_evaluated`) walk the DAG
level by level; as vectorised numpy over ``(level, plans)`` slices each level costs a dozen
array calls, which on pipeline DAGs (thousands of narrow levels) is most of the planning time.
Here each pass is one loop over the nodes in level order, compiled by numba (once per
installation, then loaded from its cache; where, and when a process uses them, see
:mod:`perseus.solver.kernel_cache`). The results equal the numpy passes' exactly: the same
float operations in the same order per element. Each kernel is called with one set of
argument types (arrays copied to them where a caller's differ), so that the few calls of
``planner.warm_kernels`` compile or load everything a plan uses.

Rows are nodes in level order (``Planner._order``); row ``n`` is "none" (finishes at 0, and in
the backward pass is the ceiling). ``pred`` and ``succ`` hold rows.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt

from perseus.solver.kernel_cache import numba_cache_dir

__all__ = ["FitTable", "Network", "evaluate", "longest_path", "refill", "with_transitions"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
_F = TypeVar("_F", bound=Callable[..., Any])

# Where numba caches the kernels for later processes: the per-user folder of
# perseus.solver.kernel_cache, never beside this file (numba's default, inside the installed
# package). None: not writable, so compiled in memory for this process alone.
_CACHE_DIR = numba_cache_dir()


def _jit(**options: Any) -> Callable[[_F], _F]:
    """``numba.njit(nogil=True, **options)``, cached in :data:`_CACHE_DIR` where there is one.

    numba picks a function's cache folder when it is decorated, from ``numba.config.CACHE_DIR``
    (``NUMBA_CACHE_DIR``): set for the decoration alone, so that the process's other numba
    functions keep their own setting."""

    def decorate(function: _F) -> _F:
        if _CACHE_DIR is None:
            return cast(_F, numba.njit(cache=False, nogil=True, **options)(function))
        config: Any = numba.config
        previous = config.CACHE_DIR
        config.CACHE_DIR = str(_CACHE_DIR)
        try:
            return cast(_F, numba.njit(cache=True, nogil=True, **options)(function))
        finally:
            config.CACHE_DIR = previous

    return decorate


_compiled = _jit()
_parallel = _jit(parallel=True)
_inlined = _jit(inline="always")


@_inlined
def _table_row(room: float, scale: float, offset: float, low: float, high: float) -> int:
    """The fit table's row for ``room`` (``Planner.fit_times``'s position, clipped to the
    row's class)."""
    position = room * scale
    position += offset
    position = max(position, low)
    position = min(position, high)
    return int(position)


@_inlined
def _fit_span(
    rooms: FloatArray,
    width: int,
    r: int,
    fit: Any,
    one_step: bool,
    found: IntArray,
    taken: FloatArray,
) -> None:
    """For ``rooms[:width]`` of row ``r``: the slowest option that takes at most each room
    (the fastest if none does) into ``found`` and its time into ``taken``; ``Planner.fit_times``
    for one row of a tile. ``fit``: :meth:`FitTable.arrays`.

    One branch on ``one_step`` per row, and a loop per case: the branch inside the loop over
    plans (as a per-element helper had it) kept the compiled loops 2.4x slower.
    """
    first, scale, offset, low, high, table, table_time, table_next, padded = fit
    row_scale, row_offset, row_low, row_high = scale[r], offset[r], low[r], high[r]
    if one_step:
        for p in range(width):
            room = rooms[p]
            row = _table_row(room, row_scale, row_offset, row_low, row_high)
            after = table_next[row]
            if after <= room:
                found[p] = table[row] + 1
                taken[p] = after
            else:
                found[p] = table[row]
                taken[p] = table_time[row]
        return
    start = first[r]
    for p in range(width):
        room = rooms[p]
        pick = table[_table_row(room, row_scale, row_offset, row_low, row_high)]
        while padded[start + 1 + pick] <= room:
            pick += 1
        time = padded[start + pick]
        while time > room and pick > 0:
            pick -= 1
            time = padded[start + pick]
        found[p] = pick
        taken[p] = time


@dataclass(frozen=True, slots=True)
class FitTable:
    """What a fit needs, per row (node in level order) and per table entry: see
    ``Planner.fit_times``."""

    first: IntArray
    scale: FloatArray
    offset: FloatArray
    low: FloatArray
    high: FloatArray
    table: IntArray
    table_time: FloatArray
    table_next: FloatArray
    padded: FloatArray
    one_step: bool

    def arrays(self) -> tuple[npt.NDArray[Any], ...]:
        """The arrays, in field order, as the kernels take them."""
        return (self.first, self.scale, self.offset, self.low, self.high, self.table,
                self.table_time, self.table_next, self.padded)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Network:
    """The DAG in level order: ``order[r]`` is row ``r``'s node and ``place[j]`` node ``j``'s
    row, ``pred``/``succ`` hold rows (``n``: none); and each node's cost-table start, for the
    energies."""

    order: IntArray
    place: IntArray
    pred: IntArray
    succ: IntArray
    start: IntArray

    def arrays(self) -> tuple[IntArray, ...]:
        """The arrays, in field order, as the kernels take them."""
        return (self.order, self.place, self.pred, self.succ, self.start)


def refill(
    choices: IntArray,
    ceiling: FloatArray,
    network: Network,
    fit: FitTable,
    energy_j: FloatArray,
    p_block_w: float,
    num_gpus: int,
    blocks: int | None = None,
) -> tuple[IntArray, FloatArray, FloatArray]:
    """The refill of plans ``choices`` ``(n, P)`` (node order) under ``ceiling`` ``(P,)``,
    in ``blocks`` of plans side by side on threads (None: one per core from 2^13 cells).

    Returns:
        The refilled plans ``(n, P)`` (node order), their iteration times and energies
        (``Planner.evaluate``'s sums, node by node in node order).
    """
    n, plans = choices.shape
    out = np.empty((n, plans), dtype=np.int64)
    total = np.zeros(plans)
    energy = np.zeros(plans)
    args = (
        np.ascontiguousarray(choices, dtype=np.int64),
        np.array(np.broadcast_to(ceiling, (plans,)), dtype=np.float64),  # writable: one type
        network.arrays(), fit.arrays(), fit.one_step, energy_j, float(p_block_w), int(num_gpus),
        out, total, energy,
    )  # fmt: skip
    if blocks is None:
        blocks = _BLOCKS if n * plans >= _PARALLEL_CELLS else 1
    blocks = min(blocks, plans)
    if blocks > 1:
        _refill_blocks(*args, blocks)
    else:
        _refill_block(*args, 0, plans)
    return out, total, energy


# Plans are refilled in up to this many blocks side by side (one per thread), when there are
# at least _PARALLEL_CELLS (node, plan) cells: below that a thread's start and a busy core's
# time slice cost more than the pass. Compiled, 8 x 12's searches (40-500 plans of 192 nodes a
# call) took its planning call 0.92-1.24 s split from 2^13 cells, 1.23-1.43 s from 2^20; 8 x 96
# (compiled by default) showed no clear difference (8.3-8.6 s and 8.0-8.4 s, a noisy machine).
_BLOCKS = max(1, min(8, os.cpu_count() or 1))
_PARALLEL_CELLS = 1 << 13
_TILE = 32  # plans per pass (see _refill_block)


@_parallel
def _refill_blocks(
    choices: IntArray,
    ceiling: FloatArray,
    network: Any,
    fit: Any,
    one_step: bool,
    energy_j: FloatArray,
    p_block_w: float,
    num_gpus: int,
    out: IntArray,
    total: FloatArray,
    energy: FloatArray,
    blocks: int,
) -> None:
    plans = choices.shape[1]
    size = -(-plans // blocks)
    for k in numba.prange(blocks):
        _refill_block(choices, ceiling, network, fit, one_step, energy_j, p_block_w, num_gpus,
                      out, total, energy, k * size, min(plans, (k + 1) * size))  # fmt: skip


@_compiled
def _refill_block(
    choices: IntArray,
    ceiling: FloatArray,
    network: Any,
    fit: Any,
    one_step: bool,
    energy_j: FloatArray,
    p_block_w: float,
    num_gpus: int,
    out: IntArray,
    total: FloatArray,
    energy: FloatArray,
    lo: int,
    hi: int,
) -> None:
    """The refill of plans ``lo`` to ``hi`` into ``out``, ``total`` and ``energy``,
    ``_TILE`` plans at a time: a tile's six working arrays (nodes x tile) stay in the cache."""
    order, place, pred, succ, start = network
    first = fit[0]
    padded = fit[8]
    n = choices.shape[0]
    chosen = np.empty((n, _TILE), dtype=np.int64)
    durations = np.empty((n, _TILE))
    finish = np.empty((n + 1, _TILE))
    begin = np.empty((n, _TILE))
    latest = np.empty((n + 1, _TILE))
    finish_by = np.empty((n, _TILE))
    summed = np.empty(_TILE)
    busy = np.empty(_TILE)
    rooms = np.empty(_TILE)  # one row's rooms, and what the fit found for them
    found = np.empty(_TILE, dtype=np.int64)
    taken = np.empty(_TILE)
    for tile in range(lo, hi, _TILE):
        width = min(hi, tile + _TILE) - tile
        # the current plans' earliest starts
        finish[n] = 0.0
        for r in range(n):
            a, b = pred[r, 0], pred[r, 1]
            node, row_first = order[r], first[r]
            for p in range(width):
                pick = choices[node, tile + p]
                chosen[r, p] = pick
                d = padded[row_first + pick]
                durations[r, p] = d
                end = max(finish[a, p], finish[b, p]) + d
                finish[r, p] = end
                begin[r, p] = end - d
        # backward: each node, latest first, takes the slack up to its successors' latest start
        latest[n, :width] = ceiling[tile : tile + width]
        for r in range(n - 1, -1, -1):
            a, b = succ[r, 0], succ[r, 1]
            for p in range(width):
                bound = min(latest[a, p], latest[b, p])
                finish_by[r, p] = bound
                rooms[p] = bound - begin[r, p]
            _fit_span(rooms, width, r, fit, one_step, found, taken)
            for p in range(width):
                chosen[r, p] = found[p]
                durations[r, p] = taken[p]
                latest[r, p] = finish_by[r, p] - taken[p]
        # forward: the same from the other side (options ascend in time: slower is later);
        # begin now holds the refilled plan's earliest starts
        earliest = finish
        for r in range(n):
            a, b = pred[r, 0], pred[r, 1]
            for p in range(width):
                begin_at = max(earliest[a, p], earliest[b, p])
                begin[r, p] = begin_at
                rooms[p] = finish_by[r, p] - begin_at
            _fit_span(rooms, width, r, fit, one_step, found, taken)
            for p in range(width):
                if found[p] > chosen[r, p]:
                    chosen[r, p] = found[p]
                if taken[p] > durations[r, p]:
                    durations[r, p] = taken[p]
                end = begin[r, p] + durations[r, p]
                earliest[r, p] = end
                if r == 0 or end > total[tile + p]:
                    total[tile + p] = end
        # back to node order; the energies summed node by node as Planner.evaluate's are
        summed[:] = 0.0
        busy[:] = 0.0
        for j in range(n):
            r, node_start = place[j], start[j]
            for p in range(width):
                pick = chosen[r, p]
                out[j, tile + p] = pick
                summed[p] += energy_j[node_start + pick]
                busy[p] += durations[r, p]
        for p in range(width):
            energy[tile + p] = summed[p] + p_block_w * (num_gpus * total[tile + p] - busy[p])


def evaluate(
    choices: npt.NDArray[np.integer[Any]],
    network: Network,
    time_s: FloatArray,
    energy_j: FloatArray,
    p_block_w: float,
    num_gpus: int,
) -> tuple[FloatArray, FloatArray]:
    """Iteration time and energy ``(P,)`` of plans ``choices`` ``(n, P)`` (node order, any
    integer type): ``Planner.evaluate``'s values, without its ``(n, P)`` temporaries."""
    plans = choices.shape[1]
    total, energy = np.zeros(plans), np.empty(plans)
    _evaluate(np.ascontiguousarray(choices, dtype=np.int64), network.order, network.pred,
              network.start, time_s, energy_j, float(p_block_w), int(num_gpus), total,
              energy)  # fmt: skip
    return total, energy


@_compiled
def _evaluate(
    choices: Any,
    order: IntArray,
    pred: IntArray,
    start: IntArray,
    time_s: FloatArray,
    energy_j: FloatArray,
    p_block_w: float,
    num_gpus: int,
    total: FloatArray,
    energy: FloatArray,
) -> None:
    """:func:`evaluate`, ``_TILE`` plans at a time: the longest path in level order, then the
    sums node by node in node order (as ``Planner.evaluate``'s are)."""
    n, plans = choices.shape
    finish = np.empty((n + 1, _TILE))
    summed = np.empty(_TILE)
    busy = np.empty(_TILE)
    for tile in range(0, plans, _TILE):
        width = min(plans, tile + _TILE) - tile
        finish[n, :] = 0.0
        for r in range(n):
            a, b = pred[r, 0], pred[r, 1]
            node = order[r]
            node_start = start[node]
            for p in range(width):
                end = max(finish[a, p], finish[b, p]) + time_s[node_start + choices[node, tile + p]]
                finish[r, p] = end
                if r == 0 or end > total[tile + p]:
                    total[tile + p] = end
        summed[:] = 0.0
        busy[:] = 0.0
        for j in range(n):
            node_start = start[j]
            for p in range(width):
                k = node_start + choices[j, tile + p]
                summed[p] += energy_j[k]
                busy[p] += time_s[k]
        for p in range(width):
            energy[tile + p] = summed[p] + p_block_w * (num_gpus * total[tile + p] - busy[p])


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


def with_transitions(
    time_s: FloatArray,
    energy_j: FloatArray,
    head: tuple[npt.NDArray[np.bool_], FloatArray, FloatArray],
    tail: tuple[npt.NDArray[np.bool_], FloatArray, FloatArray],
    margin_s: float,
) -> tuple[FloatArray, FloatArray]:
    """:func:`perseus.solver.transitions.with_transitions` for ``margin_s > 0``, element by
    element in one compiled loop: the same float operations in the same order, so the same
    values (the frontier's thousand plans of 8,192 instructions: a tenth of the time)."""
    arrays = np.broadcast_arrays(time_s, energy_j, *head, *tail)
    shape = arrays[0].shape
    flat = [np.ascontiguousarray(a).ravel() for a in arrays]
    time, energy = np.empty(flat[0].size), np.empty(flat[0].size)
    t, e, h_higher, h_t, h_e, t_higher, t_t, t_e = flat
    _with_transitions(t, e, h_higher, h_t, h_e, t_higher, t_t, t_e, float(margin_s), time, energy)
    return time.reshape(shape), energy.reshape(shape)


@_inlined
def _share(higher: bool, t_s: float, margin_s: float) -> float:
    """``transitions._share`` of one element."""
    if not higher:
        return 0.0
    return margin_s / t_s if t_s > margin_s else 1.0


@_compiled
def _with_transitions(
    time_s: FloatArray,
    energy_j: FloatArray,
    head_higher: npt.NDArray[np.bool_],
    head_t: FloatArray,
    head_e: FloatArray,
    tail_higher: npt.NDArray[np.bool_],
    tail_t: FloatArray,
    tail_e: FloatArray,
    margin_s: float,
    time: FloatArray,
    energy: FloatArray,
) -> None:
    for i in range(time_s.size):
        t, e = time_s[i], energy_j[i]
        h_t, h_e, t_t, t_e = head_t[i], head_e[i], tail_t[i], tail_e[i]
        w_head = _share(head_higher[i], h_t, margin_s)
        w_tail = _share(tail_higher[i], t_t, margin_s)
        time[i] = t + w_head * (h_t - t) + w_tail * (t_t - t)
        energy[i] = e + w_head * (h_e - e) + w_tail * (t_e - e)
        if w_head + w_tail >= 1.0:
            if head_higher[i] and tail_higher[i]:
                span = h_t + t_t
                time[i] = 2.0 * h_t * t_t / span
                energy[i] = (t_t * h_e + h_t * t_e) / span
            elif head_higher[i]:
                time[i], energy[i] = h_t, h_e
            else:
                time[i], energy[i] = t_t, t_e
