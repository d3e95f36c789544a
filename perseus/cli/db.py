"""``perseus db upgrade`` and ``perseus db current``: the planner database's schema by hand.

``perseus serve`` upgrades the database when it starts; these are for operators who migrate
before a rollout, or check where a database stands. The database defaults to the one
``perseus serve`` uses (``$PERSEUS_DATABASE``, else ``sqlite:///./perseus.db``). The
migrations (:mod:`perseus.server.store.migrations`, the server extra) are imported when a command
runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from perseus.cli.arguments import Parser, UsageError, needs

__all__ = ["build_parser", "database_url", "run", "run_db"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``perseus db`` and its subcommands."""
    parser = Parser(
        prog="perseus db",
        description="Upgrade or inspect the planner server's database schema, for operators "
        "who migrate by hand (perseus serve upgrades the database when it starts).",
    )
    database = Parser(add_help=False)
    database.add_argument(
        "--database",
        metavar="URL",
        help="sqlite:///file.db or postgresql+psycopg://user:pw@host/db (default: as perseus "
        "serve, $PERSEUS_DATABASE, else sqlite:///./perseus.db)",
    )
    commands = parser.add_subparsers(
        title="commands", metavar="COMMAND", parser_class=Parser, required=True
    )
    upgrade = commands.add_parser(
        "upgrade",
        parents=[database],
        help="migrate the database to the newest schema",
        description="Migrate the database to the newest schema (creating it if it is empty) "
        "and print the revision it reached.",
    )
    upgrade.set_defaults(db_command="upgrade")
    current = commands.add_parser(
        "current",
        parents=[database],
        help="print the database's schema revision",
        description="Print the database's schema revision, or 'none' for an empty database "
        "or one made before migrations (which perseus db upgrade adopts). Creates nothing.",
    )
    current.set_defaults(db_command="current")
    return parser


def run(argv: list[str]) -> int:
    """Run ``perseus db`` with ``argv`` (the arguments after ``db``); returns 0.

    Raises:
        UsageError: A bad command line or setting, or the server extra is not installed.
        PerseusError: The database cannot be reached or migrated.
    """
    args = build_parser().parse_args(argv)
    with needs(f"db {argv[0]}", "server", "the planner server"):
        return run_db(args)


def run_db(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Upgrade the database or print its revision, as ``args.db_command`` says.

    Returns:
        0.

    Raises:
        UsageError: An invalid ``PERSEUS_*`` setting.
        PerseusError: The database cannot be reached or migrated.
    """
    stream = sys.stdout if out is None else out
    url = database_url(args.database)
    from perseus.server.store.migrations import current_revision, upgrade_database

    if args.db_command == "upgrade":
        stream.write(f"database at revision {upgrade_database(url)}\n")
    else:
        stream.write(f"{current_revision(url) or 'none'}\n")
    return 0


def database_url(given: str | None) -> str:
    """``given``, else the database ``perseus serve`` would use: ``$PERSEUS_DATABASE``, else
    the default.

    Raises:
        UsageError: ``PERSEUS_*`` variables that ``perseus serve`` would refuse.
    """
    from pydantic import ValidationError

    from perseus.server.settings import Settings

    try:
        settings = Settings() if given is None else Settings(database=given)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in err.errors()
        )
        raise UsageError(f"invalid settings: {problems}") from None
    return settings.database
