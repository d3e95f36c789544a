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

The relaxation is in :mod:`perseus.solver.relaxation`, what both share in
:mod:`perseus.solver.lp_model`; their names are re-exported here.

Both go through HiGHS's public Python package, ``highspy`` (pinned in ``pyproject.toml``), one
adapter (:func:`perseus.solver.lp_model.highs_model`) that builds a quiet, single-threaded
model: nothing HiGHS says reaches stdout or stderr.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np
import numpy.typing as npt

from perseus.core.errors import InfeasibleDeadline, PerseusError, SolverTimeout
from perseus.solver.costs import CostTable
from perseus.solver.dag import PipelineDag
from perseus.solver.lp_model import (
    LIMIT_STATUSES,
    MODEL_STATUS,
    FloatArray,
    IntArray,
    SparseRows,
    highs_model,
    hull_mask,
    hull_options,
    precedence_rows,
)
from perseus.solver.relaxation import Relaxation, RelaxedSolution

__all__ = ["ExactProgram", "ExactSolution", "Relaxation", "RelaxedSolution", "hull_options"]


@dataclass(frozen=True, slots=True)
class ExactSolution:
    """An optimal plan at one deadline: option index (within its class) of every node."""

    choice: IntArray
    bound_j: float
    nodes: int  # branch-and-bound nodes the solve took
    optimal: bool = True  # False: a limit stopped the search; ``bound_j`` is still proven


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
        precedence, _ = precedence_rows(dag, columns, width)
        pick = SparseRows.from_entries(
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
        self._on_hull = hull_mask(costs)[flat]
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
        return highs_model(
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
        if status == MODEL_STATUS.kInfeasible:
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
        self.last_stopped = status == MODEL_STATUS.kTimeLimit
        if status == MODEL_STATUS.kInfeasible:
            raise InfeasibleDeadline(f"no plan finishes within {deadline_s} s")
        if status in LIMIT_STATUSES:
            if not (allow_incomplete and found):
                raise SolverTimeout(f"the MILP at {deadline_s} s ran out of time or nodes")
        elif status != MODEL_STATUS.kOptimal or not found:
            raise PerseusError(f"the MILP failed: {highs.modelStatusToString(status)}")
        bound = float(info.mip_dual_bound)
        return ExactSolution(self.plan_of(x), bound, nodes, status == MODEL_STATUS.kOptimal)

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
