"""Planning defaults shared by the solver, the CLI and the server.

A module of plain numbers (standard library only), so that the CLI can show them in its
help without importing the solver.
"""

from __future__ import annotations

__all__ = ["EXACT_TIME_LIMIT_S", "POLISH_S", "RESOLUTION_S"]

RESOLUTION_S = 1e-3
"""The default and coarsest spacing of frontier deadlines, in seconds."""

EXACT_TIME_LIMIT_S = 60.0
"""Exact mode's default wall-clock limit; a sweep estimated to need more is refused at once."""

POLISH_S = 0.0
"""Default seconds of branch and bound on the no-slowdown point: off, so that a frontier is
the same on a fast and a slow machine (the search is budgeted in work instead)."""
