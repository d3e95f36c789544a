"""Job store: SQLAlchemy 2 tables and typed transactions over SQLite or PostgreSQL.

The same code serves an embedded SQLite file (the default, nothing to install) and a
PostgreSQL server shared by several planner processes (``postgresql+psycopg://...``).
Callers never see SQL: a transaction hands out frozen row values and takes them back.
Statements are SQLAlchemy Core (no ORM session): a registration is a handful of short
statements, and the ORM's bookkeeping would cost more than they do.

Write transactions serialize per job: on PostgreSQL by ``SELECT ... FOR UPDATE`` of the
job row, on SQLite by ``BEGIN IMMEDIATE`` (SQLite has one writer at a time anyway). So a
read-check-write inside :meth:`Store.write` is atomic, which is what lets exactly one
process claim a job's planning.

What a transaction reads and writes is in :mod:`perseus.server.store.transaction`, the tables
and the row values in :mod:`perseus.server.store.tables`, the engines and
PostgreSQL's change notifications in :mod:`perseus.server.store.database`. The schema evolves by
Alembic revisions (:mod:`perseus.server.store.alembic`): :meth:`Store.create_schema` brings any
older database to this version's tables.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from perseus.server.store.alembic import VERSION_TABLE
from perseus.server.store.alembic import revision as schema_revision
from perseus.server.store.alembic import upgrade as upgrade_schema
from perseus.server.store.database import (
    CHANGES_CHANNEL,
    ChangeListener,
    normalize_database_url,
    sqlite_engine,
)
from perseus.server.store.storage import (
    StorageGuard,
    StorageProblem,
    is_storage_error,
    storage_problem,
)
from perseus.server.store.tables import (
    FrontierRow,
    IterationWindow,
    JobRow,
    ProfileRecord,
    RankRow,
    RankWindow,
    metadata,
)
from perseus.server.store.transaction import Transaction

__all__ = [
    "CHANGES_CHANNEL",
    "ChangeListener",
    "FrontierRow",
    "IterationWindow",
    "JobRow",
    "ProfileRecord",
    "RankRow",
    "RankWindow",
    "Store",
    "Transaction",
    "metadata",
    "normalize_database_url",
]

# An arbitrary constant: the advisory lock that serializes schema upgrades on PostgreSQL.
_SCHEMA_LOCK_KEY = 7787_0001


# ----------------------------------------------------------------------------- the store


class Store:
    """The job store.

    Args:
        url: SQLAlchemy URL: ``sqlite:///path.db`` or ``postgresql+psycopg://user:pw@host/db``.
        storage_check: for an SQLite file, what finds a storage fault (tests inject one;
            default :func:`~perseus.server.store.storage.storage_problem`).
    """

    def __init__(
        self, url: str, *, storage_check: Callable[[str], StorageProblem | None] = storage_problem
    ) -> None:
        self.url = normalize_database_url(url)
        parsed = make_url(self.url)
        self.backend = parsed.get_backend_name()
        self._write_lock: AbstractContextManager[Any]
        self.guard: StorageGuard | None = None
        """The SQLite file's storage faults (None: in memory, or PostgreSQL)."""
        if self.backend == "sqlite":
            in_memory = parsed.database in (None, "", ":memory:")
            # Reads take no lock; writes take SQLite's one write lock up front, so that a
            # read-check-write never fails half way with "database is locked".
            self._write_engine = sqlite_engine(self.url, "BEGIN IMMEDIATE", in_memory=in_memory)
            self._read_engine = (
                self._write_engine
                if in_memory
                else sqlite_engine(self.url, "BEGIN", in_memory=False)
            )
            # Threads of one process queue here for SQLite's single write lock rather than
            # in SQLite's busy handler, which sleeps in growing steps (long tail latencies).
            self._write_lock = threading.Lock()
            if not in_memory and parsed.database:
                self.guard = StorageGuard(
                    parsed.database, storage_check, on_recover=self._drop_connections
                )
                guard = self.guard
                for engine in {self._write_engine, self._read_engine}:
                    # Before SQLite opens (and maps) anything: never a read-only -shm.
                    event.listen(engine, "do_connect", lambda *_: guard.require_connectable())
        else:
            engine = create_engine(self.url, pool_size=5, max_overflow=10, pool_pre_ping=True)
            self._write_engine = self._read_engine = engine
            self._write_lock = nullcontext()

    def create_schema(self) -> str:
        """Create the tables, or upgrade them to this version's schema (Alembic revisions,
        see :mod:`perseus.server.store.alembic`), in one transaction; safe when several processes
        start at once.

        Returns:
            The schema revision reached (the newest this version knows).

        Raises:
            StoreError: the database was upgraded by a newer perseus, or is not perseus's.
            sqlalchemy.exc.SQLAlchemyError: the database cannot be reached or written.
        """
        with self._write_lock, self._write_engine.begin() as connection:
            if self.backend == "postgresql":
                # SQLite's BEGIN IMMEDIATE already admits one writer at a time.
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK_KEY}
                )
            return upgrade_schema(connection)

    def schema_revision(self) -> str | None:
        """The database's schema revision; None when it has none (empty, or made before
        migrations)."""
        with self._read_engine.begin() as connection:
            return schema_revision(connection)

    def drop_schema(self) -> None:
        """Drop every table and the schema revision (tests only)."""
        with self._write_engine.begin() as connection:
            metadata.drop_all(connection)
            connection.execute(text(f"DROP TABLE IF EXISTS {VERSION_TABLE}"))

    @contextmanager
    def read(self) -> Iterator[Transaction]:
        """A read-only transaction."""
        with self._read_engine.begin() as connection:
            yield Transaction(connection, locking=False)

    @contextmanager
    def write(self) -> Iterator[Transaction]:
        """A write transaction; :meth:`Transaction.job` locks the job row.

        Raises:
            StorageFault: the SQLite file's storage cannot be written (checked first; or
                the write failed with a storage error).
        """
        guard = self.guard
        if guard is None:
            with self._write_lock, self._write_engine.begin() as connection:
                yield Transaction(connection, locking=True, notify=self.backend == "postgresql")
            return
        guard.require()
        try:
            with self._write_lock, self._write_engine.begin() as connection:
                yield Transaction(connection, locking=True)
        except OperationalError as err:
            if not is_storage_error(err):
                raise
            raise guard.failed(err) from err

    @property
    def fault(self) -> str | None:
        """Why the store cannot write now (None: it can, or it cannot tell)."""
        return None if self.guard is None else self.guard.fault

    def probe_storage(self) -> str | None:
        """Check the storage now (sets or clears :attr:`fault`); returns the fault."""
        return None if self.guard is None else self.guard.probe()

    def _drop_connections(self) -> None:
        # Connections opened while the storage was faulty may hold read-only handles.
        self._write_engine.dispose()
        if self._read_engine is not self._write_engine:
            self._read_engine.dispose()

    def listen(self, callback: Callable[[str, int, str], None]) -> ChangeListener | None:
        """Call ``callback(job_id, version, state)`` in a thread on every job's plan change
        made by any process (PostgreSQL's LISTEN); None where the database cannot notify.
        """
        if self.backend != "postgresql":
            return None
        listener = ChangeListener(self.url, callback)
        listener.start()
        return listener

    def close(self) -> None:
        self._write_engine.dispose()
        if self._read_engine is not self._write_engine:
            self._read_engine.dispose()
