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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from perseus.errors import InfeasibleDeadline, PerseusError
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

__all__ = ["Relaxation", "RelaxedSolution"]

# Relaxations of DAGs of this many instructions or more price the dual simplex by devex instead of
# HiGHS's default dual steepest edge, whose exact weights cost more than they save there:
# on 16 x 128 interleaved (8,192 instructions) the free optimum, the all-fastest deadline and
# four anchors from each other took 6.1 s against 16.4 s, at the same iteration counts within
# 15 %; on 8 x 96 no difference (so smaller DAGs keep the default and their frontiers).
_DEVEX_FROM = 2049


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


class Relaxation:
    """The convex relaxation of one DAG and cost table, solvable at any deadline.

    Columns: finish time of every node, the iteration time ``T``, then one column per hull
    segment of every node (how far the node is slowed along that segment).
    """

    def __init__(self, dag: PipelineDag, costs: CostTable) -> None:
        n = dag.size
        self._n = n
        segment_node: list[int] = []
        slopes: list[float] = []
        lengths: list[float] = []
        base_time = np.empty(n)
        base_value = 0.0
        effective = costs.effective_j
        hulls: dict[int, tuple[float, float, list[tuple[float, float]]]] = {}
        for c in range(len(costs.start) - 1):
            lo, hi = int(costs.start[c]), int(costs.start[c + 1])
            t, e = costs.time_s[lo:hi], effective[lo:hi]
            h = lower_hull(t, e)
            segs = [((e[b] - e[a]) / (t[b] - t[a]), t[b] - t[a]) for a, b in itertools.pairwise(h)]
            hulls[c] = (float(t[0]), float(e[0]), segs)
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
        self._highs = highs_model(
            matrix,
            np.full(matrix.shape[0], -np.inf),
            b_ub,
            cost,
            np.concatenate([np.full(n + 1, np.inf), lengths_arr]),
        )
        if n >= _DEVEX_FROM:
            self._highs.setOptionValue("simplex_dual_edge_weight_strategy", 1)
        self._lengths = lengths_arr
        self._cost = cost
        self._segment_start = np.searchsorted(np.asarray(segment_node), np.arange(n + 1))
        self._segment_node = np.asarray(segment_node, dtype=np.int64)
        self._base_time = base_time
        self._base_value = base_value
        self._tau_col = tau_col

    def solve(
        self, deadline_s: float | None, start: RelaxedSolution | None = None
    ) -> RelaxedSolution:
        """Solve the relaxation with ``T <= deadline_s`` (or no deadline when None).

        The HiGHS model persists between calls, so a solve starts from the previous optimal
        basis, or from ``start``'s: nearby deadlines take a few dual simplex pivots.

        Raises:
            InfeasibleDeadline: The deadline is shorter than the all-fastest iteration time.
        """
        n = self._n
        highs = self._highs
        if start is not None and start.basis is not None:
            highs.setBasis(start.basis)
        highs.changeColBounds(
            self._tau_col, 0.0, highspy.kHighsInf if deadline_s is None else deadline_s
        )
        highs.run()
        status = highs.getModelStatus()
        if status == MODEL_STATUS.kInfeasible:
            raise InfeasibleDeadline(f"no plan finishes within {deadline_s} s")
        if status != MODEL_STATUS.kOptimal:
            raise PerseusError(f"the relaxation failed: {highs.modelStatusToString(status)}")
        solution = highs.getSolution()
        x = np.asarray(solution.col_value)
        durations = self._base_time + np.bincount(
            self._segment_node, weights=x[n + 1 :], minlength=n
        )
        slope = 0.0 if deadline_s is None else float(solution.col_dual[self._tau_col])
        return RelaxedSolution(
            deadline_s=math.inf if deadline_s is None else deadline_s,
            value_j=float(highs.getInfo().objective_function_value) + self._base_value,
            slope_j_per_s=min(slope, 0.0),
            durations_s=durations,
            iteration_time_s=float(x[self._tau_col]),
            basis=highs.getBasis(),
        )

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
        try:
            if first is None or first.basis is None:
                solution = self.solve(deadline_s)
            else:
                self._highs.setBasis(first.basis)
                solution = first
            solves = 1
            while not fixed.all():
                free = np.flatnonzero(~fixed)
                picks = np.empty(len(free), dtype=np.int64)
                distance = np.empty(len(free))
                for k, j in enumerate(free.tolist()):
                    times = option_times[j]
                    d = solution.durations_s[j]
                    picks[k] = max(int(np.searchsorted(times, d * (1 + 1e-12), "right")) - 1, 0)
                    distance[k] = max(d - times[picks[k]], 0.0)
                exact = distance <= 1e-9 * max(deadline_s, 1.0)
                last = rounds is not None and solves >= rounds
                count = len(free) if last else max(1, math.ceil(fraction * len(free)))
                chosen = exact.copy()
                chosen[np.argsort(distance, kind="stable")[:count]] = True
                nodes = free[chosen]
                durations = np.asarray(
                    [option_times[j][pick] for j, pick in zip(nodes, picks[chosen], strict=True)]
                )
                self._fix(nodes, durations)
                choice[nodes] = picks[chosen]
                fixed[nodes] = True
                if not fixed.all():
                    solution = self.solve(deadline_s)
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
