"""Database engines for the store (SQLite, PostgreSQL) and PostgreSQL's change notifications."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

__all__ = ["CHANGES_CHANNEL", "ChangeListener", "normalize_database_url", "sqlite_engine"]

CHANGES_CHANNEL = "perseus_job_changes"
"""PostgreSQL notification channel: ``"<job id> <version> <state>"`` on each plan change."""

_log = logging.getLogger("perseus.server")


def normalize_database_url(url: str) -> str:
    """Use psycopg 3 for bare ``postgresql://`` URLs (SQLAlchemy would pick psycopg2)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


def sqlite_engine(url: str, begin: str, *, in_memory: bool) -> Engine:
    if in_memory:
        engine = create_engine(url, connect_args={"check_same_thread": False}, poolclass=StaticPool)
    else:
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30.0},
            pool_size=8,
            max_overflow=16,
        )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, decide where transactions begin (see _on_begin).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not in_memory:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql(begin)

    return engine


class ChangeListener:
    """A thread that LISTENs on :data:`CHANGES_CHANNEL`, reconnecting after errors.

    Args:
        url: the store's SQLAlchemy URL (PostgreSQL).
        callback: called in the thread with ``(job_id, version, state)``.
    """

    def __init__(self, url: str, callback: Callable[[str, int, str], None]) -> None:
        self._conninfo = (
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        self._callback = callback
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perseus listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANGES_CHANNEL}")
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            job_id, version, state = note.payload.split(" ")
                            self._callback(job_id, int(version), state)
            except Exception:
                # Waits fall back to polling meanwhile (JobHeads); reconnect shortly.
                _log.warning("listening for job changes failed; retrying", exc_info=True)
                self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
