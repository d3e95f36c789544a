"""The exact mode: one MILP per frontier point, deadlines swept downwards.

Fast mode also uses it, under a work budget, for problems small enough to solve exactly
(:func:`small_exact`). Budgets here are branch-and-bound nodes plus a fixed charge per solve:
unlike a time limit, they decide the same way on a busy machine as on an idle one.

What a sweep's time limit cut short (solves stopped before proving optimality, deadlines left
to the fast frontier) is an :class:`ExactSweep`, handed to whoever listens with
:func:`recorded_sweeps` (``perseus plan --exact`` says it).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from perseus.core.errors import InfeasibleDeadline, SolverTimeout
from perseus.solver.planner import Found, IntArray, Planner, Progress, pareto
from perseus.solver.programs import ExactProgram

__all__ = [
    "EXACT_UP_TO",
    "EXACT_WORK",
    "SOLVE_CHARGE",
    "ExactSweep",
    "exact_estimate_s",
    "exact_frontier",
    "recorded_sweeps",
    "small_exact",
]

# Problems with at most this many (instruction, option) pairs are solved exactly even in fast
# mode: their MILPs take milliseconds, and rounding is weakest on them (few options, no averaging).
EXACT_UP_TO = 128
# ... unless their MILPs together need more work than this, counted in branch-and-bound nodes
# plus a fixed charge per solve (its root: presolve, cuts): a budget that, unlike a time limit,
# decides the same way on a busy machine as on an idle one. Up to a few seconds on one core.
EXACT_WORK = 6_000
SOLVE_CHARGE = 20
# Exact mode with a time limit times one MILP root before it starts, up to this many
# (instruction, option) pairs; beyond, it refuses from the size alone.
_EXACT_TIMED_UP_TO = 20_000


@dataclass(frozen=True, slots=True)
class ExactSweep:
    """What one exact sweep solved, and what its time limit cut short.

    Attributes:
        time_limit_s: The sweep's wall-clock limit (None: none).
        deadlines: Deadlines in the sweep's grid (a solve covers every deadline down to its
            plan's time, so there are usually fewer solves).
        solves: MILPs run.
        stopped: Of those, how many a limit stopped before they proved optimality (their best
            plan stands, with its proven gap).
        unsolved: The shortest deadlines the time limit left without a MILP (0: none); the fast
            frontier's points stand there (where it was given), with their own gaps.
    """

    time_limit_s: float | None
    deadlines: int
    solves: int
    stopped: int
    unsolved: int

    @property
    def partial(self) -> bool:
        """Whether a limit cut the sweep short: not every point is proven optimal by a MILP."""
        return self.stopped > 0 or self.unsolved > 0


_SWEEPS: ContextVar[list[ExactSweep] | None] = ContextVar("perseus_exact_sweeps", default=None)


@contextlib.contextmanager
def recorded_sweeps() -> Iterator[list[ExactSweep]]:
    """Collect the :class:`ExactSweep` of every exact sweep that ends within the block (in this
    thread or context), e.g. the one :func:`~perseus.solver.compute_frontier` runs with
    ``exact=True``; a sweep that raises records nothing."""
    sweeps: list[ExactSweep] = []
    token = _SWEEPS.set(sweeps)
    try:
        yield sweeps
    finally:
        _SWEEPS.reset(token)


def small_exact(
    planner: Planner, resolution_s: float, progress: Progress, t_default: float
) -> Found | None:
    """The exact frontier of a small problem (at most :data:`EXACT_UP_TO` instruction-option
    pairs) within :data:`EXACT_WORK`; None when the problem is larger or needs more work."""
    if int((planner.last + 1).sum()) > EXACT_UP_TO:
        return None
    try:
        return exact_frontier(planner, resolution_s, progress, EXACT_WORK, None, t_default)
    except SolverTimeout:
        return None


def exact_frontier(
    planner: Planner,
    resolution_s: float,
    progress: Progress,
    work_budget: int | None,
    time_limit_s: float | None,
    t_default: float,
    fast: Found | None = None,
) -> Found:
    """One MILP per frontier point, deadlines swept downwards: ``(times, energies, gaps,
    choices)``, time ascending.

    Args:
        resolution_s: Spacing of the deadlines.
        progress: Progress callback.
        work_budget: Branch-and-bound nodes (plus ``SOLVE_CHARGE`` per solve) for the
            whole sweep; None: unlimited.
        time_limit_s: Wall-clock limit of the sweep; None: unlimited.
        t_default: The default plan's time (always one of the deadlines).
        fast: The fast frontier ``(times, energies, gaps, choices)``: each MILP starts
            from its best plan that fits, and where the time limit ends the sweep its
            points stand (with their own gaps).

    What the limits cut short goes, as an :class:`ExactSweep`, to :func:`recorded_sweeps`.

    Raises:
        SolverTimeout: All solves together needed more than ``work_budget``, or the sweep
            is estimated to need more than ``time_limit_s`` (refused before it starts).
    """
    program = ExactProgram(planner.dag, planner.costs)
    t_fast = planner.fastest_time_s
    slowest_time = planner.slowest_time_s
    steps = math.ceil((slowest_time - t_fast) / resolution_s - 1e-9)
    grid = t_fast + resolution_s * np.arange(steps + 1)
    if t_fast <= t_default <= slowest_time:
        grid = np.unique(np.concatenate([grid, [t_default]]))
    started = time.monotonic()
    if time_limit_s is not None:
        planned = len(fast[0]) if fast is not None else len(grid)
        estimate = exact_estimate_s(planner, program, t_default, time_limit_s / planned) * planned
        if estimate > time_limit_s:
            raise SolverTimeout(
                f"exact mode: estimated to need at least {estimate:.0f} s ({planned} MILPs, "
                f"each at least as long as one timed root solve), over the limit of "
                f"{time_limit_s:g} s; use the fast mode, whose reported gaps bound what it "
                "can lose, or allow more time"
            )
    plans: list[tuple[float, float, float, IntArray]] = []
    solves = stopped = 0
    g = len(grid) - 1
    while g >= 0:
        left_s = None
        if time_limit_s is not None:
            left_s = time_limit_s - (time.monotonic() - started)
            if left_s <= 0:
                break  # the fast frontier's points stand for the rest
        if work_budget is not None:
            work_budget -= SOLVE_CHARGE
        incumbent = None
        floor = -math.inf  # a lower bound at this deadline known before the solve
        if fast is not None:
            fits = np.flatnonzero(fast[0] <= grid[g] * (1 + 1e-12))
            if len(fits):
                # the fast point serves this deadline, so its bound holds here
                incumbent = fast[3][fits[-1]]
                floor = float(fast[1][fits[-1]] / (1 + fast[2][fits[-1]]))
        solution = program.solve(
            float(grid[g]),
            time_limit_s=left_s,
            node_limit=work_budget,
            incumbent=incumbent,
            allow_incomplete=left_s is not None,
        )
        if work_budget is not None:
            work_budget -= solution.nodes
        solves += 1
        stopped += not solution.optimal
        choice = solution.choice[:, None]
        time_s, energy = planner.evaluate(choice)
        gap = float(energy[0]) / max(solution.bound_j, floor) - 1.0
        plans.append((float(time_s[0]), float(energy[0]), gap, solution.choice))
        g = int(np.searchsorted(grid, time_s[0] * (1 - 1e-12), side="left")) - 1
        progress(len(grid) - 1 - max(g, 0), len(grid))
    if fast is not None and g >= 0:
        plans.extend(
            (float(t), float(e), float(gp), c)
            for t, e, gp, c in zip(fast.times, fast.energies, fast.gaps, fast.choices, strict=True)
            if t <= grid[g] * (1 + 1e-12)
        )
    record = _SWEEPS.get()
    if record is not None:
        record.append(ExactSweep(time_limit_s, len(grid), solves, stopped, max(g + 1, 0)))
    times = np.asarray([p[0] for p in plans])
    energies = np.asarray([p[1] for p in plans])
    keep = pareto(times, energies)
    gaps = np.maximum(np.asarray([p[2] for p in plans])[keep], 0.0)
    chosen = np.stack([plans[k][3] for k in keep])
    return Found(times[keep], energies[keep], gaps, chosen)


def exact_estimate_s(
    planner: Planner, program: ExactProgram, deadline_s: float, cap_s: float
) -> float:
    """A quick lower estimate of one exact solve's time: one MILP's root, timed.

    The root (presolve, cuts, root heuristics) of the MILP at the no-slowdown deadline
    with a node limit of one, stopped after ``cap_s`` (then the estimate is at least
    ``cap_s``, which is all the caller needs to refuse); a whole solve needs at least that.
    """
    pairs = int((planner.last + 1).sum())
    if pairs > _EXACT_TIMED_UP_TO:
        # too large to time even one root quickly: a size-based floor (1 ms per pair)
        return pairs * 1e-3
    started = time.monotonic()
    with contextlib.suppress(SolverTimeout, InfeasibleDeadline):
        program.solve(deadline_s, time_limit_s=cap_s, node_limit=1, allow_incomplete=True)
    return max(time.monotonic() - started, cap_s * 1.001 if program.last_stopped else 0.0)
