"""The ``perseus`` command: plan, simulate, demo, serve, db, job, profile, reset-clocks, cluster.

Each command is a module of this package (``reset-clocks`` is :mod:`perseus.cli.reset_clocks`)
with ``build_parser()`` and ``run(argv)``; :func:`main` only picks the module and turns errors
into one line. Shared: :mod:`~perseus.cli.arguments` (the parser, argument types),
:mod:`~perseus.cli.outputs` (files written whole or not at all), :mod:`~perseus.cli.tables`,
:mod:`~perseus.cli.progress`.

Every command computes everything first and writes its files last, each through a temporary
file renamed into place, so a bad input leaves nothing behind. Errors print one line,
``perseus: error: ...`` naming the file, row or field, and exit with status 2.

Importing this package costs only the standard library: a command's module is imported when it
runs and imports what it needs (the solver, the server, the client) then, so ``perseus --help``
answers at once and ``perseus plan`` shows its progress before the solver has loaded.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol, cast

from perseus import __version__
from perseus.cli.arguments import DISTRIBUTION, Parser, UsageError, needs
from perseus.core.errors import PerseusError

__all__ = ["COMMANDS", "PLANNER_COMMANDS", "command_parser", "main"]

EXIT_ERROR = 2

COMMANDS = {
    "plan": "compute the time-energy frontier of a profile and pick a plan",
    "simulate": "replay a plan on a profile: time, energy, per-stage busy and idle",
    "demo": "plan the shipped example profile and draw the plots (no GPU needed)",
    "serve": f"run the planner server (needs {DISTRIBUTION}[server])",
    "db": f"upgrade or inspect the planner server's database (needs {DISTRIBUTION}[server])",
    "job": "create, inspect and steer jobs on a planner server",
    "profile": "profile this machine's GPU without a server",
    "reset-clocks": "restore default SM clocks, e.g. after a training process was killed",
    "cluster": "a power budget for the whole cluster: simulate it offline on saved jobs",
}
"""Each command and its one-line help; its module is ``perseus.cli.<name with _ for ->``."""

PLANNER_COMMANDS = frozenset({"plan", "simulate", "demo"})
"""Commands that run the solver: on an install without the ``planner`` extra (a training
node's ``[client]``) they say which extra to install, in one line."""


class _Command(Protocol):
    """What every command module defines."""

    def build_parser(self) -> argparse.ArgumentParser: ...

    def run(self, argv: list[str]) -> int: ...


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``perseus`` command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status: 0 on success, 2 on bad input (after one ``perseus: error:`` line).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in COMMANDS:
            with _extra_of(args[0]):
                return _command(args[0]).run(args[1:])
        _top_parser().parse_args(args)  # --help, --version, or a one-line usage error
        *others, last = COMMANDS
        raise UsageError(
            f"a command is required: {', '.join(others)} or {last} (see perseus --help)"
        )
    except (UsageError, PerseusError) as err:
        print(f"perseus: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader went away (`perseus ... | head`): stop quietly, as other tools do. Point
        # stdout at devnull so the interpreter's final flush does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def command_parser(name: str) -> argparse.ArgumentParser:
    """The full argument parser of command ``name``, e.g. to check a command line.

    Imports the command's module, never an optional extra: every ``--help`` works on a bare
    install, and running a command without its extra says which to install.

    Raises:
        UsageError: Unknown command.
    """
    if name not in COMMANDS:
        raise UsageError(f"unknown command {name!r}; see perseus --help")
    return _command(name).build_parser()


def _extra_of(name: str) -> AbstractContextManager[None]:
    if name in PLANNER_COMMANDS:
        return needs(name, "planner", "the planner")
    return nullcontext()


def _command(name: str) -> _Command:
    return cast(_Command, importlib.import_module(f"perseus.cli.{name.replace('-', '_')}"))


def _top_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="perseus",
        description="Plan per-instruction GPU clocks for pipeline-parallel training.",
        epilog="'perseus COMMAND --help' describes each command.",
    )
    parser.add_argument("--version", action="version", version=f"perseus {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    for name, text in COMMANDS.items():
        commands.add_parser(name, help=text, add_help=False)
    return parser
