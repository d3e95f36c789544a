"""Plans over one DAG and cost table: exact evaluation, fitting, the refill, crossings.

A plan is one option index per DAG node (within its cost class); ``P`` plans travel side by
side as the columns of an ``(n, P)`` array, so every operation here is vectorised over plans.
The fast sweep (:mod:`perseus.solver.fast`), the local search (:mod:`perseus.solver.search`)
and the exact mode (:mod:`perseus.solver.exact`) all build on :class:`Planner`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt

from perseus.solver.costs import CostTable, build_costs
from perseus.solver.dag import PipelineDag, build_dag
from perseus.solver.kernel_cache import compile_later, mark_ready, ready
from perseus.solver.programs import hull_options
from perseus.solver.schedules import make_schedule
from perseus.solver.synthetic import EXAMPLE_P_BLOCK_W, example_profile

__all__ = [
    "COMPILED_FROM",
    "FIT_BINS",
    "FIT_BINS_MAX",
    "Evaluated",
    "FloatArray",
    "Found",
    "IntArray",
    "Planner",
    "Progress",
    "ServedBound",
    "pareto",
    "warm_kernels",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Progress = Callable[[int, int], None]
# Plans (n, P) with their exact iteration times and energies (P each).
Evaluated = tuple[IntArray, FloatArray, FloatArray]
# Given a frontier's point times (ascending), the relaxation's lower bound on the least energy
# at the largest deadline each point serves.
ServedBound = Callable[[FloatArray], FloatArray]


class Found(NamedTuple):
    """A frontier as a mode found it, time ascending: per point its time, energy, gap to the
    lower bound at the largest deadline it serves, and choices (one row per point).
    ``served_bound``: for any frontier's point times, the lower bound at the largest deadline
    each serves, where the mode has one (the fast mode's relaxation; an exact mode's bounds are
    per point)."""

    times: FloatArray
    energies: FloatArray
    gaps: FloatArray
    choices: IntArray
    served_bound: ServedBound | None = None


FIT_BINS = 1024  # table bins per class's time range, at least (see Planner.__init__)
FIT_BINS_MAX = 1 << 15
# DAGs of this many instructions or more refill with the compiled loops (perseus.solver.kernels)
# where they are ready (compiled and cached for this installation: kernel_cache.ready): below,
# numba's import and loading them (about 0.8 s a process) cost more than they save (8 x 12:
# 192 instructions), above they save seconds (8 x 96: the refill 2x faster). Where they are not
# ready (a fresh installation, an emptied cache), compiling them takes 6-15 s, more than numpy's
# passes take to plan such a DAG: the process plans with numpy's passes and compiles them for
# the next process, once it has exited (kernel_cache.compile_later). A process that plans job
# after job (a planner server's worker) compiles or loads them ahead of its jobs instead
# (warm_kernels) and plans every DAG with them: there 8 x 12's planning call took 0.50 s
# against numpy's 0.79 s. Without numba, every DAG plans with numpy's passes.
COMPILED_FROM = 1024
_FIT_MARGIN = 1e-6  # of a bin: a table entry fits this far below its bin (rounding's room)
_CROSSOVER_SHARES = 31  # plans between two neighbouring anchors, per node order
# Set by warm_kernels: this process's compiled kernels are loaded, so every DAG uses them.
_kernel_state = {"warm": False}


class Planner:
    """Plans over one DAG and cost table. Choices are per-node option indices within a class.

    Args:
        dag: The schedule's DAG.
        costs: Its cost table.
        fit_bins_max: Most table bins per class for the one-step fit (see :meth:`fit`);
            below what a class needs, the fit steps until exact instead.
        compiled: Refill and take longest paths with the compiled loops of
            :mod:`perseus.solver.kernels` (True) or with numpy, a level at a time (False);
            None: compiled from :data:`COMPILED_FROM` instructions where the kernels are
            ready (:func:`perseus.solver.kernel_cache.ready`), or for every DAG once
            :func:`warm_kernels` has loaded them in this process; numpy otherwise, and
            always where numba is not installed. Both give the same plans, times and
            energies.

    Raises:
        ModuleNotFoundError: ``compiled=True`` where numba is not installed.
    """

    def __init__(
        self,
        dag: PipelineDag,
        costs: CostTable,
        fit_bins_max: int = FIT_BINS_MAX,
        compiled: bool | None = None,
    ) -> None:
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
        # takes, up to fit_bins_max), a bin's answer is its entry or the option after it: one
        # step, exact. Otherwise (near-duplicate times) FIT_BINS bins, and steps until exact.
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
        self.one_step = max(needed, default=0.0) <= fit_bins_max
        rows = []
        scale = np.empty(classes)
        offset = np.empty(classes)
        low = np.empty(classes)
        base = 0
        for c, times in enumerate(self.class_times):
            bins = max(FIT_BINS, math.ceil(needed[c])) if self.one_step else FIT_BINS
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
        self.fit_node = (
            padded_start[self.cls],
            scale[self.cls],
            offset[self.cls],
            low[self.cls],
            high[self.cls],
        )
        # Each node's place in its class, in (0, 1): first to last, last to first, and evenly
        # spread (van der Corput); a crossover moves the nodes below a share first.
        self.members = [np.flatnonzero(self.cls == c) for c in range(classes)]
        self.class_top = [len(times) - 1 for times in self.class_times]
        rank = np.empty(dag.size)
        spread = np.empty(dag.size)
        for members in self.members:
            rank[members] = (np.arange(len(members)) + 0.5) / max(len(members), 1)
            spread[members] = [_van_der_corput(i) for i in range(len(members))]
        self._crossing_orders = (rank, 1.0 - rank, spread)
        # The refill's passes and the longest path work in level order: node j's row is
        # _place[j], and row n is "none" (the DAG's link index n). Compiled (perseus.solver.
        # kernels): per row, its predecessors' and successors' rows and the fit's columns.
        # With numpy: every level a contiguous slice (one view per level, no scatter), the
        # backward pass walking the levels in reverse (a node's room there depends only on its
        # successors, all in later levels); per level its rows, its predecessors' and
        # successors' rows, and the fit's columns.
        order = np.concatenate([np.asarray(level, dtype=np.int64) for level in dag.levels])
        place = np.empty(dag.size + 1, dtype=np.int64)
        place[order] = np.arange(dag.size)
        place[dag.size] = dag.size
        self._order = order
        self._place = place[:-1]
        # In one step (see fit_times): per table row, the picked option's time and the next
        # option's (NaN after a class's last), each gathered by the row alone.
        table_class = np.repeat(np.arange(classes), np.diff(np.append(low, base)).astype(np.int64))
        table_first = padded_start[table_class] + self._table
        self._table_time = self._padded[table_first]
        self._table_next = self._padded[table_first + 1]
        if compiled is None:
            kernels = _kernels_for(dag.size)
        else:
            kernels = _load_kernels() if compiled else None
        self.compiled = kernels is not None
        if kernels is not None:
            self._compile(kernels, order, place)
        else:
            self._first_ordered = self.fit_node[0][order][:, None]
            pred, succ = place[dag.pred], place[dag.succ]
            steps = []
            lo = 0
            for level in dag.levels:
                hi = lo + len(level)
                steps.append((lo, hi, pred[level, 0], pred[level, 1], succ[level, 0],
                              succ[level, 1], self.columns(np.asarray(level))))  # fmt: skip
                lo = hi
            self._steps = steps
        # The all-fastest plan's time and energy (every instruction at its fastest option).
        (fastest_time,), (fastest_energy,) = self.evaluate(np.zeros((dag.size, 1), np.int64))
        self.fastest_time_s, self.fastest_energy_j = float(fastest_time), float(fastest_energy)
        # The slowest plan's time (every instruction at its slowest option): the grid's end.
        self.slowest_time_s = float(dag.iteration_time(self.durations(self.last[:, None]))[0])

    def _compile(self, kernels: ModuleType, order: IntArray, place: IntArray) -> None:
        first, scale, offset, low, high = (np.ascontiguousarray(a[order]) for a in self.fit_node)
        self._kernels = kernels
        # what the compiled refill reads (perseus.solver.kernels.refill's arguments)
        self.fit_table = kernels.FitTable(
            first, scale, offset, low, high, self._table, self._table_time, self._table_next,
            self._padded, self.one_step,
        )  # fmt: skip
        self.network = kernels.Network(
            order, np.ascontiguousarray(self._place),
            np.ascontiguousarray(place[self.dag.pred][order]),
            np.ascontiguousarray(place[self.dag.succ][order]), np.ascontiguousarray(self.start),
        )  # fmt: skip

    def flat(self, choices: IntArray) -> IntArray:
        """Flat cost-table index of every (plan, node) choice."""
        return np.asarray(self.start + choices)

    def durations(self, choices: IntArray) -> FloatArray:
        """Durations ``(n, P)`` of choices ``(n, P)``."""
        return np.asarray(self.costs.time_s[self.start[:, None] + choices])

    def evaluate(self, choices: IntArray) -> tuple[FloatArray, FloatArray]:
        """Exact iteration time and energy of plans ``(n, P)``."""
        # compiled, save for one plan: numpy sums one column pairwise, not node by node
        if self.compiled and choices.shape[1] > 1:
            costs = self.costs
            evaluated = self._kernels.evaluate(
                choices, self.network, costs.time_s, costs.energy_j, costs.p_block_w,
                costs.num_gpus,
            )  # fmt: skip
            return cast(tuple[FloatArray, FloatArray], evaluated)
        flat = self.start[:, None] + choices
        times = self.costs.time_s.take(flat)
        total = self.iteration_time(times)
        energy = self.costs.energy_j.take(flat).sum(axis=0) + self.costs.p_block_w * (
            self.costs.num_gpus * total - times.sum(axis=0)
        )
        return total, np.asarray(energy)

    def iteration_time(self, durations: FloatArray) -> FloatArray:
        """Longest path of plans' durations ``(n, P)``: ``dag.iteration_time``, in level order
        (compiled, or one slice per level, as the refill's passes). O(n * P)."""
        if self.compiled:
            ordered = np.ascontiguousarray(durations.take(self._order, axis=0), dtype=np.float64)
            return np.asarray(self._kernels.longest_path(ordered, self.network.pred))
        n = self.dag.size
        ordered = durations.take(self._order, axis=0)
        finish = np.empty((n + 1, durations.shape[1]))
        finish[n] = 0.0
        for lo, hi, before_a, before_b, _, _, _ in self._steps:
            level = finish[lo:hi]
            np.maximum(finish.take(before_a, axis=0), finish.take(before_b, axis=0), out=level)
            level += ordered[lo:hi]
        return np.asarray(finish[:n].max(axis=0))

    def fit(self, nodes: IntArray, room: FloatArray) -> IntArray:
        """Slowest option of each of ``nodes`` that takes at most its ``room`` (the fastest if
        none does); ``room`` is ``(len(nodes), P)``."""
        return self.fit_times(self.columns(nodes), room)[0]

    def columns(self, nodes: IntArray) -> tuple[npt.NDArray[Any], ...]:
        """What :meth:`fit` needs of ``nodes``, as columns."""
        first, scale, offset, low, high = (a[nodes][:, None] for a in self.fit_node)
        return first, first + 1, scale, offset, low, high

    def fit_times(
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
        if self.one_step:
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
        if self.compiled:
            refilled = self._kernels.refill(
                choices, ceiling, self.network, self.fit_table, self.costs.energy_j,
                self.costs.p_block_w, self.costs.num_gpus,
            )  # fmt: skip
            return cast(Evaluated, refilled)
        n = self.dag.size
        plans = choices.shape[1]
        steps = self._steps
        # rows in level order (see __init__); row n is "none"
        chosen = choices.take(self._order, axis=0)
        durations = self._padded[self._first_ordered + chosen]
        # the current plan's earliest starts
        finish = np.empty((n + 1, plans))
        finish[n] = 0.0
        for lo, hi, before_a, before_b, _, _, _ in steps:
            level_finish = finish[lo:hi]
            np.maximum(finish.take(before_a, axis=0), finish.take(before_b, axis=0),
                       out=level_finish)  # fmt: skip
            level_finish += durations[lo:hi]
        begin = finish[:n] - durations
        latest = np.empty((n + 1, plans))
        latest[n] = ceiling
        # each node's latest finish (its successors' earliest latest start): final once the
        # backward pass is done, so the forward pass reads it back instead of gathering again
        finish_by = np.empty((n, plans))
        for lo, hi, _, _, after_a, after_b, columns in reversed(steps):
            bound = finish_by[lo:hi]
            np.minimum(latest.take(after_a, axis=0), latest.take(after_b, axis=0), out=bound)
            picked, taken = self._fit_level(columns, bound - begin[lo:hi])
            chosen[lo:hi] = picked
            durations[lo:hi] = taken
            np.subtract(bound, taken, out=latest[lo:hi])
        earliest = finish  # reused: the earliest finishes under the refilled plan
        for lo, hi, before_a, before_b, _, _, columns in steps:
            begin_level = np.maximum(earliest.take(before_a, axis=0),
                                     earliest.take(before_b, axis=0))  # fmt: skip
            picked, taken = self._fit_level(columns, finish_by[lo:hi] - begin_level)
            # options are in ascending time: the slower of two is the later index
            level_chosen, level_durations = chosen[lo:hi], durations[lo:hi]
            np.maximum(picked, level_chosen, out=level_chosen)
            np.maximum(taken, level_durations, out=level_durations)
            np.add(begin_level, level_durations, out=earliest[lo:hi])
        total = earliest[:n].max(axis=0)
        # back to node order (the sums then add up as evaluate's do)
        choices = chosen.take(self._place, axis=0)
        durations = durations.take(self._place, axis=0)
        flat = self.start[:, None] + choices
        energy = self.costs.energy_j.take(flat).sum(axis=0) + self.costs.p_block_w * (
            self.costs.num_gpus * total - durations.sum(axis=0)
        )
        return choices, total, energy

    def _fit_level(
        self, columns: tuple[npt.NDArray[Any], ...], room: FloatArray
    ) -> tuple[IntArray, FloatArray]:
        """:meth:`fit_times` of one level of the refill; in one step, the table's rows give
        the picked option's time and the next one's directly."""
        if not self.one_step:
            return self.fit_times(columns, room)
        _, _, scale, offset, low, high = columns
        position = room * scale
        position += offset
        np.maximum(position, low, out=position)
        np.minimum(position, high, out=position)
        # take, not fancy indexing: on (level, plans) arrays it is a third faster
        rows = position.astype(np.int64)
        found = self._table.take(rows)
        after = self._table_next.take(rows)
        up = after <= room
        found += up
        taken = self._table_time.take(rows)
        np.copyto(taken, after, where=up)
        return found, taken

    def with_crossings(self, plans: IntArray) -> Evaluated:
        """``plans`` and the crossovers of each with the next by time, evaluated."""
        plan_time, plan_energy = self.evaluate(plans)
        by_time = np.lexsort((plan_energy, plan_time))
        crossed = self.crossovers(plans[:, by_time[:-1]], plans[:, by_time[1:]])
        crossed_time, crossed_energy = self.evaluate(crossed)
        return (
            np.concatenate([plans, crossed], axis=1),
            np.concatenate([plan_time, crossed_time]),
            np.concatenate([plan_energy, crossed_energy]),
        )

    def crossovers(self, fast_plans: IntArray, slow_plans: IntArray) -> IntArray:
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

    def from_anchors(
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

    def evaluated(self, plans: IntArray) -> Evaluated:
        return (plans, *self.evaluate(plans))

    def best_of(
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


def warm_kernels() -> bool:
    """Load the compiled kernels now, and plan every DAG with them from then on, small ones too.

    For a process that plans job after job, ahead of its jobs (a planner server's workers,
    :func:`perseus.server.planning.worker.warm_up`): it calls each kernel once on the shipped
    example profile at 4 x 4, with the argument types every plan uses, so that each is compiled (the
    first time on an installation, 6-15 s) or loaded from the cache (about 0.5 s with numba's
    import) before a job needs it, and records them ready for later processes
    (:mod:`perseus.solver.kernel_cache`). The plans, times and energies are the same either way.

    Returns:
        Whether the kernels are loaded; False where numba is not installed (every DAG then
        plans with numpy's passes).
    """
    if _kernel_state["warm"]:
        return True
    try:
        kernels = _load_kernels()
    except ImportError:
        return False
    profile = example_profile()
    schedule = make_schedule("1f1b", 4, 4)
    dag = build_dag(schedule)
    planner = Planner(dag, build_costs(profile, schedule, EXAMPLE_P_BLOCK_W), compiled=True)
    plans = np.zeros((dag.size, 2), dtype=np.int64)
    planner.refill_evaluated(plans, np.full(2, planner.slowest_time_s))  # one block
    kernels.refill(plans, np.full(2, planner.slowest_time_s), planner.network, planner.fit_table,
                   planner.costs.energy_j, planner.costs.p_block_w, planner.costs.num_gpus,
                   blocks=2)  # fmt: skip
    planner.evaluate(plans)
    planner.iteration_time(planner.durations(plans))
    times = planner.durations(plans).ravel()
    higher = np.arange(times.size) % 2 == 0
    kernels.with_transitions(times, times, (higher, times, times), (~higher, times, times), 1e-3)
    mark_ready()
    _kernel_state["warm"] = True
    return True


def _load_kernels() -> ModuleType:
    """The compiled kernels' module (numba's import: half a second).

    Raises:
        ImportError: numba is not installed, or cannot be imported.
    """
    # imported here, not with the module: every process that reads a profile (a training
    # rank too) imports perseus.solver, and numba is optional
    import perseus.solver.kernels as kernels

    return kernels


def _kernels_for(size: int) -> ModuleType | None:
    """The kernels for a DAG of ``size`` instructions where its planner should use them
    (see :data:`COMPILED_FROM`), else None; starts compiling them for the next process where
    a large DAG finds them not ready."""
    if not _kernel_state["warm"]:
        if size < COMPILED_FROM:
            return None
        if not ready():
            compile_later()
            return None
    try:
        return _load_kernels()
    except ImportError:
        return None


def pareto(times: FloatArray, energies: FloatArray) -> IntArray:
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


def _van_der_corput(i: int) -> float:
    """The ``i``-th term of the base-2 van der Corput sequence (0, 1/2, 1/4, 3/4, ...)."""
    value, scale = 0.0, 0.5
    while i:
        value += scale * (i & 1)
        i >>= 1
        scale /= 2
    return value
