"""The convex relaxation of the exact problem: a lower bound on every plan's energy.

:class:`Relaxation` replaces each instruction's options by the lower convex hull of its
(time, effective energy) points. Its optimum ``V(D)`` is a lower bound on every plan's energy
at deadline ``D``, and is convex and non-increasing in ``D``, so the tangent line at any
solved deadline bounds ``V`` everywhere. See :mod:`perseus.solver.programs` for the energy it
minimises.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import highspy
import numpy as np

from perseus.core.errors import InfeasibleDeadline, PerseusError
from perseus.solver.costs import CostTable
from perseus.solver.dag import PipelineDag
from perseus.solver.lp_model import (
    MODEL_STATUS,
    FloatArray,
    IntArray,
    highs_model,
    lower_hull,
    precedence_rows,
)

__all__ = ["MIXES", "SCALES", "Flow", "Relaxation", "RelaxedSolution", "Solver", "side_by_side"]

_T = TypeVar("_T")
_M = TypeVar("_M")

# How the flows of two solves mix into the lines of Relaxation.lines: the share of the second,
# and the scale of each mix. On 16 x 128 1F1B and 16 x 64 interleaved, between knots 1.05 x
# and near the free optimum, these come within 0.01 % of 41 shares by 19 scales (0.8-1.25)
# of the best bound, at a tenth of the work.
MIXES = tuple(k / 16 for k in range(17))
SCALES = (0.9, 0.95, 1.0, 1.05, 1.1)

# Relaxations of DAGs of this many instructions or more price the dual simplex by devex instead of
# HiGHS's default dual steepest edge, whose exact weights cost more than they save there:
# on 16 x 128 interleaved (8,192 instructions) the free optimum, the all-fastest deadline and
# four anchors from each other took 6.1 s against 16.4 s, at the same iteration counts within
# 15 %; on 8 x 96 no difference (so smaller DAGs keep the default and their frontiers).
_DEVEX_FROM = 2049
# HiGHS's dual simplex with its tasks (``simplex_strategy`` 2, SIP): each iteration's pricing
# and updates shared among threads, the pivots those of the serial dual simplex, so the same
# solutions bit for bit (checked on gpt3-175b+a40 and bloom+a100 1F1B, 8 x 12 to 8 x 96).
_SIMPLEX_TASKS = 2


@dataclass(frozen=True, slots=True)
class RelaxedSolution:
    """Optimum of the relaxation at one deadline.

    Attributes:
        deadline_s: The deadline (``inf`` stands for none only inside this module's callers).
        value_j: Optimal relaxed energy, a lower bound on any plan's energy.
        slope_j_per_s: A subgradient of ``V`` at the deadline (<= 0).
        durations_s: Relaxed instruction durations.
        iteration_time_s: The relaxed iteration time ``T`` (<= deadline).
    """

    deadline_s: float
    value_j: float
    slope_j_per_s: float
    durations_s: FloatArray
    iteration_time_s: float
    basis: Any = None
    flow: Flow | None = None


@dataclass(frozen=True, slots=True)
class Flow:
    """The optimal duals of one solve, as a flow through the DAG: what bounds ``V`` at every
    deadline (see :meth:`Relaxation.lines`).

    Attributes:
        node_w: Per node, the flow into it (the duals of its precedence rows, J/s).
        total_w: The flow into the sinks (the duals of the sink rows).
        imbalance_w: How far the flow is from conserved, summed over the nodes (HiGHS's
            tolerances: ~1e-9 of the flow); each deadline's bound pays it times the deadline.
    """

    node_w: FloatArray
    total_w: float
    imbalance_w: float


class Solver(Protocol):
    """What the fast mode's knots and dives solve on: a :class:`Relaxation`, or a stand-in
    for one (:class:`perseus.solver.miniature.Extension`)."""

    def start_from(self, basis: Any) -> None: ...

    def solve(
        self, deadline_s: float | None, start: RelaxedSolution | None = None
    ) -> RelaxedSolution: ...

    def solve_at_slope(self, power_w: float) -> RelaxedSolution: ...

    def dive(
        self,
        deadline_s: float,
        option_times: Sequence[FloatArray],
        fraction: float,
        rounds: int | None = None,
        first: RelaxedSolution | None = None,
    ) -> IntArray: ...


class Relaxation:
    """The convex relaxation of one DAG and cost table, solvable at any deadline.

    Columns: finish time of every node, the iteration time ``T``, then one column per hull
    segment of every node (how far the node is slowed along that segment).

    With ``threads`` over 1, HiGHS shares each dual simplex iteration among that many
    threads: the same solutions bit for bit, each solve faster where the model is large and
    solves alone (bloom+a100 8 x 96 1F1B: its 38 knots 2.44 -> 2.14 s on two cores). HiGHS
    keeps one pool of threads per thread that solves, sized by the first model it solves,
    so such a model solves on a thread of its own.

    Attributes:
        dag: The DAG it relaxes.
        costs: Its cost table.
    """

    def __init__(self, dag: PipelineDag, costs: CostTable, threads: int = 1) -> None:
        self.dag = dag
        self.costs = costs
        self._threads = threads
        self._solver_thread: ThreadPoolExecutor | None = None
        if threads > 1:
            self._solver_thread = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="perseus-simplex"
            )
            # its thread (and HiGHS's pool with it) ends with the relaxation
            weakref.finalize(self, self._solver_thread.shutdown, wait=False)
        n = dag.size
        self._n = n
        segment_node: list[int] = []
        slopes: list[float] = []
        lengths: list[float] = []
        base_time = np.empty(n)
        base_value = 0.0
        effective = costs.effective_j
        hulls: dict[int, tuple[float, float, list[tuple[float, float]]]] = {}
        vertices: list[tuple[FloatArray, FloatArray]] = []
        for c in range(len(costs.start) - 1):
            lo, hi = int(costs.start[c]), int(costs.start[c + 1])
            t, e = costs.time_s[lo:hi], effective[lo:hi]
            h = lower_hull(t, e)
            segs = [((e[b] - e[a]) / (t[b] - t[a]), t[b] - t[a]) for a, b in itertools.pairwise(h)]
            hulls[c] = (float(t[0]), float(e[0]), segs)
            vertices.append((t[h], e[h]))
        tau_col = n
        duration_cols: list[list[tuple[int, float]]] = []
        for j in range(n):
            t0, e0, segs = hulls[int(dag.cost_class[j])]
            base_time[j] = t0
            base_value += e0
            cols = []
            for slope, length in segs:
                cols.append((n + 1 + len(slopes), 1.0))
                segment_node.append(j)
                slopes.append(slope)
                lengths.append(length)
            duration_cols.append(cols)
        width = n + 1 + len(slopes)
        matrix, row_node = precedence_rows(dag, duration_cols, width)
        b_ub = np.where(row_node >= 0, -base_time[np.maximum(row_node, 0)], 0.0)
        lengths_arr = np.asarray(lengths)
        cost = np.concatenate([np.zeros(n), [costs.num_gpus * costs.p_block_w], np.asarray(slopes)])
        # the HiGHS model is built on first use: a relaxation whose solves a miniature stands
        # in for (see perseus.solver.miniature.Extension) only bounds with its rows and hulls
        self._lp: tuple[Any, ...] | None = (
            matrix,
            np.full(matrix.shape[0], -np.inf),
            b_ub,
            cost,
            np.concatenate([np.full(n + 1, np.inf), lengths_arr]),
        )
        self._model: Any = None
        self._lengths = lengths_arr
        self._cost = cost
        self._iterations = 0
        self._segment_start = np.searchsorted(np.asarray(segment_node), np.arange(n + 1))
        self._segment_node = np.asarray(segment_node, dtype=np.int64)
        self._base_time = base_time
        self._base_value = base_value
        self._tau_col = tau_col
        self._p_w = costs.num_gpus * costs.p_block_w
        # Each row's node (-1: a sink row), and the finish-time entries (row, node, value)
        # whose products with the duals give each node's imbalance.
        self._row_node = row_node
        entry_row = np.repeat(np.arange(matrix.shape[0]), np.diff(matrix.indptr))
        finish = matrix.indices < n
        self._finish_entries = (entry_row[finish], matrix.indices[finish], matrix.data[finish])
        # Each row's finish-time column of coefficient +1: a precedence row's predecessor, a
        # sink row's sink (-1: a source's row, which has none).
        before = finish & (matrix.data > 0)
        self._row_finish = np.full(matrix.shape[0], -1, dtype=np.int64)
        self._row_finish[entry_row[before]] = matrix.indices[before]
        # Per node, its hull's vertices (time, energy), padded with the last: h_j(X) is the
        # least of energy + X * time over them.
        width_v = max((len(t) for t, _ in vertices), default=1)
        padded = [
            (
                np.pad(t, (0, width_v - len(t)), mode="edge"),
                np.pad(e, (0, width_v - len(e)), mode="edge"),
            )
            for t, e in vertices
        ]
        classes = np.asarray(dag.cost_class, dtype=np.int64)
        self._vertex_time = np.stack([t for t, _ in padded])[classes] if n else np.zeros((0, 1))
        self._vertex_energy = np.stack([e for _, e in padded])[classes] if n else np.zeros((0, 1))

    @property
    def _highs(self) -> Any:
        """The HiGHS model, built on first use."""
        if self._model is None:
            assert self._lp is not None
            self._model = highs_model(*self._lp)
            if self._n >= _DEVEX_FROM:
                self._model.setOptionValue("simplex_dual_edge_weight_strategy", 1)
            if self._threads > 1:
                self._model.setOptionValue("threads", self._threads)
                self._model.setOptionValue("simplex_strategy", _SIMPLEX_TASKS)
            self._lp = None
        return self._model

    def built(self) -> Relaxation:
        """This relaxation, its HiGHS model built now (for a thread that builds it ahead of
        its first solve)."""
        _ = self._highs
        return self

    @property
    def base_time_s(self) -> FloatArray:
        """Every node's fastest relaxed duration (its hull's first vertex)."""
        return self._base_time

    @property
    def segment_node(self) -> IntArray:
        """The node of every hull-segment column (columns ``n + 1`` on), ascending."""
        return self._segment_node

    @property
    def segment_start(self) -> IntArray:
        """``segment_start[j]``: node ``j``'s first segment (``[n]``: the segment count)."""
        return self._segment_start

    @property
    def row_node(self) -> IntArray:
        """Per row, the node whose precedence row it is (-1: a sink row, after all of those)."""
        return self._row_node

    @property
    def row_finish(self) -> IntArray:
        """Per row, its finish time of coefficient +1: a precedence row's predecessor, a sink
        row's sink; -1 for a source's row."""
        return self._row_finish

    @property
    def num_segments(self) -> int:
        """Number of hull-segment columns."""
        return len(self._lengths)

    @property
    def iterations(self) -> int:
        """Dual simplex iterations of the last solve."""
        return self._iterations

    def finish_times(self) -> FloatArray:
        """Every node's finish time in the last solve."""
        return np.asarray(self._highs.getSolution().col_value)[: self._n]

    def basis_statuses(self) -> tuple[IntArray, IntArray]:
        """The model's current basis: every column's and row's ``HighsBasisStatus`` value."""
        basis = self._highs.getBasis()
        return (
            np.fromiter(map(int, basis.col_status), np.int64),
            np.fromiter(map(int, basis.row_status), np.int64),
        )

    def start_from(self, basis: Any) -> None:
        """The next solve starts from ``basis`` (a ``highspy.HighsBasis``, alien or not; see
        :mod:`perseus.solver.miniature`)."""
        self._highs.setBasis(basis)

    def solve(
        self, deadline_s: float | None, start: RelaxedSolution | None = None
    ) -> RelaxedSolution:
        """Solve the relaxation with ``T <= deadline_s`` (or no deadline when None).

        The HiGHS model persists between calls, so a solve starts from the previous optimal
        basis, or from ``start``'s: nearby deadlines take a few dual simplex pivots.

        Raises:
            InfeasibleDeadline: The deadline is shorter than the all-fastest iteration time.
        """
        if start is not None and start.basis is not None:
            self._highs.setBasis(start.basis)
        return self._solved(deadline_s)

    def solve_at_slope(self, power_w: float) -> RelaxedSolution:
        """Solve with no deadline, the iteration time costing ``power_w`` more than blocking:
        the relaxed optimum where ``V``'s slope is ``-power_w`` (its deadline is where it
        lands, its slope ``-power_w``). From the model's basis, or one given by
        :meth:`start_from`: a miniature's at the same ``power_w`` has the same steady state
        (the same marginal energy of time), so it starts nearer than one at a deadline does.
        """
        self._highs.changeColCost(self._tau_col, self._p_w + power_w)
        try:
            return self._solved(None, power_w)
        finally:
            self._highs.changeColCost(self._tau_col, self._p_w)

    def _solved(self, deadline_s: float | None, power_w: float | None = None) -> RelaxedSolution:
        """Solve with ``T <= deadline_s``, or with ``T`` costing ``power_w`` more (see
        :meth:`solve_at_slope`; read before that cost is restored)."""
        highs = self._highs
        solution = self._run(deadline_s)
        x = np.asarray(solution.col_value)
        tau = float(x[self._tau_col])
        if power_w is not None:
            deadline, slope = tau, -power_w
        elif deadline_s is None:
            deadline, slope = math.inf, 0.0
        else:
            deadline, slope = deadline_s, min(float(solution.col_dual[self._tau_col]), 0.0)
        return RelaxedSolution(
            deadline_s=deadline,
            value_j=float(highs.getInfo().objective_function_value)
            - (power_w or 0.0) * tau
            + self._base_value,
            slope_j_per_s=slope,
            durations_s=self._durations(x),
            iteration_time_s=tau,
            basis=highs.getBasis(),
            flow=self._flow(np.asarray(solution.row_dual)),
        )

    def _run(self, deadline_s: float | None) -> Any:
        """Solve with ``T <= deadline_s`` from the model's basis; HiGHS's solution."""
        highs = self._highs
        highs.changeColBounds(
            self._tau_col, 0.0, highspy.kHighsInf if deadline_s is None else deadline_s
        )
        if self._solver_thread is None:
            highs.run()
        else:
            self._solver_thread.submit(highs.run).result()
        # read now: a solve at a slope changes a cost after it, which clears HiGHS's info
        self._iterations = int(highs.getInfo().simplex_iteration_count)
        status = highs.getModelStatus()
        if status == MODEL_STATUS.kInfeasible:
            raise InfeasibleDeadline(f"no plan finishes within {deadline_s} s")
        if status != MODEL_STATUS.kOptimal:
            raise PerseusError(f"the relaxation failed: {highs.modelStatusToString(status)}")
        return highs.getSolution()

    def _durations(self, x: FloatArray) -> FloatArray:
        """Every node's relaxed duration from the columns' values ``x``."""
        n = self._n
        return np.asarray(
            self._base_time + np.bincount(self._segment_node, weights=x[n + 1 :], minlength=n)
        )

    def _flow(self, row_dual: FloatArray) -> Flow:
        """The flow of the duals: each row's multiplier is ``-dual`` (>= 0 for the rows'
        ``<=``), clipped at 0 so that every one is a valid Lagrange multiplier."""
        return self.flow_of(np.maximum(-row_dual, 0.0))

    def flow_of(self, multipliers: FloatArray) -> Flow:
        """The flow of nonnegative multipliers of the rows (in :attr:`row_node`'s order):
        any such flow bounds ``V`` (see :meth:`lines`), the more tightly the nearer it is to
        the optimum's and to conserved."""
        n, rows = self._n, self._row_node
        y = multipliers
        own = rows >= 0
        node = np.bincount(rows[own], weights=y[own], minlength=n)
        entry_row, entry_col, entry_value = self._finish_entries
        imbalance = np.bincount(entry_col, weights=entry_value * y[entry_row], minlength=n)
        return Flow(node.astype(np.float64), float(y[~own].sum()), float(np.abs(imbalance).sum()))

    def lines(
        self,
        flows: Sequence[Flow],
        mixes: Sequence[float] = MIXES,
        scales: Sequence[float] = SCALES,
    ) -> tuple[FloatArray, FloatArray]:
        """Lower bounds on ``V``, one line ``value + slope * D`` per flow mixed from each
        adjacent pair of ``flows`` (``(1 - m) * a + m * b`` for every ``m`` of ``mixes``) and
        scaled by every factor of ``scales``. Returns ``(values, slopes)``.

        Weak duality: any nonnegative multipliers of the rows bound the relaxation, which
        bounds every plan. For a flow ``X`` into the nodes and ``F`` into the sinks,
        ``V(D) >= sum_j h_j(X_j) - D * max(0, F - P) - D * imbalance``, where
        ``h_j(X) = min over the hull's vertices v of (e_v + X * t_v)``, ``P`` the blocking
        power of all GPUs, and the imbalance how far the flow is from conserved (finish
        times lie within ``[0, D]``). At a solve's own flow the line is its tangent; mixed
        flows bound ``V`` between two solves much more tightly than the two tangents do
        (16 x 128 1F1B, knots at 1.05 x and near the free optimum: 0.13 % below ``V``
        midway, the tangents 2.2 %).
        """
        values: list[float] = []
        slopes: list[float] = []
        times, energies = self._vertex_time, self._vertex_energy
        for a, b in itertools.pairwise(flows):
            for m in mixes:
                node = (1.0 - m) * a.node_w + m * b.node_w
                total = (1.0 - m) * a.total_w + m * b.total_w
                imbalance = (1.0 - m) * a.imbalance_w + m * b.imbalance_w
                for k in scales:
                    h = np.min(energies + (k * node)[:, None] * times, axis=1)
                    values.append(float(h.sum()))
                    slopes.append(-max(0.0, k * total - self._p_w) - k * imbalance)
        return np.asarray(values), np.asarray(slopes)

    def tangent(self, flow: Flow, deadline_s: float) -> tuple[float, float]:
        """The highest at ``deadline_s`` of ``flow``'s lines (see :meth:`lines`, the flow alone
        scaled by each of :data:`SCALES`): ``(its value there, its slope)``, a line below
        ``V`` everywhere."""
        values, slopes = self.lines([flow, flow], mixes=(0.0,))
        at = values + slopes * deadline_s
        best = int(np.argmax(at))
        return float(at[best]), float(slopes[best])

    def dive(
        self,
        deadline_s: float,
        option_times: Sequence[FloatArray],
        fraction: float,
        rounds: int | None = None,
        first: RelaxedSolution | None = None,
    ) -> IntArray:
        """Round the relaxation to measured options by diving: fix, re-solve, repeat.

        Each round fixes every instruction whose relaxed duration is a measured option, plus the
        ``fraction`` of the rest closest to one (rounded down, so the deadline stays feasible),
        and solves again so that the others adapt to what was fixed. Unlike rounding one
        solution, this lets instructions trade slack where the measured options are far from
        the convex hull. About ``1 / fraction`` warm-started solves.

        Args:
            deadline_s: The deadline.
            option_times: Per node, its options' times, ascending.
            fraction: Share of the unfixed instructions fixed per round beyond exact ones.
            rounds: After this many solves, fix every instruction left (rounded down); None:
                no limit. On large DAGs each solve costs seconds.
            first: The relaxation already solved at ``deadline_s`` (counts as the first
                solve; the model restarts from its basis).

        Returns:
            The option index of every node.
        """
        n = self._n
        highs = self._highs
        choice = np.zeros(n, dtype=np.int64)
        fixed = np.zeros(n, dtype=bool)
        # every node's option times in a row, padded with +inf (fits no duration)
        table = np.full((n, max((len(t) for t in option_times), default=1)), np.inf)
        for j, times in enumerate(option_times):
            table[j, : len(times)] = times
        try:
            if first is None or first.basis is None:
                relaxed = self._durations(np.asarray(self._run(deadline_s).col_value))
            else:
                self._highs.setBasis(first.basis)
                relaxed = first.durations_s
            solves = 1
            while not fixed.all():
                free = np.flatnonzero(~fixed)
                rows = table[free]
                d = relaxed[free]
                # the slowest option within each duration (times ascend), else the fastest
                picks = np.maximum((rows <= (d * (1 + 1e-12))[:, None]).sum(axis=1) - 1, 0)
                option = rows[np.arange(len(free)), picks]
                distance = np.maximum(d - option, 0.0)
                exact = distance <= 1e-9 * max(deadline_s, 1.0)
                last = rounds is not None and solves >= rounds
                count = len(free) if last else max(1, math.ceil(fraction * len(free)))
                chosen = exact.copy()
                chosen[np.argsort(distance, kind="stable")[:count]] = True
                nodes = free[chosen]
                self._fix(nodes, option[chosen])
                choice[nodes] = picks[chosen]
                fixed[nodes] = True
                if not fixed.all():
                    # the durations alone: the bound, its slope and flow, the basis unread
                    relaxed = self._durations(np.asarray(self._run(deadline_s).col_value))
                    solves += 1
        finally:
            segments = len(self._lengths)
            highs.changeColsBounds(
                segments,
                np.arange(n + 1, n + 1 + segments, dtype=np.int32),
                np.zeros(segments),
                self._lengths,
            )
        return choice

    @contextlib.contextmanager
    def weighted(self, weights: FloatArray) -> Iterator[None]:
        """Within the block, node ``j``'s energy slopes are scaled by ``weights[j]`` (> 0):
        another convex problem whose optimum sits on another vertex, for diversified dives.
        The solutions are not lower bounds of the real problem there."""
        cost = self._cost.copy()
        cost[self._n + 1 :] *= weights[self._segment_node]
        columns = np.arange(len(cost), dtype=np.int32)
        basis = self._highs.getBasis()
        self._highs.changeColsCost(len(cost), columns, cost)
        try:
            yield
        finally:
            self._highs.changeColsCost(len(cost), columns, self._cost)
            # solves after the block start where they would have without it
            self._highs.setBasis(basis)

    def _fix(self, nodes: IntArray, durations_s: FloatArray) -> None:
        """Pin the hull segments of ``nodes`` so that their durations are ``durations_s``:
        each node's segments filled in order, all nodes side by side (one HiGHS call)."""
        start = self._segment_start[nodes]
        counts = self._segment_start[nodes + 1] - start
        remaining = durations_s - self._base_time[nodes]
        columns, values = [], []
        for k in range(int(counts.max(initial=0))):
            has = counts > k
            col = start[has] + k
            value = np.minimum(np.maximum(remaining[has], 0.0), self._lengths[col])
            remaining[has] -= value
            columns.append(col)
            values.append(value)
        if columns:
            column = np.concatenate(columns)
            value = np.concatenate(values)
            self._highs.changeColsBounds(
                len(column), (self._n + 1 + column).astype(np.int32), value, value
            )


def side_by_side(relaxations: Sequence[_M], jobs: Sequence[Callable[[_M], _T]]) -> list[_T]:
    """Run ``jobs[k]`` on ``relaxations[k % len(relaxations)]``; the results, in order.

    Each model runs its jobs in order on a thread of its own, the models side by side:
    HiGHS releases Python's lock while it solves, so two models solve on two cores. Which
    model runs a job, and after which, depends only on ``k``, never on timing, so the
    results are the same from run to run. One model: the jobs in order, on this thread.
    """
    if len(relaxations) <= 1 or len(jobs) <= 1:
        return [job(relaxations[0]) for job in jobs]
    count = len(relaxations)

    def queue(m: int) -> list[_T]:
        return [jobs[k](relaxations[m]) for k in range(m, len(jobs), count)]

    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="perseus-relaxation") as pool:
        done = [f.result() for f in [pool.submit(queue, m) for m in range(count)]]
    return [done[k % count][k // count] for k in range(len(jobs))]
