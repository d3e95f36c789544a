"""Reference plans that today's tools reach (see :func:`baselines_at`), and the default
plan's iteration time: the no-slowdown reference.

The type :class:`~perseus.core.baselines.Baseline` and the keys
:class:`~perseus.core.baselines.BaselineKey` live on the ground floor (beside their labels, in a
module of the standard library only, so the command line names them before importing the solver).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from perseus.core.baselines import Baseline, BaselineKey
from perseus.core.profiles import Profile
from perseus.solver.dag import PipelineDag, build_dag
from perseus.solver.schedules import Schedule, per_gpu
from perseus.solver.transitions import (
    ClockTables,
    check_margin,
    clock_tables,
    neighbours_on_gpu,
    with_transitions,
)

__all__ = ["Baseline", "BaselineKey", "baselines_at", "default_time"]

FloatArray = npt.NDArray[np.float64]


def default_time(profile: Profile, schedule: Schedule, *, dag: PipelineDag | None = None) -> float:
    """Iteration time of the default plan: every instruction at the profile's highest clock.

    That is what a GPU left alone runs, so it is the reference of "no slowdown".
    """
    dag = dag or build_dag(schedule)
    scale = 1.0 / schedule.virtual_stages
    durations = np.empty(dag.size)
    kinds = schedule.kinds
    for c in range(len(kinds) * schedule.stages):
        options = profile.options(c // len(kinds), kinds[c % len(kinds)])
        top = max(options, key=lambda o: o.frequency_mhz)
        durations[dag.cost_class == c] = top.time_s * scale
    return float(dag.iteration_time(durations))


def baselines_at(
    profile: Profile,
    schedule: Schedule,
    p_block_w: float,
    deadline_s: float,
    *,
    dag: PipelineDag | None = None,
    clock_change_margin_s: float = 0.0,
) -> dict[str, Baseline]:
    """Plans that today's tools reach, on the same profile and deadline.

    - ``default``: every instruction at the profile's highest clock, what a GPU left alone
      runs: the reference that savings are stated against (its iteration time is "no
      slowdown").
    - ``all_fastest``: every instruction at its fastest measured clock (can differ from the
      highest clock where a GPU throttles at its top clocks).
    - ``global_clock``: one clock for every GPU, the least-energy one that meets the deadline
      (what a global power or frequency tuner reaches); the fastest one if none meets it. A
      stage that lacks a measurement at that clock runs at its nearest measured clock.
    - ``per_stage_clock``: one clock per stage, found by coordinate descent from the global
      clock (each round tries every clock of every stage and keeps the best move) until no
      single-stage change improves it.

    Every time and energy, and every choice above, is with the clock-change transitions of
    ``clock_change_margin_s`` (see :mod:`perseus.solver.transitions`): a plan with one clock
    per GPU has none, but a stage whose forward and backward run at different clocks (one of
    them lacking the other's) changes clock between them.

    Raises:
        PlanError: The margin is not a number of seconds in [0, 1).
    """
    margin_s = check_margin(clock_change_margin_s)
    dag = dag or build_dag(schedule)
    clocks_of = clock_tables(profile, schedule) if margin_s > 0 else None
    scale = 1.0 / schedule.virtual_stages
    n = dag.size

    def by_clock(stage: int, kind: str) -> dict[int, tuple[float, float]]:
        return {
            o.frequency_mhz: (o.time_s * scale, o.energy_j * scale)
            for o in profile.options(stage, kind)
        }

    kinds = len(schedule.kinds)  # cost classes per GPU
    tables = [by_clock(g, k) for g in range(schedule.stages) for k in schedule.kinds]

    def nearest(table: dict[int, tuple[float, float]], clock: int) -> int:
        return clock if clock in table else min(table, key=lambda f: (abs(f - clock), -f))

    def evaluate(clock_of_class: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray]:
        """Time and energy of plans given one clock per cost class, ``(classes, P)``."""
        if clocks_of is not None:
            return _with_margin(clocks_of, dag, p_block_w, clock_of_class, margin_s)
        width = clock_of_class.shape[1]
        times = np.empty((n, width))
        energy = np.zeros(width)
        for c, table in enumerate(tables):
            nodes = dag.cost_class == c
            pairs = np.asarray([table[int(f)] for f in clock_of_class[c]])
            times[nodes] = pairs[:, 0]
            energy += nodes.sum() * pairs[:, 1]
        total = dag.iteration_time(times)
        energy += p_block_w * (schedule.stages * total - times.sum(axis=0))
        return total, energy

    def baseline(clock_of_class: npt.NDArray[np.int64]) -> Baseline:
        time, energy = evaluate(clock_of_class[:, None])
        flat = clock_of_class[dag.cost_class]
        return Baseline(float(time[0]), float(energy[0]), per_gpu(flat, schedule))

    def uniform(clock: int, classes: range) -> list[int]:
        return [nearest(tables[c], clock) for c in classes]

    highest = np.asarray([max(t) for t in tables], dtype=np.int64)
    fastest = np.asarray([min(t, key=lambda f: t[f][0]) for t in tables], dtype=np.int64)
    result: dict[str, Baseline] = {
        BaselineKey.DEFAULT: baseline(highest),
        BaselineKey.ALL_FASTEST: baseline(fastest),
    }

    limit = deadline_s * (1 + 1e-12)
    every = range(len(tables))
    clocks = sorted(set().union(*tables), reverse=True)
    candidates = np.asarray([uniform(f, every) for f in clocks], dtype=np.int64).T
    time, energy = evaluate(candidates)
    ok = time <= limit
    pick = int(np.argmin(np.where(ok, energy, np.inf))) if ok.any() else int(np.argmin(time))
    result[BaselineKey.GLOBAL_CLOCK] = baseline(candidates[:, pick])

    per_stage = [
        sorted(set().union(*tables[kinds * g : kinds * g + kinds])) for g in range(schedule.stages)
    ]
    current = candidates[:, pick].copy()
    current_time, current_energy = float(time[pick]), float(energy[pick])
    # Every round strictly lowers the energy, so this ends at a plan no single-stage change
    # improves; the cap only guards against float noise.
    for _ in range(64 * schedule.stages):
        moves = []
        for g, stage_clocks in enumerate(per_stage):
            for f in stage_clocks:
                move = current.copy()
                move[kinds * g : kinds * g + kinds] = uniform(
                    f, range(kinds * g, kinds * g + kinds)
                )
                moves.append(move)
        trial = np.stack(moves, axis=1)
        time, energy = evaluate(trial)
        feasible = time <= max(limit, current_time)
        score = np.where(feasible, energy, np.inf)
        k = int(np.argmin(score))
        if not score[k] < current_energy * (1 - 1e-12):
            break
        current, current_time, current_energy = trial[:, k].copy(), float(time[k]), float(score[k])
    result[BaselineKey.PER_STAGE_CLOCK] = baseline(current)
    return result


# (instruction, plan) cells per batch of _with_margin: its arrays stay near 16 MiB each
_CELLS = 1 << 21


def _with_margin(
    tables: ClockTables,
    dag: PipelineDag,
    p_block_w: float,
    clock_of_class: npt.NDArray[np.int64],
    margin_s: float,
) -> tuple[FloatArray, FloatArray]:
    """:func:`~perseus.solver.transitions.evaluate_plans` of plans with one clock per cost
    class, ``(classes, P)``.

    Under such a plan an instruction's cost with its transitions depends only on its class
    and its neighbours' on the GPU, so it is worked out once per such triple (a few per GPU),
    and only the longest path runs over every instruction, in batches of plans: on 16 x 128
    interleaved (8,192 instructions) the per-stage coordinate descent's rounds of 1,760 plans
    took 2 GiB and ~20 s evaluated instruction by instruction. O(n * P) for the longest path.
    """
    previous, following = neighbours_on_gpu(dag)
    cls = dag.cost_class
    triples, node_triple = np.unique(
        np.stack([cls[previous], cls, cls[following]], axis=1), axis=0, return_inverse=True
    )
    node_triple = node_triple.reshape(-1)
    counts = np.bincount(node_triple, minlength=len(triples)).astype(np.float64)
    own_class = triples[:, 1:2]
    own = clock_of_class[triples[:, 1]]
    before, after = clock_of_class[triples[:, 0]], clock_of_class[triples[:, 2]]
    at_own, at_before, at_after = tables.index(own), tables.index(before), tables.index(after)
    durations, energies = with_transitions(
        tables.time_s[own_class, at_own],
        tables.energy_j[own_class, at_own],
        (before > own, tables.time_s[own_class, at_before], tables.energy_j[own_class, at_before]),
        (after > own, tables.time_s[own_class, at_after], tables.energy_j[own_class, at_after]),
        margin_s,
    )
    plans = clock_of_class.shape[1]
    total = np.empty(plans)
    width = max(1, _CELLS // max(dag.size, 1))
    for lo in range(0, plans, width):
        total[lo : lo + width] = dag.iteration_time(
            durations[:, lo : lo + width].take(node_triple, axis=0)
        )
    energy = counts @ energies + p_block_w * (dag.schedule.stages * total - counts @ durations)
    return total, np.asarray(energy, dtype=np.float64)
