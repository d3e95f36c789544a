"""Argument types for the ``perseus`` command line, shared by its subcommands.

argparse turns :class:`argparse.ArgumentTypeError` into ``argument --x: message``. Importing
this module costs only the standard library (``perseus --help`` uses it); the solver is loaded
when a policy is parsed.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from perseus.errors import PolicyError

if TYPE_CHECKING:
    from perseus.solver.policies import Policy

__all__ = ["finite_number", "integer_at_least", "policy"]


def integer_at_least(minimum: int) -> Callable[[str], int]:
    """A whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


def finite_number(
    minimum: float, *, inclusive: bool, maximum: float = math.inf
) -> Callable[[str], float]:
    """A finite number above ``minimum`` (or equal to it when ``inclusive``), at most
    ``maximum``."""
    bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
    if maximum < math.inf:
        bound += f" and <= {maximum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text!r}") from None
        if (
            not math.isfinite(value)
            or value < minimum
            or (value == minimum and not inclusive)
            or value > maximum
        ):
            raise argparse.ArgumentTypeError(f"expected a finite number {bound}, got {text!r}")
        return value

    return parse


def policy(text: str) -> Policy:
    """A policy such as ``no-slowdown`` or ``max-slowdown:1.05``."""
    from perseus.solver.policies import Policy

    try:
        return Policy.parse(text)
    except PolicyError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
