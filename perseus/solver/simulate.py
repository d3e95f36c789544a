"""Replay a plan on the profile values: the independent check of every stated time and energy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perseus.errors import PlanError
from perseus.solver.dag import build_dag
from perseus.solver.profiles import Profile
from perseus.solver.schedules import Schedule

__all__ = ["Replay", "replay"]


@dataclass(frozen=True)
class Replay:
    """Timeline of one iteration under a plan.

    Per-GPU tuples follow ``schedule.order``; ``critical`` marks instructions on a longest path.
    """

    time_s: float
    energy_j: float
    busy_s: tuple[float, ...]
    idle_s: tuple[float, ...]
    start_s: tuple[tuple[float, ...], ...]
    finish_s: tuple[tuple[float, ...], ...]
    critical: tuple[tuple[bool, ...], ...]


def replay(
    profile: Profile,
    schedule: Schedule,
    p_block_w: float,
    frequencies_mhz: Sequence[Sequence[int]],
) -> Replay:
    """Run ``schedule`` with the given clocks on the profile values, as soon as possible.

    Energy follows BACKGROUND.md: ``sum_i e_i + p_block_w * (S * T - sum_i t_i)``.

    Raises:
        PlanError: Shapes do not match the schedule, or a clock was not measured.
    """
    if profile.num_stages != schedule.stages:
        raise PlanError(
            f"the plan has {schedule.stages} stages but the profile has {profile.num_stages}"
        )
    if len(frequencies_mhz) != schedule.stages:
        raise PlanError(
            f"frequencies_mhz: expected {schedule.stages} rows, got {len(frequencies_mhz)}"
        )
    scale = 1.0 / schedule.virtual_stages
    durations: list[float] = []
    energy = 0.0
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
            durations.append(option.time_s * scale)
            energy += option.energy_j * scale
    dag = build_dag(schedule)
    times = np.asarray(durations)
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
    )
