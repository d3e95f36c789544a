"""``perseus serve``: the arguments and the runner the main CLI calls."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

from pydantic import ValidationError

from perseus.server.settings import Settings

__all__ = ["add_serve_arguments", "run_serve"]

log = logging.getLogger("perseus.server")

# Flags that override PERSEUS_* environment variables (which override the defaults).
_FLAGS = ("host", "port", "database", "workers", "log_level")


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


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_serve(args: argparse.Namespace) -> int:
    """Run the planner server until interrupted.

    Returns:
        The process exit status (2 for invalid settings).
    """
    import uvicorn

    from perseus.server.app import create_app
    from perseus.server.store import Store

    overrides = {
        name: getattr(args, name) for name in _FLAGS if getattr(args, name, None) is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        print(f"perseus serve: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if not _is_loopback(settings.host) and settings.admin_token is None:
        log.warning(
            "binding %s without PERSEUS_ADMIN_TOKEN: anyone who can reach it may create jobs",
            settings.host,
        )
    # Create the tables once here, so that several workers do not all race to do it.
    store = Store(settings.database)
    try:
        store.create_schema()
    finally:
        store.close()
    if settings.workers == 1:
        uvicorn.run(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
        )
        return 0
    # Worker processes build their own app from the environment.
    for name, value in overrides.items():
        os.environ[f"PERSEUS_{name.upper()}"] = str(value)
    uvicorn.run(
        "perseus.server.app:create_app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
    )
    return 0
