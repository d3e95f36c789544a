"""Policies that pick one point of a frontier: :func:`choose_point` applies a
:class:`~perseus.core.policies.Policy` (the rule as a value, on the ground floor)."""

from __future__ import annotations

import numpy as np

from perseus.core.errors import InfeasibleDeadline
from perseus.core.policies import POLICY_KINDS, Policy
from perseus.solver.frontier import Frontier

__all__ = ["POLICY_KINDS", "Policy", "choose_point", "straggler_point"]


def choose_point(frontier: Frontier, policy: Policy) -> int:
    """Index of the frontier point ``policy`` picks.

    Raises:
        InfeasibleDeadline: A deadline shorter than the fastest point.
    """
    times = frontier.times_s
    reference = frontier.reference_time_s
    if policy.kind == "no-slowdown":
        return _latest_within(frontier, reference)
    if policy.kind == "min-energy":
        return len(frontier) - 1
    if policy.kind == "zeus-cost":
        eta = float(policy.value or 0.0)
        power = float(frontier.energies_j[0] / times[0])
        cost = eta * frontier.energies_j + (1 - eta) * power * times
        return int(np.argmin(cost))
    value = float(policy.value or 0.0)  # present: Policy checks it on construction
    limit = value * reference if policy.kind == "max-slowdown" else value
    return _latest_within(frontier, limit)


def straggler_point(frontier: Frontier, iteration_time_s: float) -> int:
    """Least-energy point when iterations take ``iteration_time_s`` anyway (a straggler).

    Raises:
        InfeasibleDeadline: ``iteration_time_s`` is shorter than the fastest point.
    """
    return _latest_within(frontier, iteration_time_s)


def _latest_within(frontier: Frontier, limit_s: float) -> int:
    index = int(np.searchsorted(frontier.times_s, limit_s * (1 + 1e-12), side="right")) - 1
    if index < 0:
        raise InfeasibleDeadline(
            f"no plan finishes within {limit_s:.6f} s; the fastest takes "
            f"{float(frontier.times_s[0]):.6f} s"
        )
    return index
