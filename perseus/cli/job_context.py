"""Where a ``perseus job`` command talks to: the server, job and token from the command line
or the environment, and the planner reached with them.

Imports the HTTP client (httpx) only when a command talks to the planner, so ``perseus job
--help`` works without the client extra.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, TextIO

from perseus.core.errors import (
    AuthError,
    CommandError,
    JobNotFound,
    PerseusError,
    PlannerUnavailable,
    PlanNotReady,
    SettingsError,
)
from perseus.core.settings import ADMIN_TOKEN, JOB, SERVER, TOKEN

if TYPE_CHECKING:
    import httpx

    from perseus.client.api.client import PlannerClient

__all__ = [
    "ADMIN_TOKEN_ENV",
    "JOB_ENV",
    "SERVER_ENV",
    "TOKEN_ENV",
    "CommandError",
    "JobContext",
    "get_answer",
    "job_id_of",
    "job_path",
    "open_client",
    "send_answer",
    "server_url",
    "token_of",
]

# The variables' names, for messages and help (perseus.core.settings defines them).
SERVER_ENV = SERVER.name
JOB_ENV = JOB.name
TOKEN_ENV = TOKEN.name
ADMIN_TOKEN_ENV = ADMIN_TOKEN.name


class JobContext:
    """Where a job command talks to and writes: the server, the environment, the output."""

    def __init__(self, server: str, env: Mapping[str, str], out: TextIO) -> None:
        self.server = server
        self.env = env
        self.out = out


def server_url(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """The planner's URL: ``--server``, else ``$PERSEUS_SERVER`` (CommandError if neither)."""
    server: str | None = args.server or SERVER.text(env)
    if not server:
        raise CommandError(f"no planner server: pass --server URL or set ${SERVER_ENV}")
    try:
        SERVER.kind.parse(server, "--server")
    except SettingsError:
        raise CommandError(f"--server: expected http://HOST:PORT, got {server!r}") from None
    return server.rstrip("/")


def job_id_of(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """The job's id: ``JOB``, else ``$PERSEUS_JOB`` (CommandError if neither)."""
    job_id: str | None = args.job or JOB.text(env)
    if not job_id:
        raise CommandError(f"no job: give JOB or set ${JOB_ENV}")
    return job_id


def token_of(args: argparse.Namespace, env: Mapping[str, str], *, admin_first: bool) -> str:
    """The token: ``--token``, else the job's or the admin token from the environment."""
    order = (ADMIN_TOKEN, TOKEN) if admin_first else (TOKEN, ADMIN_TOKEN)
    token: str | None = args.token or next(
        (text for text in (var.text(env) for var in order) if text), None
    )
    if not token:
        raise CommandError(f"no token: pass --token or set ${TOKEN_ENV}")
    return token


def open_client(
    args: argparse.Namespace, ctx: JobContext, *, admin_first: bool = False
) -> PlannerClient:
    """A planner client for the job the command names, with its token."""
    import httpx

    from perseus.client.api.client import PlannerClient

    job_id = job_id_of(args, ctx.env)
    token = token_of(args, ctx.env, admin_first=admin_first)
    timeout = None if args.timeout is None else httpx.Timeout(args.timeout)
    return PlannerClient.open(ctx.server, job_id, token, timeout=timeout)


def get_answer(
    ctx: JobContext, args: argparse.Namespace, path: str, token: str | None
) -> httpx.Response:
    """``GET path`` on the planner; a failed answer becomes the error it stands for."""
    import httpx

    from perseus.client.api.client import DEFAULT_TIMEOUT

    timeout = DEFAULT_TIMEOUT if args.timeout is None else httpx.Timeout(args.timeout)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=ctx.server, timeout=timeout) as http:
            response = http.get(path, headers=headers)
    except httpx.HTTPError as err:
        raise PlannerUnavailable(
            f"planner {ctx.server} unreachable (GET {path}): {type(err).__name__}: {err}"
        ) from err
    if response.status_code == 200:
        return response
    raise _answer_error(response, f"GET {path}")


def send_answer(
    ctx: JobContext,
    args: argparse.Namespace,
    method: str,
    path: str,
    token: str | None,
    body: object | None = None,
) -> httpx.Response:
    """``method path`` (with a JSON ``body``) on the planner; a failed answer becomes the
    error it stands for, a 422 naming each rejected field."""
    import httpx

    from perseus.client.api.client import DEFAULT_TIMEOUT

    timeout = DEFAULT_TIMEOUT if args.timeout is None else httpx.Timeout(args.timeout)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=ctx.server, timeout=timeout) as http:
            response = http.request(method, path, headers=headers, json=body)
    except httpx.HTTPError as err:
        raise PlannerUnavailable(
            f"planner {ctx.server} unreachable ({method} {path}): {type(err).__name__}: {err}"
        ) from err
    if response.is_success:
        return response
    if response.status_code == 422:
        try:
            detail = response.json().get("detail")
        except (ValueError, AttributeError):
            detail = None
        if isinstance(detail, list):
            fields = "; ".join(
                f"{'.'.join(str(p) for p in d.get('loc', []) if p != 'body') or 'request'}: "
                f"{d.get('msg', '')}"
                for d in detail
                if isinstance(d, dict)
            )
            raise PerseusError(f"the planner refused it: {fields}")
    raise _answer_error(response, f"{method} {path}")


def _answer_error(response: httpx.Response, where: str) -> PerseusError:
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    message = detail if isinstance(detail, str) else f"{where}: HTTP {status}"
    if status in (401, 403):
        return AuthError(message, status)
    if status == 404:
        return JobNotFound(message)
    if status == 409 and isinstance(body, dict) and isinstance(body.get("state"), str):
        return PlanNotReady(message, body["state"])
    if status >= 500:
        return PlannerUnavailable(f"{where}: the planner failed (HTTP {status}): {message}")
    return PerseusError(message)


def job_path(template: str, job_id: str) -> str:
    """A job URL path from its template, the id quoted."""
    from urllib.parse import quote

    return template.format(job_id=quote(job_id, safe=""))
