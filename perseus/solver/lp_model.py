"""What the solver's linear programs share: sparse rows, the precedence constraints, the
lower convex hulls of the options, and the one adapter over HiGHS.

HiGHS is reached through its public Python package, ``highspy`` (pinned in
``pyproject.toml``), by one adapter (:func:`highs_model`) that builds a quiet, single-threaded
model: nothing HiGHS says reaches stdout or stderr.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np
import numpy.typing as npt

from perseus.solver.costs import CostTable
from perseus.solver.dag import PipelineDag

__all__ = [
    "LIMIT_STATUSES",
    "MODEL_STATUS",
    "FloatArray",
    "IntArray",
    "SparseRows",
    "highs_model",
    "hull_mask",
    "hull_options",
    "lower_hull",
    "precedence_rows",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class SparseRows:
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
    ) -> SparseRows:
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

    def stacked(self, below: SparseRows) -> SparseRows:
        """This matrix with ``below``'s rows appended (same column count)."""
        return SparseRows(
            np.concatenate([self.indptr, below.indptr[1:] + self.indptr[-1]]),
            np.concatenate([self.indices, below.indices]),
            np.concatenate([self.data, below.data]),
            (self.shape[0] + below.shape[0], self.shape[1]),
        )


MODEL_STATUS = highspy.HighsModelStatus
"""HiGHS's model statuses."""
# Statuses where HiGHS stopped on a limit (time, nodes, iterations) before proving optimality.
LIMIT_STATUSES = (
    MODEL_STATUS.kTimeLimit,
    MODEL_STATUS.kIterationLimit,
    MODEL_STATUS.kSolutionLimit,
    MODEL_STATUS.kInterrupt,
)


def hull_options(costs: CostTable) -> list[IntArray]:
    """Per cost class, the indices (within the class) of its lower convex hull's vertices."""
    effective = costs.effective_j
    return [
        np.asarray(lower_hull(costs.time_s[lo:hi], effective[lo:hi]), dtype=np.int64)
        for lo, hi in itertools.pairwise(costs.start.tolist())
    ]


def hull_mask(costs: CostTable) -> npt.NDArray[np.bool_]:
    """Per cost-table entry: is it a vertex of its class's lower convex hull?"""
    mask = np.zeros(len(costs.time_s), dtype=bool)
    effective = costs.effective_j
    for lo, hi in itertools.pairwise(costs.start.tolist()):
        mask[lo + np.asarray(lower_hull(costs.time_s[lo:hi], effective[lo:hi]), dtype=np.int64)] = (
            True
        )
    return mask


def lower_hull(times: FloatArray, effective: FloatArray) -> list[int]:
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


def precedence_rows(
    dag: PipelineDag, duration_cols: list[list[tuple[int, float]]], width: int
) -> tuple[SparseRows, IntArray]:
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
    matrix = SparseRows.from_entries(rows, cols, vals, (len(row_node), width))
    return matrix, np.asarray(row_node, dtype=np.int64)


def highs_model(
    matrix: SparseRows,
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
