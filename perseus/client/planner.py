"""The planner HTTP client: what a rank, or an operator, asks the planner server about a job.

:class:`PlannerClient` speaks for one job over an ``httpx.Client`` it is given (with
``base_url`` set), so tests pass FastAPI's ``TestClient`` or an ``httpx.MockTransport``;
:meth:`PlannerClient.open` builds one with explicit timeouts. Requests and replies are the
models of :mod:`perseus.schemas`, parsed with the same models the server renders them with.

Every call raises only errors of :mod:`perseus.errors`, mapped in one place
(:func:`_call`, with :func:`_transport_errors` and :func:`_error_from_response`):

- connecting, reading, writing or a timeout (``httpx.TransportError``), an answer httpx
  cannot decode (``httpx.DecodingError``), and any 5xx, become
  :class:`~perseus.errors.PlannerUnavailable`, raised from the original;
- a planner error body (``{"detail", "error"}``) becomes the class its ``error`` names, the
  server's status table read backwards: ``JobNotFound``, ``AuthError`` (with its 401 or 403),
  ``PlanNotReady`` (with the job's ``state`` and ``Retry-After``), ``JobStateError``,
  ``PlanError``, ``ProfileError``, ``ScheduleError``, ``PolicyError``, ``InfeasibleDeadline``;
  any other 4xx (422 validation, 413) becomes :class:`~perseus.errors.RequestRejected`, its
  fields named by path (``body.rows.3.time_s: ...``);
- a body that is not JSON, or not the model expected, is the server answering garbage:
  :class:`~perseus.errors.PlannerUnavailable` saying so.

Nothing here retries by itself. A caller that loops (a rank's background thread) retries with
:func:`perseus.client.retry.retry_call`, which asks ``retryable`` (the planner down or busy, a
plan not ready yet: yes; a bad token, an unknown job, a rejected request: no) and waits
``Backoff.delay_s`` on a ``threading.Event`` it can be woken from. Every request the
client makes is safe to repeat: reads are reads, a rank registers again with the same
coordinates, and a profile or iteration report sent twice replaces the first.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from perseus.errors import (
    AuthError,
    InfeasibleDeadline,
    JobNotFound,
    JobStateError,
    PerseusError,
    PlanError,
    PlannerUnavailable,
    PlanningTooLarge,
    PlanNotReady,
    PolicyError,
    ProfileError,
    QuotaExceeded,
    RequestRejected,
    ScheduleError,
)
from perseus.schemas import (
    FRONTIER_PATH,
    GAVE_UP_PATH,
    ITERATIONS_PATH,
    JOB_PATH,
    JOBS_PATH,
    PLAN_COMPUTE_PATH,
    PLAN_PATH,
    POLICY_PATH,
    PROFILE_CSV_PATH,
    PROFILES_PATH,
    RANKS_PATH,
    STRAGGLER_PATH,
    ErrorBody,
    FrontierView,
    GaveUpAccepted,
    GaveUpReport,
    IterationAccepted,
    IterationReport,
    JobCreate,
    JobCreated,
    JobView,
    PlanResponse,
    PlanVersion,
    PolicySpec,
    ProfileAccepted,
    ProfileReport,
    RankRegistered,
    RankRegistration,
    StragglerSpec,
    ValidationErrorBody,
)
from perseus.wire.ranks import MAX_REASON_CHARS

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_TIMEOUT",
    "KEEPALIVE_EXPIRY_S",
    "LONG_POLL_MARGIN_S",
    "PlanTooLarge",
    "PlannerClient",
    "create_job",
]

T = TypeVar("T")
_M = TypeVar("_M", bound=BaseModel)

DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=30.0, write=30.0, pool=10.0)
"""Timeouts of :meth:`PlannerClient.open` when none are given, in seconds."""

KEEPALIVE_EXPIRY_S = 60.0
"""An idle pooled connection is dropped after this long: below the server's keep-alive
(``PERSEUS_KEEP_ALIVE_S``, 75 s), so the client never reuses a connection the server is
closing at that moment (which fails with "Server disconnected without sending a response")."""

DEFAULT_LIMITS = httpx.Limits(
    max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_EXPIRY_S
)
"""Connection pool of :meth:`PlannerClient.open`: httpx's defaults but the idle expiry."""

LONG_POLL_MARGIN_S = 10.0
"""A long poll's read timeout is its ``wait_s`` plus this: the server's time to answer."""

# The server's error names read back into our classes: its status table (http_errors._STATUS)
# inverted once, by name. 5xx answers (SolverTimeout among them) are PlannerUnavailable
# whatever they name; names not listed here answer RequestRejected.
_ERROR_CLASSES: Mapping[str, type[PerseusError]] = {
    cls.__name__: cls
    for cls in (
        JobNotFound,
        JobStateError,
        PlanError,
        ProfileError,
        ScheduleError,
        PolicyError,
        InfeasibleDeadline,
        PlanningTooLarge,
        QuotaExceeded,
    )
}
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


def _garbage(where: str, status: int, what: str) -> PlannerUnavailable:
    return PlannerUnavailable(f"{where}: the server answered garbage (HTTP {status}): {what}")


def _shown(content: bytes) -> str:
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
        return _garbage(where, status, f"not a planner error: {_shown(response.content)}")
    if isinstance(body.get("detail"), list):
        try:
            fields = ValidationErrorBody.model_validate(body)
        except ValidationError:
            return _garbage(where, status, f"not a planner error: {_shown(response.content)}")
        name = fields.error
        message = "; ".join(_located(f.loc, f.msg) for f in fields.detail)
        state = None
    else:
        try:
            error = ErrorBody.model_validate(body)
        except ValidationError:
            return _garbage(where, status, f"not a planner error: {_shown(response.content)}")
        name, message, state = error.error, error.detail, error.state
    if status in (401, 403):
        return AuthError(message, status)
    if name == PlanNotReady.__name__:
        if state is None:  # not ready, but the server did not say why: still a state error
            return JobStateError(message)
        return PlanNotReady(message, state, retry_after_s=_retry_after_s(response))
    cls = _ERROR_CLASSES.get(name)
    if cls is not None:
        return cls(message)
    return RequestRejected(message, status)


def _call(
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
        raise _garbage(where, response.status_code, "not an answer this request can have")
    raise _error_from_response(response, where)


class PlanTooLarge(PlanError):
    """A plan's answer is longer than the rank allows; refused before it is read whole.

    Attributes:
        version: The plan's version from its ETag (None when the server sent none).
        size_bytes: Its length as far as known (Content-Length, else what was read).
    """

    def __init__(self, message: str, version: int | None = None, size_bytes: int = 0) -> None:
        super().__init__(message)
        self.version = version
        self.size_bytes = size_bytes


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


def _parse(model: type[_M], response: httpx.Response) -> _M:
    """The reply as ``model``, or PlannerUnavailable when it is not one."""
    try:
        return model.model_validate_json(response.content)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "body"
        where = f"{response.request.method} {response.request.url.path}"
        raise _garbage(
            where, response.status_code, f"not a {model.__name__}: {loc}: {first['msg']}"
        ) from err


# ----------------------------------------------------------------------------- the client


def create_job(http: httpx.Client, spec: JobCreate, admin_token: str | None) -> JobCreated:
    """Create a job on the planner.

    Args:
        http: a client with the server's ``base_url``.
        spec: the job.
        admin_token: the server's admin token, if it has one.

    Returns:
        The job's id and token (the token is shown only this once).

    Raises:
        AuthError: the server needs the admin token (401), or it is wrong (403).
        RequestRejected: the server rejected the spec.
        PlannerUnavailable: the server cannot be reached or answered garbage.
    """
    response = _call(
        http,
        "POST",
        JOBS_PATH,
        token=admin_token,
        json=spec.model_dump(mode="json", exclude_unset=True),
        expect=frozenset({201}),
    )
    return _parse(JobCreated, response)


class PlannerClient:
    """The planner API of one job, authorized by its token (or the admin token).

    Args:
        http: a client with the server's ``base_url`` (and its timeouts); closed by
            :meth:`close` only when :meth:`open` made it.
        job_id: the job's id.
        token: the job's token, or the admin token.
        long_poll_margin_s: added to a plan long poll's ``wait_s`` for its read timeout.

    Every method raises the errors listed in the module docstring; the Raises sections
    name those a caller is likely to handle.
    """

    def __init__(
        self,
        http: httpx.Client,
        job_id: str,
        token: str,
        *,
        long_poll_margin_s: float = LONG_POLL_MARGIN_S,
    ) -> None:
        self._http = http
        self._owns_http = False
        self._token = token
        self._margin_s = long_poll_margin_s
        self.job_id = job_id
        self._ids = {"job_id": quote(job_id, safe="")}

    @property
    def http(self) -> httpx.Client:
        """The httpx client the requests go through (its timeouts, whether it is closed)."""
        return self._http

    @classmethod
    def open(
        cls, server_url: str, job_id: str, token: str, *, timeout: httpx.Timeout | None = None
    ) -> PlannerClient:
        """A client with its own connection pool to ``server_url``; :meth:`close` it.

        Args:
            server_url: e.g. ``http://planner:7787``.
            job_id: the job's id.
            token: the job's token, or the admin token.
            timeout: connect, read, write and pool timeouts; :data:`DEFAULT_TIMEOUT` if None.
        """
        http = httpx.Client(
            base_url=server_url, timeout=timeout or DEFAULT_TIMEOUT, limits=DEFAULT_LIMITS
        )
        client = cls(http, job_id, token)
        client._owns_http = True
        return client

    def close(self) -> None:
        """Close the connection pool, if :meth:`open` made it."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> PlannerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _path(self, template: str) -> str:
        return template.format(**self._ids)

    def _send(
        self,
        method: str,
        template: str,
        model: type[_M],
        body: BaseModel | None = None,
        *,
        expect: frozenset[int] = frozenset({200}),
    ) -> _M:
        response = _call(
            self._http,
            method,
            self._path(template),
            token=self._token,
            json=None if body is None else body.model_dump(mode="json"),
            expect=expect,
        )
        return _parse(model, response)

    def job(self) -> JobView:
        """The job's state, counts, policy, straggler, chosen point and telemetry.

        Raises:
            JobNotFound: no such job.
            AuthError: the token is not the job's (403) or missing (401).
        """
        return self._send("GET", JOB_PATH, JobView)

    def register(self, body: RankRegistration) -> RankRegistered:
        """Register a rank; a restarted rank registers again with the same coordinates.

        Raises:
            JobStateError: the coordinates clash with the job or another rank.
            RequestRejected: a field is out of range for the job.
        """
        return self._send("POST", RANKS_PATH, RankRegistered, body)

    def report_gave_up(self, rank: int, reason: str) -> GaveUpAccepted:
        """Tell the planner that ``rank`` stopped planning and why (cut to what the wire
        takes), for the job view.

        Raises:
            JobNotFound: no such job.
            RequestRejected: the rank is outside the job.
        """
        body = GaveUpReport(rank=rank, reason=reason[:MAX_REASON_CHARS] or "unknown")
        return self._send("POST", GAVE_UP_PATH, GaveUpAccepted, body)

    def report_profile(self, body: ProfileReport) -> ProfileAccepted:
        """Report a rank's measured profile of its stage; the last one starts planning.

        Raises:
            JobStateError: the rank has not registered.
            ProfileError, RequestRejected: the rows are unusable.
        """
        return self._send("POST", PROFILES_PATH, ProfileAccepted, body)

    def plan(
        self,
        rank: int,
        *,
        version: int | None = None,
        wait_s: float = 0.0,
        max_bytes: int | None = None,
    ) -> PlanResponse | None:
        """The rank's plan, or None while ``version`` is still current.

        Args:
            rank: the asking rank.
            version: the plan version the rank runs (sent as ``If-None-Match``).
            wait_s: long poll: the server holds the request up to this long (it caps it)
                until a plan newer than ``version`` exists. The read timeout is ``wait_s``
                plus the client's long-poll margin.
            max_bytes: the longest answer taken; a longer one is refused before it is read
                whole or parsed (None: no bound).

        Returns:
            The plan, or None when the server answered 304 (``version`` is current).

        Raises:
            ValueError: ``wait_s`` is negative or not finite.
            PlanNotReady: no plan yet (``.state`` says where the job stands).
            JobStateError: the rank has not registered.
            PlanTooLarge: the answer is longer than ``max_bytes``.
        """
        if not (math.isfinite(wait_s) and wait_s >= 0):
            raise ValueError(f"wait_s must be a finite number >= 0, got {wait_s!r}")
        params: dict[str, str | int | float] = {"rank": rank}
        timeout = None
        if wait_s > 0:
            params["wait_s"] = wait_s
            base = self._http.timeout
            timeout = httpx.Timeout(
                connect=base.connect,
                read=wait_s + self._margin_s,
                write=base.write,
                pool=base.pool,
            )
        response = _call(
            self._http,
            "GET",
            self._path(PLAN_PATH),
            token=self._token,
            params=params,
            headers=None if version is None else {"If-None-Match": f'"{version}"'},
            timeout=timeout,
            expect=frozenset({200, 304}),
            max_bytes=max_bytes,
        )
        if response.status_code == 304:
            return None
        return _parse(PlanResponse, response)

    def report_iteration(self, body: IterationReport) -> IterationAccepted:
        """Report one measured iteration of a rank.

        Raises:
            JobStateError: the rank has not registered.
        """
        return self._send("POST", ITERATIONS_PATH, IterationAccepted, body)

    def frontier(self) -> FrontierView:
        """The job's time-energy frontier, baselines and chosen index.

        Raises:
            PlanNotReady: no frontier yet (``.state`` says where the job stands).
        """
        return self._send("GET", FRONTIER_PATH, FrontierView)

    def replan(self) -> PlanVersion:
        """Plan the job again now, on the profiles in (``POST .../plan:compute``).

        Raises:
            JobStateError: it is planning already, or a stage lacks a profile.
        """
        return self._send("POST", PLAN_COMPUTE_PATH, PlanVersion, expect=frozenset({202}))

    def set_policy(self, policy: PolicySpec) -> PlanVersion:
        """Change the job's policy; with a frontier, plans move to a new version.

        Raises:
            InfeasibleDeadline: the deadline is shorter than the fastest plan.
            PolicyError, RequestRejected: the policy is invalid.
        """
        return self._send("PUT", POLICY_PATH, PlanVersion, policy)

    def set_straggler(self, body: StragglerSpec) -> PlanVersion:
        """Declare that another pipeline sets the pace: plans move along the frontier.

        Raises:
            InfeasibleDeadline: the iteration time is shorter than the fastest plan.
        """
        return self._send("PUT", STRAGGLER_PATH, PlanVersion, body)

    def clear_straggler(self) -> PlanVersion:
        """No straggler any more: plans go back to the policy's point."""
        return self._send("DELETE", STRAGGLER_PATH, PlanVersion)

    def profile_csv(self) -> str:
        """The job's profile, its ranks merged as for planning, as Zeus CSV.

        The text is what ``perseus plan`` reads as it is
        (``stage,instruction,frequency,time,energy``, then ``p_block_w`` when it is known).

        Raises:
            JobStateError: some stage has no profile from each of its tensor-parallel ranks.
        """
        path = self._path(PROFILE_CSV_PATH)
        response = _call(self._http, "GET", path, token=self._token)
        if not response.headers.get("Content-Type", "").startswith("text/csv"):
            raise _garbage(
                f"GET {path}", response.status_code, f"not CSV: {_shown(response.content)}"
            )
        return response.text

    def delete(self) -> None:
        """Delete the job (the admin token if the server has one, else the job's token).

        Raises:
            AuthError: the server needs the admin token for this.
        """
        _call(
            self._http,
            "DELETE",
            self._path(JOB_PATH),
            token=self._token,
            expect=frozenset({204}),
        )
