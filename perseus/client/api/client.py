"""The planner HTTP client: what a rank, or an operator, asks the planner server about a job.

:class:`PlannerClient` speaks for one job over an ``httpx.Client`` it is given (with
``base_url`` set), so tests pass FastAPI's ``TestClient`` or an ``httpx.MockTransport``;
:meth:`PlannerClient.open` builds one with explicit timeouts. Requests and replies are the
models of :mod:`perseus.schemas`, parsed with the same models the server renders them with.

Every call raises only errors of :mod:`perseus.core.errors`, mapped in one place
(:func:`perseus.client.api.http.call_planner`, in :mod:`perseus.client.api.http`):

- connecting, reading, writing or a timeout (``httpx.TransportError``), an answer httpx
  cannot decode (``httpx.DecodingError``), and any 5xx, become
  :class:`~perseus.core.errors.PlannerUnavailable`, raised from the original;
- a planner error body (``{"detail", "error"}``) becomes the class its ``error`` names, the
  server's status table read backwards: ``JobNotFound``, ``AuthError`` (with its 401 or 403),
  ``PlanNotReady`` (with the job's ``state`` and ``Retry-After``), ``JobStateError``,
  ``PlanError``, ``ProfileError``, ``ScheduleError``, ``PolicyError``, ``InfeasibleDeadline``;
  any other 4xx (422 validation, 413) becomes :class:`~perseus.core.errors.RequestRejected`, its
  fields named by path (``body.rows.3.time_s: ...``);
- a body that is not JSON, or not the model expected, is the server answering garbage:
  :class:`~perseus.core.errors.PlannerUnavailable` saying so.

Nothing here retries by itself. A caller that loops (a rank's background thread) retries with
:func:`perseus.client.api.retry.retry_call`, which asks ``retryable`` (the planner down or busy, a
plan not ready yet: yes; a bad token, an unknown job, a rejected request: no) and waits
``Backoff.delay_s`` on a ``threading.Event`` it can be woken from. Every request the
client makes is safe to repeat: reads are reads, a rank registers again with the same
coordinates, and a profile or iteration report sent twice replaces the first.
"""

from __future__ import annotations

import math
from types import TracebackType
from typing import TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from perseus.client.api.http import (
    PlanTooLarge,
    call_planner,
    garbage_error,
    parse_reply,
    shown_body,
)
from perseus.schemas import (
    CLOCK_LATENCY_HEADER,
    CLOCK_LATENCY_PATH,
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
    ClockLatencyAccepted,
    ClockLatencyReport,
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
    response = call_planner(
        http,
        "POST",
        JOBS_PATH,
        token=admin_token,
        json=spec.model_dump(mode="json", exclude_unset=True),
        expect=frozenset({201}),
    )
    return parse_reply(JobCreated, response)


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
        self.takes_clock_latency = False
        """Whether the planner's last registration answer said it takes the rank's measured
        clock-change latency (``X-Perseus-Clock-Latency``); an older planner does not."""

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
        exclude_none: bool = False,
    ) -> _M:
        response = call_planner(
            self._http,
            method,
            self._path(template),
            token=self._token,
            json=None if body is None else body.model_dump(mode="json", exclude_none=exclude_none),
            expect=expect,
        )
        return parse_reply(model, response)

    def job(self) -> JobView:
        """The job's state, counts, policy, straggler, chosen point and telemetry.

        Raises:
            JobNotFound: no such job.
            AuthError: the token is not the job's (403) or missing (401).
        """
        return self._send("GET", JOB_PATH, JobView)

    def register(self, body: RankRegistration) -> RankRegistered:
        """Register a rank; a restarted rank registers again with the same coordinates.

        Sets :attr:`takes_clock_latency` from the answer.

        Raises:
            JobStateError: the coordinates clash with the job or another rank.
            RequestRejected: a field is out of range for the job.
        """
        response = call_planner(
            self._http,
            "POST",
            self._path(RANKS_PATH),
            token=self._token,
            json=body.model_dump(mode="json"),
        )
        reply = parse_reply(RankRegistered, response)
        self.takes_clock_latency = response.headers.get(CLOCK_LATENCY_HEADER) == "1"
        return reply

    def report_clock_latency(self, rank: int, latency_s: float) -> ClockLatencyAccepted:
        """Report a rank's measured clock-change latency (only to a planner whose
        registration answer said it takes one: :attr:`takes_clock_latency`).

        Raises:
            JobStateError: the rank has not registered.
            RequestRejected: the latency is out of range (0 <= x < 1 s), or the planner
                knows no such report.
        """
        body = ClockLatencyReport(rank=rank, clock_change_latency_s=latency_s)
        return self._send("POST", CLOCK_LATENCY_PATH, ClockLatencyAccepted, body)

    def report_gave_up(self, rank: int, reason: str) -> GaveUpAccepted:
        """Tell the planner that ``rank`` stopped planning and why (cut to what the wire
        takes), for the job view.

        Raises:
            JobNotFound: no such job.
            RequestRejected: the rank is outside the job.
        """
        # NULs go before the cut: the wire drops them, and a reason of NULs alone is empty.
        text = reason.replace("\x00", "")[:MAX_REASON_CHARS] or "unknown"
        body = GaveUpReport(rank=rank, reason=text)
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
        response = call_planner(
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
        return parse_reply(PlanResponse, response)

    def report_iteration(self, body: IterationReport) -> IterationAccepted:
        """Report one measured iteration of a rank.

        Fields left null are left out, so that a planner older than a field takes the
        report.

        Raises:
            JobStateError: the rank has not registered.
        """
        return self._send("POST", ITERATIONS_PATH, IterationAccepted, body, exclude_none=True)

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
        response = call_planner(self._http, "GET", path, token=self._token)
        if not response.headers.get("Content-Type", "").startswith("text/csv"):
            raise garbage_error(
                f"GET {path}", response.status_code, f"not CSV: {shown_body(response.content)}"
            )
        return response.text

    def delete(self) -> None:
        """Delete the job (the admin token if the server has one, else the job's token).

        Raises:
            AuthError: the server needs the admin token for this.
        """
        call_planner(
            self._http,
            "DELETE",
            self._path(JOB_PATH),
            token=self._token,
            expect=frozenset({204}),
        )
