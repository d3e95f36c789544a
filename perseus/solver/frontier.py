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

The exact mode starts from the fast frontier and replaces it with one MILP per frontier point,
sweeping deadlines downwards, within a time limit it checks (and refuses) up front.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.defaults import EXACT_TIME_LIMIT_S, POLISH_S, RESOLUTION_S
from perseus.errors import (
    InfeasibleDeadline,
    PlanError,
    ProfileError,
    SolverTimeout,
)
from perseus.solver.costs import CostTable, build_costs
from perseus.solver.dag import PipelineDag, build_dag
from perseus.solver.profiles import Profile
from perseus.solver.programs import ExactProgram, Relaxation, RelaxedSolution, hull_options
from perseus.solver.schedules import BACKWARD, FORWARD, Schedule

__all__ = [
    "FRONTIER_FORMAT",
    "MAX_CELLS",
    "Baseline",
    "Frontier",
    "Point",
    "baselines_at",
    "compute_frontier",
    "default_time",
]

FRONTIER_FORMAT = "perseus.frontier/1"
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Progress = Callable[[int, int], None]
# Plans (n, P) with their exact iteration times and energies (P each).
Evaluated = tuple[IntArray, FloatArray, FloatArray]

# Relative chord-minus-tangent error of V between knots above which another knot is solved.
_KNOT_TOLERANCE = 2e-4
_MAX_KNOTS = 64
_CHUNK = 1024
# compute_frontier's default limit on grid deadlines x instructions (its arrays: about
# 4.7 GiB), as the server's default limit on a job's planning work.
MAX_CELLS = 400_000_000
# Problems with at most this many (instruction, option) pairs are solved exactly even in fast
# mode: their MILPs take milliseconds, and rounding is weakest on them (few options, no averaging).
_EXACT_UP_TO = 128
# ... unless their MILPs together need more work than this, counted in branch-and-bound nodes
# plus a fixed charge per solve (its root: presolve, cuts): a budget that, unlike a time limit,
# decides the same way on a busy machine as on an idle one. Up to a few seconds on one core.
_EXACT_WORK = 6_000
_SOLVE_CHARGE = 20
# Exact mode with a time limit times one MILP root before it starts, up to this many
# (instruction, option) pairs; beyond, it refuses from the size alone.
_EXACT_TIMED_UP_TO = 20_000
_BASELINE_KEYS = ("default", "all_fastest", "global_clock", "per_stage_clock")
# Slowdowns (x the default plan's time) where fast mode searches hardest: the deadlines most
# users pick (no-slowdown, a few percent), each solved by a hull dive and a local search.
ANCHOR_SLOWDOWNS = (1.0, 1.005, 1.01, 1.015, 1.02, 1.03, 1.05, 1.075, 1.1)
# Local-search work over all anchors, counted in evaluated (instruction, candidate plan) cells
# plus a charge per instruction per batch (the pass's fixed cost), not in seconds, so the
# frontier is the same on a fast and a slow machine. About 3.5 s per 1e8 on one core.
DEFAULT_SEARCH_WORK = 4 * 10**7
# A pass over the DAG costs about as much as 160 more candidate plans would (measured on
# 8 x 12 to 8 x 96: 1.6-8.4 ms fixed, 10-50 us per plan).
_BATCH_CHARGE = 160
# The anchors that get twice the share of the work: the deadlines the policies name.
_MAIN_SLOWDOWNS = (1.0, 1.01, 1.02, 1.05)
# Larger DAGs search at those and at 1.03 x, inside the widest stretch between them (on
# gpt3-175b+a40 8 x 96 without it the points from 1.02 to 1.035 x reported gaps up to 1.37 %;
# with it 1.08 %, 0.98 % after resumed searches; more anchors there spread the work thinner
# and did worse).
_LARGE_SLOWDOWNS = (1.0, 1.01, 1.02, 1.03, 1.05)
_CROSSOVER_SHARES = 31  # plans between two neighbouring anchors, per node order
_CROSSOVER_ROUNDS = 2
_CROSSOVER_PAIRS = 16
_ALL_ANCHORS_UP_TO = 1024  # instructions
# Repair rounds: search again where a point's reported gap exceeds this.
_REPAIR_GAP = 0.009
# DAGs over _ALL_ANCHORS_UP_TO instructions whose largest gap is over _RESUME_ABOVE among the
# anchors search every anchor again, from the plan its search stopped at, with _RESUME_WORK of
# its share (instead of the one repair search); smaller DAGs with a gap still over it after
# the repair round get one more.
_RESUME_ABOVE = 0.01
_RESUME_WORK = 0.5
_REPAIR_ROUNDS = 1
_REPAIR_ANCHORS = 6
_WIDE_MOVES_UP_TO = 512  # instructions (see _Planner._local_search)
# DAGs of up to this many instructions search the default plan's time (the no-slowdown
# deadline) _RESTARTS more times, from relaxations scaled by up to +-_RESTART_SPREAD per node
# (see _Planner._restarts); their searches reach a local optimum, so another start is what
# can find a better one.
_RESTARTS_UP_TO = 512
_RESTARTS = 2
_RESTART_SPREAD = 0.05
_FIT_BINS = 1024  # table bins per class's time range, at least (see _Planner.__init__)
_FIT_BINS_MAX = 1 << 15
_FIT_MARGIN = 1e-6  # of a bin: a table entry fits this far below its bin (rounding's room)
_SEARCH_CHUNK = 2 * 10**6  # cells per batch of candidate plans (bounds memory: ~16 MB/array)


@dataclass(frozen=True, slots=True)
class Point:
    """One plan of the frontier.

    Attributes:
        time_s: Iteration time of the plan, replayed on the profile.
        energy_j: Energy of one iteration, replayed on the profile.
        gap: Relative gap of ``energy_j`` to a proven lower bound over the deadlines it serves.
        frequencies_mhz: ``frequencies_mhz[g][k]`` is the clock of ``schedule.order[g][k]``.
    """

    time_s: float
    energy_j: float
    gap: float
    frequencies_mhz: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class Baseline:
    """A reference plan that today's tools can reach."""

    time_s: float
    energy_j: float
    frequencies_mhz: tuple[tuple[int, ...], ...]


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
        baselines: ``default`` (every instruction at the highest clock: the reference),
            ``all_fastest``, ``global_clock`` and ``per_stage_clock`` at no slowdown.
    """

    schedule: Schedule
    p_block_w: float
    times_s: FloatArray
    energies_j: FloatArray
    gaps: FloatArray
    frequencies_mhz: npt.NDArray[np.uint16]
    baselines: dict[str, Baseline] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.times_s.shape[0])

    def point(self, i: int) -> Point:
        """Return point ``i`` (negative indices count from the slow end)."""
        i = range(len(self))[i]
        return Point(
            float(self.times_s[i]),
            float(self.energies_j[i]),
            float(self.gaps[i]),
            _split(self.frequencies_mhz[i], self.schedule),
        )

    @property
    def reference_time_s(self) -> float:
        """The no-slowdown iteration time: the default plan's (every instruction at the
        highest clock), or the fastest point's for a frontier without that baseline."""
        default = self.baselines.get("default")
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
    resolution_s: float = RESOLUTION_S,
    exact: bool = False,
    exact_time_limit_s: float | None = EXACT_TIME_LIMIT_S,
    search_work: int = DEFAULT_SEARCH_WORK,
    polish_s: float = POLISH_S,
    progress: Progress | None = None,
    max_cells: int | None = MAX_CELLS,
) -> Frontier:
    """Compute the time-energy frontier of ``schedule`` on ``profile``.

    Args:
        profile: Per-stage measurements.
        schedule: The pipeline schedule.
        p_block_w: Blocking power in watts; defaults to ``profile.p_block_w``.
        resolution_s: Spacing of the deadline grid (at most 1 ms is allowed).
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

    Returns:
        The frontier. Fast mode: a few LP solves plus O(n * G) vectorised work for ``n``
        instructions and ``G = (T_max - T_min) / resolution_s`` deadlines.

    Raises:
        ProfileError: No blocking power, or the profile does not fit the schedule.
        ScheduleError: The schedule's DAG is invalid.
    """
    power = profile.p_block_w if p_block_w is None else p_block_w
    if power is None:
        raise ProfileError(f"{profile.source}: p_block_w: the blocking power is required")
    if not (math.isfinite(power) and power >= 0):
        raise ProfileError(f"{profile.source}: p_block_w: must be a finite number >= 0")
    if not (math.isfinite(resolution_s) and 0 < resolution_s <= RESOLUTION_S):
        raise PlanError(f"resolution: must be in (0, 0.001] seconds, got {resolution_s}")
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
    planner = _Planner(dag, costs)
    if max_cells is not None:
        slowest = planner.slowest_time_s
        deadlines = math.ceil((slowest - planner.fastest_time_s) / resolution_s) + 514
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
        fast = planner.fast(resolution_s, lambda done, total: None, t_default, search_work)
        times, energies, gaps, choices = planner.exact(
            resolution_s, report, None, exact_time_limit_s, t_default, fast
        )
    else:
        try:
            if int((planner.last + 1).sum()) > _EXACT_UP_TO:
                raise SolverTimeout("too large for the exact mode")
            times, energies, gaps, choices = planner.exact(
                resolution_s, report, _EXACT_WORK, None, t_default
            )
        except SolverTimeout:
            times, energies, gaps, choices = planner.fast(
                resolution_s, report, t_default, search_work, polish_s
            )
    freqs = costs.frequency_mhz[planner.flat(choices)].astype(np.uint16)
    return Frontier(
        schedule=schedule,
        p_block_w=power,
        times_s=times,
        energies_j=energies,
        gaps=gaps,
        frequencies_mhz=freqs,
        baselines=baselines_at(profile, schedule, power, t_default, dag=dag),
    )


def anchor_slowdowns(instructions: int) -> tuple[float, ...]:
    """The deadlines (multiples of the default plan's time) where the fast mode searches, for
    a DAG of ``instructions`` nodes: large DAGs search only where the policies point."""
    return ANCHOR_SLOWDOWNS if instructions <= _ALL_ANCHORS_UP_TO else _LARGE_SLOWDOWNS


def default_time(profile: Profile, schedule: Schedule, *, dag: PipelineDag | None = None) -> float:
    """Iteration time of the default plan: every instruction at the profile's highest clock.

    That is what a GPU left alone runs, so it is the reference of "no slowdown".
    """
    dag = dag or build_dag(schedule)
    scale = 1.0 / schedule.virtual_stages
    durations = np.empty(dag.size)
    for c in range(2 * schedule.stages):
        options = profile.stages[c // 2][(FORWARD, BACKWARD)[c % 2]]
        top = max(options, key=lambda o: o.frequency_mhz)
        durations[dag.cost_class == c] = top.time_s * scale
    return float(dag.iteration_time(durations))


class _Planner:
    """Plans over one DAG and cost table. Choices are per-node option indices within a class."""

    def __init__(self, dag: PipelineDag, costs: CostTable) -> None:
        self.dag = dag
        self.costs = costs
        self.cls = dag.cost_class
        self.start = costs.start[self.cls]
        self.class_times = [costs.times_of(c) for c in range(len(costs.start) - 1)]
        self.last = costs.start[self.cls + 1] - self.start - 1
        self.hull = hull_options(costs)
        # Fitting (the slowest option within a room) by table: each class's time range cut
        # into equal bins, each bin holding the slowest option that fits a hair below its lower
        # edge. With bins narrower than the class's closest two option times (as many as that
        # takes, up to _FIT_BINS_MAX), a bin's answer is its entry or the option after it: one
        # step, exact. Otherwise (near-duplicate times) _FIT_BINS bins, and steps until exact.
        classes = len(costs.start) - 1
        padded = [np.append(self.class_times[c], math.nan) for c in range(classes)]
        self._padded = np.concatenate(padded)
        padded_start = costs.start[:-1] + np.arange(classes)
        spans = [float(times[-1] - times[0]) for times in self.class_times]
        needed = []  # bins for a class: twice its span over its closest two times
        for times, span in zip(self.class_times, spans, strict=True):
            closest = float(np.diff(times).min(initial=math.inf))
            # times within rounding of each other (relative 1e-9) count as duplicates: the
            # margin below a bin's edge must stay far above rounding
            apart = closest > 1e-9 * float(times[-1])
            needed.append(2 * span / closest if apart else math.inf)
        self._one_step = max(needed, default=0.0) <= _FIT_BINS_MAX
        rows = []
        scale = np.empty(classes)
        offset = np.empty(classes)
        low = np.empty(classes)
        base = 0
        for c, times in enumerate(self.class_times):
            bins = max(_FIT_BINS, math.ceil(needed[c])) if self._one_step else _FIT_BINS
            width = spans[c] / bins
            scale[c] = 1.0 / width if width > 0 else 1.0  # one time: any bins will do
            # rows: below the range, its bins, and at or above its end
            edges = times[0] + np.arange(bins + 1) * width - _FIT_MARGIN * width
            fitting = np.searchsorted(times, edges, side="right") - 1
            rows.append(np.concatenate([[0], np.clip(fitting, 0, len(times) - 1)]))
            low[c] = base
            offset[c] = base + 1 - times[0] * scale[c]
            base += bins + 2
        self._table = np.concatenate(rows).astype(np.int64)
        # per node: its class's first padded time, scale, offset, and table rows (first, last)
        high = np.append(low[1:], base) - 1
        self._fit_node = (
            padded_start[self.cls],
            scale[self.cls],
            offset[self.cls],
            low[self.cls],
            high[self.cls],
        )
        # Each node's place in its class, in (0, 1): first to last, last to first, and evenly
        # spread (van der Corput); a crossover moves the nodes below a share first.
        self._members = [np.flatnonzero(self.cls == c) for c in range(classes)]
        self.class_top = [len(times) - 1 for times in self.class_times]
        rank = np.empty(dag.size)
        spread = np.empty(dag.size)
        for members in self._members:
            rank[members] = (np.arange(len(members)) + 0.5) / max(len(members), 1)
            spread[members] = [_van_der_corput(i) for i in range(len(members))]
        self._crossing_orders = (rank, 1.0 - rank, spread)
        # The all-fastest plan's time and energy (every instruction at its fastest option).
        (fastest_time,), (fastest_energy,) = self.evaluate(np.zeros((dag.size, 1), np.int64))
        self.fastest_time_s, self.fastest_energy_j = float(fastest_time), float(fastest_energy)
        # The slowest plan's time (every instruction at its slowest option): the grid's end.
        self.slowest_time_s = float(dag.iteration_time(self.durations(self.last[:, None]))[0])
        # Per level of the refill's passes: its nodes, their predecessors and successors (the
        # DAG's two link columns; the index n is "none"), and the fit's columns.
        pred, succ = dag.pred, dag.succ
        self._back_steps = [
            (level, succ[level, 0], succ[level, 1], self._columns(level))
            for level in dag.back_levels
        ]
        self._steps = [
            (level, pred[level, 0], pred[level, 1], succ[level, 0], succ[level, 1],
             self._columns(level))
            for level in dag.levels
        ]  # fmt: skip

    def flat(self, choices: IntArray) -> IntArray:
        """Flat cost-table index of every (plan, node) choice."""
        return np.asarray(self.start + choices)

    def durations(self, choices: IntArray) -> FloatArray:
        """Durations ``(n, P)`` of choices ``(n, P)``."""
        return np.asarray(self.costs.time_s[self.start[:, None] + choices])

    def evaluate(self, choices: IntArray) -> tuple[FloatArray, FloatArray]:
        """Exact iteration time and energy of plans ``(n, P)``."""
        flat = self.start[:, None] + choices
        times = self.costs.time_s[flat]
        total = self.dag.iteration_time(times)
        energy = self.costs.energy_j[flat].sum(axis=0) + self.costs.p_block_w * (
            self.costs.num_gpus * total - times.sum(axis=0)
        )
        return total, np.asarray(energy)

    def fit(self, nodes: IntArray, room: FloatArray) -> IntArray:
        """Slowest option of each of ``nodes`` that takes at most its ``room`` (the fastest if
        none does); ``room`` is ``(len(nodes), P)``."""
        return self._fit(self._columns(nodes), room)

    def _columns(self, nodes: IntArray) -> tuple[npt.NDArray[Any], ...]:
        """What :meth:`_fit` needs of ``nodes``, as columns."""
        first, scale, offset, low, high = (a[nodes][:, None] for a in self._fit_node)
        return first, first + 1, scale, offset, low, high

    def _fit(self, columns: tuple[npt.NDArray[Any], ...], room: FloatArray) -> IntArray:
        return self._fit_times(columns, room)[0]

    def _fit_times(
        self, columns: tuple[npt.NDArray[Any], ...], room: FloatArray
    ) -> tuple[IntArray, FloatArray]:
        """:meth:`fit` on precomputed columns, with the picked options' times."""
        first, after, scale, offset, low, high = columns
        position = room * scale
        position += offset
        np.maximum(position, low, out=position)
        np.minimum(position, high, out=position)
        found = self._table[position.astype(np.int64)]
        times = self._padded
        if self._one_step:
            found += times[after + found] <= room
            return found, times[first + found]
        # The table's bin holds the answer at its lower edge (up to rounding): step to the
        # exact answer, up while the next option fits (a class's last option is followed by
        # NaN, which fits nothing), down while this one does not.
        while True:
            up = times[after + found] <= room
            if not up.any():
                break
            found += up
        while True:
            taken = times[first + found]
            down = taken > room
            down &= found > 0
            if not down.any():
                return found, taken
            found -= down

    def round_down(self, durations: FloatArray) -> IntArray:
        """Slowest option no longer than each relaxed duration ``(n, P)``."""
        return self.fit(np.arange(self.dag.size), durations)

    def refill(self, choices: IntArray, ceiling: FloatArray) -> IntArray:
        """Slow instructions into slack that nobody else needs; every plan finishes by ``ceiling``.

        A backward pass gives each node, latest first, the time between its earliest start
        (under the current plan) and the latest start of its successors; a forward pass then
        does the same from the other side. A node whose current plan overruns shrinks here too,
        so the result always fits ``ceiling`` when the all-fastest plan does.
        """
        return self.refill_evaluated(choices, ceiling)[0]

    def refill_evaluated(
        self, choices: IntArray, ceiling: FloatArray
    ) -> tuple[IntArray, FloatArray, FloatArray]:
        """:meth:`refill`, with the exact iteration time and energy of the refilled plans (as
        :meth:`evaluate` gives them; the forward pass has the finish times already)."""
        dag = self.dag
        n = dag.size
        choices = choices.copy()
        durations = self.durations(choices)
        begin = dag.finish_times(durations)
        begin -= durations
        latest = np.empty((n + 1, choices.shape[1]))
        latest[n] = ceiling
        for level, after_a, after_b, columns in self._back_steps:
            bound = np.minimum(latest[after_a], latest[after_b])
            picked, taken = self._fit_times(columns, bound - begin[level])
            choices[level] = picked
            durations[level] = taken
            bound -= taken
            latest[level] = bound
        earliest = np.zeros((n + 1, choices.shape[1]))
        for level, before_a, before_b, after_a, after_b, columns in self._steps:
            begin_level = np.maximum(earliest[before_a], earliest[before_b])
            bound = np.minimum(latest[after_a], latest[after_b])
            bound -= begin_level
            picked, taken = self._fit_times(columns, bound)
            # options are in ascending time: the slower of two is the later index
            choices[level] = np.maximum(picked, choices[level])
            taken = np.maximum(taken, durations[level])
            durations[level] = taken
            begin_level += taken
            earliest[level] = begin_level
        total = earliest[:n].max(axis=0)
        flat = self.start[:, None] + choices
        energy = self.costs.energy_j[flat].sum(axis=0) + self.costs.p_block_w * (
            self.costs.num_gpus * total - durations.sum(axis=0)
        )
        return choices, total, energy

    def fast(
        self,
        resolution_s: float,
        progress: Progress,
        t_default: float,
        search_work: int,
        polish_s: float = 0.0,
    ) -> tuple[FloatArray, FloatArray, FloatArray, IntArray]:
        n = self.dag.size
        t_fast = self.fastest_time_s
        relaxation = Relaxation(self.dag, self.costs)
        free = relaxation.solve(None)
        slowest_time = self.slowest_time_s
        t_end = max(t_fast, min(free.iteration_time_s, slowest_time))
        # Large DAGs search only at the deadlines the policies name (each dive and search
        # round costs O(n) passes there).
        slowdowns = anchor_slowdowns(n)
        anchors = sorted(
            {t_fast} | {d for d in (f * t_default for f in slowdowns) if t_fast <= d <= t_end}
        )
        grid = _deadline_grid(t_fast, t_end, slowest_time, resolution_s)
        grid = np.unique(np.concatenate([grid, anchors]))

        # Progress in thousandths, by where the time goes (on 8 x 96 roughly: the relaxation's
        # knots 15 %, the anchors' searches 55 %, the grid 20 %, the repairs 10 %).
        def report(first: int, last: int, done: int, total: int) -> None:
            progress(first + (last - first) * min(done, total) // max(total, 1), 1000)

        knots = self._knots(
            relaxation, t_fast, free, resolution_s, lambda d, t: report(0, 150, d, t)
        )

        # The anchors: a dive through the relaxation (rounding to hull options), then a local
        # search. Every grid deadline also gets the best anchor plan that fits, refilled.
        anchor_plans = np.empty((n, len(anchors)), dtype=np.int64)
        main = {f * t_default for f in _MAIN_SLOWDOWNS}
        weights = [2 if d in main else 1 for d in anchors]
        states = []  # where each anchor's search over hull plans stopped
        for a, deadline in enumerate(anchors):
            share = search_work * weights[a] // sum(weights)
            plan, state = self._searched(self._dived(relaxation, deadline, 0.05), deadline, share)
            states.append(state)
            if deadline == t_default and n <= _RESTARTS_UP_TO:
                plan = self._restarts(relaxation, deadline, share // 4, plan)
            if deadline == t_default and polish_s > 0:
                polished = ExactProgram(self.dag, self.costs).solve(
                    deadline,
                    time_limit_s=polish_s,
                    incumbent=plan,
                    hull_only=True,
                    rel_gap=1e-3,
                    allow_incomplete=True,
                )
                plan = self._best_of(
                    [self._evaluated(plan[:, None]), self._evaluated(polished.choice[:, None])],
                    np.asarray([deadline]),
                )[0][:, 0]
            anchor_plans[:, a] = plan
            report(150, 700, a + 1, len(anchors))
        anchor_plans, anchor_time, anchor_energy = self._with_crossings(anchor_plans)

        best_choice = np.empty((n, len(grid)), dtype=np.int64)
        best_time = np.empty(len(grid))
        best_energy = np.empty(len(grid))
        knot_deadlines = np.asarray([k.deadline_s for k in knots[:-1]] + [math.inf])
        for lo in range(0, len(grid), _CHUNK):
            deadlines = grid[lo : lo + _CHUNK]
            right = np.clip(
                np.searchsorted(knot_deadlines, deadlines, side="left"), 1, len(knots) - 1
            )
            left = right - 1
            a_dead = knot_deadlines[left]
            b_dead = np.where(np.isinf(knot_deadlines[right]), a_dead, knot_deadlines[right])
            span = np.where(b_dead > a_dead, b_dead - a_dead, 1.0)
            theta = np.clip((deadlines - a_dead) / span, 0.0, 1.0)
            durs_a = np.stack([knots[k].durations_s for k in left], axis=1)
            durs_b = np.stack([knots[k].durations_s for k in right], axis=1)
            tau_a = np.asarray([knots[k].iteration_time_s for k in left])
            tau_b = np.asarray([knots[k].iteration_time_s for k in right])
            mixed = durs_a + theta * (durs_b - durs_a)
            tau = np.minimum(tau_a + theta * (tau_b - tau_a), deadlines)
            rounded = self.round_down(mixed)
            rounded_time, _ = self.evaluate(rounded)
            # Two ceilings: the relaxation's own iteration time, and what rounding left of it;
            # and the anchors' plans.
            candidates = [
                self.refill_evaluated(rounded, tau),
                self.refill_evaluated(rounded, np.minimum(rounded_time, tau)),
                *self._from_anchors(anchor_plans, anchor_time, anchor_energy, deadlines),
            ]
            chosen, chosen_time, chosen_energy = self._best_of(candidates, deadlines)
            width = len(deadlines)
            best_choice[:, lo : lo + width] = chosen
            best_time[lo : lo + width] = chosen_time
            best_energy[lo : lo + width] = chosen_energy
            report(700, 900, lo + width, len(grid))

        def finish() -> tuple[IntArray, FloatArray, FloatArray]:
            keep = _pareto(best_time, best_energy)
            if not np.isfinite(best_energy[keep]).all():
                raise InfeasibleDeadline("no plan meets the all-fastest iteration time")
            served = _served_deadline(best_time[keep], grid)
            bound = np.max(
                [
                    k.value_j + k.slope_j_per_s * (np.minimum(served, t_end) - k.deadline_s)
                    for k in knots[:-1]
                ]
                + [np.full(len(keep), knots[-1].value_j)],
                axis=0,
            )
            return keep, served, best_energy[keep] / (bound * (1 - 1e-9)) - 1.0

        def merge(plans: IntArray, upto: float | None = None, needy: bool = False) -> None:
            """Offer every grid deadline (up to ``upto``; with ``needy``, only those served by
            a point whose gap is over the repair threshold) the best of ``plans`` that fits,
            as is and refilled."""
            plan_time, plan_energy = self.evaluate(plans)
            first = int(np.searchsorted(grid, plan_time.min() * (1 - 1e-12)))
            stop = len(grid) if upto is None else int(np.searchsorted(grid, upto, side="right"))
            where = np.arange(first, stop)
            if needy:
                point = np.searchsorted(best_time[keep], grid[where] * (1 + 1e-12), "right") - 1
                where = where[(point >= 0) & (gaps[np.maximum(point, 0)] > _REPAIR_GAP)]
            for lo in range(0, len(where), _CHUNK):
                at = where[lo : lo + _CHUNK]
                deadlines = grid[at]
                current = (best_choice[:, at], best_time[at], best_energy[at])
                extra = self._from_anchors(plans, plan_time, plan_energy, deadlines)
                chosen, chosen_time, chosen_energy = self._best_of([current, *extra], deadlines)
                best_choice[:, at] = chosen
                best_time[at] = chosen_time
                best_energy[at] = chosen_energy

        def large_gaps() -> list[int]:
            """Points whose gap is over the repair threshold, the largest first."""
            return [int(i) for i in np.argsort(-gaps, kind="stable")
                    if gaps[i] > _REPAIR_GAP and math.isfinite(served[i])]  # fmt: skip

        keep, served, gaps = finish()
        progress(900, 1000)

        small = n <= _ALL_ANCHORS_UP_TO

        def cross_repair(needy: bool = False) -> None:
            """Repair by crossing: around a large gap, plans between the point and the next
            one (cheap: no solves, so for every DAG size), offered to every deadline up to the
            last pair's (with ``needy``, only to those served by points over the threshold)."""
            nonlocal keep, served, gaps
            for _ in range(_CROSSOVER_ROUNDS):
                worst = large_gaps()[:_CROSSOVER_PAIRS]
                if not worst:
                    break
                pairs = [(int(keep[i]), int(keep[i + 1])) for i in worst]
                fast_plans = best_choice[:, [a for a, _ in pairs]]
                slow_plans = best_choice[:, [b for _, b in pairs]]
                merge(
                    self._crossovers(fast_plans, slow_plans),
                    upto=float(max(best_time[b] for _, b in pairs)),
                    needy=needy,
                )
                keep, served, gaps = finish()

        cross_repair()
        worst = large_gaps()
        if (
            not small
            and worst
            and gaps[worst[0]] > _RESUME_ABOVE
            and best_time[keep[worst[0]]] < anchors[-1]
        ):
            # Large DAGs' searches stop for want of work, not at a local optimum (one round of
            # single moves costs more than an anchor's share): where a gap over 1 % lies among
            # the anchors, every anchor searches again from the hull plan its search stopped at
            # (its moves start over from the first instruction; an order spread over every GPU
            # did no better), and the new plans and their crossings are offered to the
            # deadlines whose gaps are large (all of them would cost 0.3 s a merge on 8 x 96).
            resumed = []
            for a, deadline in enumerate(anchors):
                share = int(_RESUME_WORK * search_work * weights[a] // sum(weights))
                plan, states[a] = self._searched(states[a], deadline, share)
                resumed.append(plan)
                report(900, 950, a + 1, len(anchors))
            merge(self._with_crossings(np.stack(resumed, axis=1))[0], needy=True)
            keep, served, gaps = finish()
            cross_repair(needy=True)
            worst = []
        # Repair by searching where gaps are large; a fixed number of rounds and anchors, so
        # the work is bounded. Small DAGs search at the deadlines their worst points serve up
        # to, once more if a gap is still over 1 % (gpt3-175b+a40 gpipe 8 x 12: 1.02 ->
        # 0.97 %). Large DAGs afford one search: at the first point of the stretch of large gaps
        # holding the worst, since a plan serves every deadline from its own time up (refilled),
        # so that one plan lifts the whole stretch, not only the worst point.
        for round_ in range(_REPAIR_ROUNDS + 1):
            # the last round only for a small DAG with a gap still over 1 %
            last_chance = round_ == _REPAIR_ROUNDS
            if not worst or (last_chance and (not small or gaps[worst[0]] <= _RESUME_ABOVE)):
                break
            upto = None
            if small:
                targets = sorted({float(served[i]) for i in worst[:_REPAIR_ANCHORS]})
            else:
                first = last = worst[0]
                while first > 0 and gaps[first - 1] > _REPAIR_GAP:
                    first -= 1
                while last + 1 < len(gaps) and gaps[last + 1] > _REPAIR_GAP:
                    last += 1
                targets = [float(best_time[keep[first]])]
                upto = float(served[last])
            share = search_work // (4 * _REPAIR_ANCHORS)
            repaired = [self.search(relaxation, d, share, 0.25) for d in targets]
            merge(np.stack(repaired, axis=1), upto)
            keep, served, gaps = finish()
            worst = large_gaps()
        progress(1000, 1000)
        return best_time[keep], best_energy[keep], gaps, best_choice[:, keep].T.copy()

    def _with_crossings(self, plans: IntArray) -> Evaluated:
        """``plans`` and the crossovers of each with the next by time, evaluated."""
        plan_time, plan_energy = self.evaluate(plans)
        by_time = np.lexsort((plan_energy, plan_time))
        crossed = self._crossovers(plans[:, by_time[:-1]], plans[:, by_time[1:]])
        crossed_time, crossed_energy = self.evaluate(crossed)
        return (
            np.concatenate([plans, crossed], axis=1),
            np.concatenate([plan_time, crossed_time]),
            np.concatenate([plan_energy, crossed_energy]),
        )

    def _crossovers(self, fast_plans: IntArray, slow_plans: IntArray) -> IntArray:
        """Plans between pairs of plans (column ``k`` of ``fast_plans`` and of ``slow_plans``):
        a share of every class's nodes takes the slow plan's option, the rest keeps the fast
        plan's; the shares evenly spaced, the nodes taken in three orders (first to last, last
        to first, evenly spread).

        Where a profile is not convex, the frontier between two good plans is made of such
        mixtures (some forwards at a fast clock, the others at a much slower one), which
        rounding the relaxation misses.
        """
        shares = np.linspace(0.0, 1.0, _CROSSOVER_SHARES + 2)[1:-1]
        out = [np.empty((self.dag.size, 0), dtype=np.int64)]
        for k in range(fast_plans.shape[1]):
            fast_plan, slow_plan = fast_plans[:, k], slow_plans[:, k]
            if np.array_equal(fast_plan, slow_plan):
                continue
            for key in self._crossing_orders:
                switched = key[:, None] < shares[None, :]
                out.append(np.where(switched, slow_plan[:, None], fast_plan[:, None]))
        return np.concatenate(out, axis=1)

    def _from_anchors(
        self,
        plans: IntArray,
        plan_time: FloatArray,
        plan_energy: FloatArray,
        deadlines: FloatArray,
    ) -> list[Evaluated]:
        """Per deadline, the least-energy plan of ``plans`` that fits (the all-fastest plan
        if none does), as it is and with the extra time refilled; and the fastest plan that
        does not fit, shrunk onto the deadline by the refill.

        A plan serves deadlines from its own time up, so just below a searched plan the
        frontier otherwise holds the plan searched below it, stretched ever further: on
        gpt3-175b+a40 8 x 16 the gaps grew to 1.20 % on the way up to the next anchor. Shrinking
        the plan above by a little costs less (0.92 %)."""
        fits = np.asarray(plan_time[:, None] <= deadlines[None, :] * (1 + 1e-12))
        pick = np.argmin(np.where(fits, plan_energy[:, None], np.inf), axis=0)
        any_fits = np.asarray(fits.any(axis=0))
        chosen = np.where(any_fits[None, :], plans[:, pick], 0)
        as_is = (
            chosen,
            np.where(any_fits, plan_time[pick], self.fastest_time_s),
            np.where(any_fits, plan_energy[pick], self.fastest_energy_j),
        )
        above = np.argmin(np.where(fits, np.inf, plan_time[:, None]), axis=0)
        return [
            self.refill_evaluated(chosen, deadlines),
            as_is,
            self.refill_evaluated(plans[:, above], deadlines),
        ]

    def search(
        self, relaxation: Relaxation, deadline_s: float, work: int, fraction: float = 0.05
    ) -> IntArray:
        """A good plan at one deadline: a dive, then a local search of about ``work`` cells.

        The dive rounds the relaxation to hull options only (the relaxation mixes hull
        vertices; measured options above the hull are what rounding to any option lands on
        where profiles are not convex), and the refill then spends what is left over.
        """
        return self._searched(self._dived(relaxation, deadline_s, fraction), deadline_s, work)[0]

    def _dived(self, relaxation: Relaxation, deadline_s: float, fraction: float) -> IntArray:
        """Where :meth:`search` starts: the dive's hull plan, or the all-fastest plan if that
        one, refilled, takes less energy."""
        n = self.dag.size
        fraction = fraction if n <= _ALL_ANCHORS_UP_TO else 0.25
        hull_times = [self.class_times[c][self.hull[c]] for c in range(len(self.hull))]
        on_hull = relaxation.dive(deadline_s, [hull_times[c] for c in self.cls], fraction)
        plan = np.asarray([self.hull[c][k] for c, k in zip(self.cls, on_hull, strict=True)])
        starts = np.stack([plan, np.zeros(n, dtype=np.int64)], axis=1)
        _, _, start_energy = self.refill_evaluated(starts, np.full(2, deadline_s))
        return np.asarray(starts[:, int(np.argmin(start_energy))])

    def _searched(self, start: IntArray, deadline_s: float, work: int) -> tuple[IntArray, IntArray]:
        """The local searches of :meth:`search` from hull plan ``start``: over hull plans
        before the refill (three quarters of ``work``), then over refilled plans. Returns the
        plan, and the hull plan where the first search stopped (to go on from)."""
        hull_work = work * 3 // 4
        state = self.local_search(start, deadline_s, hull_work, raw=True, keep_state=True)
        plan = self.refill(state[:, None], np.asarray([deadline_s]))[:, 0]
        return self.local_search(plan, deadline_s, work - hull_work), state

    def _restarts(
        self, relaxation: Relaxation, deadline_s: float, work: int, plan: IntArray
    ) -> IntArray:
        """The best of ``plan`` and :data:`_RESTARTS` more searches at ``deadline_s`` (each of
        ``work``), each diving through the relaxation with every node's energy slopes scaled
        by a fixed pseudo-random factor in 1 +- :data:`_RESTART_SPREAD`.

        Which vertex the relaxation rests on decides which local optimum the search ends in
        (on gpt3-175b+a40 8 x 12 at no slowdown: 12.28-12.41 % over eight such dives, 12.31 %
        unscaled); a scaled problem rests on another vertex near the same optimum.
        """
        plans = [plan]
        for k in range(_RESTARTS):
            factors = 1.0 + _RESTART_SPREAD * np.random.default_rng(k).uniform(
                -1.0, 1.0, self.dag.size
            )
            with relaxation.weighted(factors):
                plans.append(self.search(relaxation, deadline_s, work))
        stacked = np.stack(plans, axis=1)
        plan_time, energy = self.evaluate(stacked)
        energy = np.where(plan_time <= deadline_s * (1 + 1e-12), energy, np.inf)
        return np.asarray(stacked[:, int(np.argmin(energy))])

    def local_search(
        self,
        plan: IntArray,
        deadline_s: float,
        work: int,
        *,
        raw: bool = False,
        keep_state: bool = False,
    ) -> IntArray:
        """Improve ``plan`` by moves of one node to another option, others refilled.

        Every round tries the whole-class moves, applying the best if it improves; otherwise
        every single-node move, in batches evaluated side by side (each a column refilled to
        the deadline: a node made faster frees time for the others, one made slower takes it
        from them). After each batch the best of the prefixes of 1, 2, 4, ... of its
        improving moves (best first) is applied, and the improving moves left over are tried
        again at once. Stops at a local optimum or once ``work`` cells (instruction x
        candidate plan, plus a charge per batch) have been evaluated. O(work) time.

        ``raw``: the search state is a plan on the hull options *before* the refill, moves go
        to neighbouring hull options only (on DAGs of up to 512 instructions also to the hull
        option after those), and each state is judged by its refilled plan (which is
        returned, or with ``keep_state`` the state itself). A refilled plan holds its slack in
        options off the hull, which later moves cannot take back; searching before the refill
        keeps that slack free to move.
        """
        n = self.dag.size
        limit = deadline_s * (1 + 1e-12)

        def judged(trials: IntArray) -> tuple[IntArray, FloatArray]:
            """The refilled trials and their energies (inf where the deadline is missed)."""
            refilled, time, energy = self.refill_evaluated(
                trials, np.full(trials.shape[1], deadline_s)
            )
            return refilled, np.where(time <= limit, energy, np.inf)

        def state(trials: IntArray, refilled: IntArray, k: int) -> IntArray:
            return np.asarray((trials if raw else refilled)[:, k].copy())

        energy = (
            float(judged(plan[:, None])[1][0]) if raw else float(self.evaluate(plan[:, None])[1][0])
        )

        def apply(nodes: IntArray, options: IntArray) -> tuple[IntArray, IntArray, bool]:
            """Try the moves ``nodes[k] -> options[k]`` side by side, apply the best of the
            prefixes of 1, 2, 4, ... improving ones (best first, one node once); return the
            improving moves not applied, and whether the plan improved."""
            nonlocal plan, energy, work
            trial = np.repeat(plan[:, None], len(nodes), axis=1)
            trial[nodes, np.arange(len(nodes))] = options
            gains = judged(trial)[1]
            work -= n * (len(nodes) + _BATCH_CHARGE)
            better = np.flatnonzero(gains < energy * (1 - 1e-12))
            if not len(better):
                return nodes[:0], options[:0], False
            order = better[np.argsort(gains[better], kind="stable")]
            _, first = np.unique(nodes[order], return_index=True)
            picked = order[np.sort(first)]
            sizes = np.unique(np.minimum(2 ** np.arange(len(picked).bit_length() + 1), len(picked)))
            trial = np.repeat(plan[:, None], len(sizes), axis=1)
            for k, size in enumerate(sizes.tolist()):
                trial[nodes[picked[:size]], k] = options[picked[:size]]
            refilled, trial_energy = judged(trial)
            work -= n * (len(sizes) + _BATCH_CHARGE)
            k = int(np.argmin(trial_energy))
            if not trial_energy[k] < energy * (1 - 1e-12):
                return nodes[:0], options[:0], False
            plan, energy = state(trial, refilled, k), float(trial_energy[k])
            rest = picked[int(sizes[k]) :]
            rest = rest[plan[nodes[rest]] != options[rest]]
            return nodes[rest], options[rest], True

        width = max(1, _SEARCH_CHUNK // n)
        # Small DAGs' searches converge within their work: there a node may also skip one hull
        # option (a wider neighbourhood, with more moves per round); on larger DAGs the work
        # buys more rounds of the narrower one.
        reach = 2 if raw and n <= _WIDE_MOVES_UP_TO else 1
        while work > 0:
            # Whole-class moves first: in a pipeline's steady state the instructions of one
            # class sit on the critical path together, so only moving them together frees time.
            classed = self._class_moves(plan, steps=not raw)
            shifted, shifted_energy = judged(classed)
            work -= n * (shifted.shape[1] + _BATCH_CHARGE)
            best_shift = int(np.argmin(shifted_energy))
            if shifted_energy[best_shift] < energy * (1 - 1e-12):
                plan = state(classed, shifted, best_shift)
                energy = float(shifted_energy[best_shift])
                continue
            move_node, move_option = self._moves(plan, steps=not raw, reach=reach)
            origin = plan.copy()
            improved = False
            for lo in range(0, len(move_node), width):
                if work <= 0:
                    break
                batch = np.arange(lo, min(lo + width, len(move_node)))
                # moves of nodes that an earlier batch of this round moved are stale
                batch = batch[plan[move_node[batch]] == origin[move_node[batch]]]
                nodes, options = move_node[batch], move_option[batch]
                # The improving moves left out of what was applied are tried again at once
                # (most still improve), before the next batch.
                while len(nodes) and work > 0:
                    nodes, options, applied = apply(nodes, options)
                    improved |= applied
            if not improved:
                break
        if keep_state:
            return plan
        return judged(plan[:, None])[0][:, 0] if raw else plan

    def _neighbours(self, c: int, current: IntArray, steps: bool, reach: int = 1) -> list[IntArray]:
        """Options near ``current`` (options of class ``c``): the next hull option either side
        (with ``reach`` 2, also the one after; with ``steps``, also one option either side)."""
        hull = self.hull[c]
        last = len(hull) - 1
        at = np.searchsorted(hull, current)
        after = np.searchsorted(hull, current, side="right")
        near = [hull[np.maximum(at - 1, 0)], hull[np.minimum(after, last)]]
        if reach > 1:
            near += [hull[np.maximum(at - 2, 0)], hull[np.minimum(after + 1, last)]]
        if steps:
            near += [current - 1, current + 1]
        return near

    def _class_moves(self, plan: IntArray, steps: bool = True) -> IntArray:
        """Plans: every node of one class moved together to its next hull option either side
        (and, with ``steps``, one option either side)."""
        per_class = 4 if steps else 2
        trials = np.repeat(plan[:, None], per_class * len(self.hull), axis=1)
        for c, members in enumerate(self._members):
            options = self._neighbours(c, plan[members], steps)
            for k, option in enumerate(options):
                trials[members, per_class * c + k] = np.clip(option, 0, self.class_top[c])
        return trials

    def _moves(
        self, plan: IntArray, steps: bool = True, reach: int = 1
    ) -> tuple[IntArray, IntArray]:
        """Moves from ``plan``: each node to one of :meth:`_neighbours`' options."""
        nodes: list[IntArray] = []
        options: list[IntArray] = []
        for c, members in enumerate(self._members):
            current = plan[members]
            for option in self._neighbours(c, current, steps, reach):
                ok = (option != current) & (option >= 0) & (option <= self.class_top[c])
                nodes.append(members[ok])
                options.append(option[ok])
        node_arr, option_arr = np.concatenate(nodes), np.concatenate(options)
        order = np.lexsort((option_arr, node_arr))
        pairs = np.unique(np.stack([node_arr[order], option_arr[order]]), axis=1)
        return pairs[0], pairs[1]

    def _evaluated(self, plans: IntArray) -> Evaluated:
        return (plans, *self.evaluate(plans))

    def _best_of(
        self, candidates: list[Evaluated], deadlines: FloatArray
    ) -> tuple[IntArray, FloatArray, FloatArray]:
        """Per deadline, the least-energy candidate plan that meets it (energy inf if none)."""
        limit = deadlines * (1 + 1e-12)
        first, chosen_time, chosen_energy = candidates[0]
        chosen = first.copy()
        chosen_energy = np.where(chosen_time <= limit, chosen_energy, np.inf)
        for candidate, candidate_time, energy in candidates[1:]:
            better = (candidate_time <= limit) & (energy < chosen_energy)
            chosen = np.where(better[None, :], candidate, chosen)
            chosen_time = np.where(better, candidate_time, chosen_time)
            chosen_energy = np.where(better, energy, chosen_energy)
        return chosen, chosen_time, chosen_energy

    def _knots(
        self,
        relaxation: Relaxation,
        t_fast: float,
        free: RelaxedSolution,
        resolution_s: float,
        progress: Progress,
    ) -> list[RelaxedSolution]:
        """Relaxed solutions at adaptively chosen deadlines, the unconstrained one last."""
        if free.iteration_time_s <= t_fast + resolution_s:
            first = relaxation.solve(max(t_fast, min(free.iteration_time_s, t_fast)))
            return [first, free]
        end = relaxation.solve(free.iteration_time_s, free)
        start = relaxation.solve(t_fast)
        knots = [start, end]
        pending = [(start, end)]
        while pending and len(knots) < _MAX_KNOTS:
            a, b = pending.pop()
            cut = _tangent_crossing(a, b)
            if cut is None or not (a.deadline_s + resolution_s < cut < b.deadline_s - resolution_s):
                continue
            chord = a.value_j + (b.value_j - a.value_j) * (cut - a.deadline_s) / (
                b.deadline_s - a.deadline_s
            )
            tangent = a.value_j + a.slope_j_per_s * (cut - a.deadline_s)
            if chord - tangent <= _KNOT_TOLERANCE * b.value_j:
                continue
            middle = relaxation.solve(cut, a if cut - a.deadline_s < b.deadline_s - cut else b)
            knots.append(middle)
            pending.extend([(a, middle), (middle, b)])
            progress(len(knots), _MAX_KNOTS)
        knots.sort(key=lambda k: k.deadline_s)
        return [*knots, free]

    def exact(
        self,
        resolution_s: float,
        progress: Progress,
        work_budget: int | None,
        time_limit_s: float | None,
        t_default: float,
        fast: tuple[FloatArray, FloatArray, FloatArray, IntArray] | None = None,
    ) -> tuple[FloatArray, FloatArray, FloatArray, IntArray]:
        """One MILP per frontier point, deadlines swept downwards.

        Args:
            resolution_s: Spacing of the deadlines.
            progress: Progress callback.
            work_budget: Branch-and-bound nodes (plus ``_SOLVE_CHARGE`` per solve) for the
                whole sweep; None: unlimited.
            time_limit_s: Wall-clock limit of the sweep; None: unlimited.
            t_default: The default plan's time (always one of the deadlines).
            fast: The fast frontier ``(times, energies, gaps, choices)``: each MILP starts
                from its best plan that fits, and where the time limit ends the sweep its
                points stand (with their own gaps).

        Raises:
            SolverTimeout: All solves together needed more than ``work_budget``, or the sweep
                is estimated to need more than ``time_limit_s`` (refused before it starts).
        """
        program = ExactProgram(self.dag, self.costs)
        t_fast = self.fastest_time_s
        slowest_time = self.slowest_time_s
        steps = math.ceil((slowest_time - t_fast) / resolution_s - 1e-9)
        grid = t_fast + resolution_s * np.arange(steps + 1)
        if t_fast <= t_default <= slowest_time:
            grid = np.unique(np.concatenate([grid, [t_default]]))
        started = time.monotonic()
        if time_limit_s is not None:
            solves = len(fast[0]) if fast is not None else len(grid)
            estimate = self.exact_estimate_s(program, t_default, time_limit_s / solves) * solves
            if estimate > time_limit_s:
                raise SolverTimeout(
                    f"exact mode: estimated to need at least {estimate:.0f} s ({solves} MILPs, "
                    f"each at least as long as one timed root solve), over the limit of "
                    f"{time_limit_s:g} s; use the fast mode, whose reported gaps bound what it "
                    "can lose, or allow more time"
                )
        plans: list[tuple[float, float, float, IntArray]] = []
        g = len(grid) - 1
        while g >= 0:
            left_s = None
            if time_limit_s is not None:
                left_s = time_limit_s - (time.monotonic() - started)
                if left_s <= 0:
                    break  # the fast frontier's points stand for the rest
            if work_budget is not None:
                work_budget -= _SOLVE_CHARGE
            incumbent = None
            floor = -math.inf  # a lower bound at this deadline known before the solve
            if fast is not None:
                fits = np.flatnonzero(fast[0] <= grid[g] * (1 + 1e-12))
                if len(fits):
                    # the fast point serves this deadline, so its bound holds here
                    incumbent = fast[3][fits[-1]]
                    floor = float(fast[1][fits[-1]] / (1 + fast[2][fits[-1]]))
            solution = program.solve(
                float(grid[g]),
                time_limit_s=left_s,
                node_limit=work_budget,
                incumbent=incumbent,
                allow_incomplete=left_s is not None,
            )
            if work_budget is not None:
                work_budget -= solution.nodes
            choice = solution.choice[:, None]
            time_s, energy = self.evaluate(choice)
            gap = float(energy[0]) / max(solution.bound_j, floor) - 1.0
            plans.append((float(time_s[0]), float(energy[0]), gap, solution.choice))
            g = int(np.searchsorted(grid, time_s[0] * (1 - 1e-12), side="left")) - 1
            progress(len(grid) - 1 - max(g, 0), len(grid))
        if fast is not None and g >= 0:
            plans.extend(
                (float(t), float(e), float(gp), c)
                for t, e, gp, c in zip(*fast, strict=True)
                if t <= grid[g] * (1 + 1e-12)
            )
        times = np.asarray([p[0] for p in plans])
        energies = np.asarray([p[1] for p in plans])
        keep = _pareto(times, energies)
        gaps = np.maximum(np.asarray([p[2] for p in plans])[keep], 0.0)
        chosen = np.stack([plans[k][3] for k in keep])
        return times[keep], energies[keep], gaps, chosen

    def exact_estimate_s(self, program: ExactProgram, deadline_s: float, cap_s: float) -> float:
        """A quick lower estimate of one exact solve's time: one MILP's root, timed.

        The root (presolve, cuts, root heuristics) of the MILP at the no-slowdown deadline
        with a node limit of one, stopped after ``cap_s`` (then the estimate is at least
        ``cap_s``, which is all the caller needs to refuse); a whole solve needs at least that.
        """
        pairs = int((self.last + 1).sum())
        if pairs > _EXACT_TIMED_UP_TO:
            # too large to time even one root quickly: a size-based floor (1 ms per pair)
            return pairs * 1e-3
        started = time.monotonic()
        with contextlib.suppress(SolverTimeout, InfeasibleDeadline):
            program.solve(deadline_s, time_limit_s=cap_s, node_limit=1, allow_incomplete=True)
        return max(time.monotonic() - started, cap_s * 1.001 if program.last_stopped else 0.0)


def _van_der_corput(i: int) -> float:
    """The ``i``-th term of the base-2 van der Corput sequence (0, 1/2, 1/4, 3/4, ...)."""
    value, scale = 0.0, 0.5
    while i:
        value += scale * (i & 1)
        i >>= 1
        scale /= 2
    return value


def _deadline_grid(
    t_fast: float, t_end: float, t_slowest: float, resolution_s: float
) -> FloatArray:
    """Deadlines every ``resolution_s`` up to the relaxed optimum's time ``t_end``, then on to
    the slowest plan's time (at most 512 more, evenly spread: the minimum-energy plan can be
    slower than the relaxed optimum)."""
    steps = math.ceil((t_end - t_fast) / resolution_s - 1e-9)
    grid = t_fast + resolution_s * np.arange(steps + 1)
    extra = math.floor((t_slowest - grid[-1]) / resolution_s + 1e-9)
    if extra > 0:
        tail = grid[-1] + resolution_s * np.arange(1, extra + 1)
        if extra > 512:
            tail = np.linspace(tail[0], t_slowest, 512)
        grid = np.concatenate([grid, tail, [t_slowest]] if tail[-1] < t_slowest else [grid, tail])
    return np.asarray(grid, dtype=np.float64)


def _tangent_crossing(a: RelaxedSolution, b: RelaxedSolution) -> float | None:
    """Deadline where the tangents of ``V`` at ``a`` and ``b`` cross."""
    if b.slope_j_per_s - a.slope_j_per_s <= 0:
        return None
    return (
        b.value_j - a.value_j + a.slope_j_per_s * a.deadline_s - b.slope_j_per_s * b.deadline_s
    ) / (a.slope_j_per_s - b.slope_j_per_s)


def _pareto(times: FloatArray, energies: FloatArray) -> IntArray:
    """Indices of the Pareto-optimal (time, energy) pairs, time ascending; ties merged."""
    order = np.lexsort((energies, times))
    keep: list[int] = []
    best = math.inf
    for i in order:
        if energies[i] < best:
            if keep and times[keep[-1]] == times[i]:
                continue
            keep.append(int(i))
            best = float(energies[i])
    return np.asarray(keep, dtype=np.int64)


def _served_deadline(times: FloatArray, grid: FloatArray) -> FloatArray:
    """Largest grid deadline each point answers (the next point's time, exclusive)."""
    served = np.empty(len(times))
    for i in range(len(times)):
        if i + 1 == len(times):
            served[i] = math.inf
            continue
        g = int(np.searchsorted(grid, times[i + 1], side="left")) - 1
        served[i] = max(float(grid[max(g, 0)]), float(times[i]))
    return served


def _split(flat: npt.NDArray[Any], schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    out = []
    at = 0
    for seq in schedule.order:
        out.append(tuple(int(f) for f in flat[at : at + len(seq)]))
        at += len(seq)
    return tuple(out)


def baselines_at(
    profile: Profile,
    schedule: Schedule,
    p_block_w: float,
    deadline_s: float,
    *,
    dag: PipelineDag | None = None,
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

    """
    dag = dag or build_dag(schedule)
    scale = 1.0 / schedule.virtual_stages
    stages = profile.stages
    n = dag.size

    def by_clock(stage: int, kind: str) -> dict[int, tuple[float, float]]:
        return {
            o.frequency_mhz: (o.time_s * scale, o.energy_j * scale) for o in stages[stage][kind]
        }

    tables = [by_clock(g, k) for g in range(schedule.stages) for k in (FORWARD, BACKWARD)]

    def nearest(table: dict[int, tuple[float, float]], clock: int) -> int:
        return clock if clock in table else min(table, key=lambda f: (abs(f - clock), -f))

    def evaluate(clock_of_class: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray]:
        """Time and energy of plans given one clock per cost class, ``(classes, P)``."""
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
        return Baseline(float(time[0]), float(energy[0]), _split(flat, schedule))

    def uniform(clock: int, classes: range) -> list[int]:
        return [nearest(tables[c], clock) for c in classes]

    highest = np.asarray([max(t) for t in tables], dtype=np.int64)
    fastest = np.asarray([min(t, key=lambda f: t[f][0]) for t in tables], dtype=np.int64)
    result = {"default": baseline(highest), "all_fastest": baseline(fastest)}

    limit = deadline_s * (1 + 1e-12)
    every = range(len(tables))
    clocks = sorted(set().union(*tables), reverse=True)
    candidates = np.asarray([uniform(f, every) for f in clocks], dtype=np.int64).T
    time, energy = evaluate(candidates)
    ok = time <= limit
    pick = int(np.argmin(np.where(ok, energy, np.inf))) if ok.any() else int(np.argmin(time))
    result["global_clock"] = baseline(candidates[:, pick])

    per_stage = [
        sorted(set(tables[2 * g]) | set(tables[2 * g + 1])) for g in range(schedule.stages)
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
                move[2 * g : 2 * g + 2] = uniform(f, range(2 * g, 2 * g + 2))
                moves.append(move)
        trial = np.stack(moves, axis=1)
        time, energy = evaluate(trial)
        feasible = time <= max(limit, current_time)
        score = np.where(feasible, energy, np.inf)
        k = int(np.argmin(score))
        if not score[k] < current_energy * (1 - 1e-12):
            break
        current, current_time, current_energy = trial[:, k].copy(), float(time[k]), float(score[k])
    result["per_stage_clock"] = baseline(current)
    return result
