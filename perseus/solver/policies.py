"""Policies that pick one point of a frontier."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from perseus.core.errors import InfeasibleDeadline, PolicyError
from perseus.solver.frontier import Frontier

__all__ = ["POLICY_KINDS", "Policy", "choose_point", "straggler_point"]

POLICY_KINDS = ("no-slowdown", "max-slowdown", "deadline", "min-energy", "zeus-cost")
_NEEDS_VALUE = {
    "max-slowdown": "FACTOR >= 1",
    "deadline": "SECONDS > 0",
    "zeus-cost": "ETA in [0, 1]",
}


@dataclass(frozen=True, slots=True)
class Policy:
    """A rule that picks a frontier point.

    - ``no-slowdown``: least energy within the default plan's iteration time (every
      instruction at the highest clock, what a GPU left alone runs; see
      :attr:`Frontier.reference_time_s`).
    - ``max-slowdown`` FACTOR: least energy within FACTOR times the default plan's time.
    - ``deadline`` SECONDS: least energy within an absolute iteration time.
    - ``min-energy``: the minimum-energy plan.
    - ``zeus-cost`` ETA: least ``ETA * E + (1 - ETA) * P_max * T`` (Zeus's cost), where
      ``P_max`` is the whole pipeline's average power in the fastest plan (``E_0 / T_0``), the
      most it draws on this profile.
    """

    kind: str
    value: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise PolicyError(
                f"unknown policy {self.kind!r}; expected one of {', '.join(POLICY_KINDS)}"
            )
        if self.kind in _NEEDS_VALUE:
            value = self.value
            need = _NEEDS_VALUE[self.kind]
            if value is None or isinstance(value, bool) or not math.isfinite(value):
                raise PolicyError(f"policy {self.kind} needs a value: {self.kind}:{need}")
            if (
                (self.kind == "max-slowdown" and value < 1)
                or (self.kind == "deadline" and value <= 0)
                or (self.kind == "zeus-cost" and not 0 <= value <= 1)
            ):
                raise PolicyError(f"policy {self.kind}: expected {need}, got {value}")
        elif self.value is not None:
            raise PolicyError(f"policy {self.kind} takes no value")

    @classmethod
    def parse(cls, text: str) -> Policy:
        """Parse ``kind`` or ``kind:value`` (e.g. ``max-slowdown:1.1``).

        Raises:
            PolicyError: Unknown kind or a bad value.
        """
        kind, sep, raw = text.strip().partition(":")
        if not sep:
            return cls(kind)
        try:
            value = float(raw)
        except ValueError:
            raise PolicyError(f"policy {kind}: {raw!r} is not a number") from None
        return cls(kind, value)

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}:{self.value!r}"


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
