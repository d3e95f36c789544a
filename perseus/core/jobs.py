"""A job's lifecycle on the planner: its states and the one table of moves between them.

::

    registering -> profiling, planning
    profiling   -> planning
    planning    -> ready, failed, planning
    ready       -> planning
    failed      -> planning, ready

A job is created ``registering``; once every rank registered it is ``profiling``; the last
missing profile (or a request, once every stage has one) starts ``planning``; planning ends
``ready`` (a plan) or ``failed`` (a reason). A ``planning`` job moves to ``planning`` again
when another server takes over its stale lease. ``ready`` and ``failed`` are not final: a
failed job replans on a corrected profile or becomes ready with a feasible policy, and a ready
one replans once every rank re-reported (a re-run of the training). No state leads back to
``registering``.

Every change of a job's state goes through :func:`transition`, and the store refuses to
write one that the table does not hold. Standard library only: the rank and the ``perseus``
command read these states too.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from perseus.core.errors import JobStateError

__all__ = ["CREATED", "TRANSITIONS", "JobState", "transition"]


class JobState(StrEnum):
    """Where a job stands; its value is what the API and the database say."""

    REGISTERING = "registering"
    PROFILING = "profiling"
    PLANNING = "planning"
    READY = "ready"
    FAILED = "failed"


CREATED = JobState.REGISTERING
"""The state every job is created in."""

TRANSITIONS: Mapping[JobState, frozenset[JobState]] = MappingProxyType(
    {
        JobState.REGISTERING: frozenset({JobState.PROFILING, JobState.PLANNING}),
        JobState.PROFILING: frozenset({JobState.PLANNING}),
        JobState.PLANNING: frozenset({JobState.PLANNING, JobState.READY, JobState.FAILED}),
        JobState.READY: frozenset({JobState.PLANNING}),
        JobState.FAILED: frozenset({JobState.PLANNING, JobState.READY}),
    }
)
"""The states a job in each state may move to; every other move is refused.

``registering -> planning``: planning on request (``perseus job plan``) once every stage has
a profile, before every data-parallel replica registered. ``planning -> planning``: another
server takes over a lease whose heartbeat went stale."""


def transition(current: str, to: JobState) -> JobState:
    """``to``, if a job in state ``current`` may move there (:data:`TRANSITIONS`).

    Args:
        current: the job's state now (its stored value).
        to: the state it moves to.

    Returns:
        ``to``.

    Raises:
        JobStateError: the table holds no such move (or ``current`` is no state); the message
            names both.
    """
    try:
        allowed = TRANSITIONS[JobState(current)]
    except ValueError:
        raise JobStateError(f"a job cannot move from {current!r}, not a job state") from None
    if to not in allowed:
        raise JobStateError(f"a job cannot move from {current} to {to}")
    return to
