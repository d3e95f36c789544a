"""Warm starts for large relaxations from the same pipeline with fewer microbatches.

A pipeline schedule repeats itself: past the warm-up, every microbatch (every group of
``stages`` microbatches on chunked schedules) runs the same instructions in the same order,
until the cool-down. The relaxation's optimum repeats with it: on 16 x 128 1F1B at the
all-fastest deadline, every middle microbatch's forward on a GPU takes the same relaxed time.
So the optimal basis of a :class:`Miniature` (the schedule with just enough microbatches for
its warm-up, one period and its cool-down), its middle period repeated, is most of the large
relaxation's optimal basis. HiGHS takes it as an *alien* basis (completing or trimming it to
a valid one) and its dual simplex starts there instead of from the last optimum: on 32 x 256
1F1B (thousands of dual simplex iterations) the free optimum took 17 after the miniature's 15
(on 32 x 81, each iteration about 40 % of the cost) instead of 53, the all-fastest deadline 35
and 1.05 x 51 instead of 65 and 66 from the free optimum. Between those the optimum is not the
same from microbatch to microbatch (at 1.12 x: 52.5 instead of 55). The start only changes
where the dual simplex begins: the optimum it reaches is the relaxation's, whatever the mapping
gets wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from perseus.core.errors import PerseusError, ScheduleError
from perseus.solver.dag import PipelineDag, build_dag
from perseus.solver.lp_model import MODEL_STATUS, FloatArray, IntArray, SparseRows, highs_model
from perseus.solver.relaxation import Relaxation, RelaxedSolution
from perseus.solver.schedules import make_schedule

__all__ = ["Extension", "Miniature"]

# Microbatches kept before the repeated period (and after it): the warm-up and cool-down of
# every GPU (stages - 1 microbatches on 1F1B) and a few for the optimum's own transients (on
# 32 x 256 with 4, the all-fastest deadline took 36 thousand iterations after 12 on 32 x 73;
# with 16, 26 after 19 on 32 x 97).
_EDGE_EXTRA = 8
# A miniature of more than this share of the microbatches saves too little to pay its solves.
_LARGEST_SHARE = 0.65
_STATUSES = sorted(highspy.HighsBasisStatus.__members__.values(), key=int)
_BASIC = int(highspy.HighsBasisStatus.kBasic)
_LOWER = int(highspy.HighsBasisStatus.kLower)


@dataclass(frozen=True, slots=True)
class _Shape:
    """Where a DAG's nodes sit: per node its GPU, kind, chunk and microbatch."""

    gpu: IntArray
    kind: IntArray
    chunk: IntArray
    microbatch: IntArray

    @classmethod
    def of(cls, dag: PipelineDag) -> _Shape:
        order = dag.schedule.order
        return cls(
            dag.gpu,
            dag.kind,
            np.fromiter((i.chunk for seq in order for i in seq), np.int64, dag.size),
            np.fromiter((i.microbatch for seq in order for i in seq), np.int64, dag.size),
        )


class Miniature:
    """The relaxation of ``dag``'s schedule with fewer microbatches, whose optimal bases,
    repeated, start ``relaxation`` (of ``dag`` and ``costs``) near its optimum.

    Build one with :meth:`of`; :meth:`basis` solves the miniature at a slowdown and maps its
    basis. Not thread-safe: one caller at a time.

    Attributes:
        share: The miniature's share of the full schedule's microbatches.
    """

    def __init__(self, relaxation: Relaxation, small: PipelineDag, period: int) -> None:
        self._small = Relaxation(small, relaxation.costs)
        self._small_fast_s = float(small.iteration_time(self._small.base_time_s))
        microbatches, small_microbatches = (
            relaxation.dag.schedule.microbatches,
            small.schedule.microbatches,
        )
        self.share = small_microbatches / microbatches
        self._extra_periods = (microbatches - small_microbatches) // period
        # per (GPU, kind, chunk) of the middle period: its node, and the same a period later
        shape = _Shape.of(small)
        middle = (small_microbatches - period) // 2
        inside = np.flatnonzero((shape.microbatch >= middle) & (shape.microbatch < middle + period))
        later = _places(small)[
            shape.gpu[inside], shape.kind[inside], shape.chunk[inside],
            shape.microbatch[inside] + period,
        ]  # fmt: skip
        self._period_pairs = np.stack([inside, later], axis=1)[later >= 0]
        self._columns, self._rows = _maps(relaxation, self._small, period)
        self._full = relaxation
        self._defaults = np.concatenate(
            [
                np.full(relaxation.dag.size + 1, _BASIC, dtype=np.int64),
                np.full(relaxation.num_segments, _LOWER, dtype=np.int64),
            ]
        )

    @property
    def relaxation(self) -> Relaxation:
        """The miniature's own relaxation."""
        return self._small

    @classmethod
    def of(cls, relaxation: Relaxation, edge_extra: int = _EDGE_EXTRA) -> Miniature | None:
        """The miniature of ``relaxation``'s schedule, or None where there is none worth
        solving: a schedule not rebuilt by name, or too few microbatches to leave any out.
        O(instructions)."""
        schedule = relaxation.dag.schedule
        stages, microbatches, chunks = (
            schedule.stages,
            schedule.microbatches,
            schedule.virtual_stages,
        )
        # chunked schedules repeat every `stages` microbatches (Megatron's groups)
        period = 1 if chunks == 1 else stages
        edge = period * math.ceil((stages + edge_extra) / period)
        small_microbatches = 2 * edge + period
        if (
            small_microbatches > _LARGEST_SHARE * microbatches
            or (microbatches - small_microbatches) % period
        ):
            return None
        try:
            if make_schedule(schedule.name, stages, microbatches, chunks).order != schedule.order:
                return None  # built from action lists of its own: no smaller one to compare
            small = make_schedule(schedule.name, stages, small_microbatches, chunks)
        except ScheduleError:
            return None
        return cls(relaxation, build_dag(small), period)

    def basis(self, slowdown: float | None) -> Any:
        """The miniature's optimal basis at ``slowdown`` times its all-fastest iteration time
        (None: no deadline), its middle period repeated over the full DAG: an alien
        ``highspy.HighsBasis`` for :meth:`Relaxation.start_from`. Each solve starts from
        the miniature's last."""
        self._small.solve(None if slowdown is None else slowdown * self._small_fast_s)
        return self._mapped()

    def basis_at(self, deadline_s: float, full_fast_s: float, solves: int = 3) -> Any:
        """As :meth:`basis`, the miniature solved where its steady state matches the full
        relaxation's at ``deadline_s`` (``full_fast_s`` its all-fastest time): where the
        miniature's iteration time plus its middle period's length times the full schedule's
        extra periods is ``deadline_s`` (a secant search over the miniature's deadline, at
        most ``solves`` solves). The same slowdown would give the miniature's middle too much
        slack: on 32 x 256 1F1B at 1.05 x, the full relaxation's optimum lies at 1.02 x of
        the miniature (32 x 81), not 1.05 x, and its dual simplex took 29-43 thousand
        iterations from bases near there, 51 from 1.05 x's."""
        self.matched(deadline_s, full_fast_s, solves)
        return self._mapped()

    def matched(
        self,
        deadline_s: float,
        full_fast_s: float,
        solves: int = 3,
        finish: Callable[[RelaxedSolution], float] | None = None,
        start_s: float | None = None,
    ) -> tuple[RelaxedSolution, float]:
        """The miniature's relaxed optimum where its steady state matches the full
        relaxation's at ``deadline_s`` (see :meth:`basis_at`), and its deadline there.
        ``finish``: where the full DAG would finish after the miniature's ``solution``, instead
        of its iteration time plus its middle period times the extra periods. ``start_s``: the
        miniature's first deadline to try (default: the same slowdown as ``deadline_s``'s).

        After the first, each deadline tried is where the full DAG would finish on time if
        it finished in proportion to the miniature's deadline, then the secant's."""
        fast = self._small_fast_s
        tried: list[tuple[float, float, RelaxedSolution]] = []
        at = max(fast, deadline_s * fast / full_fast_s if start_s is None else start_s)
        for _ in range(solves):
            solution = self._small.solve(at)
            ends = at + self._extra_periods * self._period() if finish is None else finish(solution)
            error = ends - deadline_s
            tried.append((at, error, solution))
            if abs(error) <= 5e-4 * deadline_s or len(tried) == solves:
                break
            if len(tried) == 1:
                following = at * deadline_s / ends
            else:
                (a, error_a, _), (b, error_b, _) = tried[-2], tried[-1]
                following = b - error_b * (b - a) / (error_b - error_a) if error_b != error_a else b
            following = max(fast, following)
            if following == at:
                break
            at = following
        best, _, solution = min(tried, key=lambda t: abs(t[1]))
        if best != tried[-1][0]:
            self._small.start_from(solution.basis)  # where basis_at maps it from
        return solution, best

    def _period(self) -> float:
        """The length of the miniature's middle period in its last solve: the median over its
        (GPU, kind, chunk) of how much later a node finishes one period on."""
        if not len(self._period_pairs):
            return 0.0
        finish = self._small.finish_times()
        return float(np.median(finish[self._period_pairs[:, 1]] - finish[self._period_pairs[:, 0]]))

    def basis_at_slope(self, power_w: float) -> Any:
        """As :meth:`basis`, the miniature solved where ``V``'s slope is ``-power_w`` (see
        :meth:`Relaxation.solve_at_slope`): the same marginal energy of time, so the same
        steady state as the full relaxation's there, whatever the deadline."""
        self._small.solve_at_slope(power_w)
        return self._mapped()

    def _mapped(self) -> Any:
        """The miniature's current basis, its middle period repeated over the full DAG."""
        col_status, row_status = self._small.basis_statuses()
        columns = np.where(self._columns >= 0, col_status[self._columns], self._defaults)
        rows = np.where(self._rows >= 0, row_status[self._rows], _BASIC)
        basis = highspy.HighsBasis()
        basis.col_status = [_STATUSES[s] for s in columns.tolist()]
        basis.row_status = [_STATUSES[s] for s in rows.tolist()]
        basis.alien = True
        return basis


class Extension:
    """The full relaxation's optima stood in for by its miniature's, extended: for DAGs whose
    relaxation costs tens of seconds a solve and whose miniature is a small share of it.

    Each solve solves the miniature where its steady state matches the full relaxation's
    (see :meth:`Miniature.matched`), or at the same slope, and repeats its middle period over
    the full DAG: the durations (where to round from) and the flow of its duals, made
    conserved again through the full DAG by a small network LP (:class:`_Router`), whose
    lines (see :meth:`Relaxation.lines`) are lower bounds like a solve's own, if less tight
    (on 16 x 128 1F1B within 0.02 % of ``V`` from 1 to 1.05 x, 0.05 % at 1.15 x; on 32 x 256
    at 1 x 0.06 %). A dive dives the miniature at the matched deadline and repeats its
    choices. Has :class:`Relaxation`'s solving methods; not thread-safe. Where the miniature
    or the routing fails, that call solves a full relaxation of its own instead: slower, not
    wrong.
    """

    def __init__(
        self,
        miniature: Miniature,
        full_fast_s: float,
        matched: dict[float, tuple[RelaxedSolution, float]] | None = None,
    ) -> None:
        self._miniature = miniature
        self._small = miniature.relaxation
        self._full = miniature._full
        self.dag = self._full.dag
        self.costs = self._full.costs
        self._fast_s = full_fast_s
        self._node = miniature._columns[: self.dag.size]
        # a full node in the place of each miniature node (the option times of a dive)
        self._representative = np.empty(self._small.dag.size, dtype=np.int64)
        self._representative[self._node[::-1]] = np.arange(self.dag.size)[::-1]
        self._router = _Router(self._full)
        # per full deadline, the miniature's matched deadline and solution there (one dict
        # may serve several extensions of the same DAG: see perseus.solver.knots)
        self._matched = {} if matched is None else matched
        # this extension's own matches (full deadline, miniature deadline), whatever the
        # other extensions did: its guesses depend only on the order of its own solves
        self._history: list[tuple[float, float]] = []
        self._columns = self._small.dag.size + 1 + self._small.num_segments
        self._fallback: Relaxation | None = None

    def start_from(self, basis: Any) -> None:
        """The next solve starts from ``basis``: the miniature's, as an extended solution's
        ``basis`` is (another, a full relaxation's, is ignored)."""
        if basis is not None and len(basis.col_status) == self._columns:
            self._small.start_from(basis)

    def solve(
        self, deadline_s: float | None, start: RelaxedSolution | None = None
    ) -> RelaxedSolution:
        """The extended optimum at ``deadline_s`` (None: none), from ``start``'s basis (an
        extended solution's: the miniature's) or the miniature's last."""
        if start is not None:
            self.start_from(start.basis)
        try:
            if deadline_s is None:
                small = self._small.solve(None)
                free = self._extended(small, None)
                # a knot at the free optimum's own time is this solve again
                self._matched[free.iteration_time_s] = (small, small.iteration_time_s)
                return free
            return self._extended(self._match(deadline_s)[0], deadline_s)
        except PerseusError:  # the full relaxation's own, if the deadline is infeasible
            return self._full_relaxation().solve(deadline_s)

    def solve_at_slope(self, power_w: float) -> RelaxedSolution:
        """The extended optimum where ``V``'s slope is ``-power_w``: the miniature's there,
        its deadline where the extended durations finish."""
        try:
            return self._extended(self._small.solve_at_slope(power_w), None, power_w)
        except PerseusError:
            return self._full_relaxation().solve_at_slope(power_w)

    def dive(
        self,
        deadline_s: float,
        option_times: Sequence[FloatArray],
        fraction: float,
        rounds: int | None = None,
        first: RelaxedSolution | None = None,
    ) -> IntArray:
        """:meth:`Relaxation.dive` on the miniature where its steady state matches
        ``deadline_s``, its choices repeated over the full DAG (``first`` is not used: the
        dive starts from the miniature's solve there, where :meth:`solve` made one)."""
        small_times = [option_times[int(j)] for j in self._representative]
        try:
            small, at = self._match(deadline_s)
            return self._small.dive(at, small_times, fraction, rounds, small)[self._node]
        except PerseusError:
            return self._full_relaxation().dive(deadline_s, option_times, fraction, rounds)

    def _full_relaxation(self) -> Relaxation:
        """This extension's own full relaxation, built on its first use (where the miniature
        failed)."""
        if self._fallback is None:
            self._fallback = Relaxation(self.dag, self.costs)
        return self._fallback

    def _match(self, deadline_s: float) -> tuple[RelaxedSolution, float]:
        """:meth:`Miniature.matched` where the extended durations finish at ``deadline_s``,
        from a first deadline interpolated between this extension's earlier matches (on
        32 x 256 1F1B the miniature's deadline is 0.544-0.551 of the full one's); a deadline
        matched before (by any extension sharing this one's matches) is not solved again."""
        known = self._matched.get(deadline_s)
        if known is not None:
            return known
        history = sorted(self._history, key=lambda pair: abs(pair[0] - deadline_s))[:2]
        start = None
        if len(history) == 1 or (len(history) == 2 and history[0][0] == history[1][0]):
            start = history[0][1] * deadline_s / history[0][0]
        elif len(history) == 2:
            (d0, a0), (d1, a1) = history
            start = a0 + (a1 - a0) * (deadline_s - d0) / (d1 - d0)
        small, at = self._miniature.matched(
            deadline_s, self._fast_s, finish=self._finish, start_s=start
        )
        self._history.append((deadline_s, at))
        self._matched[deadline_s] = (small, at)
        return small, at

    def _finish(self, small: RelaxedSolution) -> float:
        """The full DAG's iteration time with ``small``'s durations repeated."""
        return float(self.dag.iteration_time(small.durations_s[self._node]))

    def _extended(
        self, small: RelaxedSolution, deadline_s: float | None, power_w: float | None = None
    ) -> RelaxedSolution:
        durations = small.durations_s[self._node]
        finish = float(self.dag.iteration_time(durations))
        assert small.flow is not None
        flow = self._full.flow_of(self._router.route(small.flow.node_w[self._node], durations))
        if deadline_s is not None:
            value, slope = self._full.tangent(flow, deadline_s)
            deadline = deadline_s
        elif power_w is not None:
            deadline = max(finish, self._fast_s)
            value, slope = self._full.tangent(flow, deadline)
        else:
            # the free optimum's flat line: its value at the latest deadline it serves
            deadline = math.inf
            value, slope = self._full.tangent(flow, max(finish, self._fast_s))[0], 0.0
        return RelaxedSolution(deadline, value, slope, durations, finish, small.basis, flow)


class _Router:
    """Conserved flows through a DAG near given inflows: over the multipliers ``y >= 0`` of
    ``relaxation``'s rows (see :meth:`Relaxation.flow_of`), the LP

        min sum_j w_j |in_j(y) - X_j|   s.t.   in_j(y) = out_j(y) for every node j,

    with ``in_j`` the multipliers of node ``j``'s own rows and ``out_j`` those of the rows
    it precedes (and its sink row). A flow's bound pays the deadline times its imbalance,
    a change of ``X_j`` about the node's duration ``w_j`` times that change: a miniature's
    middle repeated is a few watts from conserved on every copy (on 16 x 128 1F1B at 1.05 x:
    7 W on each of 80 copies of a forward, the bound 54 % below ``V`` for it), which the
    routed flow's bound no longer pays. One HiGHS model, each call from the last basis.
    """

    def __init__(self, relaxation: Relaxation) -> None:
        rows, before = relaxation.row_node, relaxation.row_finish
        n, count = relaxation.dag.size, len(rows)
        own, leaving = np.flatnonzero(rows >= 0), np.flatnonzero(before >= 0)
        nodes = np.arange(n)
        ones, minus = np.ones(len(own)), -np.ones(len(leaving))
        matrix = SparseRows.from_entries(
            np.concatenate([rows[own], before[leaving], n + rows[own], n + nodes, n + nodes]),
            np.concatenate([own, leaving, own, count + nodes, count + n + nodes]),
            np.concatenate([ones, minus, ones, -np.ones(n), np.ones(n)]),
            (2 * n, count + 2 * n),
        )
        zeros = np.zeros(2 * n)
        self._highs = highs_model(
            matrix, zeros, zeros, np.zeros(count + 2 * n), np.full(count + 2 * n, np.inf)
        )
        self._n, self._count = n, count

    def route(self, inflow_w: FloatArray, weights: FloatArray) -> FloatArray:
        """The rows' multipliers of a conserved flow whose inflows are nearest ``inflow_w``
        (each node's miss weighted by ``weights``)."""
        n, count = self._n, self._count
        highs = self._highs
        highs.changeRowsBounds(n, np.arange(n, 2 * n, dtype=np.int32), inflow_w, inflow_w)
        highs.changeColsCost(
            2 * n,
            np.arange(count, count + 2 * n, dtype=np.int32),
            np.concatenate([weights, weights]),
        )
        highs.clearSolver()
        highs.run()
        if highs.getModelStatus() != MODEL_STATUS.kOptimal:
            raise PerseusError(
                f"routing the miniature's flow failed: "
                f"{highs.modelStatusToString(highs.getModelStatus())}"
            )
        values = np.asarray(highs.getSolution().col_value, dtype=np.float64)
        return np.maximum(values[:count], 0.0)


def _places(dag: PipelineDag) -> IntArray:
    """Each node of ``dag`` by place: ``[gpu, kind, chunk, microbatch]`` -> node (-1: none)."""
    shape = _Shape.of(dag)
    schedule = dag.schedule
    table = np.full(
        (schedule.stages, 4, schedule.virtual_stages, schedule.microbatches), -1, dtype=np.int64
    )
    table[shape.gpu, shape.kind, shape.chunk, shape.microbatch] = np.arange(dag.size)
    return table


def _maps(relaxation: Relaxation, small: Relaxation, period: int) -> tuple[IntArray, IntArray]:
    """Per column and per row of ``relaxation``, the column and row of ``small`` (its
    miniature, repeating every ``period`` microbatches) in the same place (-1: none).
    O(instructions + segments)."""
    dag, little_dag = relaxation.dag, small.dag
    big = _Shape.of(dag)
    m = little_dag.size
    microbatches, small_microbatches = dag.schedule.microbatches, little_dag.schedule.microbatches
    edge = (small_microbatches - period) // 2
    table = _places(little_dag)
    k = big.microbatch
    late = k - (microbatches - small_microbatches)
    mapped = np.where(
        k < edge, k, np.where(late >= edge + period, late, edge + (k - edge) % period)
    )
    shift = k - mapped
    node = table[big.gpu, big.kind, big.chunk, mapped]

    def moved(nodes: IntArray, by: IntArray) -> IntArray:
        """The small node in the place of each of ``nodes`` moved ``by`` microbatches back."""
        at = big.microbatch[nodes] - by
        inside = (at >= 0) & (at < small_microbatches)
        at = np.clip(at, 0, small_microbatches - 1)
        found = table[big.gpu[nodes], big.kind[nodes], big.chunk[nodes], at]
        return np.where(inside, found, -1)

    # columns: finish times, T, then each node's segments in order (a class's, same count)
    segment_node = relaxation.segment_node
    within = np.arange(len(segment_node)) - relaxation.segment_start[segment_node]
    owner = node[segment_node]
    columns = np.concatenate(
        [
            node,
            [m],
            np.where(owner >= 0, m + 1 + small.segment_start[np.maximum(owner, 0)] + within, -1),
        ]
    )
    # precedence rows: a row of node j and predecessor p (-1: none) is the small row of
    # node[j] whose predecessor is p moved as j is (a node's rows are adjacent, at most two)
    row_node, row_finish = relaxation.row_node, relaxation.row_finish
    small_node, small_finish = small.row_node, small.row_finish
    small_count = np.bincount(small_node[small_node >= 0], minlength=m)
    small_first = np.concatenate([[0], np.cumsum(small_count)[:-1]])
    own = row_node >= 0
    j, p = row_node[own], row_finish[own]
    jj = node[j]
    pp = np.where(p >= 0, moved(np.maximum(p, 0), shift[j]), -1)
    usable = (jj >= 0) & ((p < 0) | (pp >= 0))
    first = small_first[np.maximum(jj, 0)]
    second = np.minimum(first + 1, len(small_node) - 1)
    twice = small_count[np.maximum(jj, 0)] > 1
    rows = np.full(len(row_node), -1, dtype=np.int64)
    rows[own] = np.where(
        usable & (small_finish[first] == pp),
        first,
        np.where(usable & twice & (small_finish[second] == pp), second, -1),
    )
    # sink rows: the small sink row of the mapped sink
    small_sink_row = np.full(m, -1, dtype=np.int64)
    small_sinks = np.flatnonzero(small_node < 0)
    small_sink_row[small_finish[small_sinks]] = small_sinks
    sink_node = node[row_finish[~own]]
    rows[~own] = np.where(sink_node >= 0, small_sink_row[np.maximum(sink_node, 0)], -1)
    return columns, rows
