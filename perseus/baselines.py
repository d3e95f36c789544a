"""How a run's baselines are named and which one savings are stated against.

One mapping for every place that shows baselines: the ``perseus plan`` table, ``frontier.json``,
the frontier plot and ``perseus job frontier``. The reference is ``default`` (every instruction
at the profile's highest clock: what a GPU left alone runs) when the run has it, else
``all_fastest`` (every instruction at its fastest measured clock).

Imports nothing but the standard library: the command line uses it before any solving.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, TypeVar

__all__ = [
    "BASELINE_LABELS",
    "BaselineLike",
    "baseline_label",
    "reference_key",
    "saving_text",
    "shown_baselines",
]

BASELINE_LABELS: Mapping[str, str] = {
    "default": "default (max clock)",
    "all_fastest": "all-fastest",
    "global_clock": "global clock",
    "per_stage_clock": "per-stage clock",
}
_REFERENCE_KEYS = ("default", "all_fastest")


class BaselineLike(Protocol):
    """What a baseline shows: its iteration time and energy."""

    @property
    def time_s(self) -> float: ...

    @property
    def energy_j(self) -> float: ...


B = TypeVar("B", bound=BaselineLike)


def baseline_label(key: str) -> str:
    """The label of baseline ``key`` (an unknown key reads as its words)."""
    return BASELINE_LABELS.get(key, key.replace("_", " "))


def reference_key(keys: Iterable[str]) -> str | None:
    """The baseline savings are stated against: ``default`` if present, else ``all_fastest``."""
    present = set(keys)
    return next((key for key in _REFERENCE_KEYS if key in present), None)


def shown_baselines(baselines: Mapping[str, B]) -> list[tuple[str, B]]:
    """Baselines in display order, reference first.

    ``all_fastest`` is left out when a ``default`` baseline with the same time and energy is
    there (the profile's highest clock is then every instruction's fastest): one row, not two.
    """
    ordered = [key for key in BASELINE_LABELS if key in baselines]
    ordered += sorted(key for key in baselines if key not in BASELINE_LABELS)
    default = baselines.get("default")
    fastest = baselines.get("all_fastest")
    if (
        default is not None
        and fastest is not None
        and _same(default.time_s, fastest.time_s)
        and _same(default.energy_j, fastest.energy_j)
    ):
        ordered.remove("all_fastest")
    return [(key, baselines[key]) for key in ordered]


def saving_text(energy_j: float, reference_j: float) -> str:
    """Saving against the reference, as the table prints it: ``11.81 %`` (negative: costs more)."""
    return f"{100.0 * (1.0 - energy_j / reference_j):.2f} %"


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 * max(abs(a), abs(b), 1.0)
