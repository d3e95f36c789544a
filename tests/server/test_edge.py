"""The connection and request edge (perseus.server.api.edge): head timeout, connection cap, token
before body, log redaction. Real uvicorn on loopback where sockets matter. (The documented
error shape of router and parsing errors is the app's: test_app.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from perseus.client.api.client import KEEPALIVE_EXPIRY_S
from perseus.server.api.edge import AccessLogFilter, EdgeConfig, EdgeProtocol, redact_query
from perseus.server.app import create_app
from perseus.server.settings import Settings

from .conftest import loopback_socket


@contextlib.contextmanager
def _edge_server(database: Path, **limits: Any) -> Iterator[tuple[str, int]]:
    """A real uvicorn with :class:`EdgeConfig` and ``limits`` on loopback: ``(url, port)``."""
    with _edge_uvicorn(database, **limits) as (url, port, _):
        yield url, port


@contextlib.contextmanager
def _edge_uvicorn(database: Path, **limits: Any) -> Iterator[tuple[str, int, uvicorn.Server]]:
    """As :func:`_edge_server`, with the uvicorn server itself: ``(url, port, server)``."""
    app = create_app(Settings(database=f"sqlite:///{database}", warm_planner=False))
    sock = loopback_socket()
    port = sock.getsockname()[1]
    config = EdgeConfig(app, host="127.0.0.1", port=port, log_level="error", **limits)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", port, server
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server with a 0.3 s head timeout and at most 16 connections: ``{url, port, job}``."""
    database = tmp_path_factory.mktemp("edge") / "perseus.db"
    with _edge_server(database, header_timeout_s=0.3, max_connections=16) as (url, port):
        spec = {"schedule": "1f1b", "stages": 2, "microbatches": 2, "data_parallel": 1,
                "tensor_parallel": 1}  # fmt: skip
        created = httpx.post(f"{url}/v1/jobs", json=spec).json()
        yield {"url": url, "port": port, "job_id": created["job_id"], "token": created["token"]}


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_silent_connection_is_closed_after_the_head_timeout(edge: dict[str, Any]) -> None:
    # Nothing else closes a fresh connection (uvicorn's keep-alive timer starts after a
    # response): the wait may be generous, for a loaded host's late server thread.
    with socket.create_connection(("127.0.0.1", edge["port"])) as sock:
        assert _closed_within(sock, 10.0)


def test_a_trickled_head_is_closed_too(edge: dict[str, Any]) -> None:
    with socket.create_connection(("127.0.0.1", edge["port"])) as sock:
        for piece in (b"GET /healthz HTTP/1.1\r\n", b"Host: x\r\n"):
            sock.sendall(piece)
            time.sleep(0.2)
        assert _closed_within(sock, 10.0)


def test_a_kept_alive_connection_outlives_the_head_timeout(edge: dict[str, Any]) -> None:
    with httpx.Client(base_url=edge["url"]) as c:
        assert c.get("/healthz").status_code == 200
        time.sleep(0.6)  # longer than the head timeout, shorter than the keep-alive
        assert c.get("/healthz").status_code == 200


def test_past_the_cap_idle_connections_make_room(edge: dict[str, Any]) -> None:
    idle = [socket.create_connection(("127.0.0.1", edge["port"])) for _ in range(40)]
    try:
        started = time.perf_counter()
        assert httpx.get(f"{edge['url']}/healthz", timeout=10).status_code == 200
        assert time.perf_counter() - started < 5.0  # a loaded host's thread, not a wait
        closed = sum(_closed_within(sock, 0.05) for sock in idle[:20])
        assert closed == 20  # the oldest went first
    finally:
        for sock in idle:
            sock.close()


def test_a_body_is_not_read_before_the_token_is_checked(edge: dict[str, Any]) -> None:
    # Declares a 1 MB body and sends none: only a server that answers before reading it
    # replies at all.
    head = (
        f"POST /v1/jobs/{edge['job_id']}/profiles HTTP/1.1\r\nHost: x\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", edge["port"])) as sock:
        sock.sendall(head.encode())
        sock.settimeout(10.0)  # a server waiting for the body never answers (none comes)
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 401")
    assert b"connection: close" in reply.lower()


def test_an_etag_of_non_ascii_digits_is_no_version_not_a_500(edge: dict[str, Any]) -> None:
    # Header bytes are latin-1: b"\xb2" is "²", which str.isdigit() accepts and int() refuses.
    job_id, token = edge["job_id"], edge["token"]
    body = {"rank": 1, "stage": 1, "data_parallel_rank": 0, "tensor_parallel_rank": 0,
            "gpu_name": "NVIDIA H200", "supported_clocks_mhz": [1000]}  # fmt: skip
    auth = {"Authorization": f"Bearer {token}"}
    r = httpx.post(f"{edge['url']}/v1/jobs/{job_id}/ranks", json=body, headers=auth)
    assert r.status_code == 200, r.text
    head = (
        f"GET /v1/jobs/{job_id}/plan?rank=1 HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\n"
    ).encode() + b'If-None-Match: "\xb2", W/"\xb9"\r\n\r\n'
    with socket.create_connection(("127.0.0.1", edge["port"])) as sock:
        sock.sendall(head)
        sock.settimeout(5.0)
        reply = sock.recv(65536)
        # the body may come in a segment of its own
        length = re.search(rb"content-length: (\d+)", reply.lower())
        while length and len(reply.partition(b"\r\n\r\n")[2]) < int(length[1]):
            more = sock.recv(65536)
            if not more:
                break
            reply += more
    assert reply.startswith(b"HTTP/1.1 409"), reply[:200]  # no plan yet, as without the header
    assert b'"error":"PlanNotReady"' in reply


def test_server_keep_alive_outlasts_the_client_pool() -> None:
    assert Settings().keep_alive_s > KEEPALIVE_EXPIRY_S + 5


def test_default_body_cap_fits_the_largest_profile_report(client: TestClient) -> None:
    row = {"instruction": "backward", "frequency_mhz": 100000,
           "time_s": 1.2345678901234567e-05, "energy_j": 1.2345678901234567e-05}  # fmt: skip
    body = httpx.Request("POST", "http://x", json={"rank": 131071, "stage": 1023,
                         "rows": [row] * 10_000, "p_block_w": 123456.78901234567})  # fmt: skip
    size = len(body.read())
    cap = Settings().max_body_bytes
    assert size * 1.5 < cap < size * 2


# -- logs ---------------------------------------------------------------------------------------


def test_query_strings_keep_only_the_api_parameters() -> None:
    assert redact_query("/v1/jobs/x/plan?rank=3&token=s3cr3t&wait_s=1") == (
        "/v1/jobs/x/plan?rank=3&token=***&wait_s=1"
    )
    assert redact_query("/healthz") == "/healthz"


def _access_record(path: str, status: int) -> logging.LogRecord:
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", path, "1.1", status), None,
    )  # fmt: skip


def test_access_log_redacts_and_demotes_plan_polls() -> None:
    logger = logging.getLogger("uvicorn.access")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        record = _access_record("/v1/jobs/ab/plan?rank=0&access_token=s3cr3t", 200)
        assert AccessLogFilter().filter(record) is False  # a poll: debug, not shown at info
        assert "s3cr3t" not in record.getMessage()
        record = _access_record("/v1/jobs?token=s3cr3t", 401)
        assert AccessLogFilter().filter(record) is True
        assert "s3cr3t" not in record.getMessage()
    finally:
        logger.setLevel(level)


@pytest.fixture(scope="module")
def slow_body_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server whose requests have 1 s to send their bodies: ``{url, port}``."""
    database = tmp_path_factory.mktemp("body") / "perseus.db"
    limits = {"header_timeout_s": 5.0, "body_timeout_s": 1.0, "max_connections": 16}
    with _edge_server(database, **limits) as (url, port):
        yield {"url": url, "port": port}


SPEC = (b'{"schedule": "1f1b", "stages": 2, "microbatches": 2, "data_parallel": 1, '
        b'"tensor_parallel": 1}')  # fmt: skip


def _response(sock: socket.socket) -> bytes:
    """One whole HTTP response from ``sock`` (head and ``Content-Length`` body), however the
    bytes are split across reads."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-response: {data[:80]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
         if line.lower().startswith(b"content-length:")),
        0,
    )  # fmt: skip
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-body: {data[:80]!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def _head(length: int) -> bytes:
    return (f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()  # fmt: skip


def test_a_body_that_stops_halfway_is_dropped_and_nothing_stored(
    slow_body_server: dict[str, Any],
) -> None:
    url = slow_body_server["url"]
    before = httpx.get(f"{url}/v1/jobs").json()
    with socket.create_connection(("127.0.0.1", slow_body_server["port"])) as sock:
        sock.sendall(_head(len(SPEC)) + SPEC[:20])
        assert _closed_within(sock, 5.0)
    assert httpx.get(f"{url}/v1/jobs").json() == before


def test_a_trickled_body_is_dropped_even_while_bytes_keep_coming(
    slow_body_server: dict[str, Any],
) -> None:
    with socket.create_connection(("127.0.0.1", slow_body_server["port"])) as sock:
        sock.sendall(_head(len(SPEC)))
        started = time.monotonic()
        closed = False
        for byte in SPEC[:-1]:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.05)
        assert closed or _closed_within(sock, 5.0)
        assert time.monotonic() - started < 4.0


def test_a_body_in_time_is_served_and_the_connection_kept(
    slow_body_server: dict[str, Any],
) -> None:
    with socket.create_connection(("127.0.0.1", slow_body_server["port"])) as sock:
        sock.sendall(_head(len(SPEC)) + SPEC[:20])
        time.sleep(0.2)  # well within the body timeout, also where this thread wakes late
        sock.sendall(SPEC[20:])
        sock.settimeout(5.0)
        answer = _response(sock)
        assert answer.startswith(b"HTTP/1.1 201"), answer[:80]
        time.sleep(1.3)  # past the body timeout: an idle kept-alive connection is not touched
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _response(sock).startswith(b"HTTP/1.1 200")


_SWAGGER_JS = "/docs/static/swagger-ui-bundle.js"  # ~1.4 MB


def _never_reading(port: int, requests: int, window: int = 1024) -> socket.socket:
    """A connection with a tiny receive window that pipelines big GETs and never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {_SWAGGER_JS} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * requests)
    time.sleep(0.03)  # its request is running (and its output stalled) before the next comes
    return sock


def test_clients_that_never_read_are_cut_off_and_fresh_requests_served(
    tmp_path: Path,
) -> None:
    # Issue 24, item 2: 60 such clients held every slot (cap 16 + uvicorn's margin of 32)
    # past every timeout, and each fresh /healthz got 503 for as long as they wished.
    limits = {"header_timeout_s": 5.0, "max_connections": 16, "write_timeout_s": 0.5}
    with _edge_uvicorn(tmp_path / "perseus.db", **limits) as (url, port, server):
        assert httpx.get(url + _SWAGGER_JS).status_code == 200  # it exists, and is large
        stalled = [_never_reading(port, 4) for _ in range(60)]
        try:
            # Unfixed, every fresh request got 503 for as long as the 60 stayed; a loaded
            # host's server may take a while to cut them off (or make room), not forever.
            deadline = time.monotonic() + 30
            while httpx.get(f"{url}/healthz", timeout=10).status_code != 200:
                assert time.monotonic() < deadline, "fresh requests still refused"
                time.sleep(0.1)
            codes = [httpx.get(f"{url}/healthz", timeout=10).status_code for _ in range(5)]
            assert codes == [200] * 5
            deadline = time.monotonic() + 30
            while len(server.server_state.connections) > 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(server.server_state.connections) <= 2  # none of the 60 is held
        finally:
            for sock in stalled:
                sock.close()


def test_unread_output_past_the_write_timeout_drops_the_connection(tmp_path: Path) -> None:
    # Far under the connection cap: the write timeout alone cuts the client off.
    limits = {"header_timeout_s": 5.0, "max_connections": 1000, "write_timeout_s": 1.0}
    with (
        _edge_uvicorn(tmp_path / "perseus.db", **limits) as (_, port, server),
        _never_reading(port, 4),
    ):
        state = server.server_state
        deadline = time.monotonic() + 10
        while not state.connections:  # accepted (and not yet cut off: that takes 1 s)
            assert time.monotonic() < deadline, "the connection was never accepted"
            time.sleep(0.005)
        assert len(state.connections) == 1
        # Cut off, and its request's task ended too: the task ends on the server's loop a
        # moment after the connection leaves ``connections``, so both are waited for.
        deadline = time.monotonic() + 30
        while (state.connections or state.tasks) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not state.connections
        assert not state.tasks


def test_a_slow_reader_keeps_its_connection(tmp_path: Path) -> None:
    # The write timeout bounds how long output waits unread, not how long a download takes
    # (here about 3 s, in pauses of 0.2 s: a second leaves room for a loaded host's reader).
    with _edge_uvicorn(tmp_path / "perseus.db", header_timeout_s=5.0, max_connections=16,
                       write_timeout_s=1.0) as (url, port, _):  # fmt: skip
        total = len(httpx.get(url + _SWAGGER_JS).content)
        sock = _never_reading(port, 1, window=64 * 1024)
        got = 0
        with sock:
            sock.settimeout(5.0)
            while got < total:
                chunk = sock.recv(256 * 1024)
                assert chunk, "closed mid-response"
                got += len(chunk)
                time.sleep(0.2)  # long pauses, each shorter than the write timeout
        assert got >= total


# What edge.py takes from uvicorn beyond its public Config and Server: the h11 protocol class
# it subclasses, the methods it overrides and calls through super(), the attributes it reads
# on the protocol and on its request cycle. pyproject.toml pins uvicorn to the tested minor
# version; this says what to look at when that pin moves.
_H11_METHODS = (
    "connection_made",
    "connection_lost",
    "handle_events",
    "on_response_complete",
    "pause_writing",
    "resume_writing",
    "timeout_keep_alive_handler",
)
_H11_ATTRIBUTES = ("connections", "cycle", "transport", "loop")
_CYCLE_ATTRIBUTES = ("response_complete", "more_body")


class _Transport(asyncio.Transport):
    """Enough of a socket transport for uvicorn's protocol, written bytes discarded."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_uvicorn_still_has_what_edge_protocol_relies_on() -> None:
    from uvicorn.config import LOGGING_CONFIG
    from uvicorn.protocols.http import h11_impl
    from uvicorn.server import ServerState

    def require(present: bool, what: str) -> None:
        if not present:
            pytest.fail(
                f"uvicorn {uvicorn.__version__}: {what} is gone; perseus/server/api/edge.py "
                "(EdgeProtocol, log_config) relies on it: adapt edge.py before moving the pin"
            )

    require(hasattr(h11_impl, "H11Protocol"), "uvicorn.protocols.http.h11_impl.H11Protocol")
    for name in _H11_METHODS:
        require(callable(getattr(h11_impl.H11Protocol, name, None)), f"H11Protocol.{name}()")
    require("access" in LOGGING_CONFIG.get("handlers", {}), "LOGGING_CONFIG's 'access' handler")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass  # never runs: the loop is not run past the request head

    loop = asyncio.new_event_loop()
    try:
        state = ServerState()
        require(hasattr(state, "connections"), "ServerState.connections")
        protocol = EdgeProtocol(uvicorn.Config(app), state, {}, _loop=loop)
        protocol.connection_made(_Transport())
        for name in _H11_ATTRIBUTES:
            require(hasattr(protocol, name), f"the H11Protocol attribute {name!r}")
        require(protocol in state.connections, "H11Protocol adding itself to connections")
        # A head with half its body: data_received() must go through handle_events().
        protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhalf")
        require(protocol.cycle is not None, "H11Protocol.cycle set by handle_events()")
        for name in _CYCLE_ATTRIBUTES:
            require(hasattr(protocol.cycle, name), f"the RequestResponseCycle attribute {name!r}")
        busy = protocol.requests == 1 and protocol.waiting_since is None
        require(busy, "data_received() calling handle_events()")
        pending = protocol.cycle.more_body and not protocol.cycle.response_complete
        require(pending, "more_body/response_complete saying that a body is pending")
        protocol.connection_lost(None)
        require(protocol not in state.connections, "H11Protocol leaving connections")
        for task in state.tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*state.tasks, return_exceptions=True))
    finally:
        loop.close()
