"""Replay a plan on the profile values: the independent check of every stated time and energy.

With a clock-change margin, the instruction with the lower clock of each pair of neighbours on
a GPU runs the margin next to their boundary at the higher clock (see
:mod:`perseus.solver.transitions` for the model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perseus.core.errors import PlanError
from perseus.core.profiles import Profile
from perseus.solver.dag import build_dag
from perseus.solver.schedules import Schedule
from perseus.solver.transitions import (
    BoolArray,
    FloatArray,
    check_margin,
    nearest_option,
    with_transitions,
)

__all__ = ["Replay", "instruction_times_s", "replay"]


@dataclass(frozen=True)
class Replay:
    """Timeline of one iteration under a plan.

    Per-GPU tuples follow ``schedule.order``; ``critical`` marks instructions on a longest path.
    ``durations_s`` are the instructions' durations with their transitions (``finish_s -
    start_s``), ``clock_change_margin_s`` the margin they were computed with.
    """

    time_s: float
    energy_j: float
    busy_s: tuple[float, ...]
    idle_s: tuple[float, ...]
    start_s: tuple[tuple[float, ...], ...]
    finish_s: tuple[tuple[float, ...], ...]
    critical: tuple[tuple[bool, ...], ...]
    durations_s: tuple[tuple[float, ...], ...]
    clock_change_margin_s: float

    @property
    def spans_s(self) -> tuple[float, ...]:
        """Each GPU's span, its first instruction's start to its last's finish (0 without
        instructions): what a rank measures as its iteration."""
        return tuple(
            finish[-1] - start[0] if start else 0.0
            for start, finish in zip(self.start_s, self.finish_s, strict=True)
        )

    def span_energy_j(self, p_block_w: float) -> float:
        """The energy every GPU draws over its own span (:attr:`spans_s`): the iteration's
        energy less the blocking outside the spans (before a GPU's first instruction and
        after its last), what the ranks' energies over their spans add up to."""
        return self.energy_j - p_block_w * sum(self.time_s - s for s in self.spans_s)


def replay(
    profile: Profile,
    schedule: Schedule,
    p_block_w: float,
    frequencies_mhz: Sequence[Sequence[int]],
    *,
    clock_change_margin_s: float = 0.0,
) -> Replay:
    """Run ``schedule`` with the given clocks on the profile values, as soon as possible.

    Energy follows BACKGROUND.md: ``sum_i e_i + p_block_w * (S * T - sum_i t_i)``, where with
    a clock-change margin ``m`` every instruction whose previous or next instruction on its
    GPU (wrapping around the iteration) runs at a higher clock ``h`` runs ``m`` seconds next
    to that boundary at ``h``, doing the share ``w_h = m / t_h`` of its work there:
    ``t' = t + sum_h w_h (t_h - t)`` and ``e' = e + sum_h w_h (e_h - e)``, with ``t_h``,
    ``e_h`` its own time and energy at ``h`` (its nearest measured clock where that one was
    not measured); where ``sum_h w_h >= 1`` it runs wholly at the higher clock(s). See
    :mod:`perseus.solver.transitions`. A margin of 0 or one clock per GPU: no transitions.

    Args:
        profile: Per-stage measurements.
        schedule: The pipeline schedule.
        p_block_w: Blocking power in watts.
        frequencies_mhz: ``frequencies_mhz[g][k]``: the clock of ``schedule.order[g][k]``.
        clock_change_margin_s: How long a raise takes effect before its boundary, and a
            lowering after it.

    Returns:
        The timeline. O(n) for ``n`` instructions.

    Raises:
        PlanError: Shapes do not match the schedule, a clock was not measured, or the margin
            is not a number of seconds in [0, 1).
    """
    times, energies = _costs(profile, schedule, frequencies_mhz, clock_change_margin_s)
    energy = 0.0
    for e in energies.tolist():  # in order, as a plain sum: bit-identical to the margin-free
        energy += e
    dag = build_dag(schedule)
    finish = dag.finish_times(times)
    total = float(finish.max())
    critical = dag.critical(times)
    energy += p_block_w * (schedule.stages * total - float(times.sum()))
    offsets = dag.offsets
    busy = tuple(float(times[offsets[g] : offsets[g + 1]].sum()) for g in range(schedule.stages))

    def per_gpu(values: np.ndarray) -> tuple[tuple, ...]:  # type: ignore[type-arg]
        return tuple(
            tuple(v.item() for v in values[offsets[g] : offsets[g + 1]])
            for g in range(schedule.stages)
        )

    return Replay(
        time_s=total,
        energy_j=energy,
        busy_s=busy,
        idle_s=tuple(total - b for b in busy),
        start_s=per_gpu(finish - times),
        finish_s=per_gpu(finish),
        critical=per_gpu(critical),
        durations_s=per_gpu(times),
        clock_change_margin_s=float(clock_change_margin_s),
    )


def instruction_times_s(
    profile: Profile,
    schedule: Schedule,
    frequencies_mhz: Sequence[Sequence[int]],
    *,
    clock_change_margin_s: float,
) -> tuple[tuple[float, ...], ...]:
    """Each instruction's expected duration under a plan, with its clock-change transitions.

    ``result[g][k]`` is how long ``schedule.order[g][k]`` runs (the same as
    :func:`replay`'s ``durations_s``, without building the timeline): what a rank adds up to
    predict its next boundary. O(n).

    Raises:
        PlanError: As :func:`replay`.
    """
    times, _energies = _costs(profile, schedule, frequencies_mhz, clock_change_margin_s)
    offsets = np.cumsum([0] + [len(seq) for seq in schedule.order])
    return tuple(tuple(times[offsets[g] : offsets[g + 1]].tolist()) for g in range(schedule.stages))


def _costs(
    profile: Profile,
    schedule: Schedule,
    frequencies_mhz: Sequence[Sequence[int]],
    margin_s: float,
) -> tuple[FloatArray, FloatArray]:
    """Every instruction's (duration, energy) with its transitions, GPU by GPU in order."""
    margin_s = check_margin(margin_s)
    if profile.num_stages != schedule.stages:
        raise PlanError(
            f"the plan has {schedule.stages} stages but the profile has {profile.num_stages}"
        )
    if len(frequencies_mhz) != schedule.stages:
        raise PlanError(
            f"frequencies_mhz: expected {schedule.stages} rows, got {len(frequencies_mhz)}"
        )
    scale = 1.0 / schedule.virtual_stages
    own: list[tuple[float, float]] = []
    head: list[tuple[bool, float, float]] = []
    tail: list[tuple[bool, float, float]] = []
    for g, (seq, clocks) in enumerate(zip(schedule.order, frequencies_mhz, strict=True)):
        if len(clocks) != len(seq):
            raise PlanError(f"frequencies_mhz[{g}]: expected {len(seq)} clocks, got {len(clocks)}")
        for k, (inst, clock) in enumerate(zip(seq, clocks, strict=True)):
            try:
                option = profile.option(g, inst.kind, int(clock))
            except (KeyError, TypeError, ValueError):
                raise PlanError(
                    f"frequencies_mhz[{g}][{k}]: {clock!r} MHz is not measured for stage {g} "
                    f"{inst.kind}"
                ) from None
            own.append((option.time_s * scale, option.energy_j * scale))
        for k, inst in enumerate(seq):
            # the previous and next instructions' clocks (wrapping around the iteration), at
            # this instruction's nearest measured clock
            mine = int(clocks[k])
            for neighbour, out in (
                (int(clocks[k - 1]), head),
                (int(clocks[(k + 1) % len(seq)]), tail),
            ):
                near = nearest_option(profile.stages[g][inst.kind], neighbour)
                out.append((neighbour > mine, near.time_s * scale, near.energy_j * scale))
    costs = np.asarray(own, dtype=np.float64).reshape(-1, 2)

    def side(rows: list[tuple[bool, float, float]]) -> tuple[BoolArray, FloatArray, FloatArray]:
        values = np.asarray([(t, e) for _h, t, e in rows], dtype=np.float64).reshape(-1, 2)
        higher = np.asarray([h for h, _t, _e in rows], dtype=np.bool_)
        return higher, values[:, 0], values[:, 1]

    return with_transitions(costs[:, 0], costs[:, 1], side(head), side(tail), margin_s)
