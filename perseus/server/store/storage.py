"""SQLite storage faults: found before they can hurt, answered with 503, cleared when gone.

SQLite in WAL mode maps the ``-shm`` file into memory. A connection opened while that file
(or its filesystem) is read-only maps it read-only, and SQLite's next write to the mapping
kills the process with SIGBUS: every later request then gets "connection refused". A
read-only ``-wal`` fails each write (500s), and a read-only main file lets writes pile up in
the WAL while checkpoints fail silently. The realistic trigger is a filesystem remounted
read-only after errors.

So the store asks :class:`StorageGuard` first: before SQLite opens a connection (none is
opened while the ``-shm`` or the directory is read-only: no mapping of a file it cannot
write is ever made; a read-only ``-wal`` or main file still lets connections read), and
before each write transaction (a few ``access()`` calls). A fault found there, or a write
failing with a storage error, marks the store faulted: writes answer 503 naming the file,
``/healthz`` says so, and a probe every second clears the fault once the files are
writable again (pooled connections are dropped then, so none opened meanwhile lingers).
Root ignores file modes but not a read-only filesystem (``access()`` says ``EROFS``),
which is what a remount gives.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from perseus.core.errors import StorageFault

__all__ = ["StorageFault", "StorageGuard", "StorageProblem", "storage_problem"]

_log = logging.getLogger("perseus.server")

_STORAGE_ERRORS = (
    "readonly",
    "read-only",
    "disk i/o error",
    "unable to open",
    "disk is full",
    "database or disk is full",
)
"""Words of SQLite's messages for the storage failing (not a busy or locked database)."""


@dataclass(frozen=True, slots=True)
class StorageProblem:
    """Why SQLite cannot write the database.

    Attributes:
        message: what is read-only, named.
        maps: whether a new connection would map a file it cannot write (the ``-shm``, or a
            directory where it cannot create one): then no connection may open at all.
    """

    message: str
    maps: bool


def _writable(path: str) -> bool:
    return os.access(path, os.W_OK)


def storage_problem(
    path: str, writable: Callable[[str], bool] = _writable
) -> StorageProblem | None:
    """What keeps SQLite from writing the database at ``path`` (None: nothing).

    Checks the directory (SQLite creates ``-wal`` and ``-shm`` there), then, where they
    exist, the ``-shm``, the main file and the ``-wal``. Complexity: four ``access()`` calls.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if not writable(directory):
        return StorageProblem(f"{directory} (the database's directory) is not writable", True)
    for name, maps in ((f"{path}-shm", True), (path, False), (f"{path}-wal", False)):
        if os.path.exists(name) and not writable(name):
            return StorageProblem(f"{name} is read-only (file mode or read-only filesystem)", maps)
    return None


def is_storage_error(err: BaseException) -> bool:
    """Whether a database error says the storage failed (not that the database is busy)."""
    text = str(err).lower()
    return any(word in text for word in _STORAGE_ERRORS)


class StorageGuard:
    """The fault state of one SQLite file's storage.

    Args:
        path: the database file.
        check: finds a problem with the files (tests inject one; default
            :func:`storage_problem`).
        on_recover: called once the fault clears (the store drops its pooled connections).
    """

    def __init__(
        self,
        path: str,
        check: Callable[[str], StorageProblem | None] = storage_problem,
        on_recover: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self._check = check
        self._on_recover = on_recover
        self._lock = threading.Lock()
        self.fault: str | None = None
        """Why the store cannot write now (None: it can)."""

    def require(self) -> None:
        """Raise :class:`StorageFault` if the storage cannot be written now (checked)."""
        problem = self._check(self.path)
        if problem is not None:
            self._set(problem.message)
            raise StorageFault(f"storage fault: {problem.message}")

    def require_connectable(self) -> None:
        """Raise :class:`StorageFault` if a new connection would map a file it cannot write
        (a read-only ``-wal`` or main file still lets it read)."""
        problem = self._check(self.path)
        if problem is not None:
            self._set(problem.message)
            if problem.maps:
                raise StorageFault(f"storage fault: {problem.message}")

    def failed(self, err: BaseException) -> StorageFault:
        """A write failed with ``err``, a storage error: the store is faulted."""
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        self._set(f"writing {self.path} failed: {detail}")
        return StorageFault(f"storage fault: {self.fault}")

    def probe(self) -> str | None:
        """Check the storage now: sets or clears the fault; returns it."""
        problem = self._check(self.path)
        if problem is not None:
            self._set(problem.message)
            return problem.message
        with self._lock:
            was, self.fault = self.fault, None
        if was is not None:
            _log.warning("storage writable again (was: %s)", was)
            if self._on_recover is not None:
                self._on_recover()
        return None

    def _set(self, problem: str) -> None:
        with self._lock:
            new = self.fault != problem
            self.fault = problem
        if new:
            _log.error("storage fault: %s; writes answer 503 until it clears", problem)
