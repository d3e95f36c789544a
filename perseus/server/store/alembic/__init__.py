"""The job store's schema history as Alembic revisions, and how a connection is brought to head.

``versions/`` holds one script per schema change, ``env.py`` runs them on the connection it
is handed (nothing here reads an ``alembic.ini``). :func:`upgrade` is what
:meth:`perseus.server.store.job_store.Store.create_schema` calls inside its locked transaction, so
an
upgrade commits whole or not at all (PostgreSQL and SQLite both have transactional DDL).

A database made before migrations existed has the store's tables and no version table. It
is adopted: the columns that ``_add_missing_columns`` used to add are added, the database
is stamped at :data:`BASELINE` (the schema of that time, revision ``0001``), then upgraded.

A new revision: change the tables in ``store.py``, then
``python -c "from perseus.server.store.migrations import new_revision; new_revision('what')"``
writes ``versions/<id>_<what>.py`` from the difference; review it (SQLite alters tables in
batch mode) and add a test in ``tests/server/test_migrations.py``.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Connection, String, inspect

from perseus.core.errors import StoreError

__all__ = ["BASELINE", "VERSION_TABLE", "config", "head", "revision", "upgrade"]

SCRIPTS = Path(__file__).parent
"""Alembic's script location: this folder, inside the installed package."""

VERSION_TABLE = "perseus_alembic_version"
"""Where the revision is kept: named for perseus, as its tables are, since a PostgreSQL
database shared with another Alembic user would otherwise share ``alembic_version``."""

BASELINE = "0001"
"""The first revision: the schema as perseus made it before migrations."""

_BASELINE_TABLES = frozenset(
    {"perseus_jobs", "perseus_frontiers", "perseus_ranks", "perseus_profiles"}
)

# Nullable columns that releases before migrations added to tables made by older releases
# (the store's _add_missing_columns): a database they made may lack them.
_ADDED_BEFORE_MIGRATIONS = (("perseus_ranks", "host", 255),)


def config(connection: Connection | None = None) -> Config:
    """Alembic's configuration for these scripts, no ini file; ``env.py`` runs on
    ``connection`` (in its transaction) when one is given."""
    result = Config()
    result.set_main_option("script_location", str(SCRIPTS))
    result.set_main_option("file_template", "r%%(rev)s_%%(slug)s")  # an importable name
    if connection is not None:
        result.attributes["connection"] = connection
    return result


def head() -> str:
    """The newest revision these scripts know."""
    found = ScriptDirectory.from_config(config()).get_current_head()
    if found is None:  # pragma: no cover - the package ships at least the baseline
        raise StoreError(f"no schema revisions in {SCRIPTS}")
    return found


def revision(connection: Connection) -> str | None:
    """The revision the database on ``connection`` is at; None when it has no version table
    (empty, or made before migrations)."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def upgrade(connection: Connection) -> str:
    """Bring the database on ``connection`` to :func:`head`, inside the caller's transaction.

    Returns:
        The revision reached (head).

    Raises:
        StoreError: the database is at a revision these scripts do not know (a newer perseus
            upgraded it), or holds some of the store's tables but not all and no version.
    """
    tables = set(inspect(connection).get_table_names())
    if VERSION_TABLE not in tables and tables & _BASELINE_TABLES:
        _adopt(connection, tables)
    known = revision(connection)
    scripts = ScriptDirectory.from_config(config())
    if known is not None and known not in {s.revision for s in scripts.walk_revisions()}:
        raise StoreError(
            f"the database is at schema revision {known}, which this perseus does not know "
            f"(its newest is {head()}): a newer perseus upgraded it; run that version"
        )
    command.upgrade(config(connection), "head")
    reached = revision(connection)
    if reached is None:  # pragma: no cover - upgrade writes the version
        raise StoreError("the schema upgrade wrote no revision")
    return reached


def _adopt(connection: Connection, tables: set[str]) -> None:
    """Stamp a database made before migrations at :data:`BASELINE`, first adding the columns
    its release may have lacked."""
    missing = sorted(_BASELINE_TABLES - tables)
    if missing:
        raise StoreError(
            f"the database has some of perseus's tables but not {', '.join(missing)}, and no "
            f"{VERSION_TABLE}: it was not made by perseus, or only in part; use an empty one"
        )
    operations = Operations(MigrationContext.configure(connection))
    inspector = inspect(connection)
    for table, name, length in _ADDED_BEFORE_MIGRATIONS:
        if name not in {column["name"] for column in inspector.get_columns(table)}:
            operations.add_column(table, Column(name, String(length)))
    command.stamp(config(connection), BASELINE)
