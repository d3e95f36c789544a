"""Clock changes that can land: no run of one clock shorter than the clock-change delay.

A rank's clock controller (:mod:`perseus.client.clocks.controller`) issues each planned clock
change its measured latency ahead of the boundary it serves, and the changes are serialised
(NVML's set call blocks until the clock is in effect): a change issued before the previous one
landed lands late, and one whose successor is due no later is dropped. So a plan whose changes
follow each other faster than the delay runs at other clocks than planned. This module makes
every plan's changes far enough apart, and the plan's stated time and energy then come from the
replay of what it really asks for.

On each GPU's instruction order (wrapping around the iteration, as
:mod:`perseus.solver.transitions` treats it), a *run* is a maximal stretch of consecutive
instructions at one clock; its *span* is the time from its first instruction's start to the
next run's first instruction's start on the replayed timeline (idle time included; the next
iteration starts at the iteration time). With ``L`` the delay and ``m`` the clock-change
margin, the change into a run is issued at its boundary ``b - m - L`` (a raise) or
``b + m - L`` (a lowering), and likewise the change out of it, so the two are issued at least
``L`` apart when the span is at least::

    L + m * (s_in - s_out)      s = -1 for a raise, +1 for a lowering

(``L + 2m`` for a run below both neighbours, ``L - 2m`` above both, ``L`` otherwise). A
shorter run is merged:

- a run below a neighbour is raised to the lower of its higher neighbours' clocks (it joins
  that run);
- a run above both neighbours extends into the run after it: that run's instructions that
  start within the required span (at least its first) are raised to the run's clock.

Only raises: on a profile where a higher clock is never slower, no instruction lengthens, so a
merged plan is never slower than the plan it came from. An instruction is raised to the lowest
clock measured for it at or above the target (its highest measured one where none is), so
every clock stays one its instruction was measured at. Raising shortens instructions and moves
starts, so the merge repeats on the new timeline until no run is short or no raise is left;
every round raises at least one instruction of each plan it touches, so it ends.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.core.errors import PlanError
from perseus.solver.dag import PipelineDag
from perseus.solver.transitions import ClockTables, plan_costs

__all__ = ["check_delay", "merge_short_runs", "short_runs"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_CELLS = 1 << 21
"""(instruction, plan) cells per batch of plans merged side by side."""
_RTOL = 1e-9
"""A span this close to its requirement (relatively) counts as long enough."""


def check_delay(delay_s: float) -> float:
    """``delay_s`` as a float, checked: finite, ``>= 0`` and ``< 1`` second.

    Raises:
        PlanError: Any other value.
    """
    if isinstance(delay_s, bool) or not isinstance(delay_s, int | float):
        raise PlanError(f"clock-change delay: must be a number of seconds, got {delay_s!r}")
    if not (math.isfinite(delay_s) and 0 <= delay_s < 1):
        raise PlanError(
            f"clock-change delay: must be a number of seconds >= 0 and < 1, got {delay_s}"
        )
    return float(delay_s)


def merge_short_runs(
    tables: ClockTables,
    dag: PipelineDag,
    frequencies_mhz: npt.NDArray[np.integer],
    margin_s: float,
    delay_s: float,
    compiled: bool = False,
) -> IntArray:
    """The plans with every run of one clock long enough for its changes to land in turn.

    Args:
        tables: The profile's clock tables (:func:`~perseus.solver.transitions.clock_tables`).
        dag: The schedule's DAG.
        frequencies_mhz: ``(n, P)`` plans node by node (every clock measured for its
            instruction); not modified.
        margin_s: The clock-change margin the timeline is replayed with.
        delay_s: The clock-change delay; 0 returns the plans as they are.
        compiled: Replay with the compiled transitions (see
            :func:`~perseus.solver.transitions.plan_costs`).

    Returns:
        ``(n, P)`` merged plans: each clock the same or higher.

    Complexity: O(n * P) per round; a round per merge step a plan still needs (a few on the
    schedules measured: interleaved and zero-bubble plans of 8 x 48 took 3-6).
    """
    plans = np.array(frequencies_mhz, dtype=np.int64, copy=True)
    if plans.ndim != 2:
        raise ValueError(f"plans must be (instructions, plans), got shape {plans.shape}")
    if delay_s == 0 or plans.size == 0:
        return plans
    up = _at_or_above(tables)
    width = max(1, _CELLS // max(dag.size, 1))
    for lo in range(0, plans.shape[1], width):
        active = np.arange(lo, min(lo + width, plans.shape[1]))
        while active.size:
            current = plans[:, active]
            target = _targets(tables, dag, current, margin_s, delay_s, compiled)
            raised = np.where(target > 0, _measured(tables, up, dag, target), current)
            raised = np.maximum(raised, current)
            moved = (raised != current).any(axis=0)
            plans[:, active] = raised
            active = active[moved]
    return plans


def short_runs(
    tables: ClockTables,
    dag: PipelineDag,
    frequencies_mhz: npt.NDArray[np.integer],
    margin_s: float,
    delay_s: float,
) -> IntArray:
    """How many runs of each ``(n, P)`` plan are shorter than their changes need. O(n * P)."""
    plans = np.asarray(frequencies_mhz, dtype=np.int64)
    short = _short(tables, dag, plans, margin_s, delay_s, False)
    return np.asarray(short.sum(axis=0), dtype=np.int64)


def _timeline(
    tables: ClockTables, dag: PipelineDag, plans: IntArray, margin_s: float, compiled: bool
) -> tuple[FloatArray, FloatArray]:
    """``(starts (n, P), iteration times (P,))`` of the plans replayed with transitions."""
    durations, _ = plan_costs(tables, dag, plans, margin_s, compiled)
    finish = dag.finish_times(durations)
    return finish - durations, finish.max(axis=0)


class _Runs:
    """The runs of one GPU's clocks ``c`` (``(L, P)``), every quantity per position."""

    def __init__(self, clocks: IntArray, start: FloatArray, total: FloatArray) -> None:
        length = clocks.shape[0]
        pos = np.arange(length)[:, None]
        self.before = np.roll(clocks, 1, axis=0)  # the previous position's clock, wrapping
        self.change = clocks != self.before  # a run starts here
        none = 2 * length
        marks = np.where(self.change, pos, none)
        from_here = np.minimum.accumulate(marks[::-1], axis=0)[::-1]  # first start >= k
        after = np.concatenate([from_here[1:], np.full((1, clocks.shape[1]), none)])
        # the next run's first position, past the end: in the next iteration (+ length)
        nxt = np.where(after < none, after, from_here[0] + length)
        self.next = np.minimum(nxt, 2 * length - 1)
        latest = np.maximum.accumulate(np.where(self.change, pos, -1), axis=0)
        self.first = np.where(latest >= 0, latest, latest[-1])  # the run each position is in
        ext = np.concatenate([start, start + total])
        self.span = np.take_along_axis(ext, self.next, axis=0) - start
        self.out = self.next % length  # the next run's first position in this iteration
        self.after = np.take_along_axis(clocks, self.out, axis=0)  # the next run's clock


def _required(runs: _Runs, clocks: IntArray, margin_s: float, delay_s: float) -> FloatArray:
    """Each run's required span at its first position (see the module)."""
    into = np.where(clocks > runs.before, -1.0, 1.0)
    out = np.where(runs.after > clocks, -1.0, 1.0)
    return np.asarray(delay_s + margin_s * (into - out), dtype=np.float64)


@dataclass(frozen=True)
class _Gpu:
    """One GPU's instructions ``a:b`` on the plans' replayed timeline."""

    a: int
    b: int
    clocks: IntArray  # (b - a, P)
    start: FloatArray  # (b - a, P)
    total: FloatArray  # (P,): iteration times
    runs: _Runs
    need: FloatArray  # each run's required span, at its first position
    short: BoolArray  # the first positions of the runs too short for their changes


def _gpus(
    tables: ClockTables,
    dag: PipelineDag,
    plans: IntArray,
    margin_s: float,
    delay_s: float,
    compiled: bool,
) -> Iterator[_Gpu]:
    """Each GPU with two instructions or more, on the plans' replayed timeline."""
    start, total = _timeline(tables, dag, plans, margin_s, compiled)
    for g in range(dag.schedule.stages):
        a, b = int(dag.offsets[g]), int(dag.offsets[g + 1])
        if b - a < 2:
            continue
        clocks = plans[a:b]
        runs = _Runs(clocks, start[a:b], total)
        need = _required(runs, clocks, margin_s, delay_s)
        short = runs.change & (runs.span < need * (1 - _RTOL))
        yield _Gpu(a, b, clocks, start[a:b], total, runs, need, short)


def _short(
    tables: ClockTables,
    dag: PipelineDag,
    plans: IntArray,
    margin_s: float,
    delay_s: float,
    compiled: bool,
) -> BoolArray:
    """``(n, P)``: the first positions of the runs too short for their changes."""
    short = np.zeros(plans.shape, dtype=np.bool_)
    for gpu in _gpus(tables, dag, plans, margin_s, delay_s, compiled):
        short[gpu.a : gpu.b] = gpu.short
    return short


def _targets(
    tables: ClockTables,
    dag: PipelineDag,
    plans: IntArray,
    margin_s: float,
    delay_s: float,
    compiled: bool,
) -> IntArray:
    """``(n, P)``: the clock each instruction is raised towards this round; 0: none."""
    target = np.zeros(plans.shape, dtype=np.int64)
    for gpu in _gpus(tables, dag, plans, margin_s, delay_s, compiled):
        a, b, clocks, s, total = gpu.a, gpu.b, gpu.clocks, gpu.start, gpu.total
        runs, need, short = gpu.runs, gpu.need, gpu.short
        if not short.any():
            continue
        before, after = runs.before, runs.after
        up_before, up_after = before > clocks, after > clocks
        # a run below a neighbour joins the lower of its higher neighbours
        join = np.where(
            up_before & up_after,
            np.minimum(before, after),
            np.where(up_before, before, np.where(up_after, after, 0)),
        )
        join = np.where(short, join, 0)
        own = np.take_along_axis(join, runs.first, axis=0)
        # a run above both extends into the next run: the positions whose previous run is
        # such a one, its first always, the rest where they start within the required span
        peak = short & ~(up_before | up_after)
        prev_first = np.take_along_axis(runs.first, (runs.first - 1) % (b - a), axis=0)
        from_peak = np.take_along_axis(peak, prev_first, axis=0)
        pos = np.arange(b - a)[:, None]
        shifted = s + np.where(pos < prev_first, total, 0.0)  # the next iteration's, wrapped
        reach = np.take_along_axis(s + need, prev_first, axis=0)
        extend = from_peak & ((pos == runs.first) | (shifted < reach))
        peak_clock = np.take_along_axis(clocks, prev_first, axis=0)
        target[a:b] = np.maximum(own, np.where(extend, peak_clock, 0))
    return target


def _at_or_above(tables: ClockTables) -> IntArray:
    """``(C, F)``: for each cost class and clock column, the column of the lowest clock
    measured for the class at or above it (the class's highest measured one where none)."""
    width = tables.measured.shape[1]
    cols = np.arange(width)
    marks = np.where(tables.measured, cols[None, :], width)
    up = np.minimum.accumulate(marks[:, ::-1], axis=1)[:, ::-1]
    top = np.where(tables.measured, cols[None, :], -1).max(axis=1, initial=-1)
    return np.asarray(np.where(up < width, up, np.maximum(top, 0)[:, None]), dtype=np.int64)


def _measured(tables: ClockTables, up: IntArray, dag: PipelineDag, target: IntArray) -> IntArray:
    """Each target clock (a profile clock, or 0) as the lowest measured for its instruction at
    or above it."""
    cls = dag.cost_class[:, None]
    col = np.minimum(tables.index(target), up.shape[1] - 1)
    return np.asarray(tables.clocks_mhz[up[cls, col]], dtype=np.int64)
