"""``perseus serve`` arguments and settings precedence: flags over PERSEUS_* over defaults."""

from __future__ import annotations

import argparse

import pytest

from perseus.server.cli import add_serve_arguments, run_serve
from perseus.server.settings import DEFAULT_DATABASE, Settings


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_bind_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HOST", "PORT", "DATABASE", "WORKERS", "ADMIN_TOKEN"):
        monkeypatch.delenv(f"PERSEUS_{name}", raising=False)
    settings = Settings()
    assert (settings.host, settings.port, settings.database, settings.workers) == (
        "127.0.0.1",
        7787,
        DEFAULT_DATABASE,
        1,
    )
    assert settings.admin_token is None
    args = _parse()
    assert (args.host, args.port, args.database, args.workers) == (None, None, None, None)


def test_environment_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERSEUS_PORT", "9000")
    monkeypatch.setenv("PERSEUS_WORKERS", "3")
    monkeypatch.setenv("PERSEUS_ADMIN_TOKEN", "s3cr3t-value")
    args = _parse("--port", "9001", "--database", "postgresql+psycopg://u:p@h/db")
    settings = Settings(**{k: v for k, v in vars(args).items() if v is not None})
    assert settings.port == 9001
    assert settings.workers == 3
    assert settings.database == "postgresql+psycopg://u:p@h/db"
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "s3cr3t-value"
    assert "s3cr3t-value" not in repr(settings)


def test_invalid_settings_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_serve(_parse("--workers", "0")) == 2
    assert "workers" in capsys.readouterr().err


def test_polish_seconds_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERSEUS_POLISH_S", raising=False)
    assert Settings().polish_s == 30.0
    monkeypatch.setenv("PERSEUS_POLISH_S", "2.5")
    assert Settings().polish_s == 2.5
    monkeypatch.setenv("PERSEUS_POLISH_S", "-1")
    with pytest.raises(ValueError, match="polish_s"):
        Settings()
