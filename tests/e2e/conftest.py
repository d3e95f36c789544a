"""Fixtures of the end-to-end tests: real planner servers (uvicorn subprocesses) on loopback."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from .pipelines import Launch  # pipelines imports this module

REPO = Path(__file__).parents[2]
SHARED = REPO / ".." / "shared"


# Ports for servers that a subprocess binds a moment later: below Linux's ephemeral range
# (32768-60999), so no outgoing connection takes one in between, as it may take a port the
# kernel handed out for bind(0).
_PORTS = range(20_000, 32_000)


def free_port() -> int:
    """A TCP port free on loopback now, outside the ephemeral range."""
    for port in random.sample(_PORTS, 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_PORTS.start}-{_PORTS.stop - 1} on loopback")


@dataclass
class LiveServer:
    """One ``python -m perseus.server`` process; restartable on the same port and database.

    ``root`` is the folder it runs in, whose ``perseus`` it runs: this repository's, or another
    version's unpacked elsewhere (tests/e2e/test_version_skew.py).
    """

    database: str
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    root: Path = REPO

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        # Only this server's settings: none leak in from the caller's PERSEUS_* variables.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
        env.update(self.env)
        command = [
            sys.executable, "-m", "perseus.server",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--database", self.database, "--log-level", "warning",
        ]  # fmt: skip
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(command, env=env, stdout=log, stderr=log, cwd=self.root)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not start: {self.log_path.read_text()[-3000:]}")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 30.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self, sig: signal.Signals = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """Start servers: ``live_server(database=None, **env)``; all are stopped at teardown."""
    servers: list[LiveServer] = []

    def start(database: str | None = None, **env: str) -> LiveServer:
        n = len(servers)
        server = LiveServer(
            database or f"sqlite:///{tmp_path / 'perseus.db'}",
            tmp_path / f"server{n}.log",
            {"PERSEUS_WARM_PLANNER": "true", **{f"PERSEUS_{k.upper()}": v for k, v in env.items()}},
        )
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    """Torchrun launches a test appends here are stopped at teardown."""
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.stop()
