"""Engines and URLs (perseus.server.database)."""

from __future__ import annotations

import pytest

from perseus.server.database import normalize_database_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p@h/db", "postgresql+psycopg://u:p@h/db"),
        ("postgresql+psycopg://u:p@h:5/db", "postgresql+psycopg://u:p@h:5/db"),
        ("sqlite:///x.db", "sqlite:///x.db"),
    ],
)
def test_database_urls_use_psycopg3(url: str, expected: str) -> None:
    assert normalize_database_url(url) == expected
