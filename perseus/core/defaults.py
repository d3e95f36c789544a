"""Planning defaults shared by the solver, the CLI and the server.

A module of plain numbers (standard library only), so that the CLI can show them in its
help without importing the solver.
"""

from __future__ import annotations

__all__ = [
    "BASELINE_ITERATIONS",
    "CLOCK_CHANGE_DELAY_S",
    "CLOCK_CHANGE_MARGIN_S",
    "EXACT_TIME_LIMIT_S",
    "MAX_CELLS",
    "POLISH_S",
    "RESOLUTION_S",
]

RESOLUTION_S = 1e-3
"""The default and coarsest spacing of frontier deadlines, in seconds."""

EXACT_TIME_LIMIT_S = 60.0
"""Exact mode's default wall-clock limit; a sweep estimated to need more is refused at once."""

POLISH_S = 0.0
"""Default seconds of branch and bound on the no-slowdown point: off, so that a frontier is
the same on a fast and a slow machine (the search is budgeted in work instead)."""

CLOCK_CHANGE_MARGIN_S = 0.005
"""How far from an instruction boundary a planned clock change is aimed to take effect.

Changes are asymmetric so that no instruction runs slower than planned: a raise is aimed to
take effect this long before the boundary (the tail of the instruction before it runs at the
higher clock), a lowering this long after it (the head of the instruction after it runs at the
higher clock). A rank issues each change its measured clock-change latency ahead of that aim.
The solver's replay and the frontier's stated times and energies include these heads and
tails (:mod:`perseus.solver.transitions`)."""

CLOCK_CHANGE_DELAY_S = 0.03
"""The clock-change delay a planner server plans for (``PERSEUS_CLOCK_CHANGE_DELAY_S``): how
long a clock change takes to land on the ranks, the same as the latency a rank's clock
controller assumes until it has measured its own (``PERSEUS_CLOCK_LATENCY_S``). Changes are
serialised, so the planner merges every run of one clock shorter than its changes need
(:mod:`perseus.solver.changes`); 0 plans without."""

BASELINE_ITERATIONS = 10
"""Iterations a rank runs at default clocks, reported as the baseline, before it follows its
first plan (the realized saving is measured against them)."""

MAX_CELLS = 400_000_000
"""The solver's default limit on grid deadlines x instructions (its arrays: about 4.7 GiB),
and the server's default limit on a job's planning work (``PERSEUS_PLANNING_MAX_CELLS``)."""
