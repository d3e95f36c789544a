"""One request to the planner: send it, read its answer (bounded), map its errors, parse it.

Every call raises only errors of :mod:`perseus.core.errors`, mapped in one place
(:func:`call_planner`, with :func:`_transport_errors` and :func:`_error_from_response`):
see :mod:`perseus.client.api.client` for the table. Reading an error answer does no I/O of its
own, so the mapping is tested without a server.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from perseus.core.errors import (
    AnswerNotUnderstood,
    AuthError,
    JobStateError,
    PerseusError,
    PlannerUnavailable,
    PlanNotReady,
    PlanTooLarge,
    RequestFieldError,
    RequestRejected,
    error_named,
)
from perseus.schemas import (
    ErrorBody,
    ValidationErrorBody,
)

__all__ = [
    "AnswerNotUnderstood",
    "PlanTooLarge",
    "call_planner",
    "garbage_error",
    "parse_reply",
    "shown_body",
]

_M = TypeVar("_M", bound=BaseModel)

_GARBAGE_SHOWN = 200  # characters of an unexpected body quoted in the error


# ----------------------------------------------------------------------------- errors


def _located(loc: Sequence[str | int], msg: str) -> str:
    """``body.rows.3.time_s: msg``; an error about a whole body is its message alone."""
    where = ".".join(str(part) for part in loc)
    return msg if where in ("", "body", "query", "path") else f"{where}: {msg}"


@contextmanager
def _transport_errors(http: httpx.Client, where: str) -> Iterator[None]:
    """Turn httpx's request errors (connect, read, write, timeouts, undecodable answers) into
    PlannerUnavailable."""
    try:
        yield
    except httpx.TransportError as err:
        raise PlannerUnavailable(
            f"planner {http.base_url} unreachable ({where}): {type(err).__name__}: {err}"
        ) from err
    except httpx.RequestError as err:  # an answer httpx cannot read (a bad Content-Encoding)
        raise PlannerUnavailable(
            f"{where}: the server answered garbage: {type(err).__name__}: {err}"
        ) from err


def garbage_error(where: str, status: int, what: str) -> PlannerUnavailable:
    """The server answered something no planner answers (``what`` says what)."""
    return PlannerUnavailable(f"{where}: the server answered garbage (HTTP {status}): {what}")


def shown_body(content: bytes) -> str:
    """The start of an unexpected body, quoted for an error message."""
    text = content[:_GARBAGE_SHOWN].decode("utf-8", "replace")
    return repr(text) + (" ..." if len(content) > _GARBAGE_SHOWN else "")


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    try:
        seconds = float(value)
    except ValueError:
        return None  # absent, or an HTTP date: the caller's backoff decides alone
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _error_from_response(response: httpx.Response, where: str) -> PerseusError:
    """The error an unsuccessful planner answer stands for (no I/O: the body is read)."""
    status = response.status_code
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    if status >= 500:
        detail = body.get("detail") if isinstance(body, dict) else None
        reason = detail if isinstance(detail, str) else response.reason_phrase
        return PlannerUnavailable(f"{where}: the planner failed (HTTP {status}): {reason}")
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        return garbage_error(where, status, f"not a planner error: {shown_body(response.content)}")
    if isinstance(body.get("detail"), list):
        try:
            fields = ValidationErrorBody.model_validate(body, extra="ignore")
        except ValidationError:
            return garbage_error(
                where, status, f"not a planner error: {shown_body(response.content)}"
            )
        name = fields.error
        message = "; ".join(_located(f.loc, f.msg) for f in fields.detail)
        state = None
    else:
        try:
            error = ErrorBody.model_validate(body, extra="ignore")
        except ValidationError:
            return garbage_error(
                where, status, f"not a planner error: {shown_body(response.content)}"
            )
        name, message, state = error.error, error.detail, error.state
    if status in (401, 403):
        return AuthError(message, status)
    if name == PlanNotReady.__name__:
        if state is None:  # not ready, but the server did not say why: still a state error
            return JobStateError(message)
        return PlanNotReady(message, state, retry_after_s=_retry_after_s(response))
    # The server's own status table (perseus.core.errors.HTTP_STATUS) read back by name. A
    # RequestFieldError comes as fields, like pydantic's errors: RequestRejected, as those.
    cls = error_named(name)
    if cls is None or cls is RequestFieldError:
        return RequestRejected(message, status)
    return cls(message)


def call_planner(
    http: httpx.Client,
    method: str,
    path: str,
    *,
    token: str | None,
    json: Any = None,
    params: Mapping[str, str | int | float] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: httpx.Timeout | None = None,
    expect: frozenset[int] = frozenset({200}),
    max_bytes: int | None = None,
) -> httpx.Response:
    """Send one request; the answer if its status is in ``expect``, else the mapped error.

    ``max_bytes`` bounds a 200 answer's body: a longer one is refused unread (PlanTooLarge).

    Raises:
        PerseusError: as the module docstring lists.
    """
    where = f"{method} {path}"
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    with _transport_errors(http, where):
        request = http.build_request(
            method,
            path,
            json=json,
            params=params,
            headers=sent,
            timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
        )
        response = http.send(request, stream=max_bytes is not None)
    if max_bytes is not None:
        # errors and 304s are short: 1 MiB bounds them as well
        limit = max_bytes if response.status_code == 200 else 1 << 20
        response = _read_bounded(http, response, where, limit)
    if response.status_code in expect:
        return response
    if response.status_code < 400:  # a redirect, or a success we did not ask for
        raise garbage_error(where, response.status_code, "not an answer this request can have")
    raise _error_from_response(response, where)


def _etag_version(response: httpx.Response) -> int | None:
    text = response.headers.get("ETag", "").strip().removeprefix("W/").strip('"')
    return int(text) if text.isascii() and text.isdigit() and len(text) < 19 else None


def _read_bounded(
    http: httpx.Client, response: httpx.Response, where: str, limit: int
) -> httpx.Response:
    """A streamed answer read whole, unless it is longer than ``limit``.

    Raises:
        PlanTooLarge: it is (by Content-Length, or once ``limit`` bytes came); closed unread.
    """
    try:
        declared = response.headers.get("Content-Length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            raise PlanTooLarge(
                f"{where}: the plan is {int(declared):,} bytes, more than this rank takes "
                f"({limit:,})",
                _etag_version(response),
                int(declared),
            )
        chunks: list[bytes] = []
        size = 0
        with _transport_errors(http, where):
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > limit:
                    raise PlanTooLarge(
                        f"{where}: the plan is more than {limit:,} bytes, more than this rank "
                        "takes",
                        _etag_version(response),
                        size,
                    )
                chunks.append(chunk)
    finally:
        response.close()
    # the body is decoded already: drop what described it on the wire
    headers = [
        (k, v)
        for k, v in response.headers.multi_items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    return httpx.Response(
        response.status_code,
        headers=headers,
        content=b"".join(chunks),
        request=response.request,
    )


def parse_reply(model: type[_M], response: httpx.Response) -> _M:
    """The reply as ``model``, ignoring fields the model does not know.

    A newer server may answer with fields this client has never heard of; they are dropped
    here, on the client, so a planner can grow its answers without un-planning the ranks
    already running. (The server still refuses unknown fields in requests: ``extra`` is
    overridden for this parse only, the models stay ``extra="forbid"``.)

    Raises:
        AnswerNotUnderstood: A field the model needs is missing or not what it expects.
    """
    try:
        return model.model_validate_json(response.content, extra="ignore")
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "body"
        where = f"{response.request.method} {response.request.url.path}"
        raise AnswerNotUnderstood(
            f"{where}: the server answered garbage (HTTP {response.status_code}): "
            f"not a {model.__name__}: {loc}: {first['msg']}"
        ) from err
