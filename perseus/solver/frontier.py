"""The time-energy frontier: for every deadline, the least-energy per-instruction clock plan.

How the fast mode works, for a DAG of ``n`` instructions and ``G`` grid deadlines:

1. Solve the convex relaxation (:class:`~perseus.solver.programs.Relaxation`) at a few
   deadlines ("knots"), chosen adaptively where the relaxed value ``V(D)`` bends most. ``V`` is
   convex, so between two knots the straight mix of their solutions is a feasible relaxed
   solution, and the tangents at the knots bound ``V`` from below everywhere.
2. For every grid deadline, round the mixed relaxed durations down to the slowest measured option
   that fits, then refill the slack this leaves with two greedy passes (latest finish backwards,
   earliest start forwards). Each pass only uses time that no other instruction needs, so the
   plan keeps its deadline. All ``G`` deadlines move through the passes side by side as numpy
   columns: O(n * G) work with small constants.
3. At a few anchor deadlines (the default plan's time, every instruction at its highest clock,
   and small slowdowns of it: the deadlines the policies name), dive through the relaxation
   rounding to hull options only, and run a local search whose moves (a node, or a whole
   class of nodes, to a neighbouring option, the rest refilled) are evaluated side by side as
   numpy columns: first over plans on hull options, each judged by its refilled plan (so the
   slack stays free to move until the refill spends it), then over refilled plans; on small
   DAGs the no-slowdown deadline is searched twice more, from relaxations with scaled slopes.
   Every grid deadline also gets the best anchor plan that fits, and the fastest that does
   not, shrunk onto it. All budgets are counted in work, never seconds: the same frontier on
   every machine.
4. Replay every plan exactly on the profile values (so stated times and energies are truthful),
   keep the Pareto-optimal ones, and report each plan's gap to the lower bound at the largest
   deadline it serves; then cross the plans around large gaps, and search once more where
   gaps are still large (on large DAGs, where a gap over 1 % lies among the anchors, every
   anchor searches again from the plan its search stopped at instead: there searches stop
   for want of work).
5. With a clock-change margin (:mod:`perseus.solver.transitions`), the search above stays as
   it is; then every point is restated with its transitions (a change lets the lower-clocked
   instruction of its pair run the margin at the higher clock, so on a profile where a higher
   clock is never slower a point only gets faster and costlier), joined by the default and
   all-fastest plans, and the Pareto-optimal ones are kept: a point found for a deadline past
   the default plan's time may now meet it. Where a kept point is then over 1 % from the
   bound (it serves a range its neighbours moved away from), plans between it and the next
   point join the candidates, stated with their transitions too.
6. With a clock-change delay (:mod:`perseus.solver.changes`), every candidate of step 5 first
   has its runs of one clock shorter than its changes need merged (clocks only raised), and is
   stated as the merged plan replays.

The exact mode starts from the fast frontier and replaces it with one MILP per frontier point,
sweeping deadlines downwards, within a time limit it checks (and refuses) up front.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from perseus.core.baselines import BaselineKey
from perseus.core.defaults import EXACT_TIME_LIMIT_S, POLISH_S, RESOLUTION_S
from perseus.core.errors import InfeasibleDeadline, PlanError, ProfileError
from perseus.core.points import Point
from perseus.core.profiles import Profile
from perseus.solver.baselines import Baseline, baselines_at, default_time
from perseus.solver.changes import check_delay, merge_short_runs
from perseus.solver.costs import build_costs
from perseus.solver.dag import build_dag
from perseus.solver.deadlines import (
    MAX_CELLS,
    MAX_RESOLUTION_S,
    deadline_count,
    default_resolution,
)
from perseus.solver.exact import exact_frontier, small_exact
from perseus.solver.fast import ANCHOR_SLOWDOWNS, anchor_slowdowns, fast_frontier
from perseus.solver.planner import FloatArray, IntArray, Planner, Progress, ServedBound, pareto
from perseus.solver.schedules import Schedule, per_gpu
from perseus.solver.search import DEFAULT_SEARCH_WORK
from perseus.solver.simulate import Replay, replay
from perseus.solver.transitions import check_margin, clock_tables, evaluate_plans

__all__ = [
    "ANCHOR_SLOWDOWNS",
    "DEFAULT_SEARCH_WORK",
    "FRONTIER_FORMAT",
    "MAX_CELLS",
    "RESOLUTION_S",
    "Baseline",
    "Frontier",
    "Point",
    "anchor_slowdowns",
    "baselines_at",
    "compute_frontier",
    "default_time",
]

FRONTIER_FORMAT = "perseus.frontier/1"
_TRANSITION_CELLS = 1 << 21  # (instruction, plan) cells per batch of transition replays
# Restated points whose gaps are over _REPAIR_GAP get plans between them and the next point
# (the worst _REPAIR_PAIRS a round, _REPAIR_ROUNDS rounds). On bloom+a40 interleaved 8 x 32 the
# all-fastest plan, restated 0.15 ms faster than the next point, served those 0.15 ms at 10.5 %
# over the bound; the first round's plans took it to 1.4 %. More pairs or rounds moved the
# largest gaps by under 0.1 point (64 pairs, 4 rounds on bloom+a40 8 x 96).
_REPAIR_GAP = 0.01
_REPAIR_PAIRS = 16
_REPAIR_ROUNDS = 2


@dataclass(frozen=True)
class Frontier:
    """Pareto-optimal plans, time strictly ascending and energy strictly descending.

    Attributes:
        schedule: The schedule the plans are for.
        p_block_w: Blocking power used in the energy model.
        times_s: Iteration time of every point.
        energies_j: Energy of every point.
        gaps: Gap of every point to the lower bound.
        frequencies_mhz: ``(points, instructions)`` clocks, instructions GPU by GPU in order.
        baselines: By :class:`~perseus.core.baselines.BaselineKey` (typed ``str`` keys, so plain
            strings index it too): ``default`` (every instruction at the highest clock: the
            reference), ``all_fastest``, ``global_clock`` and ``per_stage_clock`` at no
            slowdown.
        clock_change_margin_s: How long before each instruction boundary the plans assume a
            clock change takes effect; every stated time and energy includes those
            transitions (see :mod:`perseus.solver.transitions`). 0: none.
        resolution_s: The spacing of the deadline grid the plans were found on (the
            default follows the job); None where it is not known (a file
            written before it was recorded).
        clock_change_delay_s: The clock-change delay the plans were merged for: no run of
            one clock on a GPU is shorter than its changes need (see
            :mod:`perseus.solver.changes`). 0: none assumed.
    """

    schedule: Schedule
    p_block_w: float
    times_s: FloatArray
    energies_j: FloatArray
    gaps: FloatArray
    frequencies_mhz: npt.NDArray[np.uint16]
    baselines: dict[str, Baseline] = field(default_factory=dict)
    clock_change_margin_s: float = 0.0
    resolution_s: float | None = None
    clock_change_delay_s: float = 0.0

    def __len__(self) -> int:
        return int(self.times_s.shape[0])

    def point(self, i: int) -> Point:
        """Return point ``i`` (negative indices count from the slow end)."""
        i = range(len(self))[i]
        return Point(
            float(self.times_s[i]),
            float(self.energies_j[i]),
            float(self.gaps[i]),
            per_gpu(self.frequencies_mhz[i].tolist(), self.schedule),
        )

    def replay_point(self, profile: Profile, i: int) -> Replay:
        """Point ``i``'s timeline on ``profile`` (the one it was planned on): its clocks
        replayed with this frontier's blocking power and clock-change margin."""
        return replay(
            profile,
            self.schedule,
            self.p_block_w,
            self.point(i).frequencies_mhz,
            clock_change_margin_s=self.clock_change_margin_s,
        )

    @property
    def reference_time_s(self) -> float:
        """The no-slowdown iteration time: the default plan's (every instruction at the
        highest clock), or the fastest point's for a frontier without that baseline."""
        default = self.baselines.get(BaselineKey.DEFAULT)
        return (
            float(self.times_s[0])
            if default is None
            else max(default.time_s, float(self.times_s[0]))
        )

    def energy_at(self, i: int, iteration_time_s: float) -> float:
        """Energy of point ``i`` when every iteration is stretched to ``iteration_time_s``.

        Every GPU then blocks for the extra time, drawing the blocking power.

        Raises:
            InfeasibleDeadline: The point is slower than ``iteration_time_s``.
        """
        time_s = float(self.times_s[i])
        if iteration_time_s < time_s * (1 - 1e-12):
            raise InfeasibleDeadline(
                f"point {i} takes {time_s:.6f} s, longer than {iteration_time_s:.6f} s"
            )
        extra = max(iteration_time_s - time_s, 0.0)
        return float(self.energies_j[i]) + self.schedule.stages * self.p_block_w * extra


def compute_frontier(
    profile: Profile,
    schedule: Schedule,
    *,
    p_block_w: float | None = None,
    resolution_s: float | None = None,
    exact: bool = False,
    exact_time_limit_s: float | None = EXACT_TIME_LIMIT_S,
    search_work: int = DEFAULT_SEARCH_WORK,
    polish_s: float = POLISH_S,
    progress: Progress | None = None,
    max_cells: int | None = MAX_CELLS,
    clock_change_margin_s: float = 0.0,
    clock_change_delay_s: float = 0.0,
) -> Frontier:
    """Compute the time-energy frontier of ``schedule`` on ``profile``.

    Args:
        profile: Per-stage measurements.
        schedule: The pipeline schedule.
        p_block_w: Blocking power in watts; defaults to ``profile.p_block_w``.
        resolution_s: Spacing of the deadline grid, in seconds (at most
            :data:`~perseus.solver.deadlines.MAX_RESOLUTION_S`). None (the default): it follows
            the job, :func:`~perseus.solver.deadlines.default_resolution` of the span of plan
            times and the instructions (1 ms where that grid is small, as on every job up to
            8 x 96; else a bounded number of deadlines across the span). The frontier records
            the spacing used.
        exact: Solve an MILP per frontier point instead of the fast relaxation-and-rounding.
            Small problems (at most 128 instruction-option pairs) are solved exactly anyway
            when their MILPs need little work (a fixed budget of branch-and-bound nodes).
        exact_time_limit_s: Exact mode: wall-clock limit of the whole sweep (default 60 s).
            Before it starts, a sweep estimated to need more is refused at once
            (:class:`SolverTimeout`, with the estimate). When the limit ends a solve, its
            best plan so far is kept with its proven gap, and the fast frontier's points
            stand for the deadlines not reached. None: no limit.
        search_work: Fast mode: local-search work per anchor deadline (no-slowdown and small
            slowdowns of the default plan), counted in evaluated (instruction, plan) cells;
            deterministic. 0: no local search.
        polish_s: Fast mode: also spend up to this many seconds improving the no-slowdown
            point with a branch and bound over the measured clocks on each instruction's
            convex hull, started from the searched plan, so it never gets worse. Off by
            default: the result then depends on the machine's speed.
        progress: Called as ``progress(done, total)`` while working.
        max_cells: Refuse (:class:`PlanError`) a problem whose deadline grid, from the
            fastest to the slowest plan's time, times its instructions exceeds this (the
            frontier's arrays take about 12 bytes a cell); None: no limit.
        clock_change_margin_s: The rank raises a clock this long before an instruction
            boundary and lowers it this long after one, so the instruction with the lower
            clock of the pair runs that many seconds at the higher clock. The search is the
            same at every margin; at a margin > 0 every point and baseline is stated with its
            transitions, and the dominated points are dropped. 0 (the default): no
            transitions.
        clock_change_delay_s: How long a clock change takes to land on the ranks (their
            measured latency): changes are serialised, so every point's runs of one clock
            are merged (by raising clocks) until the changes into and out of each run can be
            issued that far apart (see :mod:`perseus.solver.changes`); every point is then
            stated as the merged plan replays, and the dominated points are dropped. 0 (the
            default): no merge.

    Returns:
        The frontier. Fast mode: a few LP solves plus O(n * G) vectorised work for ``n``
        instructions and ``G = (T_max - T_min) / resolution_s`` deadlines.

    Raises:
        ProfileError: No blocking power, or the profile does not fit the schedule.
        ScheduleError: The schedule's DAG is invalid.
        PlanError: A bad resolution, polish, time limit, search work, cell limit, margin or
            delay.
    """
    margin_s = check_margin(clock_change_margin_s)
    delay_s = check_delay(clock_change_delay_s)
    power = profile.p_block_w if p_block_w is None else p_block_w
    if power is None:
        raise ProfileError(f"{profile.source}: p_block_w: the blocking power is required")
    if not (math.isfinite(power) and power >= 0):
        raise ProfileError(f"{profile.source}: p_block_w: must be a finite number >= 0")
    if resolution_s is not None and not (
        isinstance(resolution_s, int | float)
        and math.isfinite(resolution_s)
        and 0 < resolution_s <= MAX_RESOLUTION_S
    ):
        raise PlanError(
            f"resolution: must be in (0, {MAX_RESOLUTION_S:g}] seconds or None, got {resolution_s}"
        )
    if not (math.isfinite(polish_s) and polish_s >= 0):
        raise PlanError(f"polish: must be a number of seconds >= 0, got {polish_s}")
    if exact_time_limit_s is not None and not (
        math.isfinite(exact_time_limit_s) and exact_time_limit_s > 0
    ):
        raise PlanError(f"exact time limit: must be a number of seconds > 0, got "
                        f"{exact_time_limit_s}")  # fmt: skip
    if isinstance(search_work, bool) or not isinstance(search_work, int) or search_work < 0:
        raise PlanError(f"search work: must be an integer >= 0, got {search_work!r}")
    if max_cells is not None and (
        isinstance(max_cells, bool) or not isinstance(max_cells, int) or max_cells < 1
    ):
        raise PlanError(f"max cells: must be an integer >= 1 or None, got {max_cells!r}")
    dag = build_dag(schedule)
    costs = build_costs(profile, schedule, power)
    planner = Planner(dag, costs)
    span_s = planner.slowest_time_s - planner.fastest_time_s
    if resolution_s is None:
        resolution_s = default_resolution(span_s, dag.size)
    if max_cells is not None:
        slowest = planner.slowest_time_s
        deadlines = deadline_count(span_s, resolution_s)
        if deadlines * dag.size > max_cells:
            raise PlanError(
                f"resolution: {resolution_s:g} s gives up to {deadlines:,} deadlines from "
                f"{planner.fastest_time_s:.4f} to {slowest:.4f} s, for {dag.size} instructions "
                f"each: over the {max_cells:,} cells allowed; use a coarser resolution"
            )
    t_default = default_time(profile, schedule, dag=dag)
    report = progress or (lambda done, total: None)
    if exact:
        # The fast frontier first: it starts every MILP (so none ends worse than it), sizes
        # the estimate, and stands in where a time limit stops the sweep.
        fast = fast_frontier(
            planner, resolution_s, lambda done, total: None, t_default, search_work
        )
        solved = exact_frontier(
            planner, resolution_s, report, None, exact_time_limit_s, t_default, fast
        )
    else:
        small = small_exact(planner, resolution_s, report, t_default)
        solved = (
            small
            if small is not None
            else fast_frontier(planner, resolution_s, report, t_default, search_work, polish_s)
        )
    times, energies, gaps, choices, served_bound = solved
    freqs = costs.frequency_mhz[planner.flat(choices)].astype(np.uint16)
    baselines = baselines_at(
        profile, schedule, power, t_default, dag=dag, clock_change_margin_s=margin_s
    )
    if margin_s > 0 or delay_s > 0:
        times, energies, gaps, freqs = _with_transitions(
            profile, schedule, planner, margin_s, (times, energies, gaps, freqs), baselines,
            served_bound, delay_s,
        )  # fmt: skip
    return Frontier(
        schedule=schedule,
        p_block_w=power,
        times_s=times,
        energies_j=energies,
        gaps=gaps,
        frequencies_mhz=freqs,
        baselines=baselines,
        clock_change_margin_s=margin_s,
        resolution_s=float(resolution_s),
        clock_change_delay_s=delay_s,
    )


def _with_transitions(
    profile: Profile,
    schedule: Schedule,
    planner: Planner,
    margin_s: float,
    found: tuple[FloatArray, FloatArray, FloatArray, npt.NDArray[np.uint16]],
    baselines: dict[str, Baseline],
    served_bound: ServedBound | None,
    delay_s: float = 0.0,
) -> tuple[FloatArray, FloatArray, FloatArray, npt.NDArray[np.uint16]]:
    """The frontier of the searched plans stated with their transitions.

    With a clock-change delay, every candidate's short runs are merged first
    (:func:`~perseus.solver.changes.merge_short_runs`), and the merged plans are stated.

    Candidates: every point, and the default and all-fastest plans (whose times are the
    references, and which have transitions only where a stage's forward and backward differ
    in clock). Each point's gap is against the relaxation's bound at the largest grid deadline
    it now serves (below the next point's time): an adjusted instruction mixes measured
    options of its own, which the relaxation's bound covers. Without the relaxation's bound
    at any deadline (``served_bound`` None: an exact mode, whose bounds are per point) it is the
    bound of the margin-free point that served that deadline, at the end of that point's own
    range (lower, so the gap only reads larger; an exact MILP's bound is of whole options, so
    a gap is clamped at 0).

    Restated, the points move (on a profile where a higher clock is never slower, faster and
    costlier; where it can be slower, slower), so some points serve wider ranges of deadlines
    than they were searched for. Around the points whose gaps are then over
    :data:`_REPAIR_GAP`, plans between each and the next point (:meth:`Planner.crossovers`)
    join the candidates, stated with their transitions, for :data:`_REPAIR_ROUNDS` rounds.
    O(n * P) per round.
    """
    times, energies, gaps, freqs = found
    tables = clock_tables(profile, schedule)
    dag, compiled = planner.dag, planner.compiled
    plans = freqs.T.astype(np.int64)  # (n, P)
    extra = [
        np.asarray([f for row in baselines[key].frequencies_mhz for f in row], dtype=np.int64)
        for key in (BaselineKey.DEFAULT, BaselineKey.ALL_FASTEST)
    ]

    def stated(candidates: IntArray) -> tuple[IntArray, FloatArray, FloatArray]:
        if delay_s > 0:
            candidates = merge_short_runs(tables, dag, candidates, margin_s, delay_s, compiled)
        # In batches of columns: each plan's evaluation is its own, and a batch's temporaries
        # (a dozen (n, P) arrays) stay small on a DAG of 16,384 instructions.
        width = max(1, _TRANSITION_CELLS // max(dag.size, 1))
        power = planner.costs.p_block_w
        evaluated = [
            evaluate_plans(tables, dag, power, candidates[:, lo : lo + width], margin_s, compiled)
            for lo in range(0, candidates.shape[1], width)
        ]
        return (
            candidates,
            np.concatenate([t for t, _ in evaluated]),
            np.concatenate([e for _, e in evaluated]),
        )

    margin_free_bounds = energies / (1.0 + gaps)

    def drawn(
        candidates: IntArray, new_times: FloatArray, new_energies: FloatArray
    ) -> tuple[IntArray, FloatArray]:
        """The Pareto-optimal candidates, and their gaps."""
        keep = pareto(new_times, new_energies)
        kept_times = new_times[keep]
        if served_bound is not None:
            bounds = served_bound(kept_times) * (1 - 1e-9)
        else:
            upto = np.append(kept_times[1:], math.inf)
            served = np.clip(np.searchsorted(times, upto, side="left") - 1, 0, len(times) - 1)
            bounds = margin_free_bounds[served]
        return keep, np.maximum(new_energies[keep] / bounds - 1.0, 0.0)

    candidates, new_times, new_energies = stated(
        np.concatenate([plans, np.stack(extra, axis=1)], axis=1)
    )
    keep, new_gaps = drawn(candidates, new_times, new_energies)
    for _ in range(_REPAIR_ROUNDS):
        worst = [int(i) for i in np.argsort(-new_gaps, kind="stable")[:_REPAIR_PAIRS]
                 if new_gaps[i] > _REPAIR_GAP and i + 1 < len(keep)]  # fmt: skip
        if not worst:
            break
        crossed = planner.crossovers(
            candidates[:, [keep[i] for i in worst]], candidates[:, [keep[i + 1] for i in worst]]
        )
        more, more_times, more_energies = stated(crossed)
        candidates = np.concatenate([candidates, more], axis=1)
        new_times = np.concatenate([new_times, more_times])
        new_energies = np.concatenate([new_energies, more_energies])
        keep, new_gaps = drawn(candidates, new_times, new_energies)
    return (
        new_times[keep],
        new_energies[keep],
        new_gaps,
        candidates[:, keep].T.astype(np.uint16),
    )
