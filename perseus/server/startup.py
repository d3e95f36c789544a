"""Starting the planner server: bind the port, check the database, run uvicorn.

``perseus serve`` (:mod:`perseus.cli.serve`) and ``python -m perseus.server`` both start it
here. Flags override ``PERSEUS_*`` variables, which override the defaults
(:class:`perseus.server.settings.Settings`). The port is bound first and the database checked
second, so that a failed start creates nothing; every start-up problem is one line on stderr
and exit status 2. The server's modules (FastAPI, uvicorn, SQLAlchemy: the server extra) are
imported only when it runs, so that ``--help`` works on a bare install.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from perseus.core.errors import StartupError

if TYPE_CHECKING:
    from perseus.server.settings import Settings


__all__ = [
    "StartupError",
    "add_serve_arguments",
    "bind_socket",
    "check_database",
    "run_serve",
    "serve_parser",
    "serve_settings",
]

log = logging.getLogger("perseus.server")

# Flags that override PERSEUS_* environment variables (which override the defaults).
_FLAGS = (
    "host",
    "port",
    "database",
    "workers",
    "log_level",
    "keep_alive_s",
    "header_timeout_s",
    "body_timeout_s",
    "write_timeout_s",
    "max_connections",
)

# How long the start-up check waits for PostgreSQL (unless the URL sets connect_timeout).
_CONNECT_TIMEOUT_S = 10


def serve_parser(
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    """The parser of ``perseus serve`` (and ``python -m perseus.server``), of ``parser_class``."""
    parser = parser_class(prog="perseus serve", description="Run the planner server.")
    add_serve_arguments(parser)
    return parser


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``perseus serve`` options; unset ones fall back to ``PERSEUS_*`` variables."""
    parser.add_argument("--host", help="address to bind (default 127.0.0.1; PERSEUS_HOST)")
    parser.add_argument("--port", type=int, help="port (default 7787; PERSEUS_PORT)")
    parser.add_argument(
        "--database",
        metavar="URL",
        help="sqlite:///file.db (default ./perseus.db) or postgresql+psycopg://user:pw@host/db "
        "(PERSEUS_DATABASE)",
    )
    parser.add_argument(
        "--workers", type=int, metavar="N", help="server processes (default 1; PERSEUS_WORKERS)"
    )
    parser.add_argument(
        "--log-level",
        choices=("critical", "error", "warning", "info", "debug"),
        help="log level (default info; PERSEUS_LOG_LEVEL)",
    )
    parser.add_argument(
        "--keep-alive",
        dest="keep_alive_s",
        type=int,
        metavar="S",
        help="close idle keep-alive connections after S seconds (default 75; longer than "
        "clients' pool expiry; PERSEUS_KEEP_ALIVE_S)",
    )
    parser.add_argument(
        "--header-timeout",
        dest="header_timeout_s",
        type=float,
        metavar="S",
        help="close connections that have not sent a complete request head within S seconds "
        "(default 10; PERSEUS_HEADER_TIMEOUT_S)",
    )
    parser.add_argument(
        "--body-timeout",
        dest="body_timeout_s",
        type=float,
        metavar="S",
        help="close connections whose request body has not arrived whole within S seconds of "
        "its head (default 60; PERSEUS_BODY_TIMEOUT_S)",
    )
    parser.add_argument(
        "--write-timeout",
        dest="write_timeout_s",
        type=float,
        metavar="S",
        help="abort connections that leave 64 KiB of output unread for S seconds (default 30; "
        "PERSEUS_WRITE_TIMEOUT_S)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="open connections per server process (default: the open-file limit less 128; "
        "PERSEUS_MAX_CONNECTIONS)",
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything else is created.

    Raises:
        StartupError: the address is in use or cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that name it, and without
    # it a response written in two parts waits 40 ms for the peer's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(
                f"port {port} on {host} is in use (another perseus serve?): stop that "
                "process or choose another port with --port"
            ) from None
        raise StartupError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; check --host and --port"
        ) from None
    sock.set_inheritable(True)
    return sock


def check_database(url: str) -> None:
    """Open the database and create missing tables, or say in one line why not.

    Raises:
        StartupError: a URL that does not parse or names another database, an SQLite file
            that cannot be created or written, a PostgreSQL server that cannot be reached.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from perseus.core.errors import StoreError
    from perseus.server.store.job_store import Store
    from perseus.server.store.storage import StorageFault

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StartupError(
            f"{url!r} is not a database URL: use sqlite:///path/to/perseus.db or "
            "postgresql+psycopg://user:password@host/db"
        ) from None
    backend = parsed.get_backend_name()
    shown = parsed.render_as_string(hide_password=True)
    if backend not in ("sqlite", "postgresql"):
        raise StartupError(
            f"unsupported database {shown}: perseus stores jobs in SQLite "
            "(sqlite:///path/to/perseus.db) or PostgreSQL (postgresql+psycopg://user:pw@host/db)"
        )
    if backend == "postgresql" and "connect_timeout" not in parsed.query:
        parsed = parsed.update_query_dict({"connect_timeout": str(_CONNECT_TIMEOUT_S)})
        url = parsed.render_as_string(hide_password=False)
    try:
        store = Store(url)
    except (ImportError, SQLAlchemyError) as exc:
        raise StartupError(
            f"cannot use {shown}: {_first_line(exc)}; for PostgreSQL write "
            "postgresql+psycopg://user:pw@host/db"
        ) from None
    try:
        store.create_schema()
    except (SQLAlchemyError, StorageFault) as exc:  # the guard's fault: a read-only folder
        reason = _first_line(getattr(exc, "orig", None) or exc)
        if backend == "sqlite":
            path = parsed.database or ":memory:"
            raise StartupError(
                f"cannot create or write the SQLite database {os.path.abspath(path)}: {reason}; "
                "make its directory writable or choose another file with "
                "--database sqlite:///path/to/perseus.db"
            ) from None
        raise StartupError(
            f"cannot reach PostgreSQL at {shown}: {reason}; check that the server runs and "
            "accepts this user and password, or choose another with --database"
        ) from None
    except StoreError as exc:  # a schema this version cannot migrate (newer, or partial)
        raise StartupError(str(exc)) from None
    finally:
        store.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0].rstrip(".")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in _FLAGS if getattr(args, name, None) is not None}


def serve_settings(args: argparse.Namespace) -> Settings:
    """The server's settings: flags given, over ``PERSEUS_*`` variables, over defaults.

    Raises:
        pydantic.ValidationError: a value is invalid.
    """
    from perseus.server.settings import Settings  # pydantic-settings: the server extra

    return Settings(**_overrides(args))


def run_serve(args: argparse.Namespace) -> int:
    """Run the planner server until interrupted.

    The port is bound first and the database checked second, so that a failed start
    creates nothing (no empty SQLite file beside a busy port).

    Returns:
        The process exit status: 0 after a clean shutdown, 2 when it cannot start (one
        line on stderr says why and what to do).
    """
    import uvicorn
    from pydantic import ValidationError
    from uvicorn.supervisors import Multiprocess

    from perseus.server.api.edge import (
        EdgeConfig,
        connection_cap,
        log_config,
        raise_open_file_limit,
    )
    from perseus.server.app import create_app

    overrides = _overrides(args)
    try:
        settings = serve_settings(args)
    except ValidationError as exc:
        print(f"perseus serve: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    soft, hard = raise_open_file_limit()
    cap = connection_cap(settings.max_connections)
    try:
        sock = bind_socket(settings.host, settings.port)
    except StartupError as exc:
        print(f"perseus serve: {exc}", file=sys.stderr)
        return 2
    try:
        # Create the tables once here, so that several workers do not all race to do it.
        check_database(settings.database)
    except StartupError as exc:
        sock.close()
        print(f"perseus serve: {exc}", file=sys.stderr)
        return 2
    if not _is_loopback(settings.host) and settings.admin_token is None:
        log.warning(
            "binding %s without PERSEUS_ADMIN_TOKEN: anyone who can reach it may create jobs",
            settings.host,
        )
    log.info(
        "listening on http://%s:%d (Ctrl-C to stop); open files: limit %d (hard %d), "
        "at most %d connections",
        f"[{settings.host}]" if ":" in settings.host else settings.host,
        sock.getsockname()[1],
        soft,
        hard,
        cap,
    )
    common: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "log_config": log_config(),
        "timeout_keep_alive": settings.keep_alive_s,
        "header_timeout_s": settings.header_timeout_s,
        "body_timeout_s": settings.body_timeout_s,
        "write_timeout_s": settings.write_timeout_s,
        "max_connections": cap,
    }
    if settings.workers == 1:
        server = uvicorn.Server(EdgeConfig(create_app(settings), **common))
        # Uvicorn shuts down cleanly on Ctrl-C, then raises the signal again: as uvicorn.run,
        # end quietly rather than with a KeyboardInterrupt traceback.
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[sock])
        return 0 if server.started else 2
    # Worker processes build their own app from the environment.
    for name, value in overrides.items():
        os.environ[f"PERSEUS_{name.upper()}"] = str(value)
    config = EdgeConfig(
        "perseus.server.app:create_app_from_env",
        factory=True,
        workers=settings.workers,
        **common,
    )
    with contextlib.suppress(KeyboardInterrupt):
        Multiprocess(config, sockets=[sock]).run()
    return 0
