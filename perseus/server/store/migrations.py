"""Schema migrations for operators: bring a job database to this version, or ask where it is.

``perseus serve`` upgrades the database itself when it starts (:meth:`Store.create_schema`);
these are for operators who migrate by hand, before starting a new version on a database
that several planners share (``perseus db upgrade``, ``perseus db current``). The revisions
and how they run are in :mod:`perseus.server.store.alembic`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from alembic import command
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from perseus.core.errors import StoreError
from perseus.server.store import alembic as schema
from perseus.server.store.job_store import Store, metadata, normalize_database_url

__all__ = ["current_revision", "head_revision", "new_revision", "upgrade_database"]

_CONNECT_TIMEOUT_S = 10


def upgrade_database(url: str) -> str:
    """Bring the database at ``url`` to this version's schema (creating it when empty).

    A database made before migrations (no revision) is adopted first; running it again, or
    on a database already at head, changes nothing. One transaction: a failure leaves the
    database as it was.

    Args:
        url: SQLAlchemy URL: ``sqlite:///path.db`` or ``postgresql+psycopg://user:pw@host/db``.

    Returns:
        The revision reached (:func:`head_revision`).

    Raises:
        StoreError: the URL is not a database perseus can use, the database cannot be
            reached or written, or a newer perseus upgraded it.
    """
    with _opened(url, create=True) as store:
        return store.create_schema()


def current_revision(url: str) -> str | None:
    """The schema revision of the database at ``url``, changing nothing.

    Args:
        url: SQLAlchemy URL, as for :func:`upgrade_database`.

    Returns:
        The revision; None when the database has none: it is empty, or was made before
        migrations (``perseus serve`` or :func:`upgrade_database` adopts it).

    Raises:
        StoreError: the URL is not a database perseus can use, or the database cannot be
            reached (an SQLite file that does not exist included: nothing is created).
    """
    with _opened(url, create=False) as store:
        return store.schema_revision()


def head_revision() -> str:
    """The newest schema revision this version knows."""
    return schema.head()


def new_revision(message: str) -> str:
    """Write a new revision script (for developers): the difference between the tables in
    ``store.py`` and a scratch SQLite database at head, as Alembic's autogenerate sees it.

    Review the script: autogenerate misses some changes (renames, server defaults).

    Args:
        message: what the revision does, a few words (also the file name's slug).

    Returns:
        The new revision's id (the head's, plus one).
    """
    rev_id = f"{int(schema.head()) + 1:04d}"
    with tempfile.TemporaryDirectory() as scratch:
        engine = create_engine(f"sqlite:///{os.path.join(scratch, 'head.db')}")
        try:
            with engine.begin() as connection:
                schema.upgrade(connection)
                config = schema.config(connection)
                config.attributes["target_metadata"] = metadata
                command.revision(config, message, autogenerate=True, rev_id=rev_id)
        finally:
            engine.dispose()
    return rev_id


@contextmanager
def _opened(url: str, *, create: bool) -> Iterator[Store]:
    """A store on ``url``, its failures as :class:`StoreError` naming the database."""
    try:
        parsed = make_url(normalize_database_url(url))
    except ArgumentError:
        raise StoreError(
            f"{url!r} is not a database URL: write sqlite:///path/to/perseus.db or "
            "postgresql+psycopg://user:pw@host/db"
        ) from None
    shown = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(
            f"unsupported database {shown}: perseus stores jobs in SQLite or PostgreSQL"
        )
    if backend == "sqlite" and not create:
        path = parsed.database or ""
        if path not in ("", ":memory:") and not os.path.isfile(path):
            raise StoreError(f"no SQLite database at {os.path.abspath(path)}")
    if backend == "postgresql" and "connect_timeout" not in parsed.query:
        # An unreachable host fails in seconds, not after the system's TCP timeout.
        parsed = parsed.update_query_dict({"connect_timeout": str(_CONNECT_TIMEOUT_S)})
    try:
        store = Store(parsed.render_as_string(hide_password=False))
    except (ImportError, SQLAlchemyError) as exc:
        raise StoreError(f"cannot use {shown}: {_first_line(exc)}") from exc
    try:
        yield store
    except SQLAlchemyError as exc:
        reason = _first_line(getattr(exc, "orig", None) or exc)
        raise StoreError(f"cannot reach or write {shown}: {reason}") from exc
    finally:
        store.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
