"""The local search at one deadline: a dive through the relaxation, then moves of one node
(or one class of nodes) to a neighbouring option, judged side by side as numpy columns.

Every budget is counted in work (evaluated (instruction, candidate plan) cells plus a charge
per batch), never seconds, so a search ends the same way on a fast and a slow machine.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from functools import partial
from typing import TypeVar

import numpy as np

from perseus.solver.planner import Evaluated, FloatArray, IntArray, Planner
from perseus.solver.programs import Relaxation, RelaxedSolution
from perseus.solver.relaxation import Solver, side_by_side

__all__ = [
    "ALL_ANCHORS_UP_TO",
    "DEFAULT_SEARCH_WORK",
    "Searching",
    "best_at",
    "dived",
    "dived_side_by_side",
    "local_search",
    "moves",
    "restart_starts",
    "restarts",
    "run_together",
    "search",
    "searched",
    "searching",
]

# Local-search work over all anchors, counted in evaluated (instruction, candidate plan) cells
# plus a charge per instruction per batch (the pass's fixed cost), not in seconds, so the
# frontier is the same on a fast and a slow machine. About 3.5 s per 1e8 on one core.
DEFAULT_SEARCH_WORK = 4 * 10**7
# A pass over the DAG costs about as much as 160 more candidate plans would (measured on
# 8 x 12 to 8 x 96: 1.6-8.4 ms fixed, 10-50 us per plan).
_BATCH_CHARGE = 160
# DAGs of up to this many instructions dive finely (a small rounding fraction) and search
# every anchor deadline; larger ones dive coarsely (see :func:`dived`).
ALL_ANCHORS_UP_TO = 1024  # instructions
_WIDE_MOVES_UP_TO = 512  # instructions (see local_search)
_FINE_DIVES_UP_TO = 1536  # instructions (see dived; as fast.py's _FINE_KNOTS_UP_TO)
_COARSE_DIVE_SOLVES = 2  # larger DAGs: relaxations per dive (the first is a knot), the last
# rounds every node down
# DAGs of up to this many instructions search the default plan's time (the no-slowdown
# deadline) _RESTARTS more times, from relaxations scaled by up to +-_RESTART_SPREAD per node
# (see restarts); their searches reach a local optimum, so another start is what can find a
# better one.
RESTARTS_UP_TO = 512
_RESTARTS = 2
_RESTART_SPREAD = 0.05
_SEARCH_CHUNK = 2 * 10**6  # cells per batch of candidate plans (bounds memory: ~16 MB/array)

_R = TypeVar("_R")
# A search in progress: it yields the plans it wants refilled (columns) and their deadline, is
# sent back what Planner.refill_evaluated gives for them, and returns its result. Searches at
# several deadlines run side by side (run_together): one refill pass over the DAG serves all
# of them, where each alone would pay the pass's fixed cost (a few numpy calls per level).
Searching = Generator[tuple[IntArray, float], Evaluated, _R]


def run_together(
    planner: Planner,
    searches: Sequence[Searching[_R]],
    done: Callable[[int], None] | None = None,
) -> list[_R]:
    """Run ``searches`` side by side; their results, in order.

    Each round, every search still running asks for its plans refilled; the requests are
    packed into refill calls of at most :data:`_SEARCH_CHUNK` cells (a larger one alone),
    so memory stays what one search's batches take. A search's decisions depend only on
    its own columns, so it ends exactly as it would alone. ``done(i)`` is called as search
    ``i`` ends.
    """
    n = planner.dag.size
    width = max(1, _SEARCH_CHUNK // max(n, 1))
    results: dict[int, _R] = {}
    pending: dict[int, tuple[IntArray, float]] = {}

    def advance(i: int, answer: Evaluated | None) -> None:
        try:
            pending[i] = next(searches[i]) if answer is None else searches[i].send(answer)
        except StopIteration as stop:
            pending.pop(i, None)
            results[i] = stop.value
            if done is not None:
                done(i)

    for i in range(len(searches)):
        advance(i, None)
    while pending:
        groups: list[list[int]] = [[]]
        columns = 0
        for i, (trials, _) in pending.items():
            if groups[-1] and columns + trials.shape[1] > width:
                groups.append([])
                columns = 0
            groups[-1].append(i)
            columns += trials.shape[1]
        answers: dict[int, Evaluated] = {}
        for group in groups:
            plans = [pending[i][0] for i in group]
            ceiling = np.concatenate([np.full(p.shape[1], pending[i][1]) for i, p in
                                      zip(group, plans, strict=True)])  # fmt: skip
            refilled, time, energy = planner.refill_evaluated(
                plans[0] if len(plans) == 1 else np.concatenate(plans, axis=1), ceiling
            )
            lo = 0
            for i, p in zip(group, plans, strict=True):
                hi = lo + p.shape[1]
                answers[i] = (refilled[:, lo:hi], time[lo:hi], energy[lo:hi])
                lo = hi
        for i, answer in answers.items():
            advance(i, answer)
    return [results[i] for i in range(len(searches))]


def _alone(planner: Planner, running: Searching[_R]) -> _R:
    return run_together(planner, [running])[0]


def search(
    planner: Planner, relaxation: Relaxation, deadline_s: float, work: int, fraction: float = 0.05
) -> IntArray:
    """A good plan at one deadline: a dive, then a local search of about ``work`` cells.

    The dive rounds the relaxation to hull options only (the relaxation mixes hull
    vertices; measured options above the hull are what rounding to any option lands on
    where profiles are not convex), and the refill then spends what is left over.
    """
    return searched(planner, dived(planner, relaxation, deadline_s, fraction), deadline_s, work)[0]


def dived(
    planner: Planner,
    relaxation: Solver,
    deadline_s: float,
    fraction: float,
    first: RelaxedSolution | None = None,
) -> IntArray:
    """Where :func:`search` starts: the dive's hull plan, or the all-fastest plan if that
    one, refilled, takes less energy. ``first``: the relaxation already solved at the
    deadline (see :meth:`Relaxation.dive`)."""
    times, fraction, rounds = _dive_settings(planner, fraction)
    return _hull_start(
        planner, relaxation.dive(deadline_s, times, fraction, rounds, first), deadline_s
    )


def dived_side_by_side(
    planner: Planner,
    relaxations: Sequence[Solver],
    deadlines: Sequence[float],
    fraction: float,
    firsts: Sequence[RelaxedSolution | None],
) -> list[IntArray]:
    """:func:`dived` at every deadline, the relaxation's dives on ``relaxations`` side by side
    (see :func:`~perseus.solver.relaxation.side_by_side`; each dive starts from its
    ``firsts`` entry, so the model it runs on does not matter)."""
    times, fraction, rounds = _dive_settings(planner, fraction)

    def dive(relaxation: Solver, deadline_s: float, first: RelaxedSolution | None) -> IntArray:
        return relaxation.dive(deadline_s, times, fraction, rounds, first)

    on_hull = side_by_side(
        relaxations,
        [partial(dive, deadline_s=d, first=f) for d, f in zip(deadlines, firsts, strict=True)],
    )
    return [_hull_start(planner, h, d) for h, d in zip(on_hull, deadlines, strict=True)]


def _dive_settings(planner: Planner, fraction: float) -> tuple[list[FloatArray], float, int | None]:
    """The dive's options (each node's hull times), fraction and rounds for this DAG."""
    n = planner.dag.size
    # larger DAGs fix more per round: each relaxation costs a second or more past 1,536
    fraction = fraction if n <= ALL_ANCHORS_UP_TO else 0.25 if n <= _FINE_DIVES_UP_TO else 0.5
    hull_times = [planner.class_times[c][planner.hull[c]] for c in range(len(planner.hull))]
    rounds = None if n <= _FINE_DIVES_UP_TO else _COARSE_DIVE_SOLVES
    return [hull_times[c] for c in planner.cls], fraction, rounds


def _hull_start(planner: Planner, on_hull: IntArray, deadline_s: float) -> IntArray:
    """The dive's hull plan, or the all-fastest plan if that one, refilled, takes less."""
    n = planner.dag.size
    plan = np.asarray([planner.hull[c][k] for c, k in zip(planner.cls, on_hull, strict=True)])
    starts = np.stack([plan, np.zeros(n, dtype=np.int64)], axis=1)
    _, _, start_energy = planner.refill_evaluated(starts, np.full(2, deadline_s))
    return np.asarray(starts[:, int(np.argmin(start_energy))])


def searched(
    planner: Planner, start: IntArray, deadline_s: float, work: int
) -> tuple[IntArray, IntArray]:
    """The local searches of :func:`search` from hull plan ``start``: over hull plans
    before the refill (three quarters of ``work``), then over refilled plans. Returns the
    plan, and the hull plan where the first search stopped (to go on from)."""
    return _alone(planner, searching(planner, start, deadline_s, work))


def searching(
    planner: Planner, start: IntArray, deadline_s: float, work: int
) -> Searching[tuple[IntArray, IntArray]]:
    """:func:`searched`, as a search in progress (see :func:`run_together`)."""
    hull_work = work * 3 // 4
    state = yield from _LocalSearch(planner, start, deadline_s, hull_work, raw=True).ran(True)
    refilled, _, _ = yield state[:, None], deadline_s
    plan = yield from _LocalSearch(planner, refilled[:, 0], deadline_s, work - hull_work).ran()
    return plan, state


def restart_starts(planner: Planner, relaxation: Relaxation, deadline_s: float) -> list[IntArray]:
    """Where :func:`restarts`' searches start: :data:`_RESTARTS` dives at ``deadline_s``,
    each through the relaxation with every node's energy slopes scaled by a fixed
    pseudo-random factor in 1 +- :data:`_RESTART_SPREAD`.

    Which vertex the relaxation rests on decides which local optimum the search ends in
    (on gpt3-175b+a40 8 x 12 at no slowdown: 12.28-12.41 % over eight such dives, 12.31 %
    unscaled); a scaled problem rests on another vertex near the same optimum.
    """
    starts = []
    for k in range(_RESTARTS):
        factors = 1.0 + _RESTART_SPREAD * np.random.default_rng(k).uniform(
            -1.0, 1.0, planner.dag.size
        )
        with relaxation.weighted(factors):
            starts.append(dived(planner, relaxation, deadline_s, 0.05))
    return starts


def restarts(
    planner: Planner, relaxation: Relaxation, deadline_s: float, work: int, plan: IntArray
) -> IntArray:
    """The best of ``plan`` and :data:`_RESTARTS` more searches at ``deadline_s`` (each of
    ``work``), from :func:`restart_starts`."""
    starts = restart_starts(planner, relaxation, deadline_s)
    found = run_together(planner, [searching(planner, s, deadline_s, work) for s in starts])
    return best_at(planner, [plan, *(p for p, _ in found)], deadline_s)


def best_at(planner: Planner, plans: Sequence[IntArray], deadline_s: float) -> IntArray:
    """The least-energy of ``plans`` that meets ``deadline_s`` (the first if none does)."""
    stacked = np.stack(plans, axis=1)
    plan_time, energy = planner.evaluate(stacked)
    energy = np.where(plan_time <= deadline_s * (1 + 1e-12), energy, np.inf)
    return np.asarray(stacked[:, int(np.argmin(energy))])


def local_search(
    planner: Planner,
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
    return _alone(planner, _LocalSearch(planner, plan, deadline_s, work, raw).ran(keep_state))


class _LocalSearch:
    """The state of one :func:`local_search`: the current plan, its energy, the work left.
    Its methods are searches in progress (see :func:`run_together`)."""

    def __init__(
        self, planner: Planner, plan: IntArray, deadline_s: float, work: int, raw: bool = False
    ) -> None:
        self.planner = planner
        self.deadline_s = deadline_s
        self.limit = deadline_s * (1 + 1e-12)
        self.raw = raw
        self.work = work
        self.plan = plan
        self.energy = 0.0

    def ran(self, keep_state: bool = False) -> Searching[IntArray]:
        """The whole search: see :func:`local_search`."""
        if self.raw:
            self.energy = float((yield from self.judged(self.plan[:, None]))[1][0])
        else:
            self.energy = float(self.planner.evaluate(self.plan[:, None])[1][0])
        yield from self.run()
        if keep_state or not self.raw:
            return self.plan
        return (yield from self.judged(self.plan[:, None]))[0][:, 0]

    def judged(self, trials: IntArray) -> Searching[tuple[IntArray, FloatArray]]:
        """The refilled trials and their energies (inf where the deadline is missed)."""
        refilled, time, energy = yield trials, self.deadline_s
        return refilled, np.where(time <= self.limit, energy, np.inf)

    def state(self, trials: IntArray, refilled: IntArray, k: int) -> IntArray:
        return np.asarray((trials if self.raw else refilled)[:, k].copy())

    def apply(
        self, nodes: IntArray, options: IntArray
    ) -> Searching[tuple[IntArray, IntArray, bool]]:
        """Try the moves ``nodes[k] -> options[k]`` side by side, apply the best of the
        prefixes of 1, 2, 4, ... improving ones (best first, one node once); return the
        improving moves not applied, and whether the plan improved."""
        n = self.planner.dag.size
        trial = np.repeat(self.plan[:, None], len(nodes), axis=1)
        trial[nodes, np.arange(len(nodes))] = options
        gains = (yield from self.judged(trial))[1]
        self.work -= n * (len(nodes) + _BATCH_CHARGE)
        better = np.flatnonzero(gains < self.energy * (1 - 1e-12))
        if not len(better):
            return nodes[:0], options[:0], False
        order = better[np.argsort(gains[better], kind="stable")]
        _, first = np.unique(nodes[order], return_index=True)
        picked = order[np.sort(first)]
        sizes = np.unique(np.minimum(2 ** np.arange(len(picked).bit_length() + 1), len(picked)))
        trial = np.repeat(self.plan[:, None], len(sizes), axis=1)
        for k, size in enumerate(sizes.tolist()):
            trial[nodes[picked[:size]], k] = options[picked[:size]]
        refilled, trial_energy = yield from self.judged(trial)
        self.work -= n * (len(sizes) + _BATCH_CHARGE)
        k = int(np.argmin(trial_energy))
        if not trial_energy[k] < self.energy * (1 - 1e-12):
            return nodes[:0], options[:0], False
        self.plan, self.energy = self.state(trial, refilled, k), float(trial_energy[k])
        rest = picked[int(sizes[k]) :]
        rest = rest[self.plan[nodes[rest]] != options[rest]]
        return nodes[rest], options[rest], True

    def run(self) -> Searching[None]:
        """Rounds of moves until a local optimum or the work is spent."""
        planner, raw = self.planner, self.raw
        n = planner.dag.size
        width = max(1, _SEARCH_CHUNK // n)
        # Small DAGs' searches converge within their work: there a node may also skip one hull
        # option (a wider neighbourhood, with more moves per round); on larger DAGs the work
        # buys more rounds of the narrower one.
        reach = 2 if raw and n <= _WIDE_MOVES_UP_TO else 1
        while self.work > 0:
            # Whole-class moves first: in a pipeline's steady state the instructions of one
            # class sit on the critical path together, so only moving them together frees time.
            classed = _class_moves(planner, self.plan, steps=not raw)
            shifted, shifted_energy = yield from self.judged(classed)
            self.work -= n * (shifted.shape[1] + _BATCH_CHARGE)
            best_shift = int(np.argmin(shifted_energy))
            if shifted_energy[best_shift] < self.energy * (1 - 1e-12):
                self.plan = self.state(classed, shifted, best_shift)
                self.energy = float(shifted_energy[best_shift])
                continue
            move_node, move_option = moves(planner, self.plan, steps=not raw, reach=reach)
            origin = self.plan.copy()
            improved = False
            for lo in range(0, len(move_node), width):
                if self.work <= 0:
                    break
                batch = np.arange(lo, min(lo + width, len(move_node)))
                # moves of nodes that an earlier batch of this round moved are stale
                batch = batch[self.plan[move_node[batch]] == origin[move_node[batch]]]
                nodes, options = move_node[batch], move_option[batch]
                # The improving moves left out of what was applied are tried again at once
                # (most still improve), before the next batch.
                while len(nodes) and self.work > 0:
                    nodes, options, applied = yield from self.apply(nodes, options)
                    improved |= applied
            if not improved:
                break


def _neighbours(
    planner: Planner, c: int, current: IntArray, steps: bool, reach: int = 1
) -> list[IntArray]:
    """Options near ``current`` (options of class ``c``): the next hull option either side
    (with ``reach`` 2, also the one after; with ``steps``, also one option either side)."""
    hull = planner.hull[c]
    last = len(hull) - 1
    at = np.searchsorted(hull, current)
    after = np.searchsorted(hull, current, side="right")
    near = [hull[np.maximum(at - 1, 0)], hull[np.minimum(after, last)]]
    if reach > 1:
        near += [hull[np.maximum(at - 2, 0)], hull[np.minimum(after + 1, last)]]
    if steps:
        near += [current - 1, current + 1]
    return near


def _class_moves(planner: Planner, plan: IntArray, steps: bool = True) -> IntArray:
    """Plans: every node of one class moved together to its next hull option either side
    (and, with ``steps``, one option either side)."""
    per_class = 4 if steps else 2
    trials = np.repeat(plan[:, None], per_class * len(planner.hull), axis=1)
    for c, members in enumerate(planner.members):
        options = _neighbours(planner, c, plan[members], steps)
        for k, option in enumerate(options):
            trials[members, per_class * c + k] = np.clip(option, 0, planner.class_top[c])
    return trials


def moves(
    planner: Planner, plan: IntArray, steps: bool = True, reach: int = 1
) -> tuple[IntArray, IntArray]:
    """Moves from ``plan``: each node to one of :func:`_neighbours`' options."""
    nodes: list[IntArray] = []
    options: list[IntArray] = []
    for c, members in enumerate(planner.members):
        current = plan[members]
        for option in _neighbours(planner, c, current, steps, reach):
            ok = (option != current) & (option >= 0) & (option <= planner.class_top[c])
            nodes.append(members[ok])
            options.append(option[ok])
    node_arr, option_arr = np.concatenate(nodes), np.concatenate(options)
    order = np.lexsort((option_arr, node_arr))
    pairs = np.unique(np.stack([node_arr[order], option_arr[order]]), axis=1)
    return pairs[0], pairs[1]
