"""``perseus db upgrade`` and ``perseus db current`` on a SQLite file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from perseus.cli import main

needs_migrations = pytest.mark.skipif(
    importlib.util.find_spec("sqlalchemy") is None
    or importlib.util.find_spec("perseus.server.store.migrations") is None,
    reason="perseus.server.store.migrations (and the server extra) not available",
)


@needs_migrations
def test_upgrade_then_current_prints_the_revision_reached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = tmp_path / "x.db"
    url = f"sqlite:///{database}"
    assert main(["db", "current", "--database", url]) == 2  # creates nothing
    err = capsys.readouterr().err
    assert err.startswith("perseus: error: ") and err.count("\n") == 1 and str(database) in err
    assert not database.exists()
    database.touch()  # an empty SQLite database: no revision yet
    assert main(["db", "current", "--database", url]) == 0
    assert capsys.readouterr().out == "none\n"
    assert main(["db", "upgrade", "--database", url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("database at revision ") and out.count("\n") == 1
    revision = out.removeprefix("database at revision ").strip()
    assert revision
    assert main(["db", "current", "--database", url]) == 0
    assert capsys.readouterr().out == f"{revision}\n"
    assert main(["db", "upgrade", "--database", url]) == 0  # already there: nothing to do
    assert capsys.readouterr().out == out


@needs_migrations
def test_the_database_defaults_to_perseus_serves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    database = tmp_path / "from-env.db"
    monkeypatch.setenv("PERSEUS_DATABASE", f"sqlite:///{database}")
    assert main(["db", "upgrade"]) == 0
    assert database.exists()
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PERSEUS_DATABASE")
    assert main(["db", "upgrade"]) == 0
    assert (tmp_path / "perseus.db").exists()  # serve's default, ./perseus.db


def test_a_subcommand_is_required_and_bad_settings_are_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["db"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perseus: error: db: ") and "COMMAND" in err and err.count("\n") == 1
    pytest.importorskip("pydantic_settings")
    monkeypatch.setenv("PERSEUS_WORKERS", "0")
    assert main(["db", "current"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perseus: error: invalid settings: workers") and err.count("\n") == 1
