"""Parsing the ``perseus`` command line: the parser, argument types, one-line errors.

argparse turns :class:`argparse.ArgumentTypeError` into ``argument --x: message``, and
:class:`Parser` turns that into a :class:`UsageError`, which :func:`perseus.cli.main` prints
as one ``perseus: error:`` line. Importing this module costs only the standard library
(``perseus --help`` uses it); the solver is loaded when a policy is parsed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NoReturn

from perseus.core.errors import PolicyError, UsageError

if TYPE_CHECKING:
    from perseus.core.policies import Policy

__all__ = [
    "DISTRIBUTION",
    "Parser",
    "UsageError",
    "asks_help",
    "finite_number",
    "index",
    "install_hint",
    "integer_at_least",
    "needs",
    "nonnegative_float",
    "policy",
    "positive_float",
    "positive_int",
]

DISTRIBUTION = "perseus-planner"


class Parser(argparse.ArgumentParser):
    """An argument parser that reports errors in one line instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog.removeprefix('perseus').strip() or 'perseus'}: {message}")


def asks_help(argv: Sequence[str]) -> bool:
    """Does ``argv`` ask for ``--help`` (before any ``--``)?"""
    return any(
        arg in ("-h", "--help") for arg in argv[: argv.index("--") if "--" in argv else None]
    )


def install_hint(extra: str) -> str:
    """How to install an extra, from the package index and from a checkout."""
    return f"pip install '{DISTRIBUTION}[{extra}]' (from a checkout: pip install '.[{extra}]')"


@contextlib.contextmanager
def needs(command: str, extra: str, what: str) -> Iterator[None]:
    """Turn a missing optional dependency, met while ``command`` runs, into a one-line error
    that says which extra to install (its ``--help`` works without it).

    Raises:
        UsageError: A module outside perseus was not found.
    """
    try:
        yield
    except ModuleNotFoundError as err:
        if err.name is None or err.name.split(".")[0] == "perseus":
            raise
        raise UsageError(
            f"{command}: {what} is not installed ({err}); " + install_hint(extra)
        ) from err


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


positive_int = integer_at_least(1)
index = integer_at_least(0)
positive_float = finite_number(0, inclusive=False)
nonnegative_float = finite_number(0, inclusive=True)


def policy(text: str) -> Policy:
    """A policy such as ``no-slowdown`` or ``max-slowdown:1.05``."""
    from perseus.core.policies import Policy

    try:
        return Policy.parse(text)
    except PolicyError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
