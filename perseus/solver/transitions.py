"""Clock-change transitions: the seconds next to a boundary that run at the higher clock.

A rank applies planned clock changes asymmetrically, so that no instruction starts at a
clock lower than its own. Between consecutive instructions ``k`` and ``n`` on one GPU (each
GPU's order wraps around: its last instruction is followed by its first of the next
iteration) with different clocks:

- a *raise* (``n`` higher) is issued ahead, to take effect ``margin`` seconds before the
  boundary, so the last ``margin`` seconds of ``k`` run at ``n``'s clock (a *tail*);
- a *lowering* (``n`` lower) is issued at the boundary and takes effect ``margin`` seconds
  after it, so the first ``margin`` seconds of ``n`` run at ``k``'s clock (a *head*).

Either way the instruction with the lower clock of the pair runs ``margin`` seconds next to
the boundary at the higher clock (see :data:`perseus.core.defaults.CLOCK_CHANGE_MARGIN_S`); an
instruction between two higher-clocked neighbours gets both a head and a tail.

The model, per instruction ``x`` (its own stage and kind throughout): ``t``, ``e`` are ``x``'s
time and energy at its own clock; for each boundary whose neighbour runs at a higher clock
``h``, ``t_h``, ``e_h`` are ``x``'s time and energy at ``h`` (the nearest measured clock of
``x``'s kind where ``h`` was not measured, the higher of two equally near), all after the
interleaved ``1/V`` scaling. In ``margin`` seconds at ``h``, ``x`` does the share
``w_h = margin / t_h`` of its work, so, summing over its (zero, one or two) higher
neighbours::

    t' = t + sum_h w_h * (t_h - t)      (x runs t * (1 - sum_h w_h) s at its own clock)
    e' = e + sum_h w_h * (e_h - e)

while ``W = sum_h w_h < 1``. Once ``W >= 1`` the head and the tail would cover all of ``x``:
it runs wholly at the higher clock(s), each for the same ``s = margin / W`` seconds (the head
and the tail shrink alike until they meet), so ``t' = sum_h (w_h / W) * t_h`` and
``e' = sum_h (w_h / W) * e_h`` (with one higher neighbour exactly ``t_h``, ``e_h``). Both
forms agree at ``W = 1``.

On a profile where a higher clock is never slower, no instruction takes longer than at its
own clock, so no plan's iteration is slower than without transitions; it usually costs more
energy. Where a profile measured an instruction slower at a higher clock (noise, or a power
limit), the model follows the profile and that instruction lengthens; the stated times
include it. With equal clocks, or a margin of 0, ``t' = t`` and ``e' = e`` exactly. Blocking
power then applies to the idle time of the timeline built from the adjusted durations.

An adjusted instruction is a convex mix of measured options of its own (at most three), so
the convex relaxation's lower bound still holds for adjusted plans.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.core.errors import PlanError
from perseus.core.profiles import Option, Profile
from perseus.solver.dag import PipelineDag
from perseus.solver.schedules import Schedule

__all__ = [
    "ClockTables",
    "check_margin",
    "clock_tables",
    "evaluate_plans",
    "nearest_option",
    "neighbours_on_gpu",
    "plan_costs",
    "with_transitions",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def check_margin(margin_s: float) -> float:
    """``margin_s`` as a float, checked: finite, ``>= 0`` and ``< 1`` second.

    Raises:
        PlanError: Any other value.
    """
    if isinstance(margin_s, bool) or not isinstance(margin_s, int | float):
        raise PlanError(f"clock-change margin: must be a number of seconds, got {margin_s!r}")
    if not (math.isfinite(margin_s) and 0 <= margin_s < 1):
        raise PlanError(
            f"clock-change margin: must be a number of seconds >= 0 and < 1, got {margin_s}"
        )
    return float(margin_s)


# clock_tables' sort key: distance first, then the higher clock (clocks stay far below it)
_KEY_SCALE = 1 << 24
# ClockTables.index looks clocks up in a table of every MHz up to this, a take instead of a
# binary search, where the clocks are many
_LOOKUP_MHZ = 1 << 16


def nearest_option(options: Iterable[Option], frequency_mhz: int) -> Option:
    """The option measured nearest ``frequency_mhz`` (the higher of two equally near)."""
    return min(options, key=lambda o: (abs(o.frequency_mhz - frequency_mhz), -o.frequency_mhz))


def neighbours_on_gpu(dag: PipelineDag) -> tuple[IntArray, IntArray]:
    """``(previous, following)``: the node before and after each node on its GPU, wrapping
    around (the first's previous is the GPU's last, of the iteration before; the last's
    following is the GPU's first, of the next iteration). O(n)."""
    previous = np.arange(-1, dag.size - 1, dtype=np.int64)
    following = np.arange(1, dag.size + 1, dtype=np.int64)
    for g in range(dag.schedule.stages):
        first, end = int(dag.offsets[g]), int(dag.offsets[g + 1])
        if end > first:
            previous[first] = end - 1
            following[end - 1] = first
    return previous, following


@dataclass(frozen=True, slots=True)
class ClockTables:
    """Every cost class's time and energy at every clock the profile names.

    Attributes:
        clocks_mhz: ``(F,)`` every clock of the profile, ascending.
        time_s: ``(C, F)``: cost class ``c`` (see :class:`~perseus.solver.dag.PipelineDag`) at
            clock ``clocks_mhz[f]``,
            scaled by ``1/V``; at its nearest measured clock where that one was not measured
            (the higher of two equally near).
        energy_j: ``(C, F)``, the same way.
        measured: ``(C, F)``: whether class ``c`` was measured at that clock.
    """

    clocks_mhz: IntArray
    time_s: FloatArray
    energy_j: FloatArray
    measured: npt.NDArray[np.bool_]

    def index(self, frequency_mhz: npt.ArrayLike) -> IntArray:
        """Column of each clock in the tables (the clocks must be the profile's)."""
        clocks = np.asarray(frequency_mhz, dtype=np.int64)
        top = int(self.clocks_mhz[-1]) if len(self.clocks_mhz) else 0
        if clocks.size < 4 * top or top > _LOOKUP_MHZ:
            return np.asarray(np.searchsorted(self.clocks_mhz, clocks), dtype=np.int64)
        # many clocks (a frontier's plans): one table of every MHz up to the top one and a
        # take, a tenth of a binary search's time; past the top, the column after the last
        lookup = np.searchsorted(self.clocks_mhz, np.arange(top + 2, dtype=np.int64))
        return np.asarray(lookup.take(np.clip(clocks, 0, top + 1)), dtype=np.int64)


def clock_tables(profile: Profile, schedule: Schedule) -> ClockTables:
    """Build the :class:`ClockTables` of ``schedule`` on ``profile``. O(C * F log F)."""
    scale = 1.0 / schedule.virtual_stages
    clocks = sorted(
        {o.frequency_mhz for stage in profile.stages for opts in stage.values() for o in opts}
    )
    classes = [
        profile.options(g, kind) for g in range(profile.num_stages) for kind in schedule.kinds
    ]
    clock_arr = np.asarray(clocks, dtype=np.int64)
    time = np.empty((len(classes), len(clocks)))
    energy = np.empty_like(time)
    measured = np.zeros(time.shape, dtype=np.bool_)
    for c, options in enumerate(classes):
        # nearest_option for every clock at once: the least distance, then the higher clock
        freq = np.asarray([o.frequency_mhz for o in options], dtype=np.int64)
        key = np.abs(freq[None, :] - clock_arr[:, None]) * _KEY_SCALE - freq[None, :]
        pick = np.argmin(key, axis=1)
        time[c] = np.asarray([o.time_s for o in options])[pick] * scale
        energy[c] = np.asarray([o.energy_j for o in options])[pick] * scale
        measured[c] = freq[pick] == clock_arr
    return ClockTables(clock_arr, time, energy, measured)


def with_transitions(
    time_s: FloatArray,
    energy_j: FloatArray,
    head: tuple[BoolArray, FloatArray, FloatArray],
    tail: tuple[BoolArray, FloatArray, FloatArray],
    margin_s: float,
) -> tuple[FloatArray, FloatArray]:
    """Adjusted durations and energies (see the module's docstring), elementwise.

    Args:
        time_s, energy_j: Each instruction at its own clock.
        head: ``(higher, t_h, e_h)``: whether the previous instruction on the GPU runs at a
            higher clock, and this instruction's time and energy at that clock (any finite
            values where it does not).
        tail: The same for the next instruction.
        margin_s: How long each higher clock lasts next to its boundary.

    Returns:
        ``(t', e')``; exactly ``(t, e)`` where neither neighbour is higher or the margin is 0.
    """
    head_higher, head_t, head_e = head
    tail_higher, tail_t, tail_e = tail
    if margin_s == 0:
        return np.array(time_s, dtype=np.float64), np.array(energy_j, dtype=np.float64)
    w_head = _share(head_higher, head_t, margin_s)
    w_tail = _share(tail_higher, tail_t, margin_s)
    time = time_s + w_head * (head_t - time_s) + w_tail * (tail_t - time_s)
    energy = energy_j + w_head * (head_e - energy_j) + w_tail * (tail_e - energy_j)
    whole = w_head + w_tail >= 1.0  # all of it at the higher clock(s), the same seconds at each
    if whole.any():
        both = head_higher & tail_higher & whole
        one_t = np.where(head_higher, head_t, tail_t)
        one_e = np.where(head_higher, head_e, tail_e)
        # Both higher: h t / (h + t) seconds at each (the work's shares add up to 1), in
        # products and one sum, so that tiny times do not overflow a quotient.
        span = np.where(both, head_t + tail_t, 1.0)
        both_t = np.multiply(2.0 * head_t, tail_t, out=np.zeros_like(span), where=both) / span
        both_e = (
            np.multiply(tail_t, head_e, out=np.zeros_like(span), where=both)
            + np.multiply(head_t, tail_e, out=np.zeros_like(span), where=both)
        ) / span
        time = np.where(whole, np.where(both, both_t, one_t), time)
        energy = np.where(whole, np.where(both, both_e, one_e), energy)
    return np.asarray(time, dtype=np.float64), np.asarray(energy, dtype=np.float64)


def _share(higher: BoolArray, t_s: FloatArray, margin_s: float) -> FloatArray:
    """The share of an instruction's work its neighbour's higher clock does in ``margin_s``
    (``t_s``: the whole at that clock): ``margin_s / t_s``, 1 where that reaches 1 (all of
    it), 0 where the neighbour is not higher; no quotient where it is not needed (a tiny
    time would overflow it)."""
    higher, t_s = np.broadcast_arrays(higher, t_s)
    share = np.zeros(t_s.shape)
    part = higher & (t_s > margin_s)
    np.divide(margin_s, t_s, out=share, where=part)
    share[higher & ~part] = 1.0
    return share


def plan_costs(
    tables: ClockTables,
    dag: PipelineDag,
    frequencies_mhz: npt.NDArray[np.integer],
    margin_s: float,
    compiled: bool = False,
) -> tuple[FloatArray, FloatArray]:
    """Adjusted ``(durations, energies)`` of plans given node by node, ``(n,)`` or ``(n, P)``.

    The clocks must be measured for their own instructions (the frontier's always are).
    ``compiled``: adjust them in :func:`perseus.solver.kernels.with_transitions` (the same
    values; for callers whose planner already runs compiled). O(n * P).
    """
    cls = dag.cost_class.reshape((-1,) + (1,) * (frequencies_mhz.ndim - 1))
    clocks = np.asarray(frequencies_mhz, dtype=np.int64)
    own = tables.index(clocks)
    width = tables.time_s.shape[1]
    if own.size and int(own.max()) >= width:
        raise IndexError(f"a clock past the profile's highest, {int(tables.clocks_mhz[-1])} MHz")
    previous, following = neighbours_on_gpu(dag)
    # flat positions in the tables; a neighbour's clock's column is its own entry of ``own``
    row = cls * width
    at, at_before, at_after = row + own, row + own[previous], row + own[following]
    time_s, energy_j = tables.time_s.ravel(), tables.energy_j.ravel()
    adjusted = with_transitions
    if compiled and margin_s > 0:
        # loaded already: the compiled planner imported it
        from perseus.solver.kernels import with_transitions as adjusted
    return adjusted(
        time_s.take(at),
        energy_j.take(at),
        (clocks[previous] > clocks, time_s.take(at_before), energy_j.take(at_before)),
        (clocks[following] > clocks, time_s.take(at_after), energy_j.take(at_after)),
        margin_s,
    )


def evaluate_plans(
    tables: ClockTables,
    dag: PipelineDag,
    p_block_w: float,
    frequencies_mhz: npt.NDArray[np.integer],
    margin_s: float,
    compiled: bool = False,
) -> tuple[FloatArray, FloatArray]:
    """Iteration time and energy of ``(n, P)`` plans with their transitions (``compiled``: see
    :func:`plan_costs`). O(n * P)."""
    durations, energies = plan_costs(tables, dag, frequencies_mhz, margin_s, compiled)
    total = dag.iteration_time(durations)
    energy = energies.sum(axis=0) + p_block_w * (dag.schedule.stages * total - durations.sum(0))
    return np.asarray(total, dtype=np.float64), np.asarray(energy, dtype=np.float64)
