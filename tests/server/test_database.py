"""Engines and URLs (perseus.server.store.database). (PostgreSQL's change notifications are tested
across two server processes in test_versions.)"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from perseus.server.store.database import normalize_database_url, sqlite_engine


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p@h/db", "postgresql+psycopg://u:p@h/db"),
        ("postgres://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql://u:p%40ss@h/db", "postgresql+psycopg://u:p%40ss@h/db"),  # not hidden
        ("postgresql+psycopg://u:p@h:5/db", "postgresql+psycopg://u:p@h:5/db"),
        ("sqlite:///x.db", "sqlite:///x.db"),
    ],
)
def test_database_urls_use_psycopg3(url: str, expected: str) -> None:
    assert normalize_database_url(url) == expected


def test_a_sqlite_file_is_written_ahead_and_waits_for_a_busy_writer(tmp_path: Path) -> None:
    engine = sqlite_engine(f"sqlite:///{tmp_path / 'a.db'}", "BEGIN", in_memory=False)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30000
    engine.dispose()


@pytest.mark.parametrize(("begin", "locks"), [("BEGIN IMMEDIATE", True), ("BEGIN", False)])
def test_transactions_begin_with_the_given_statement(
    tmp_path: Path, begin: str, locks: bool
) -> None:
    path = tmp_path / "a.db"
    engine = sqlite_engine(f"sqlite:///{path}", begin, in_memory=False)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with engine.begin() as conn:
        conn.execute(text("SELECT 1"))  # the transaction has begun; nothing written yet
        try:
            other.execute("INSERT INTO t VALUES (1)")
            locked = False
        except sqlite3.OperationalError as exc:
            assert "locked" in str(exc)
            locked = True
    other.close()
    engine.dispose()
    assert locked is locks


def test_an_in_memory_database_is_one_database_for_every_connection() -> None:
    engine = sqlite_engine("sqlite://", "BEGIN", in_memory=True)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
        conn.execute(text("INSERT INTO t VALUES (7)"))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT x FROM t")).scalar() == 7
    engine.dispose()
