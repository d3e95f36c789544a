"""Where a ``perseus job`` command talks to: the server, job and token from flags or the
environment, the planner client opened with them, job paths, and a GET whose failed answers
become the errors they stand for (against a scripted HTTP server on loopback)."""

from __future__ import annotations

import argparse
import io
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from perseus.cli.job_context import (
    ADMIN_TOKEN_ENV,
    JOB_ENV,
    SERVER_ENV,
    TOKEN_ENV,
    CommandError,
    JobContext,
    get_answer,
    job_id_of,
    job_path,
    open_client,
    server_url,
    token_of,
)
from perseus.core.errors import (
    AuthError,
    JobNotFound,
    PerseusError,
    PlannerUnavailable,
    PlanNotReady,
)


def args(**given: object) -> argparse.Namespace:
    fields: dict[str, object] = {"server": None, "job": None, "token": None, "timeout": None}
    return argparse.Namespace(**(fields | given))


# ----------------------------------------------------------------------------- flags and env


def test_the_server_flag_wins_over_the_environment() -> None:
    env = {SERVER_ENV: "http://env:1"}
    assert server_url(args(server="https://flag:2/"), env) == "https://flag:2"
    assert server_url(args(), env) == "http://env:1"


@pytest.mark.parametrize(
    ("server", "message"),
    [(None, r"pass --server URL or set \$PERSEUS_SERVER"), ("planner:7787", "expected http://")],
)
def test_a_missing_or_malformed_server_is_a_command_error(server: str | None, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        server_url(args(server=server), {})


def test_the_job_from_the_argument_else_the_environment() -> None:
    assert job_id_of(args(job="j1"), {JOB_ENV: "j2"}) == "j1"
    assert job_id_of(args(), {JOB_ENV: "j2"}) == "j2"
    with pytest.raises(CommandError, match=r"give JOB or set \$PERSEUS_JOB"):
        job_id_of(args(), {JOB_ENV: ""})


def test_the_token_flag_then_the_job_or_admin_token_as_asked() -> None:
    both = {TOKEN_ENV: "job", ADMIN_TOKEN_ENV: "admin"}
    assert token_of(args(token="flag"), both, admin_first=True) == "flag"
    assert token_of(args(), both, admin_first=False) == "job"
    assert token_of(args(), both, admin_first=True) == "admin"
    assert token_of(args(), {ADMIN_TOKEN_ENV: "admin"}, admin_first=False) == "admin"
    assert token_of(args(), {TOKEN_ENV: "job"}, admin_first=True) == "job"
    with pytest.raises(CommandError, match="no token"):
        token_of(args(), {TOKEN_ENV: ""}, admin_first=False)


def test_job_paths_quote_the_id() -> None:
    assert job_path("/v1/jobs/{job_id}/plan", "abc") == "/v1/jobs/abc/plan"
    assert job_path("/v1/jobs/{job_id}", "a/b c?") == "/v1/jobs/a%2Fb%20c%3F"


def test_the_client_is_for_the_named_job_with_the_given_timeout() -> None:
    ctx = JobContext("http://127.0.0.1:9", {JOB_ENV: "j", TOKEN_ENV: "t"}, io.StringIO())
    with open_client(args(timeout=2.5), ctx) as client:
        assert client.job_id == "j"
        assert str(client.http.base_url).rstrip("/") == "http://127.0.0.1:9"
        assert client.http.timeout == httpx.Timeout(2.5)
    assert client.http.is_closed
    with pytest.raises(CommandError, match="no job"):
        open_client(args(), JobContext(ctx.server, {}, ctx.out))


# ----------------------------------------------------------------------------- get_answer

ANSWERS: dict[str, tuple[int, bytes]] = {
    "/ok": (200, b'{"fine": true}'),
    "/auth": (403, b'{"detail": "wrong token"}'),
    "/missing": (404, b'{"detail": "no job x"}'),
    "/early": (409, b'{"detail": "not planned yet", "state": "profiling"}'),
    "/conflict": (409, b'{"detail": "busy"}'),
    "/broken": (503, b"<html>down</html>"),
    "/teapot": (418, b"short and stout"),
}


class Scripted(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, body = ANSWERS[self.path]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Seen-Authorization", self.headers.get("Authorization", "-"))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def planner() -> Iterator[JobContext]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    try:
        yield JobContext(f"http://{host!s}:{port}", {}, io.StringIO())
    finally:
        server.shutdown()
        server.server_close()


def test_a_200_is_the_answer_with_the_token_sent(planner: JobContext) -> None:
    response = get_answer(planner, args(timeout=5.0), "/ok", "secret")
    assert json.loads(response.content) == {"fine": True}
    assert response.headers["X-Seen-Authorization"] == "Bearer secret"
    anonymous = get_answer(planner, args(), "/ok", None)
    assert anonymous.headers["X-Seen-Authorization"] == "-"


@pytest.mark.parametrize(
    ("path", "error", "message"),
    [
        ("/auth", AuthError, "wrong token"),
        ("/missing", JobNotFound, "no job x"),
        ("/early", PlanNotReady, "not planned yet"),
        ("/broken", PlannerUnavailable, r"GET /broken: the planner failed \(HTTP 503\)"),
        ("/conflict", PerseusError, "busy"),
        ("/teapot", PerseusError, "GET /teapot: HTTP 418"),
    ],
)
def test_a_failed_answer_is_the_error_it_stands_for(
    planner: JobContext, path: str, error: type[PerseusError], message: str
) -> None:
    with pytest.raises(error, match=message) as caught:
        get_answer(planner, args(timeout=5.0), path, "t")
    assert type(caught.value) is error
    if isinstance(caught.value, AuthError):
        assert caught.value.status_code == 403
    if isinstance(caught.value, PlanNotReady):
        assert caught.value.state == "profiling"


def test_an_unreachable_planner_is_unavailable() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = JobContext(f"http://127.0.0.1:{port}", {}, io.StringIO())
    with pytest.raises(PlannerUnavailable, match=rf"127\.0\.0\.1:{port} unreachable \(GET /ok\)"):
        get_answer(ctx, args(timeout=5.0), "/ok", None)
