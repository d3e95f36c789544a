"""``perseus serve``: run the planner server (:mod:`perseus.server.startup` starts it).

Flags override ``PERSEUS_*`` variables, which override the defaults
(:class:`perseus.server.settings.Settings`). Every start-up problem is one line on stderr and
exit status 2; without the server extra, one line says which extra to install (``perseus serve
--help`` works on a bare install). ``python -m perseus.server`` is the same command.
"""

from __future__ import annotations

import argparse

from perseus.cli.arguments import Parser, needs
from perseus.server.startup import (
    StartupError,
    add_serve_arguments,
    bind_socket,
    check_database,
    run_serve,
    serve_parser,
    serve_settings,
)

__all__ = [
    "StartupError",
    "add_serve_arguments",
    "bind_socket",
    "build_parser",
    "check_database",
    "run",
    "run_serve",
    "serve_settings",
]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``perseus serve``."""
    return serve_parser(Parser)


def run(argv: list[str]) -> int:
    """Run ``perseus serve`` with ``argv`` (the arguments after ``serve``) until interrupted.

    Returns:
        The exit status of :func:`~perseus.server.startup.run_serve`.

    Raises:
        UsageError: A bad command line, or the server extra is not installed.
    """
    args = build_parser().parse_args(argv)
    with needs("serve", "server", "the planner server"):
        return run_serve(args)
