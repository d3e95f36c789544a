"""Clock-change transitions: the tail of an instruction that runs at the next one's clock.

A rank issues each planned clock change ahead of time, so that it takes effect ``margin``
seconds before the boundary between instruction ``k`` and the next instruction ``n`` on the
same GPU (see :data:`perseus.defaults.CLOCK_CHANGE_MARGIN_S`). Where their clocks differ, the
last ``margin`` seconds of ``k`` therefore run at ``n``'s clock. Each GPU's order wraps
around: its last instruction is followed by its first of the next iteration, and its tail
changes clock too.

The model, per instruction ``k`` (its own stage and kind throughout): ``t``, ``e`` are ``k``'s
time and energy at its own clock, ``t_n``, ``e_n`` at the next instruction's clock (the
nearest measured clock of ``k``'s kind where that one was not measured, the higher of two
equally near), both after the interleaved ``1/V`` scaling. In ``margin`` seconds at the next
clock ``k`` does the share ``w = min(1, margin / t_n)`` of its work, so::

    t' = t + w * (t_n - t)        (= t + margin * (1 - t / t_n) while margin < t_n)
    e' = e + w * (e_n - e)        (= (t' - margin) * e / t + margin * e_n / t_n)

and ``k`` runs at the next clock throughout (``t' = t_n``, ``e' = e_n``) once
``margin >= t_n``. A raise makes ``k``'s tail faster and (usually) costlier, a lowering
slower. With equal clocks, or a margin of 0, ``t' = t`` and ``e' = e`` exactly. Blocking power
then applies to the idle time of the timeline built from the adjusted durations.

A tail mixes two measured options of one instruction, so an adjusted instruction lies on the
segment between them: the convex relaxation's lower bound still holds for adjusted plans.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.errors import PlanError
from perseus.solver.dag import PipelineDag
from perseus.solver.profiles import INSTRUCTIONS, Option, Profile
from perseus.solver.schedules import Schedule

__all__ = [
    "ClockTables",
    "check_margin",
    "clock_tables",
    "evaluate_plans",
    "nearest_option",
    "next_on_gpu",
    "plan_costs",
    "repair_tails",
    "with_tails",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


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


def nearest_option(options: Iterable[Option], frequency_mhz: int) -> Option:
    """The option measured nearest ``frequency_mhz`` (the higher of two equally near)."""
    return min(options, key=lambda o: (abs(o.frequency_mhz - frequency_mhz), -o.frequency_mhz))


def next_on_gpu(dag: PipelineDag) -> IntArray:
    """The node that follows each node on its GPU; the last one's is the GPU's first (the
    next iteration's). O(n)."""
    following = np.arange(1, dag.size + 1, dtype=np.int64)
    for g in range(dag.schedule.stages):
        first, end = int(dag.offsets[g]), int(dag.offsets[g + 1])
        if end > first:
            following[end - 1] = first
    return following


@dataclass(frozen=True, slots=True)
class ClockTables:
    """Every cost class's time and energy at every clock the profile names.

    Attributes:
        clocks_mhz: ``(F,)`` every clock of the profile, ascending.
        time_s: ``(C, F)``: class ``c`` (``2 * gpu + kind``) at clock ``clocks_mhz[f]``,
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
        return np.asarray(
            np.searchsorted(self.clocks_mhz, np.asarray(frequency_mhz, dtype=np.int64)),
            dtype=np.int64,
        )


def clock_tables(profile: Profile, schedule: Schedule) -> ClockTables:
    """Build the :class:`ClockTables` of ``schedule`` on ``profile``. O(C * F log F)."""
    scale = 1.0 / schedule.virtual_stages
    clocks = sorted(
        {o.frequency_mhz for stage in profile.stages for opts in stage.values() for o in opts}
    )
    classes = [stage[kind] for stage in profile.stages for kind in INSTRUCTIONS]
    time = np.empty((len(classes), len(clocks)))
    energy = np.empty_like(time)
    measured = np.zeros(time.shape, dtype=np.bool_)
    for c, options in enumerate(classes):
        for f, clock in enumerate(clocks):
            option = nearest_option(options, clock)
            time[c, f] = option.time_s * scale
            energy[c, f] = option.energy_j * scale
            measured[c, f] = option.frequency_mhz == clock
    return ClockTables(np.asarray(clocks, dtype=np.int64), time, energy, measured)


def with_tails(
    time_s: FloatArray,
    energy_j: FloatArray,
    next_time_s: FloatArray,
    next_energy_j: FloatArray,
    margin_s: float,
) -> tuple[FloatArray, FloatArray]:
    """Adjusted durations and energies (see the module's docstring), elementwise.

    Args:
        time_s, energy_j: Each instruction at its own clock.
        next_time_s, next_energy_j: The same instruction at the next instruction's clock.
        margin_s: How long before the boundary the next clock takes effect.

    Returns:
        ``(t', e')``; exactly ``(t, e)`` where the clocks are equal or the margin is 0.
    """
    share = margin_s / next_time_s
    whole = share >= 1.0  # all of it at the next clock: exactly the next option
    return (
        np.where(whole, next_time_s, time_s + share * (next_time_s - time_s)),
        np.where(whole, next_energy_j, energy_j + share * (next_energy_j - energy_j)),
    )


def plan_costs(
    tables: ClockTables,
    dag: PipelineDag,
    frequencies_mhz: npt.NDArray[np.integer],
    margin_s: float,
) -> tuple[FloatArray, FloatArray]:
    """Adjusted ``(durations, energies)`` of plans given node by node, ``(n,)`` or ``(n, P)``.

    The clocks must be measured for their own instructions (the frontier's always are).
    O(n * P).
    """
    cls = dag.cost_class.reshape((-1,) + (1,) * (frequencies_mhz.ndim - 1))
    own = tables.index(frequencies_mhz)
    following = tables.index(frequencies_mhz[next_on_gpu(dag)])
    return with_tails(
        tables.time_s[cls, own],
        tables.energy_j[cls, own],
        tables.time_s[cls, following],
        tables.energy_j[cls, following],
        margin_s,
    )


def evaluate_plans(
    tables: ClockTables,
    dag: PipelineDag,
    p_block_w: float,
    frequencies_mhz: npt.NDArray[np.integer],
    margin_s: float,
) -> tuple[FloatArray, FloatArray]:
    """Iteration time and energy of ``(n, P)`` plans with their transitions. O(n * P)."""
    durations, energies = plan_costs(tables, dag, frequencies_mhz, margin_s)
    total = dag.iteration_time(durations)
    energy = energies.sum(axis=0) + p_block_w * (dag.schedule.stages * total - durations.sum(0))
    return np.asarray(total, dtype=np.float64), np.asarray(energy, dtype=np.float64)


# Rounds of :func:`repair_tails`; each removes every slowing tail on a longest path of every
# late plan at once, and one to four rounds sufficed on the demo and the shared profiles.
REPAIR_ROUNDS = 32


def repair_tails(
    tables: ClockTables,
    dag: PipelineDag,
    frequencies_mhz: IntArray,
    targets_s: FloatArray,
    margin_s: float,
    rounds: int = REPAIR_ROUNDS,
) -> IntArray:
    """Raise clocks until the plans' transitions no longer make them later than ``targets_s``.

    A lowering makes the tail of the instruction before it slower; on a longest path that
    delays the iteration. Each round takes every plan still later than its target, finds the
    instructions on a longest path that their tails slow down, and raises the clock of the
    instruction after each to the lowest clock measured for it that is at least the slowed
    instruction's own (so that tail runs at its own pace; with clocks that never slow an
    instruction down, this only shortens durations). The plans that are late after ``rounds``
    stay as they are at that point: the caller states what they take.

    Args:
        tables: The profile's clock tables.
        dag: The schedule's DAG.
        frequencies_mhz: ``(n, P)`` plans, node by node.
        targets_s: ``(P,)`` the iteration time each plan should keep.
        margin_s: The clock-change margin.
        rounds: At most this many rounds.

    Returns:
        The repaired ``(n, P)`` plans (a new array). O(rounds * n * P).
    """
    plans = np.array(frequencies_mhz, dtype=np.int64, copy=True)
    following = next_on_gpu(dag)
    classes, columns = tables.measured.shape
    # raise_to[c, f]: the column of class c's lowest measured clock >= clocks_mhz[f] (its
    # highest where none is)
    raise_to = np.empty((classes, columns), dtype=np.int64)
    for c in range(classes):
        measured = np.flatnonzero(tables.measured[c])
        at = np.searchsorted(measured, np.arange(columns))
        raise_to[c] = measured[np.minimum(at, len(measured) - 1)]
    cls = dag.cost_class[:, None]
    for _ in range(rounds):
        own = tables.index(plans)
        durations, _energies = plan_costs(tables, dag, plans, margin_s)
        finish = dag.finish_times(durations)
        total = finish.max(axis=0)
        late = total > targets_s * (1 + 1e-12)
        if not late.any():
            break
        latest = dag.latest_starts(durations, total) + durations
        critical = np.abs(latest - finish) <= 1e-9 * np.maximum(total, 1.0)
        slowed = durations > tables.time_s[cls, own] * (1 + 1e-12)
        rows, cols = np.nonzero(critical & slowed & late[None, :])
        if rows.size == 0:
            break
        after = following[rows]
        lifted = tables.clocks_mhz[raise_to[dag.cost_class[after], own[rows, cols]]]
        plans[after, cols] = np.maximum(plans[after, cols], lifted)
    return plans
