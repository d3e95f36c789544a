"""The fast mode: the convex relaxation rounded and refilled at every grid deadline, searched
hard at a few anchor deadlines, then repaired where the reported gaps are large.

See :mod:`perseus.solver.frontier` for the method as a whole. The entry point is
:func:`fast_frontier`; the sweep's state (each grid deadline's best plan so far, and the
Pareto points drawn from them) lives in one :class:`_GridPlans`; the relaxation's knots and
first solves are :mod:`perseus.solver.knots`.
"""

from __future__ import annotations

import math
import os

import numpy as np

from perseus.core.errors import InfeasibleDeadline
from perseus.solver.deadlines import deadline_grid, served_deadline
from perseus.solver.knots import first_solves, relaxed_knots
from perseus.solver.planner import FloatArray, Found, IntArray, Planner, Progress, pareto
from perseus.solver.programs import ExactProgram, Relaxation, RelaxedSolution
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

__all__ = ["ANCHOR_SLOWDOWNS", "anchor_slowdowns", "fast_frontier"]

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
_CHUNK = 1024  # grid deadlines per vectorised batch, at most
# Fine DAGs of this many instructions or more (their one model solves alone) share each
# relaxation's dual simplex iterations among two threads where the process has two cores
# (see Relaxation's ``threads``): the same frontier, bloom+a100 8 x 96 1F1B 5.56 -> 5.05 s,
# 8 x 64 4.69 -> 4.43 s; smaller solves are too short to share (8 x 24: 1.23 -> 1.33 s).
# Only where a core is idle, though: HiGHS's threads wait on each other every iteration, and
# where the machine's other work keeps both cores busy each wait lasts a time slice. On a
# 2-core machine at a load average of 12-20 (other users' jobs), gpt3-175b+a40 8 x 96 took
# 282 s and 66 s with two threads, 18 s and 14 s with one, the same frontier.
_SHARED_SIMPLEX_FROM = 1024
_SPARE_CORES = 1.0  # idle cores the second thread needs: cores minus the 1-minute load average
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


def _cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _spare_cores() -> float:
    """Cores this process may run on that the machine's load leaves idle (all of them where
    the load average cannot be read): its cores minus the 1-minute load average, which counts
    this process's own running thread too."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return float(_cores())
    return _cores() - load


def _simplex_threads(instructions: int, fine: bool) -> int:
    """The threads each relaxation solve shares (see :data:`_SHARED_SIMPLEX_FROM`): two on a
    fine DAG from that size where the process has two cores and the machine leaves one idle.
    Either way the same frontier, bit for bit."""
    if not fine or instructions < _SHARED_SIMPLEX_FROM or _cores() < 2:
        return 1
    return 2 if _spare_cores() >= _SPARE_CORES else 1


def fast_frontier(
    planner: Planner,
    resolution_s: float,
    progress: Progress,
    t_default: float,
    search_work: int,
    polish_s: float = 0.0,
) -> Found:
    """The fast mode's frontier, time ascending, with the relaxation's bound for any points.

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
    relaxation = Relaxation(planner.dag, planner.costs, _simplex_threads(n, fine))
    started = first_solves(relaxation, fine, t_fast, max(_LARGE_SLOWDOWNS) * t_default)
    free, relaxations = started.free, started.models
    solver = relaxations[0]  # the dives' (the full relaxation's, or an extension's)
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

    knots = relaxed_knots(
        relaxations,
        t_fast,
        free,
        resolution_s,
        lambda d, t: report(0, 150, d, t),
        fine=fine,
        # large DAGs: the anchors are knots, and their dives start from them (each relaxation
        # costs a second or more there: 16 x 128 interleaved, 8,192 instructions, ~1.3 s)
        at=() if fine else anchors,
        seeds=started.seeds,
        miniature=started.matched,
        known=started.known,
    )
    del started  # the seeds and the miniature can go
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
    return Found(
        sweep.best_time[keep],
        sweep.best_energy[keep],
        sweep.gaps,
        sweep.best_choice[:, keep].T.astype(np.int64),
        sweep.served_bound,
    )


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
        keep = pareto(self.best_time, self.best_energy)
        if not np.isfinite(self.best_energy[keep]).all():
            raise InfeasibleDeadline("no plan meets the all-fastest iteration time")
        served = served_deadline(self.best_time[keep], self.grid)
        bound = self.bound_at(served)
        self.keep, self.served = keep, served
        self.gaps = self.best_energy[keep] / (bound * (1 - 1e-9)) - 1.0

    def bound_at(self, deadlines: FloatArray) -> FloatArray:
        """The relaxation's lower bound on the least energy at each of ``deadlines``: the
        highest of the knots' tangents and the mixed flows' lines (past the last knot, its
        value). O(len(deadlines) * (knots + lines))."""
        knots = self.knots
        at = np.minimum(deadlines, self.t_end)
        bound = np.max(
            [k.value_j + k.slope_j_per_s * (at - k.deadline_s) for k in knots[:-1]]
            + [np.full(len(at), knots[-1].value_j)],
            axis=0,
        )
        if self.lines is not None and len(self.lines[0]):
            values, slopes = self.lines
            for lo in range(0, len(at), _CHUNK):
                part = at[lo : lo + _CHUNK]
                mixed = np.max(values[:, None] + slopes[:, None] * part[None, :], axis=0)
                bound[lo : lo + _CHUNK] = np.maximum(bound[lo : lo + _CHUNK], mixed)
        return np.asarray(bound)

    def served_bound(self, times: FloatArray) -> FloatArray:
        """For a frontier's point times (ascending), the bound at the largest grid deadline
        each serves (see :func:`served_deadline`)."""
        return self.bound_at(served_deadline(times, self.grid))

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
