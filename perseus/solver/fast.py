"""The fast mode: the convex relaxation rounded and refilled at every grid deadline, searched
hard at a few anchor deadlines, then repaired where the reported gaps are large.

See :mod:`perseus.solver.frontier` for the method as a whole. The entry point is
:func:`fast_frontier`; the sweep's state (each grid deadline's best plan so far, and the
Pareto points drawn from them) lives in one :class:`_GridPlans`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from perseus.errors import InfeasibleDeadline, PerseusError
from perseus.solver.deadlines import deadline_grid, served_deadline
from perseus.solver.miniature import Extension, Miniature
from perseus.solver.planner import FloatArray, IntArray, Planner, Progress, pareto
from perseus.solver.programs import ExactProgram, Relaxation, RelaxedSolution
from perseus.solver.relaxation import Solver, side_by_side
from perseus.solver.search import (
    ALL_ANCHORS_UP_TO,
    RESTARTS_UP_TO,
    best_at,
    dived_side_by_side,
    restart_starts,
    run_together,
    searching,
)
from perseus.solver.search import dived as _dived

__all__ = ["ANCHOR_SLOWDOWNS", "anchor_slowdowns", "extended_microbatches", "fast_frontier"]

# Relative chord-minus-tangent error of V between knots above which another knot is solved.
_KNOT_TOLERANCE = 2e-4
_MAX_KNOTS = 64
# DAGs over _FINE_KNOTS_UP_TO instructions (beyond 8 x 96 1F1B, the largest shared-profile
# case, which quality.py checks against an MILP) solve fewer knots: 16 x 64 1F1B (2,048) took
# 22.3 s with 64 of them and 5.9 s with 8, largest gap 0.82 % and 0.90 % (1.01 x 0.68 and
# 0.71 %, 1.05 x 0.66 and 0.59 %). Each relaxation costs a second or more past that
# (16 x 128 interleaved: ~1 s, 32 x 256: ~36 s), and 64 of them were 40 % of the run; 16 x 128
# 1F1B (4,096) took 62 s with them, against 37 s for interleaved 16 x 128 (8,192) without.
# Their bound between knots is the highest of the lines of the knots' flows mixed (see
# Relaxation.lines), not only of their tangents. At most 8 (the anchors among them, so two
# more; they solve two at a time): 12 took 16.8 s on 16 x 128 interleaved and 51.9 s on
# 32 x 128 1F1B, largest gaps 0.80 % and 0.51 %; 8 took 11.2 s and 38.6 s, 0.81 % and
# 0.76 %; the anchors alone (6) 12.8 s and 30.9 s, but 1.18 % and 1.37 % (the grid's plans
# past the last anchor are mixed from fewer knots).
_FINE_KNOTS_UP_TO = 1536
_COARSE_KNOT_TOLERANCE = 1e-3
_COARSE_MAX_KNOTS = 8
_NO_SEEDS: Mapping[float | None, Any] = {}
_NO_KNOTS: Mapping[float, RelaxedSolution] = {}
# Largest share of the microbatches (see Miniature.share) at which a miniature starts the
# upper chain's first knot where the steady states match (not at the same slowdown) and the
# adaptive knots.
_MATCHED_SHARE = 0.4
_EXTEND_FROM = 4096
_EXTEND_EDGE = 1
_EXTEND_SHARE = 0.55
_EXTENDED = ("1f1b",)
_CHUNK = 1024  # grid deadlines per vectorised batch, at most
# (instruction, deadline) cells per batch: a batch's temporaries (a dozen (n, chunk) arrays)
# stay near 16 MiB each however large the DAG (DAGs up to 2,048 instructions: _CHUNK deadlines)
_CHUNK_CELLS = 1 << 21
# Slowdowns (x the default plan's time) where fast mode searches hardest: the deadlines most
# users pick (no-slowdown, a few percent), each solved by a hull dive and a local search.
ANCHOR_SLOWDOWNS = (1.0, 1.005, 1.01, 1.015, 1.02, 1.03, 1.05, 1.075, 1.1)
# The anchors that get twice the share of the work: the deadlines the policies name.
_MAIN_SLOWDOWNS = (1.0, 1.01, 1.02, 1.05)
# Larger DAGs search at those and at 1.03 x, inside the widest stretch between them (on
# gpt3-175b+a40 8 x 96 without it the points from 1.02 to 1.035 x reported gaps up to 1.37 %;
# with it 1.08 %, 0.98 % after resumed searches; more anchors there spread the work thinner
# and did worse).
_LARGE_SLOWDOWNS = (1.0, 1.01, 1.02, 1.03, 1.05)
_CROSSOVER_ROUNDS = 2
_CROSSOVER_PAIRS = 16
# Repair rounds: search again where a point's reported gap exceeds this.
_REPAIR_GAP = 0.009
# DAGs over ALL_ANCHORS_UP_TO instructions whose largest gap is over _RESUME_ABOVE among the
# anchors search every anchor again, from the plan its search stopped at, with _RESUME_WORK of
# its share (instead of the one repair search); smaller DAGs with a gap still over it after
# the repair round get one more.
_RESUME_ABOVE = 0.01
_RESUME_WORK = 0.5
_REPAIR_ROUNDS = 1
_REPAIR_ANCHORS = 6


def anchor_slowdowns(instructions: int) -> tuple[float, ...]:
    """The deadlines (multiples of the default plan's time) where the fast mode searches, for
    a DAG of ``instructions`` nodes: large DAGs search only where the policies point."""
    return ANCHOR_SLOWDOWNS if instructions <= ALL_ANCHORS_UP_TO else _LARGE_SLOWDOWNS


def fast_frontier(
    planner: Planner,
    resolution_s: float,
    progress: Progress,
    t_default: float,
    search_work: int,
    polish_s: float = 0.0,
) -> tuple[FloatArray, FloatArray, FloatArray, IntArray]:
    """The fast mode's frontier ``(times, energies, gaps, choices)``, time ascending.

    Args:
        planner: The DAG and cost table.
        resolution_s: Spacing of the deadline grid.
        progress: Called as ``progress(done, 1000)``.
        t_default: The default plan's time (the no-slowdown deadline).
        search_work: Local-search work over all anchors, in cells.
        polish_s: Seconds of branch and bound on the no-slowdown plan (0: none).

    Raises:
        InfeasibleDeadline: No plan meets the all-fastest iteration time.
    """
    n = planner.dag.size
    t_fast = planner.fastest_time_s
    fine = n <= _FINE_KNOTS_UP_TO
    relaxation = Relaxation(planner.dag, planner.costs)
    extensions = [] if fine else _extensions(relaxation, t_fast)
    solver: Solver = extensions[0] if extensions else relaxation
    known: dict[float, RelaxedSolution] = {}
    if extensions:
        # the free optimum and the all-fastest deadline side by side (from its cold start
        # the miniature takes about as many iterations as from the free optimum's basis)
        free, known[t_fast] = side_by_side(
            extensions, [partial(_solve_at, deadline_s=None), partial(_solve_at, deadline_s=t_fast)]
        )
        relaxations: list[Solver] = list(extensions)
        seeds: dict[float | None, Any] = {}
        matched: Miniature | None = None
    else:
        free, relaxations, seeds, matched = _first_solves(relaxation, fine, t_fast, t_default)
    slowest_time = planner.slowest_time_s
    t_end = max(t_fast, min(free.iteration_time_s, slowest_time))
    # Large DAGs search only at the deadlines the policies name (each dive and search
    # round costs O(n) passes there).
    slowdowns = anchor_slowdowns(n)
    anchors = sorted(
        {t_fast} | {d for d in (f * t_default for f in slowdowns) if t_fast <= d <= t_end}
    )
    grid = deadline_grid(t_fast, t_end, slowest_time, resolution_s)
    grid = np.unique(np.concatenate([grid, anchors]))

    # Progress in thousandths, by where the time goes (on 8 x 96 roughly: the relaxation's
    # knots 15 %, the anchors' searches 55 %, the grid 20 %, the repairs 10 %).
    def report(first: int, last: int, done: int, total: int) -> None:
        progress(first + (last - first) * min(done, total) // max(total, 1), 1000)

    knots = _knots(
        relaxations,
        t_fast,
        free,
        resolution_s,
        lambda d, t: report(0, 150, d, t),
        fine=fine,
        # large DAGs: the anchors are knots, and their dives start from them (each relaxation
        # costs a second or more there: 16 x 128 interleaved, 8,192 instructions, ~1.3 s)
        at=() if fine else anchors,
        seeds=seeds,
        miniature=matched,
        known=known,
    )
    seeds.clear()
    matched = None
    solved = {} if fine else {k.deadline_s: k for k in knots[:-1]}

    # The anchors: a dive through the relaxation (rounding to hull options), then a local
    # search. Every grid deadline also gets the best anchor plan that fits, refilled.
    anchor_plans = np.empty((n, len(anchors)), dtype=np.int64)
    main = {f * t_default for f in _MAIN_SLOWDOWNS}
    weights = [2 if d in main else 1 for d in anchors]
    shares = [search_work * w // sum(weights) for w in weights]
    # The dives first, in the order the searches once took them (the relaxation's HiGHS
    # model starts each solve from the last basis); then every anchor's search, and on
    # small DAGs the no-slowdown deadline's restarts, side by side.
    starts = []
    again = []  # the restarts: (anchor, start)
    if len(relaxations) > 1:
        firsts = [solved.get(deadline) for deadline in anchors]
        starts = dived_side_by_side(planner, relaxations, anchors, 0.05, firsts)
        del relaxations[1:]  # its memory back before the sweep's table is allocated
    else:
        for a, deadline in enumerate(anchors):
            starts.append(_dived(planner, solver, deadline, 0.05, solved.get(deadline)))
            if deadline == t_default and n <= RESTARTS_UP_TO:
                again += [(a, start) for start in restart_starts(planner, relaxation, deadline)]
    finished = 0

    def ended(_: int) -> None:
        nonlocal finished
        finished += 1
        report(150, 700, finished, len(anchors) + len(again))

    found = run_together(
        planner,
        [searching(planner, start, d, share) for start, d, share in
         zip(starts, anchors, shares, strict=True)]
        + [searching(planner, start, anchors[a], shares[a] // 4) for a, start in again],
        ended,
    )  # fmt: skip
    states = [state for _, state in found[: len(anchors)]]  # where each hull search stopped
    for a, deadline in enumerate(anchors):
        plan = found[a][0]
        tried = [plan] + [found[len(anchors) + k][0] for k, (b, _) in enumerate(again) if b == a]
        if len(tried) > 1:
            plan = best_at(planner, tried, deadline)
        if deadline == t_default and polish_s > 0:
            polished = ExactProgram(planner.dag, planner.costs).solve(
                deadline,
                time_limit_s=polish_s,
                incumbent=plan,
                hull_only=True,
                rel_gap=1e-3,
                allow_incomplete=True,
            )
            plan = planner.best_of(
                [planner.evaluated(plan[:, None]), planner.evaluated(polished.choice[:, None])],
                np.asarray([deadline]),
            )[0][:, 0]
        anchor_plans[:, a] = plan

    # Large DAGs' knots are few: between two, flows mixed from theirs bound V far more tightly
    # than their tangents (see Relaxation.lines). Small DAGs' knots are dense, their tangents
    # within 0.02 % of V.
    lines = None if fine else relaxation.lines([k.flow for k in knots[:-1] if k.flow is not None])
    sweep = _GridPlans(planner, grid, knots, t_end, lines)
    sweep.fill(planner.with_crossings(anchor_plans), lambda d, t: report(700, 900, d, t))
    sweep.finish()
    progress(900, 1000)

    small = n <= ALL_ANCHORS_UP_TO
    sweep.cross_repair()
    worst = sweep.large_gaps()
    if (
        not small
        and worst
        and sweep.gaps[worst[0]] > _RESUME_ABOVE
        and sweep.best_time[sweep.keep[worst[0]]] < anchors[-1]
    ):
        # Large DAGs' searches stop for want of work, not at a local optimum (one round of
        # single moves costs more than an anchor's share): where a gap over 1 % lies among
        # the anchors, every anchor searches again from the hull plan its search stopped at
        # (its moves start over from the first instruction; an order spread over every GPU
        # did no better), and the new plans and their crossings are offered to the
        # deadlines whose gaps are large (all of them would cost 0.3 s a merge on 8 x 96).
        resumed = run_together(
            planner,
            [searching(planner, states[a], deadline,
                       int(_RESUME_WORK * search_work * weights[a] // sum(weights)))
             for a, deadline in enumerate(anchors)],
            lambda _: report(900, 950, 1, 1),
        )  # fmt: skip
        sweep.merge(
            planner.with_crossings(np.stack([plan for plan, _ in resumed], axis=1))[0],
            needy=True,
        )
        sweep.finish()
        sweep.cross_repair(needy=True)
        worst = []
    # Repair by searching where gaps are large; a fixed number of rounds and anchors, so
    # the work is bounded. Small DAGs search at the deadlines their worst points serve up
    # to, once more if a gap is still over 1 % (gpt3-175b+a40 gpipe 8 x 12: 1.02 ->
    # 0.97 %). Large DAGs afford one search: at the first point of the stretch of large gaps
    # holding the worst, since a plan serves every deadline from its own time up (refilled),
    # so that one plan lifts the whole stretch, not only the worst point.
    for round_ in range(_REPAIR_ROUNDS + 1):
        gaps, served = sweep.gaps, sweep.served
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
            targets = [float(sweep.best_time[sweep.keep[first]])]
            upto = float(served[last])
        share = search_work // (4 * _REPAIR_ANCHORS)
        dives = [_dived(planner, solver, d, 0.25) for d in targets]
        repaired = run_together(
            planner, [searching(planner, s, d, share) for s, d in zip(dives, targets, strict=True)]
        )
        sweep.merge(np.stack([plan for plan, _ in repaired], axis=1), upto)
        sweep.finish()
        worst = sweep.large_gaps()
    progress(1000, 1000)
    keep = sweep.keep
    return (
        sweep.best_time[keep],
        sweep.best_energy[keep],
        sweep.gaps,
        sweep.best_choice[:, keep].T.astype(np.int64),
    )


def extended_microbatches(
    schedule: str, stages: int, microbatches: int, instructions: int
) -> int | None:
    """The microbatches of the miniature whose solves stand in for the full relaxation's
    (see :class:`~perseus.solver.miniature.Extension`) on a job of this shape, or None where
    the full relaxation is solved: 1F1B DAGs of _EXTEND_FROM instructions or more whose
    miniature (edges of twice the stages, a period of one microbatch) is at most
    _EXTEND_SHARE of them."""
    if instructions < _EXTEND_FROM or schedule not in _EXTENDED:
        return None
    small = 2 * (stages + _EXTEND_EDGE * stages) + 1
    return small if small <= _EXTEND_SHARE * microbatches else None


def _extensions(relaxation: Relaxation, t_fast: float) -> list[Extension]:
    """Two extensions of ``relaxation`` to solve side by side where
    :func:`extended_microbatches` says so, else none."""
    shape = relaxation.dag.schedule
    if (
        extended_microbatches(shape.name, shape.stages, shape.microbatches, relaxation.dag.size)
        is None
    ):
        return []
    extra = _EXTEND_EDGE * relaxation.dag.schedule.stages
    miniature = Miniature.of(relaxation, extra)
    if miniature is None or miniature.share > _EXTEND_SHARE:
        return []
    other = Miniature.of(relaxation, extra)
    assert other is not None
    matched: dict[float, tuple[float, RelaxedSolution]] = {}
    return [Extension(miniature, t_fast, matched), Extension(other, t_fast, matched)]


def _first_solves(
    relaxation: Relaxation, fine: bool, t_fast: float, t_default: float
) -> tuple[RelaxedSolution, list[Solver], dict[float | None, Any], Miniature | None]:
    """The free optimum; the models the knots solve on; the miniature's bases where the
    chains of knots start; the miniature that starts the adaptive knots (see _knots)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="perseus-relaxation") as pool:
        # large DAGs: a second model, built while the first solves, for the knots and dives
        # side by side (each solve costs seconds there: 32 x 256, 20-100 s)
        other = (
            None
            if fine
            else pool.submit(lambda: Relaxation(relaxation.dag, relaxation.costs).built())
        )
        # and the first solves start from a miniature's bases (see perseus.solver.miniature):
        # the free optimum, then the deadlines where the two chains of knots start (see
        # _knots), the all-fastest one and the highest anchor, while the free optimum solves
        miniature = None if fine else Miniature.of(relaxation)
        seeding = None
        matched: Miniature | None = None
        if miniature is not None:
            free_seed = _seeds(miniature, [None], t_fast)
            if None in free_seed:
                relaxation.start_from(free_seed[None])
            chain_starts = (t_fast, max(_LARGE_SLOWDOWNS) * t_default)
            # where the miniature is much the smaller, it starts the upper chain's first knot
            # where the steady states match, and the adaptive knots at their slopes (see
            # _at_slopes); on 16 x 128 interleaved (63 %) its solves there cost more than
            # they save (18 s against 15 s)
            if miniature.share <= _MATCHED_SHARE:
                matched = miniature
            seeding = pool.submit(_seeds, miniature, chain_starts, t_fast, matched is not None)
        free = relaxation.solve(None)
        relaxations: list[Solver] = [relaxation]
        if other is not None:
            relaxations.append(other.result())
        seeds = {} if seeding is None else seeding.result()
        # the lists hold the second model and the seeds alone, so that the rest can go
        other = seeding = None
    return free, relaxations, seeds, matched


class _GridPlans:
    """Every grid deadline's best plan so far, and the frontier drawn from them.

    ``best_choice[:, g]``, ``best_time[g]``, ``best_energy[g]``: the best plan found for grid
    deadline ``g``. After :meth:`finish`: ``keep`` (the grid entries on the Pareto frontier,
    time ascending), ``served`` (the largest deadline each serves) and ``gaps`` (each one's
    gap to the relaxation's lower bound at that deadline).
    """

    def __init__(
        self,
        planner: Planner,
        grid: FloatArray,
        knots: list[RelaxedSolution],
        t_end: float,
        lines: tuple[FloatArray, FloatArray] | None = None,
    ) -> None:
        n = planner.dag.size
        self.planner = planner
        self.grid = grid
        self.knots = knots
        self.t_end = t_end
        self.lines = lines  # more lower bounds on V: (values, slopes)
        # the table of every deadline's plan is the largest array: option indices fit 16 bits
        small = max(planner.class_top, default=0) < np.iinfo(np.int16).max
        self.best_choice = np.empty((n, len(grid)), dtype=np.int16 if small else np.int64)
        self.chunk = max(1, min(_CHUNK, _CHUNK_CELLS // max(n, 1)))
        self.best_time = np.empty(len(grid))
        self.best_energy = np.empty(len(grid))
        self.keep = np.empty(0, dtype=np.int64)
        self.served = np.empty(0)
        self.gaps = np.empty(0)

    def fill(self, anchors: tuple[IntArray, FloatArray, FloatArray], progress: Progress) -> None:
        """Give every grid deadline its first plan: the relaxation mixed between the knots,
        rounded down and refilled (two ceilings), or an anchor plan (see
        :meth:`Planner.from_anchors`), whichever takes the least energy."""
        planner, grid, knots = self.planner, self.grid, self.knots
        anchor_plans, anchor_time, anchor_energy = anchors
        knot_deadlines = np.asarray([k.deadline_s for k in knots[:-1]] + [math.inf])
        for lo in range(0, len(grid), self.chunk):
            deadlines = grid[lo : lo + self.chunk]
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
            rounded = planner.round_down(mixed)
            rounded_time, _ = planner.evaluate(rounded)
            # Two ceilings: the relaxation's own iteration time, and what rounding left of it;
            # and the anchors' plans.
            candidates = [
                planner.refill_evaluated(rounded, tau),
                planner.refill_evaluated(rounded, np.minimum(rounded_time, tau)),
                *planner.from_anchors(anchor_plans, anchor_time, anchor_energy, deadlines),
            ]
            chosen, chosen_time, chosen_energy = planner.best_of(candidates, deadlines)
            width = len(deadlines)
            self.best_choice[:, lo : lo + width] = chosen
            self.best_time[lo : lo + width] = chosen_time
            self.best_energy[lo : lo + width] = chosen_energy
            progress(lo + width, len(grid))

    def finish(self) -> None:
        """Draw the Pareto frontier from the grid's plans: ``keep``, ``served``, ``gaps``."""
        knots = self.knots
        keep = pareto(self.best_time, self.best_energy)
        if not np.isfinite(self.best_energy[keep]).all():
            raise InfeasibleDeadline("no plan meets the all-fastest iteration time")
        served = served_deadline(self.best_time[keep], self.grid)
        at = np.minimum(served, self.t_end)
        bound = np.max(
            [k.value_j + k.slope_j_per_s * (at - k.deadline_s) for k in knots[:-1]]
            + [np.full(len(keep), knots[-1].value_j)],
            axis=0,
        )
        if self.lines is not None and len(self.lines[0]):
            values, slopes = self.lines
            for lo in range(0, len(at), _CHUNK):
                part = at[lo : lo + _CHUNK]
                mixed = np.max(values[:, None] + slopes[:, None] * part[None, :], axis=0)
                bound[lo : lo + _CHUNK] = np.maximum(bound[lo : lo + _CHUNK], mixed)
        self.keep, self.served = keep, served
        self.gaps = self.best_energy[keep] / (bound * (1 - 1e-9)) - 1.0

    def merge(self, plans: IntArray, upto: float | None = None, needy: bool = False) -> None:
        """Offer every grid deadline (up to ``upto``; with ``needy``, only those served by
        a point whose gap is over the repair threshold) the best of ``plans`` that fits,
        as is and refilled."""
        planner, grid = self.planner, self.grid
        plan_time, plan_energy = planner.evaluate(plans)
        first = int(np.searchsorted(grid, plan_time.min() * (1 - 1e-12)))
        stop = len(grid) if upto is None else int(np.searchsorted(grid, upto, side="right"))
        where = np.arange(first, stop)
        if needy:
            point = (
                np.searchsorted(self.best_time[self.keep], grid[where] * (1 + 1e-12), "right") - 1
            )
            where = where[(point >= 0) & (self.gaps[np.maximum(point, 0)] > _REPAIR_GAP)]
        for lo in range(0, len(where), self.chunk):
            at = where[lo : lo + self.chunk]
            deadlines = grid[at]
            current = (self.best_choice[:, at], self.best_time[at], self.best_energy[at])
            extra = planner.from_anchors(plans, plan_time, plan_energy, deadlines)
            chosen, chosen_time, chosen_energy = planner.best_of([current, *extra], deadlines)
            self.best_choice[:, at] = chosen
            self.best_time[at] = chosen_time
            self.best_energy[at] = chosen_energy

    def large_gaps(self) -> list[int]:
        """Points whose gap is over the repair threshold, the largest first."""
        gaps = self.gaps
        return [int(i) for i in np.argsort(-gaps, kind="stable")
                if gaps[i] > _REPAIR_GAP and math.isfinite(self.served[i])]  # fmt: skip

    def cross_repair(self, needy: bool = False) -> None:
        """Repair by crossing: around a large gap, plans between the point and the next
        one (cheap: no solves, so for every DAG size), offered to every deadline up to the
        last pair's (with ``needy``, only to those served by points over the threshold)."""
        for _ in range(_CROSSOVER_ROUNDS):
            worst = self.large_gaps()[:_CROSSOVER_PAIRS]
            if not worst:
                break
            keep = self.keep
            pairs = [(int(keep[i]), int(keep[i + 1])) for i in worst]
            fast_plans = self.best_choice[:, [a for a, _ in pairs]]
            slow_plans = self.best_choice[:, [b for _, b in pairs]]
            self.merge(
                self.planner.crossovers(fast_plans, slow_plans),
                upto=float(max(self.best_time[b] for _, b in pairs)),
                needy=needy,
            )
            self.finish()


def _knots(
    relaxations: Sequence[Solver],
    t_fast: float,
    free: RelaxedSolution,
    resolution_s: float,
    progress: Progress,
    fine: bool = True,
    at: Sequence[float] = (),
    seeds: Mapping[float | None, Any] = _NO_SEEDS,
    miniature: Miniature | None = None,
    known: Mapping[float, RelaxedSolution] = _NO_KNOTS,
) -> list[RelaxedSolution]:
    """Relaxed solutions at adaptively chosen deadlines, the unconstrained one last (with
    ``fine``, to a tighter tolerance and up to more knots). The deadlines ``at`` (between
    ``t_fast`` and the free optimum's time) are knots too, solved first, each from the one
    below it: where the anchors' dives need the relaxation anyway, their solves serve the
    bound as well.

    With two models (``relaxations``, the first one's last solve ``free``), they solve side
    by side: one from ``t_fast`` up through the lower half of ``at``, the other from the free
    optimum down through the upper half; then the adaptive knots two at a time (in the order
    one model would solve them, each from the basis of the nearer knot), and where only one
    interval wants a knot, two cuts in it. A deadline of ``seeds`` (a miniature's basis
    there, see :mod:`perseus.solver.miniature`) starts from that basis instead. On 32 x 256 (in
    thousands of dual simplex iterations) the free optimum took 53; from it, the all-fastest
    time 65 and 1.05 x 66 (from the miniature's bases 17, 35 and 51, each after 11-15 on the
    miniature, 32 x 81); each 1 % up from the all-fastest time 21-22, 1.03 x from 1.05 x 33;
    each adaptive knot 50-58: two of them one after the other were a third of the run."""
    relaxation = relaxations[0]
    tolerance = _KNOT_TOLERANCE if fine else _COARSE_KNOT_TOLERANCE
    most = _MAX_KNOTS if fine else _COARSE_MAX_KNOTS
    if free.iteration_time_s <= t_fast + resolution_s:
        first = known.get(t_fast) or relaxation.solve(t_fast)
        return [first, free]
    inner = sorted(d for d in set(at) if t_fast < d < free.iteration_time_s)
    if len(relaxations) == 1:
        end = relaxation.solve(free.iteration_time_s, free)
        chain = [*_chain(relaxation, t_fast, inner, None, known=known), end]
    else:
        lower, upper = inner[: (len(inner) + 1) // 2], inner[(len(inner) + 1) // 2 :]
        if t_fast in known and upper:
            # the all-fastest knot solved already (beside the free optimum): both chains
            # start there, the second on through the upper anchors to the free optimum's time
            # (from its basis); on 32 x 256's miniature 1.05 x took 30 thousand iterations
            # from the free optimum, 8-10 from the knot below
            ends = {**seeds, free.iteration_time_s: free.basis}
            up, down = side_by_side(
                relaxations,
                [
                    lambda r: _chain(r, t_fast, lower, None, seeds, known),
                    lambda r: _chain(
                        r, upper[0], [*upper[1:], free.iteration_time_s], known[t_fast], ends
                    ),
                ],
            )
            chain = up + down
        else:
            up, down = side_by_side(
                relaxations,
                [
                    lambda r: _chain(r, t_fast, lower, None, seeds, known),
                    lambda r: _chain(r, free.iteration_time_s, upper[::-1], free, seeds, known),
                ],
            )
            chain = up + down[::-1]
    knots = list(chain)
    pending = list(itertools.pairwise(chain))
    while pending and len(knots) < most:
        # breadth first when knots are few, so that they spread over the whole range
        batch: list[tuple[RelaxedSolution, RelaxedSolution, list[float]]] = []
        while pending and len(batch) < min(len(relaxations), most - len(knots)):
            a, b = pending.pop() if fine else pending.pop(0)
            cut = _tangent_crossing(a, b)
            if cut is None or not (a.deadline_s + resolution_s < cut < b.deadline_s - resolution_s):
                continue
            chord = a.value_j + (b.value_j - a.value_j) * (cut - a.deadline_s) / (
                b.deadline_s - a.deadline_s
            )
            tangent = a.value_j + a.slope_j_per_s * (cut - a.deadline_s)
            if chord - tangent > tolerance * b.value_j:
                batch.append((a, b, [cut]))
        if not fine and 0 < len(batch) < len(relaxations) and len(knots) + len(batch) < most:
            # a model would idle: the widest interval gets a second cut, midway along the
            # longer side of its first (so at least half that side from every knot)
            a, b, cuts = max(batch, key=lambda item: item[1].deadline_s - item[0].deadline_s)
            cut = cuts[0]
            above, below = b.deadline_s - cut, cut - a.deadline_s
            if max(above, below) / 2 > resolution_s:
                cuts.append((cut + b.deadline_s) / 2 if above > below else (a.deadline_s + cut) / 2)
                cuts.sort()
        if fine:
            jobs = [(a, b, cut) for a, b, cuts in batch for cut in cuts]
            middles = side_by_side(
                relaxations,
                [
                    partial(
                        _solve_at,
                        deadline_s=cut,
                        start=a if cut - a.deadline_s < b.deadline_s - cut else b,
                    )
                    for a, b, cut in jobs
                ],
            )
        else:
            intervals = [(a, b, len(cuts)) for a, b, cuts in batch]
            middles = _at_slopes(relaxations, intervals, miniature)
        solved = iter(middles)
        for a, b, cuts in batch:
            inside = [next(solved) for _ in cuts]
            inside = [
                k
                for k in inside
                if a.deadline_s + resolution_s < k.deadline_s < b.deadline_s - resolution_s
            ]
            knots.extend(inside)
            pending.extend(itertools.pairwise([a, *inside, b]))
            progress(len(knots), most)
    knots.sort(key=lambda k: k.deadline_s)
    return [*knots, free]


def _solve_at(
    relaxation: Solver, deadline_s: float | None, start: RelaxedSolution | None = None
) -> RelaxedSolution:
    return relaxation.solve(deadline_s, start)


def _at_slopes(
    relaxations: Sequence[Solver],
    intervals: Sequence[tuple[RelaxedSolution, RelaxedSolution, int]],
    miniature: Miniature | None,
) -> list[RelaxedSolution]:
    """Per interval ``(a, b, count)`` between two knots, ``count`` (1 or 2) relaxed optima at
    slopes of ``V`` between theirs, solved side by side, in order: one at the chord's slope,
    where ``V`` lies farthest below the chord; two halfway from it to each knot's.

    Each solve has no deadline, the iteration time costing the slope's power more (see
    :meth:`Relaxation.solve_at_slope`), and starts from the miniature's basis at the same
    slope (its steady state is the full one's there), else from the nearer knot's. On
    32 x 256 1F1B the two knots between 1.05 x and the free optimum took 55-57 thousand
    dual simplex iterations at deadlines from the nearer knot's basis (58-60 s side by side),
    22 and 32 thousand at slopes from the miniature's (16 and 25 s, after 7 s on the
    miniature). The miniature's solves run first, one after the other, so that the results
    do not depend on timing."""
    jobs: list[tuple[float, Any]] = []
    for a, b, count in intervals:
        steep, flat = -a.slope_j_per_s, -b.slope_j_per_s
        chord = (a.value_j - b.value_j) / (b.deadline_s - a.deadline_s)
        for power in [chord] if count == 1 else [(steep + chord) / 2, (chord + flat) / 2]:
            start = a.basis if steep - power < power - flat else b.basis
            if miniature is not None:
                with contextlib.suppress(PerseusError):
                    start = miniature.basis_at_slope(power)
            jobs.append((power, start))

    def solve(power: float, start: Any, relaxation: Solver) -> RelaxedSolution:
        if start is not None:
            relaxation.start_from(start)
        return relaxation.solve_at_slope(power)

    return side_by_side(relaxations, [partial(solve, power, start) for power, start in jobs])


def _chain(
    relaxation: Solver,
    first_s: float,
    deadlines: Sequence[float],
    start: RelaxedSolution | None,
    seeds: Mapping[float | None, Any] = _NO_SEEDS,
    known: Mapping[float, RelaxedSolution] = _NO_KNOTS,
) -> list[RelaxedSolution]:
    """Solutions at ``first_s`` (from ``start``'s basis, or the model's last), then at each of
    ``deadlines`` in order, each from the one before; a deadline of ``seeds`` from its basis
    there instead, one of ``known`` already solved. (On 32 x 256 1F1B, 1.03 x took 33
    thousand dual simplex iterations from 1.05 x, and 38 from the miniature's basis where the
    steady states match.)"""
    chain: list[RelaxedSolution] = []
    for deadline in [first_s, *deadlines]:
        if deadline in known:
            chain.append(known[deadline])
            continue
        before = chain[-1] if chain else start
        if deadline in seeds:
            relaxation.start_from(seeds[deadline])
            before = None
        chain.append(relaxation.solve(deadline, before))
    return chain


def _seeds(
    miniature: Miniature,
    deadlines: Sequence[float | None],
    t_fast: float,
    matched: bool = True,
) -> dict[float | None, Any]:
    """The miniature's bases at ``deadlines`` (None: no deadline; the all-fastest time
    ``t_fast``: the miniature's; a later one: with ``matched`` where their steady states
    match, see :meth:`Miniature.basis_at`, else at the same slowdown), in order, up to the
    first that fails to solve (only a start is lost: the full relaxation then solves from its
    last basis)."""
    seeds: dict[float | None, Any] = {}
    for deadline in deadlines:
        try:
            if deadline is None or deadline <= t_fast or not matched:
                seeds[deadline] = miniature.basis(None if deadline is None else deadline / t_fast)
            else:
                seeds[deadline] = miniature.basis_at(deadline, t_fast)
        except PerseusError:
            break
    return seeds


def _tangent_crossing(a: RelaxedSolution, b: RelaxedSolution) -> float | None:
    """Deadline where the tangents of ``V`` at ``a`` and ``b`` cross."""
    if b.slope_j_per_s - a.slope_j_per_s <= 0:
        return None
    return (
        b.value_j - a.value_j + a.slope_j_per_s * a.deadline_s - b.slope_j_per_s * b.deadline_s
    ) / (a.slope_j_per_s - b.slope_j_per_s)
