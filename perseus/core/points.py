"""A point of the time-energy frontier: one plan, its iteration time and energy.

:class:`Point` is the one type of a frontier point: the solver's
:meth:`perseus.solver.Frontier.point` returns it, and the wire's ``FrontierPoint`` and the
files' ``FilePoint`` render it (their fields are its fields, or some of them).

Imports nothing but the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Point"]


@dataclass(frozen=True, slots=True)
class Point:
    """One plan of the frontier.

    Attributes:
        time_s: Iteration time of the plan, replayed on the profile.
        energy_j: Energy of one iteration, replayed on the profile.
        gap: Relative gap of ``energy_j`` to a proven lower bound over the deadlines it serves.
        frequencies_mhz: ``frequencies_mhz[g][k]`` is the clock of ``schedule.order[g][k]``.
    """

    time_s: float
    energy_j: float
    gap: float
    frequencies_mhz: tuple[tuple[int, ...], ...]
