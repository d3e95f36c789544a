"""Policies: the rules that pick one point of a frontier, by name (``max-slowdown:1.05``).

:class:`Policy` is the rule as a value, parsed and checked; :func:`perseus.solver.choose_point`
applies it to a frontier. Imports nothing but the standard library: the command line parses
``--policy`` (and ``perseus job policy``) without loading the solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perseus.core.errors import PolicyError

__all__ = ["POLICY_KINDS", "Policy"]

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
      :attr:`perseus.solver.Frontier.reference_time_s`).
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
