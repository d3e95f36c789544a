"""The relaxation's knots: the deadlines (and slopes) where the fast mode solves the convex
relaxation, whose solutions its grid's plans round from and whose flows bound ``V`` between
them, and the first solves they start from (see :mod:`perseus.solver.fast`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from perseus.core.errors import PerseusError
from perseus.solver.miniature import Extension, Miniature
from perseus.solver.planner import Progress
from perseus.solver.relaxation import Relaxation, RelaxedSolution, Solver, side_by_side

__all__ = ["FirstSolves", "extended_microbatches", "first_solves", "relaxed_knots"]

# Relative chord-minus-tangent error of V between knots above which another knot is solved.
_KNOT_TOLERANCE = 2e-4
_MAX_KNOTS = 64
# DAGs past fast.py's _FINE_KNOTS_UP_TO (not ``fine``) solve at most 8 knots, to 0.1 %.
_COARSE_KNOT_TOLERANCE = 1e-3
_COARSE_MAX_KNOTS = 8
_NO_SEEDS: Mapping[float | None, Any] = {}
_NO_KNOTS: Mapping[float, RelaxedSolution] = {}
# Largest share of the microbatches (see Miniature.share) at which a miniature starts the
# upper chain's first knot where the steady states match (not at the same slowdown) and the
# adaptive knots.
_MATCHED_SHARE = 0.4
# Where extensions stand in for the full relaxation (see extended_microbatches): from this
# many instructions, with edges of _EXTEND_EDGE x stages microbatches, up to this share.
_EXTEND_FROM = 4096
_EXTEND_EDGE = 1
_EXTEND_SHARE = 0.55
_EXTENDED = ("1f1b",)


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
    :func:`extended_microbatches` says so (and its miniature can be built), else none."""
    shape = relaxation.dag.schedule
    size = relaxation.dag.size
    if extended_microbatches(shape.name, shape.stages, shape.microbatches, size) is None:
        return []
    extra = _EXTEND_EDGE * shape.stages
    miniature = Miniature.of(relaxation, extra)
    if miniature is None:
        return []
    other = Miniature.of(relaxation, extra)
    assert other is not None
    matched: dict[float, tuple[RelaxedSolution, float]] = {}
    return [Extension(miniature, t_fast, matched), Extension(other, t_fast, matched)]


@dataclass(frozen=True, slots=True)
class FirstSolves:
    """What the knots start from (see :func:`first_solves`).

    Attributes:
        free: The free optimum.
        models: The models the knots and dives solve on (one or two; the first the dives').
        seeds: Miniature bases at the deadlines where the chains of knots start.
        matched: The miniature that starts the adaptive knots at their slopes, if any.
        known: Knots solved already (the all-fastest one, beside the free optimum).
    """

    free: RelaxedSolution
    models: list[Solver]
    seeds: dict[float | None, Any]
    matched: Miniature | None
    known: dict[float, RelaxedSolution]


def first_solves(
    relaxation: Relaxation, fine: bool, t_fast: float, upper_start_s: float
) -> FirstSolves:
    """The free optimum and the models for :func:`relaxed_knots`: small DAGs (``fine``) one
    model, ``relaxation``; large 1F1B ones two extensions (:func:`extended_microbatches`),
    the free optimum and the all-fastest knot solved side by side on them (from its cold
    start the miniature takes about as many iterations as from the free optimum's basis);
    other large DAGs ``relaxation`` and a second model, the free optimum and the chains'
    first knots (``t_fast`` and ``upper_start_s``) started from a miniature's bases."""
    extensions = [] if fine else _extensions(relaxation, t_fast)
    if extensions:
        free, fastest = side_by_side(
            extensions, [lambda e: e.solve(None), lambda e: e.solve(t_fast)]
        )
        return FirstSolves(free, list(extensions), {}, None, {t_fast: fastest})
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
        # relaxed_knots), the all-fastest one and the highest anchor, while the free optimum solves
        miniature = None if fine else Miniature.of(relaxation)
        seeding = None
        matched: Miniature | None = None
        if miniature is not None:
            free_seed = _seeds(miniature, [None], t_fast)
            if None in free_seed:
                relaxation.start_from(free_seed[None])
            chain_starts = (t_fast, upper_start_s)
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
    return FirstSolves(free, relaxations, seeds, matched, {})


def relaxed_knots(
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
