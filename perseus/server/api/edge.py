"""The connection and request edge of the server: what happens before a route runs.

* :class:`EdgeProtocol` (uvicorn's h11 protocol, plus three rules): a connection must send a
  complete request head within ``header_timeout_s`` of opening (or of its first byte after
  a keep-alive pause), and then its whole body within ``body_timeout_s``, else it is closed;
  and past ``max_connections`` open connections, a
  new one closes the connections that have waited longest for a request, those that never
  sent one first. Uvicorn alone closes neither: an idle socket holds a file descriptor
  forever, and ~1,000 of them leave none for ``/healthz`` or the database. A fourth rule
  covers clients that send requests and never read the answers: output the client does not
  take within ``write_timeout_s`` drops the connection (see :class:`EdgeProtocol`).
* :func:`raise_open_file_limit` and :func:`connection_cap`: the soft file limit goes up to
  the hard one at start, and connections stop short of it, leaving descriptors for the
  database, the planning processes and the log files.
* :class:`AuthBeforeBody`: a request with a body under a job (or creating one, when an
  admin token is set) is checked against its token before a byte of the body is read.
* :class:`AccessLogFilter`: query strings in the access log keep only the parameters the
  API defines (a token pasted into a URL never reaches a log), and plan polls log at debug.
* :func:`bounded_accept_errors`: "Too many open files" from the accept loop is logged at
  most once per ``interval_s``, with the count of those suppressed.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import re
import resource
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState as UvicornServerState

from perseus.core.errors import JobNotFound, PerseusError
from perseus.schemas import JOBS_PATH
from perseus.server.api.auth import bearer_token, check_admin, check_job_token
from perseus.server.api.routes import ServerState, error_response
from perseus.server.settings import Settings

__all__ = [
    "FD_RESERVE",
    "WRITE_TIMEOUT_S",
    "AccessLogFilter",
    "AuthBeforeBody",
    "EdgeConfig",
    "EdgeProtocol",
    "bounded_accept_errors",
    "connection_cap",
    "log_config",
    "raise_open_file_limit",
]

log = logging.getLogger("perseus.server")

FD_RESERVE = 128
"""File descriptors kept free of client connections: database files and sockets, the
planning processes' pipes, log files, the listening socket."""

WRITE_TIMEOUT_S: float = Settings.model_fields["write_timeout_s"].default
"""Default of :class:`EdgeConfig`'s ``write_timeout_s``: the server setting's."""

# Past the connection cap, a connection whose output has waited this long for its client
# to read may be dropped to make room (after every connection waiting for a request).
_STALLED_EVICT_S = 1.0


def raise_open_file_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open files to its hard limit.

    Returns:
        ``(soft, hard)`` after the change (the soft limit is unchanged if it cannot move).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        # Linux refuses an infinite soft limit for files; 1,048,576 is its usual ceiling.
        target = hard if hard != resource.RLIM_INFINITY else 1_048_576
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft, hard


def connection_cap(max_connections: int | None) -> int:
    """The most client connections this process keeps open.

    Args:
        max_connections: the configured cap; None for "as many as the file limit allows".

    Returns:
        The smaller of ``max_connections`` and the soft file limit less :data:`FD_RESERVE`
        (at least 16).
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    by_files = max(16, soft - FD_RESERVE) if soft != resource.RLIM_INFINITY else 1_000_000
    return by_files if max_connections is None else min(max_connections, by_files)


class EdgeConfig(uvicorn.Config):
    """Uvicorn's config with :class:`EdgeProtocol` and its two limits.

    A module-level class, so that worker processes (which receive the config pickled)
    rebuild it with the limits.

    Args:
        app: the ASGI app or its import string.
        header_timeout_s: seconds a connection has to send a complete request head.
        body_timeout_s: seconds a request has, from its complete head, to send its whole body.
        max_connections: the most open connections (see :func:`connection_cap`); past it,
            idle connections are closed to make room, then those stalled on a client that
            does not read; when none is either, requests get 503.
        write_timeout_s: seconds a connection's pending output may wait for its client to
            read (None: forever, as uvicorn).
        **kwargs: passed to :class:`uvicorn.Config`.
    """

    def __init__(
        self,
        app: Any,
        *,
        header_timeout_s: float,
        max_connections: int,
        body_timeout_s: float | None = None,
        write_timeout_s: float | None = WRITE_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        # Uvicorn answers 503 once connections reach limit_concurrency: leave room above the
        # eviction threshold for connections that cannot be made room for.
        kwargs.setdefault("limit_concurrency", max_connections + FD_RESERVE // 4)
        super().__init__(app, http=EdgeProtocol, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.write_timeout_s = write_timeout_s
        self.max_connections = max_connections


class EdgeProtocol(H11Protocol):
    """Uvicorn's h11 protocol with request-head and request-body timeouts and a connection cap.

    A connection is *waiting* from when it opens, or its last response ends, until the
    head of its next request is complete. Waiting after a response is uvicorn's keep-alive
    (``timeout_keep_alive``); once bytes of the next request arrive, or on a fresh
    connection, the head must be complete within ``header_timeout_s``, however slowly it
    trickles in. Once the head is complete, the body must be too within ``body_timeout_s``
    (uvicorn waits for it forever: a client that sends its body a byte at a time, or stops
    halfway, holds the connection and the request's task).

    Output is bounded too: once more than the transport's high-water mark (64 KiB) of a
    response waits for the client to read it, the client must take it down to the low-water
    mark within ``write_timeout_s``, and a connection being closed must be rid of its pending
    output within that time; else it is aborted. Uvicorn waits for a client that does not
    read forever (its request task blocked, its connection busy and never evicted): sixty
    such clients pipelining large GETs held every connection slot, and each fresh request
    got 503. Closing is no remedy, as a closed socket with pending output stays open until
    the output is gone. Under a config without those limits (a plain
    :class:`uvicorn.Config`), it behaves as uvicorn's protocol.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: UvicornServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._max_connections: int | None = getattr(config, "max_connections", None)
        self._head = _Deadline(getattr(config, "header_timeout_s", None), "request head")
        self._body = _Deadline(getattr(config, "body_timeout_s", None), "request body")
        self._write = _Deadline(
            getattr(config, "write_timeout_s", None), "output, unread by its client,", abort=True
        )
        self.stalled_since: float | None = None
        """When this connection's output passed the high-water mark (None: it has not)."""
        self.waiting_since: float | None = None
        """When this connection started waiting for a request head (None: busy)."""
        self.requests = 0
        """Requests this connection has sent a complete head for."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.waiting_since = time.monotonic()
        self._head.start(self)
        if self._max_connections is not None and len(self.connections) > self._max_connections:
            self._make_room(len(self.connections) - self._max_connections)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._head.cancel()
        self._body.cancel()
        self._write.cancel()
        self.waiting_since = None
        self.stalled_since = None

    def pause_writing(self) -> None:
        super().pause_writing()
        self.stalled_since = time.monotonic()
        self._write.start(self)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.stalled_since = None
        if not self.transport.is_closing():
            # The client reads. (A closing connection must be rid of all its output.)
            self._write.cancel()

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()
        self._closing_with_output()

    def close(self) -> None:
        """Close this connection; abort it if its output is not gone within the write timeout."""
        self.transport.close()
        self._closing_with_output()

    def _closing_with_output(self) -> None:
        if self.transport.is_closing() and self.transport.get_write_buffer_size() > 0:
            self._write.start(self)

    def handle_events(self) -> None:
        super().handle_events()
        busy = self.cycle is not None and not self.cycle.response_complete
        if busy:
            if self.waiting_since is not None:
                self.waiting_since = None
                self.requests += 1
            self._head.cancel()
        if busy and self.cycle is not None and self.cycle.more_body:
            # Closing tells the request's task the client is gone (its receive() answers
            # http.disconnect): the route never runs on half a body, nothing is stored.
            self._body.start(self)
        else:
            self._body.cancel()
        if not busy and not self.transport.is_closing():
            # Bytes of a request head arrived after a keep-alive pause (which uvicorn has
            # just cancelled): the rest must follow within the head timeout.
            self._head.start(self)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._closing_with_output()  # a response with Connection: close
        self._body.cancel()
        if self.cycle is not None and self.cycle.response_complete:
            # Idle again: uvicorn's keep-alive timer governs until the next bytes arrive.
            self._head.cancel()
            self.waiting_since = time.monotonic()

    def _make_room(self, count: int) -> None:
        """Close ``count`` connections: waiting ones (never-used first, oldest first), then
        those whose unread output has waited over a second (longest first)."""
        stalled_before = time.monotonic() - _STALLED_EVICT_S
        candidates = [
            c
            for c in self.connections
            if c is not self
            and isinstance(c, EdgeProtocol)
            and not c.transport.is_closing()
            and (
                c.waiting_since is not None
                or (c.stalled_since is not None and c.stalled_since <= stalled_before)
            )
        ]
        for victim in heapq.nsmallest(count, candidates, key=_eviction_order):
            victim._head.cancel()
            if victim.waiting_since is None or victim.transport.get_write_buffer_size() > 0:
                # Its client does not read what it was sent: closing would wait for it.
                victim.transport.abort()
            else:
                victim.transport.close()
            victim.waiting_since = None


class _Deadline:
    """A one-shot timer that closes its connection when it expires (aborts it, with
    ``abort``: pending output dropped); never, when ``seconds`` is None. Starting a running
    one leaves it running."""

    def __init__(self, seconds: float | None, what: str, *, abort: bool = False) -> None:
        self.seconds = seconds
        self.what = what
        self.abort = abort
        self._handle: asyncio.TimerHandle | None = None

    def start(self, protocol: EdgeProtocol) -> None:
        if self.seconds is not None and self._handle is None:
            self._handle = protocol.loop.call_later(self.seconds, self._expire, protocol)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _expire(self, protocol: EdgeProtocol) -> None:
        self._handle = None
        if self.abort:
            log.debug("aborted a connection whose %s waited over %s s", self.what, self.seconds)
            protocol.transport.abort()
        elif not protocol.transport.is_closing():
            log.debug("closed a connection whose %s took over %s s", self.what, self.seconds)
            protocol.close()


def _eviction_order(protocol: EdgeProtocol) -> tuple[int, float]:
    if protocol.waiting_since is not None:
        return int(protocol.requests > 0), protocol.waiting_since
    return 2, protocol.stalled_since or 0.0


def bounded_accept_errors(
    loop: asyncio.AbstractEventLoop, interval_s: float = 10.0
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """Install a loop exception handler that logs accept errors at a bounded rate.

    When the process runs out of file descriptors, asyncio's accept loop reports every
    failed ``accept()``; this handler logs the first, then at most one line per
    ``interval_s`` with the number suppressed. Other errors go to the previous handler.

    Returns:
        The handler (installed).
    """
    previous = loop.get_exception_handler()
    last_s = -float("inf")
    suppressed = 0

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        nonlocal last_s, suppressed
        if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            now = time.monotonic()
            if now - last_s < interval_s:
                suppressed += 1
                return
            exc = context.get("exception")
            log.error(
                "cannot accept connections: %s (%d more since the last report); raise the "
                "open-file limit (LimitNOFILE) or lower PERSEUS_MAX_CONNECTIONS",
                exc,
                suppressed,
            )
            last_s, suppressed = now, 0
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    return handler


_JOB_PREFIX = JOBS_PATH + "/"
_JOB_ID = re.compile(r"[0-9a-f]{32}")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class AuthBeforeBody:
    """Checks the bearer token of a request with a body before the body is read.

    FastAPI reads and parses a body before running the route's dependencies, so without
    this an unauthenticated client could make the server read, hold and parse as much
    JSON as the body cap allows. Applies to ``POST``/``PUT``/``PATCH`` with a body under
    ``/v1/jobs/{job_id}`` (the job's token or the admin token, from the cached job heads)
    and to ``POST /v1/jobs`` when an admin token is configured. The route checks again;
    a rejection closes the connection, whose unread body would otherwise follow.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        job_id: str | None = None
        if path.startswith(_JOB_PREFIX):
            job_id = path[len(_JOB_PREFIX) :].partition("/")[0]
        elif path != JOBS_PATH:
            await self.app(scope, receive, send)
            return
        state: ServerState | None = getattr(scope["app"].state, "perseus", None)
        if state is None or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        token = bearer_token(_header(scope, b"authorization"))
        try:
            if job_id is None:
                check_admin(token, state.admin_token_hash)
            else:
                if not _JOB_ID.fullmatch(job_id):
                    raise JobNotFound(f"no job {job_id!r}")
                row = await state.heads.get(job_id)
                check_job_token(token, row.token_hash, state.admin_token_hash)
        except PerseusError as exc:
            response = error_response(exc)
            response.headers["connection"] = "close"
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            text: str = value.decode("latin-1")
            return text
    return None


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    if length is not None:
        return length.strip() != "0"
    return _header(scope, b"transfer-encoding") is not None


# Query parameters the API defines; every other value is logged as "***".
_LOGGED_PARAMS = frozenset({"rank", "wait_s", "limit", "offset"})


def redact_query(path_with_query: str) -> str:
    """``path?a=1&token=x`` -> ``path?a=1&token=***`` for parameters outside the API's."""
    path, sep, query = path_with_query.partition("?")
    if not sep:
        return path
    parts = []
    for part in query.split("&"):
        name, eq, _value = part.partition("=")
        parts.append(part if name in _LOGGED_PARAMS or not eq else f"{name}=***")
    return f"{path}?{'&'.join(parts)}"


_PLAN_POLL = re.compile(re.escape(JOBS_PATH) + r"/[^/?]+/plan(\?|$)")


class AccessLogFilter(logging.Filter):
    """Redacts uvicorn access-log lines; plan polls that succeed log at debug.

    Uvicorn's access records carry ``(client, method, path?query, http_version, status)``
    as their arguments.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str)):
            return True
        path = redact_query(args[2])
        record.args = (args[0], args[1], path, args[3], args[4])
        if args[1] == "GET" and args[4] in (200, 304) and _PLAN_POLL.match(path):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def log_config() -> dict[str, Any]:
    """Uvicorn's logging config with :class:`AccessLogFilter` on the access log."""
    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = {
        **LOGGING_CONFIG,
        "filters": {"perseus_access": {"()": AccessLogFilter}},
        "handlers": {name: dict(h) for name, h in LOGGING_CONFIG["handlers"].items()},
    }
    config["handlers"]["access"]["filters"] = ["perseus_access"]
    return config
