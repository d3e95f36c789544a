"""Linear programs over the DAG: the convex relaxation (a lower bound) and the exact MILP.

Both minimise the Perseus energy ``E = sum_i e_i + P_block * (S * T - sum_i t_i)``, written as
``sum_i (e_i - P_block * t_i) + S * P_block * T`` so that each instruction's cost depends only on
its own duration, subject to every instruction finishing by ``T <= deadline``.

- :class:`Relaxation` replaces each instruction's options by the lower convex hull of its
  (time, effective energy) points. Its optimum ``V(D)`` is a lower bound on every plan's energy
  at deadline ``D``, and is convex and non-increasing in ``D``, so the tangent line at any
  solved deadline bounds ``V`` everywhere.
- :class:`ExactProgram` picks exactly one option per instruction with binary variables
  (HiGHS's branch and bound); exponential in the worst case, for small and medium cases.

Both go through HiGHS's public Python package, ``highspy`` (pinned in ``pyproject.toml``), one
adapter (:func:`_highs_model`) that builds a quiet, single-threaded model: nothing HiGHS says
reaches stdout or stderr.
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
import numpy.typing as npt

from perseus.errors import InfeasibleDeadline, PerseusError, SolverTimeout
from perseus.solver.costs import CostTable
from perseus.solver.dag import PipelineDag

__all__ = ["ExactProgram", "ExactSolution", "Relaxation", "RelaxedSolution", "hull_options"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class _Rows:
    """A sparse matrix in compressed rows (what HiGHS takes), column indices sorted per row.

    Built here rather than with scipy.sparse, whose import takes a tenth of a second of every
    ``perseus plan`` process.
    """

    indptr: npt.NDArray[np.int32]
    indices: npt.NDArray[np.int32]
    data: FloatArray
    shape: tuple[int, int]

    @classmethod
    def from_entries(
        cls, rows: npt.ArrayLike, cols: npt.ArrayLike, vals: npt.ArrayLike, shape: tuple[int, int]
    ) -> _Rows:
        """From ``(row, column, value)`` entries, each position at most once."""
        row = np.asarray(rows, dtype=np.int64)
        col = np.asarray(cols, dtype=np.int64)
        order = np.lexsort((col, row))
        row, col = row[order], col[order]
        if len(row) > 1 and bool(((row[1:] == row[:-1]) & (col[1:] == col[:-1])).any()):
            raise ValueError("a matrix position is given twice")
        indptr = np.zeros(shape[0] + 1, dtype=np.int32)
        np.cumsum(np.bincount(row, minlength=shape[0]), out=indptr[1:])
        data = np.asarray(vals, dtype=np.float64)[order]
        return cls(indptr, col.astype(np.int32), data, shape)

    def stacked(self, below: _Rows) -> _Rows:
        """This matrix with ``below``'s rows appended (same column count)."""
        return _Rows(
            np.concatenate([self.indptr, below.indptr[1:] + self.indptr[-1]]),
            np.concatenate([self.indices, below.indices]),
            np.concatenate([self.data, below.data]),
            (self.shape[0] + below.shape[0], self.shape[1]),
        )


_STATUS = highspy.HighsModelStatus
# Statuses where HiGHS stopped on a limit (time, nodes, iterations) before proving optimality.
_LIMITS = (_STATUS.kTimeLimit, _STATUS.kIterationLimit, _STATUS.kSolutionLimit, _STATUS.kInterrupt)
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


@dataclass(frozen=True, slots=True)
class ExactSolution:
    """An optimal plan at one deadline: option index (within its class) of every node."""

    choice: IntArray
    bound_j: float
    nodes: int  # branch-and-bound nodes the solve took
    optimal: bool = True  # False: a limit stopped the search; ``bound_j`` is still proven


def hull_options(costs: CostTable) -> list[IntArray]:
    """Per cost class, the indices (within the class) of its lower convex hull's vertices."""
    effective = costs.effective_j
    return [
        np.asarray(_hull(costs.time_s[lo:hi], effective[lo:hi]), dtype=np.int64)
        for lo, hi in itertools.pairwise(costs.start.tolist())
    ]


def _hull_mask(costs: CostTable) -> npt.NDArray[np.bool_]:
    """Per cost-table entry: is it a vertex of its class's lower convex hull?"""
    mask = np.zeros(len(costs.time_s), dtype=bool)
    effective = costs.effective_j
    for lo, hi in itertools.pairwise(costs.start.tolist()):
        mask[lo + np.asarray(_hull(costs.time_s[lo:hi], effective[lo:hi]), dtype=np.int64)] = True
    return mask


def _hull(times: FloatArray, effective: FloatArray) -> list[int]:
    """Indices of the lower convex hull of points sorted by time (Andrew's monotone chain)."""
    hull: list[int] = []
    for k in range(len(times)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            cross = (effective[b] - effective[a]) * (times[k] - times[a]) - (
                effective[k] - effective[a]
            ) * (times[b] - times[a])
            if cross < 0:
                break
            hull.pop()
        hull.append(k)
    return hull


def _precedence_rows(
    dag: PipelineDag, duration_cols: list[list[tuple[int, float]]], width: int
) -> tuple[_Rows, IntArray]:
    """Rows ``C_p - C_j + duration_j <= -const_j`` per edge and source; ``C_j <= T`` per sink.

    Finish times are columns ``0..n-1`` and ``T`` is column ``n``. ``duration_cols[j]`` lists
    ``(column, coefficient)`` pairs whose sum plus a constant is node ``j``'s duration.

    Returns:
        The matrix and, per row, the node whose constant belongs on the right-hand side
        (``-1`` for sink rows, whose right-hand side is 0).
    """
    n = dag.size
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    row_node: list[int] = []
    for j in range(n):
        preds = [int(p) for p in dag.pred[j] if p != n] or [-1]
        for p in preds:
            row = len(row_node)
            if p >= 0:
                rows.append(row)
                cols.append(p)
                vals.append(1.0)
            rows.append(row)
            cols.append(j)
            vals.append(-1.0)
            for col, coef in duration_cols[j]:
                rows.append(row)
                cols.append(col)
                vals.append(coef)
            row_node.append(j)
    for j in dag.sinks:
        row = len(row_node)
        rows.extend((row, row))
        cols.extend((int(j), n))
        vals.extend((1.0, -1.0))
        row_node.append(-1)
    matrix = _Rows.from_entries(rows, cols, vals, (len(row_node), width))
    return matrix, np.asarray(row_node, dtype=np.int64)


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
            h = _hull(t, e)
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
        matrix, row_node = _precedence_rows(dag, duration_cols, width)
        b_ub = np.where(row_node >= 0, -base_time[np.maximum(row_node, 0)], 0.0)
        lengths_arr = np.asarray(lengths)
        cost = np.concatenate([np.zeros(n), [costs.num_gpus * costs.p_block_w], np.asarray(slopes)])
        self._highs = _highs_model(
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
        if status == _STATUS.kInfeasible:
            raise InfeasibleDeadline(f"no plan finishes within {deadline_s} s")
        if status != _STATUS.kOptimal:
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


def _highs_model(
    matrix: _Rows,
    row_lower: FloatArray,
    row_upper: FloatArray,
    cost: FloatArray,
    col_upper: FloatArray,
    integer: npt.NDArray[np.bool_] | None = None,
) -> Any:
    """A quiet, single-threaded HiGHS model: ``min cost @ x`` s.t.
    ``row_lower <= matrix @ x <= row_upper``, ``0 <= x <= col_upper``, ``integer`` columns
    integral."""
    rows, cols = matrix.shape
    lp = highspy.HighsLp()
    lp.num_col_ = cols
    lp.num_row_ = rows
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(cols)
    lp.col_upper_ = col_upper  # HiGHS's infinity is IEEE inf
    lp.row_lower_ = row_lower
    lp.row_upper_ = row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = matrix.indptr
    lp.a_matrix_.index_ = matrix.indices
    lp.a_matrix_.value_ = matrix.data
    if integer is not None:
        kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
        lp.integrality_ = [kinds[int(v)] for v in integer]
    highs = highspy.Highs()  # type: ignore[no-untyped-call]  # its __init__ is untyped
    # quiet before anything else: HiGHS prints its banner when a model is passed
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("log_to_console", False)
    highs.setOptionValue("threads", 1)
    highs.passModel(lp)
    return highs


class ExactProgram:
    """The exact problem as an MILP: one binary per (node, option).

    Before every solve, options that cannot fit the deadline are removed: an option is kept
    only if the node's earliest start plus the option plus the longest path after the node,
    all other instructions at their fastest, meets the deadline. No plan that meets the
    deadline is lost, and the relaxation gets tighter (no mixing with options that never fit).
    """

    def __init__(self, dag: PipelineDag, costs: CostTable) -> None:
        n = dag.size
        self._n = n
        option_node: list[int] = []
        option_local: list[int] = []
        option_flat: list[int] = []
        effective = costs.effective_j
        for j in range(n):
            c = int(dag.cost_class[j])
            lo, hi = int(costs.start[c]), int(costs.start[c + 1])
            for k in range(lo, hi):
                option_node.append(j)
                option_local.append(k - lo)
                option_flat.append(k)
        flat = np.asarray(option_flat, dtype=np.int64)
        option_time = costs.time_s[flat]
        option_cost = effective[flat]
        first = n + 1
        columns: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        for col, (j, t) in enumerate(zip(option_node, option_time.tolist(), strict=True)):
            columns[j].append((first + col, t))
        width = first + len(option_node)
        precedence, _ = _precedence_rows(dag, columns, width)
        pick = _Rows.from_entries(
            option_node, first + np.arange(len(option_node)), np.ones(len(option_node)), (n, width)
        )
        self._precedence = precedence
        self._pick = pick
        self._cost = np.concatenate(
            [np.zeros(n), [costs.num_gpus * costs.p_block_w], np.asarray(option_cost)]
        )
        self._integrality = np.concatenate([np.zeros(n + 1), np.ones(len(option_node))])
        self._option_node = np.asarray(option_node, dtype=np.int64)
        self._option_local = np.asarray(option_local, dtype=np.int64)
        # Longest path through each node with everything at its fastest, less the node itself:
        # an option fits a deadline when its time plus this is within it (a path's length
        # before a node does not depend on the deadline, nor does the length after it).
        fastest = costs.time_s[costs.start[dag.cost_class]]
        before = dag.finish_times(fastest) - fastest
        after = -dag.latest_starts(fastest, 0.0) - fastest
        self._elsewhere = (before + after)[self._option_node]
        self._option_time = option_time
        self._on_hull = _hull_mask(costs)[flat]
        self._width = width
        self._highs: Any = None
        self.last_stopped = False  # did a time limit stop the last solve?

    def fits(self, deadline_s: float) -> npt.NDArray[np.bool_]:
        """Per (node, option) column: can the option be part of a plan meeting the deadline?"""
        room = deadline_s - self._elsewhere
        return np.asarray(self._option_time <= room + 1e-9 * max(deadline_s, 1.0))

    def reference_model(self, deadline_s: float) -> Any:
        """A fresh, quiet, single-threaded HiGHS model of the MILP at ``deadline_s`` (for the
        benchmarks' references: the caller sets its limits and runs it).

        Columns: finish times of the ``n`` nodes, the iteration time, then one binary per
        (node, option), options that cannot fit removed; the objective is the plan's energy
        (each option's energy less the blocking power over its time, plus the blocking power
        of every GPU over ``T``). :meth:`plan_of` reads a plan from its solution.
        """
        edges = self._precedence.shape[0]
        return _highs_model(
            self._precedence.stacked(self._pick),
            np.concatenate([np.full(edges, -np.inf), np.ones(self._n)]),
            np.concatenate([np.zeros(edges), np.ones(self._n)]),
            self._cost,
            self._upper(deadline_s),
            self._integrality > 0,
        )

    def _upper(self, deadline_s: float) -> FloatArray:
        n = self._n
        upper = np.concatenate([np.full(n + 1, np.inf), self.fits(deadline_s).astype(float)])
        upper[n] = deadline_s
        return upper

    def solve(
        self,
        deadline_s: float,
        time_limit_s: float | None = None,
        node_limit: int | None = None,
        *,
        incumbent: IntArray | None = None,
        hull_only: bool = False,
        rel_gap: float = 1e-10,
        allow_incomplete: bool = False,
    ) -> ExactSolution:
        """Least-energy plan with iteration time <= ``deadline_s``.

        ``node_limit`` caps the branch-and-bound nodes: a budget of work that, unlike a time
        limit, gives the same answer on a busy machine as on an idle one.

        Args:
            deadline_s: The deadline.
            time_limit_s: Wall-clock limit of this solve (None: none).
            node_limit: Branch-and-bound node limit (None: none).
            incumbent: A plan meeting the deadline (option index of every node) to start from;
                the result is never worse than it.
            hull_only: Only options on each node's lower convex hull (plus the incumbent's):
                a smaller, faster search; the bound then holds for that restriction only.
            rel_gap: Stop once the plan is proven this close to the optimum.
            allow_incomplete: Return the best plan found when a limit stops the search
                (``optimal`` False) instead of raising :class:`SolverTimeout`.

        Raises:
            InfeasibleDeadline: No plan meets the deadline.
            SolverTimeout: A limit stopped the search (and ``allow_incomplete`` is False, or it
                stopped before finding any plan).
        """
        n = self._n
        if node_limit is not None and node_limit < 1:
            raise SolverTimeout(f"the MILP at {deadline_s} s has no nodes left to explore")
        upper = self._upper(deadline_s)
        if hull_only:
            own = (
                self._option_local == incumbent[self._option_node]
                if incumbent is not None
                else np.zeros(len(self._option_node), dtype=bool)
            )
            upper[n + 1 :] = ((upper[n + 1 :] > 0) & self._on_hull) | own
        highs = self._model()
        columns = np.arange(self._width, dtype=np.int32)
        highs.changeColsBounds(self._width, columns, np.zeros(self._width), upper)
        highs.setOptionValue("mip_rel_gap", rel_gap)
        highs.setOptionValue("time_limit", highspy.kHighsInf if time_limit_s is None
                             else max(time_limit_s, 1e-3))  # fmt: skip
        highs.setOptionValue("mip_max_nodes", node_limit if node_limit is not None
                             else highspy.kHighsIInf)  # fmt: skip
        highs.setOptionValue("presolve", "choose")
        if incumbent is not None:
            picked = np.flatnonzero(self._option_local == incumbent[self._option_node]) + n + 1
            highs.setSolution(
                len(picked), picked.astype(np.int32), np.ones(len(picked), dtype=np.float64)
            )
        highs.run()
        status = highs.getModelStatus()
        if status == _STATUS.kInfeasible:
            # HiGHS's presolve has been seen to call a feasible deadline infeasible (found by the
            # property tests); a second opinion without presolve settles it.
            highs.setOptionValue("presolve", "off")
            highs.run()
            status = highs.getModelStatus()
        info = highs.getInfo()
        nodes = int(info.mip_node_count)
        x = np.asarray(highs.getSolution().col_value)
        found = (
            info.primal_solution_status == highspy.kSolutionStatusFeasible
            and x.shape == (self._width,)
            and bool(np.isfinite(x).all())
        )
        self.last_stopped = status == _STATUS.kTimeLimit
        if status == _STATUS.kInfeasible:
            raise InfeasibleDeadline(f"no plan finishes within {deadline_s} s")
        if status in _LIMITS:
            if not (allow_incomplete and found):
                raise SolverTimeout(f"the MILP at {deadline_s} s ran out of time or nodes")
        elif status != _STATUS.kOptimal or not found:
            raise PerseusError(f"the MILP failed: {highs.modelStatusToString(status)}")
        bound = float(info.mip_dual_bound)
        return ExactSolution(self.plan_of(x), bound, nodes, status == _STATUS.kOptimal)

    def _model(self) -> Any:
        """The persistent HiGHS model (built on first use; solves change column bounds)."""
        if self._highs is None:
            self._highs = self.reference_model(math.inf)
        return self._highs

    def plan_of(self, x: FloatArray) -> IntArray:
        """Option index of every node in a solution ``x`` of the MILP."""
        chosen = x[self._n + 1 :] > 0.5
        choice = np.zeros(self._n, dtype=np.int64)
        choice[self._option_node[chosen]] = self._option_local[chosen]
        return choice
