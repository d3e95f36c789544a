"""How a run's baselines are named and which one savings are stated against.

One mapping for every place that shows baselines: the ``perseus plan`` table, ``frontier.json``,
the frontier plot and ``perseus job frontier``. The reference is ``default`` (every instruction
at the profile's highest clock: what a GPU left alone runs) when the run has it, else
``all_fastest`` (every instruction at its fastest measured clock).

:class:`Baseline` is a baseline's one type (the wire's and the files' models render it);
:class:`BaselineKey` names the baselines everywhere: the solver's ``Frontier.baselines``, the
wire's ``FrontierView.baselines``, ``frontier.json``. It is a string enum, so the keys compare
equal to, hash like and serialise as the plain strings they were.

Imports nothing but the standard library: the command line uses it before any solving.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar

__all__ = [
    "BASELINE_LABELS",
    "Baseline",
    "BaselineKey",
    "BaselineLike",
    "baseline_label",
    "reference_key",
    "saving_text",
    "shown_baselines",
]


class BaselineKey(StrEnum):
    """The baselines a frontier is compared with."""

    # See perseus.solver.baselines_at; the docstring is the OpenAPI document's description.

    DEFAULT = "default"
    """Every instruction at the profile's highest clock: the reference of savings."""
    ALL_FASTEST = "all_fastest"
    """Every instruction at its fastest measured clock."""
    GLOBAL_CLOCK = "global_clock"
    """One clock for every GPU, the least-energy one at no slowdown."""
    PER_STAGE_CLOCK = "per_stage_clock"
    """One clock per stage, by coordinate descent at no slowdown."""


@dataclass(frozen=True, slots=True)
class Baseline:
    """A reference plan that today's tools can reach (found by
    :func:`perseus.solver.baselines_at`).

    Attributes:
        time_s: Iteration time of the plan, replayed on the profile.
        energy_j: Energy of one iteration, replayed on the profile.
        frequencies_mhz: ``frequencies_mhz[g][k]`` is the clock of GPU ``g``'s ``k``-th
            instruction.
    """

    time_s: float
    energy_j: float
    frequencies_mhz: tuple[tuple[int, ...], ...]


BASELINE_LABELS: Mapping[str, str] = {
    BaselineKey.DEFAULT: "default (max clock)",
    BaselineKey.ALL_FASTEST: "all-fastest",
    BaselineKey.GLOBAL_CLOCK: "global clock",
    BaselineKey.PER_STAGE_CLOCK: "per-stage clock",
}
_REFERENCE_KEYS = (BaselineKey.DEFAULT, BaselineKey.ALL_FASTEST)


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
    default = baselines.get(BaselineKey.DEFAULT)
    fastest = baselines.get(BaselineKey.ALL_FASTEST)
    if (
        default is not None
        and fastest is not None
        and _same(default.time_s, fastest.time_s)
        and _same(default.energy_j, fastest.energy_j)
    ):
        ordered.remove(BaselineKey.ALL_FASTEST)
    return [(key, baselines[key]) for key in ordered]


def saving_text(energy_j: float, reference_j: float) -> str:
    """Saving against the reference, as the table prints it: ``11.81 %`` (negative: costs more)."""
    return f"{100.0 * (1.0 - energy_j / reference_j):.2f} %"


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 * max(abs(a), abs(b), 1.0)
