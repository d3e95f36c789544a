"""``perseus serve``: arguments, settings precedence (flags over PERSEUS_* over defaults),
one-line start-up errors, and ``python -m perseus.server`` as the same command."""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.cli import main
from perseus.cli.serve import add_serve_arguments, bind_socket, run_serve, serve_settings
from perseus.core.defaults import POLISH_S
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
    settings = serve_settings(args)
    assert settings.port == 9001
    assert settings.workers == 3
    assert settings.database == "postgresql+psycopg://u:p@h/db"
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "s3cr3t-value"
    assert "s3cr3t-value" not in repr(settings)


def test_write_timeout_from_the_environment_then_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PERSEUS_WRITE_TIMEOUT_S", raising=False)
    assert serve_settings(_parse()).write_timeout_s == 30.0
    monkeypatch.setenv("PERSEUS_WRITE_TIMEOUT_S", "7.5")
    assert serve_settings(_parse()).write_timeout_s == 7.5
    assert serve_settings(_parse("--write-timeout", "3")).write_timeout_s == 3.0
    assert run_serve(_parse("--write-timeout", "0")) == 2


def test_body_timeout_from_the_environment_then_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERSEUS_BODY_TIMEOUT_S", raising=False)
    assert serve_settings(_parse()).body_timeout_s == 60.0
    monkeypatch.setenv("PERSEUS_BODY_TIMEOUT_S", "12.5")
    assert serve_settings(_parse()).body_timeout_s == 12.5
    assert serve_settings(_parse("--body-timeout", "3")).body_timeout_s == 3.0
    assert run_serve(_parse("--body-timeout", "0")) == 2


def test_invalid_settings_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_serve(_parse("--workers", "0")) == 2
    assert "workers" in capsys.readouterr().err


def test_polish_seconds_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERSEUS_POLISH_S", raising=False)
    assert Settings().polish_s == POLISH_S
    monkeypatch.setenv("PERSEUS_POLISH_S", "2.5")
    assert Settings().polish_s == 2.5
    monkeypatch.setenv("PERSEUS_POLISH_S", "-1")
    with pytest.raises(ValueError, match="polish_s"):
        Settings()


def _start_fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert run_serve(_parse(*argv)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one line, no traceback
    return err


def test_a_busy_port_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    database = tmp_path / "perseus.db"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        err = _start_fails(capsys, "--port", str(port), "--database", f"sqlite:///{database}")
    assert "in use" in err and "--port" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("not a url", "not a database URL"),
        ("mysql://u:secret@h/db", "unsupported database"),
        ("sqlite:////nonexistent-dir/sub/perseus.db", "cannot create or write the SQLite"),
        ("postgresql+psycopg://u:secret@127.0.0.1:1/db", "cannot reach PostgreSQL"),
    ],
)
def test_database_problems_are_one_line(
    url: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _start_fails(capsys, "--port", "0", "--database", url)
    assert says in err
    assert "secret" not in err


def test_the_listening_socket_gives_connections_tcp_nodelay() -> None:
    """Without TCP_NODELAY every response written in two parts waited 40 ms (delayed ACK)."""

    async def accepted_nodelay() -> int:
        sock = bind_socket("127.0.0.1", 0)
        sock.listen()
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted = transport.get_extra_info("socket")
                seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        port = sock.getsockname()[1]
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await asyncio.wait_for(seen, 5)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(accepted_nodelay()) != 0


def test_serve_delegates_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    assert "--port" in capsys.readouterr().out
    assert main(["serve", "--port", "eighty"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perseus: error: serve: argument --port") and err.count("\n") == 1


def test_python_m_perseus_server_is_perseus_serve(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scripts (the end-to-end tests, the server benchmarks) start the server this way."""
    monkeypatch.setenv("COLUMNS", "100")  # the same help wrapping in both processes
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    done = subprocess.run(
        [sys.executable, "-m", "perseus.server", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == capsys.readouterr().out
    assert done.stdout.startswith("usage: perseus serve")


def test_a_database_from_a_newer_perseus_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    from perseus.server.store.migrations import upgrade_database

    url = f"sqlite:///{tmp_path / 'newer.db'}"
    upgrade_database(url)
    with sqlite3.connect(tmp_path / "newer.db") as db:
        db.execute("UPDATE perseus_alembic_version SET version_num = '9999'")
    err = _start_fails(capsys, "--port", "0", "--database", url)
    assert "newer perseus" in err
    assert "Traceback" not in err
