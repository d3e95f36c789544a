"""HTTP routes of the planner API (``/v1``), thin over :mod:`perseus.server.jobs`.

Handlers are ``async``: database work runs in the thread pool, frontiers in worker
processes, and plan fetches are answered from memory whenever the plan is cached.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response, status
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from perseus.errors import (
    AuthError,
    InfeasibleDeadline,
    JobNotFound,
    JobStateError,
    PerseusError,
    PlanError,
    PlanningTooLarge,
    PlanNotReady,
    PolicyError,
    ProfileError,
    ScheduleError,
    SolverTimeout,
)
from perseus.files import FrontierFile, profile_fingerprint
from perseus.schemas import (
    ACTIVITY_PATH,
    FRONTIER_FILE_PATH,
    FRONTIER_PATH,
    HEALTHZ_PATH,
    ITERATIONS_PATH,
    JOB_PATH,
    JOBS_PATH,
    METRICS_PATH,
    OVERVIEW_PATH,
    PLAN_COMPUTE_PATH,
    PLAN_PATH,
    POLICY_PATH,
    PROFILE_CSV_PATH,
    PROFILE_JSON_PATH,
    PROFILES_PATH,
    RANKS_PATH,
    STRAGGLER_PATH,
    ActivityView,
    ErrorBody,
    FrontierView,
    Health,
    IterationAccepted,
    IterationReport,
    JobCreate,
    JobCreated,
    JobList,
    JobView,
    JobViews,
    PlanQuery,
    PlanResponse,
    PlanVersion,
    PolicyModel,
    PolicySpec,
    ProfileAccepted,
    ProfileReport,
    RankRegistered,
    RankRegistration,
    StragglerSpec,
)
from perseus.server.activity import Activity
from perseus.server.auth import bearer_token, check_admin, check_job_token
from perseus.server.jobs import RequestFieldError
from perseus.server.metrics import JobGauges, Metrics
from perseus.server.planning import PlanningInput, merged_profile, unprofiled_stages
from perseus.server.plans import has_plan, not_ready
from perseus.server.quotas import QuotaExceeded
from perseus.server.runner import PlanningRunner
from perseus.server.runtime import Coalescer, JobHeads, RankPlace, TelemetryBuffer
from perseus.server.service import JobService
from perseus.server.settings import Settings
from perseus.server.store import JobRow
from perseus.solver.profiles import Profile, profile_to_csv, profile_to_json

__all__ = [
    "P_BLOCK_HEADER",
    "PlanFastPath",
    "ServerState",
    "error_response",
    "error_status",
    "router",
]

log = logging.getLogger("perseus.server")

_JOB_ID = re.compile(r"[0-9a-f]{32}")

P_BLOCK_HEADER = "X-Perseus-P-Block-W"
"""Header of the profile CSV: blocking power of one stage, when the job or its ranks give one."""


_STATUS: tuple[tuple[type[PerseusError], int], ...] = (
    (JobNotFound, 404),
    (PlanNotReady, 409),
    (JobStateError, 409),
    (QuotaExceeded, 409),
    (PlanError, 409),
    (RequestFieldError, 422),
    (ProfileError, 422),
    (ScheduleError, 422),
    (PolicyError, 422),
    (InfeasibleDeadline, 422),
    (PlanningTooLarge, 422),
    (SolverTimeout, 503),
)


def error_status(exc: PerseusError) -> int:
    """The HTTP status for one of our errors (400 for any not listed)."""
    if isinstance(exc, AuthError):
        return exc.status_code
    for cls, code in _STATUS:
        if isinstance(exc, cls):
            return code
    return 400


def error_response(exc: PerseusError) -> JSONResponse:
    """The JSON answer to one of our errors: ``{detail, error}`` (never a traceback)."""
    code = error_status(exc)
    if isinstance(exc, RequestFieldError):
        # The shape FastAPI uses for validation errors, so clients read one format.
        detail = [{"loc": list(exc.loc), "msg": exc.message, "type": "value_error"}]
        return JSONResponse({"detail": detail, "error": type(exc).__name__}, status_code=code)
    content: dict[str, object] = {"detail": str(exc), "error": type(exc).__name__}
    headers: dict[str, str] = {}
    if isinstance(exc, PlanNotReady):
        content["state"] = exc.state
        headers["Retry-After"] = "1"
    if code == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(content, status_code=code, headers=headers)


@dataclass
class ServerState:
    """What the lifespan opens, on ``app.state.perseus``."""

    settings: Settings
    service: JobService
    heads: JobHeads
    runner: PlanningRunner
    metrics: Metrics
    telemetry: TelemetryBuffer
    admin_token_hash: str | None
    # A new version makes every waiting rank of a stage miss the cache at once: render once.
    renders: Coalescer = field(default_factory=Coalescer)
    # (job, rank) pairs already warned about for reporting from another host than registered.
    foreign_reports: set[tuple[str, int]] = field(default_factory=set)
    # Each rank's last report and the recent iterations, for the web page.
    activity: Activity = field(default_factory=Activity)

    def check_host(self, job_id: str, rank: int, place: RankPlace, host: str | None) -> None:
        """Warn once per rank when a report comes from another host than its registration."""
        registered = place[2]
        if registered is None or host is None or host == registered:
            return
        if (job_id, rank) in self.foreign_reports:
            return
        self.foreign_reports.add((job_id, rank))
        log.warning(
            "job %s: rank %d registered from %s reports from %s (two processes with one rank?)",
            job_id,
            rank,
            registered,
            host,
        )


async def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.perseus
    return state


_bearer = HTTPBearer(auto_error=False, description="The admin token or the job's token.")

State = Annotated[ServerState, Depends(server_state)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
JobIdPath = Annotated[str, Path(description="The job id returned at creation.")]


def _token(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return None if credentials is None else credentials.credentials


async def _job(state: ServerState, job_id: str, token: str | None) -> JobRow:
    """The job, once ``token`` is checked against it (404, 401, 403)."""
    if not _JOB_ID.fullmatch(job_id):
        raise JobNotFound(f"no job {job_id!r}")
    row = await state.heads.get(job_id)
    check_job_token(token, row.token_hash, state.admin_token_hash)
    return row


async def authorized_job(state: State, job_id: JobIdPath, credentials: Credentials) -> JobRow:
    """The job named in the path, once the caller's token is checked (404, 401, 403)."""
    return await _job(state, job_id, _token(credentials))


AuthorizedJob = Annotated[JobRow, Depends(authorized_job)]

_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody, "description": "No token"},
    403: {"model": ErrorBody, "description": "Wrong token"},
    404: {"model": ErrorBody, "description": "Unknown job"},
    409: {"model": ErrorBody, "description": "Not in a state that allows this (or not ready yet)"},
    413: {"model": ErrorBody, "description": "Request body too large"},
}

router = APIRouter(responses=_ERRORS)


@router.get(HEALTHZ_PATH, response_model=Health, tags=["server"])
async def healthz() -> Health:
    """Liveness."""
    return Health(status="ok")


@router.get(METRICS_PATH, tags=["server"], response_class=Response)
async def metrics(state: State) -> Response:
    """Prometheus text: requests, latencies, jobs by state, planning seconds, each job's
    energy and energy saved."""
    jobs = state.service.jobs
    jobs_by_state = await run_in_threadpool(jobs.count_by_state)
    await state.telemetry.flush()  # every report this process accepted is in the totals
    energy = await run_in_threadpool(jobs.energy_totals)
    gauges = await run_in_threadpool(_job_gauges, state)
    # Rendering is O(routes + jobs) string formatting: in the pool too, off the event loop.
    text = await run_in_threadpool(state.metrics.render, jobs_by_state, energy, gauges)
    return Response(text, media_type="text/plain; version=0.0.4")


_GAUGED_JOBS = 1000  # the most jobs /metrics reports gauges of (oldest first)


def _job_gauges(state: ServerState) -> dict[str, JobGauges]:
    """Per planned job: predicted and measured iteration, ranks following (in a thread).

    Complexity: one job view per planned job, O(ranks x window) each.
    """
    jobs = state.service.jobs
    gauges: dict[str, JobGauges] = {}
    for summary in jobs.list(_GAUGED_JOBS, 0):
        if summary.version == 0:
            continue
        with contextlib.suppress(JobNotFound):  # deleted meanwhile
            view = jobs.view(summary.job_id)
            activity = state.activity.view(view.version, view.job_id, jobs.ranks(view.job_id))
            t = view.telemetry
            gauges[view.job_id] = JobGauges(
                predicted_time_s=None
                if view.chosen is None
                else view.chosen.expected_iteration_time_s,
                predicted_energy_j=None if view.chosen is None else view.chosen.expected_energy_j,
                measured_time_s=None if t is None else t.measured_time_s,
                measured_energy_j=None if t is None else t.measured_energy_j,
                plan_version=view.version,
                ranks=view.counts.ranks_registered,
                ranks_following=sum(r.following for r in activity.ranks),
            )
    return gauges


@router.post(
    JOBS_PATH, status_code=status.HTTP_201_CREATED, response_model=JobCreated, tags=["jobs"]
)
async def create_job(spec: JobCreate, state: State, credentials: Credentials) -> JobCreated:
    """Create a job; the reply's token is its secret (needs the admin token if one is set)."""
    check_admin(_token(credentials), state.admin_token_hash)
    created, row = await run_in_threadpool(state.service.jobs.create, spec)
    state.heads.put(row)
    return created


@router.get(JOBS_PATH, response_model=JobList, tags=["jobs"])
async def list_jobs(
    state: State,
    credentials: Credentials,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
) -> JobList:
    """List jobs, oldest first (needs the admin token if one is set)."""
    check_admin(_token(credentials), state.admin_token_hash)
    return JobList(jobs=await run_in_threadpool(state.service.jobs.list, limit, offset))


@router.get(OVERVIEW_PATH, response_model=JobViews, tags=["jobs"])
async def overview(
    state: State,
    credentials: Credentials,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
) -> JobViews:
    """Every job's view, oldest first, as the web page shows them (needs the admin token
    if one is set)."""
    check_admin(_token(credentials), state.admin_token_hash)
    await state.telemetry.flush()
    jobs = state.service.jobs

    def views() -> list[JobView]:
        found = []
        for summary in jobs.list(limit, offset):
            with contextlib.suppress(JobNotFound):  # deleted meanwhile
                found.append(jobs.view(summary.job_id))
        return found

    return JobViews(jobs=await run_in_threadpool(views))


@router.get(JOB_PATH, response_model=JobView, tags=["jobs"])
async def get_job(job: AuthorizedJob, state: State) -> JobView:
    """State, counts, policy, straggler, the chosen point, predicted against measured."""
    await state.telemetry.flush(job.id)
    view = await run_in_threadpool(state.service.jobs.view, job.id)
    return view


@router.delete(JOB_PATH, status_code=status.HTTP_204_NO_CONTENT, tags=["jobs"])
async def delete_job(state: State, job_id: JobIdPath, credentials: Credentials) -> Response:
    """Delete a job (the admin token if one is set, else the job's token)."""
    if state.admin_token_hash is not None:
        check_admin(_token(credentials), state.admin_token_hash)
    else:
        await _job(state, job_id, _token(credentials))
    if not _JOB_ID.fullmatch(job_id):
        raise JobNotFound(f"no job {job_id!r}")
    await run_in_threadpool(state.service.jobs.delete, job_id)
    state.runner.cancel(job_id)  # queued or running: nothing would store what it computes
    state.heads.forget(job_id)
    state.telemetry.forget(job_id)
    state.activity.forget(job_id)
    state.foreign_reports = {key for key in state.foreign_reports if key[0] != job_id}
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(RANKS_PATH, response_model=RankRegistered, tags=["ranks"])
async def register_rank(
    job: AuthorizedJob, body: RankRegistration, state: State, request: Request
) -> RankRegistered:
    """Register a rank (again after a restart: same coordinates, nothing changes)."""
    host = _host(request.scope)
    reply, row = await run_in_threadpool(state.service.jobs.register_rank, job.id, body, host)
    state.heads.put(row)
    state.heads.add_rank(job.id, body.rank, (body.stage, body.data_parallel_rank, host))
    state.foreign_reports.discard((job.id, body.rank))
    return reply


@router.post(PROFILES_PATH, response_model=ProfileAccepted, tags=["ranks"])
async def report_profile(
    job: AuthorizedJob, body: ProfileReport, state: State, request: Request
) -> ProfileAccepted:
    """A rank's measured profile; the last one missing starts planning."""
    reply, row, claimed = await run_in_threadpool(state.service.lease.add_profile, job.id, body)
    # Stored: from here on nothing may fail the request, and a claimed job must be planned.
    state.heads.put(row)
    if claimed:
        state.runner.start(job.id)
    with contextlib.suppress(PerseusError):
        place = await state.heads.rank_position(job.id, body.rank)
        state.check_host(job.id, body.rank, place, _host(request.scope))
    return reply


@router.post(
    PLAN_COMPUTE_PATH,
    status_code=status.HTTP_202_ACCEPTED,
    response_model=PlanVersion,
    tags=["plans"],
)
async def compute_plan(job: AuthorizedJob, state: State) -> PlanVersion:
    """Plan now with the profiles in (each stage needs one from every tensor-parallel rank)."""
    row = await run_in_threadpool(state.service.lease.claim_planning, job.id)
    state.heads.put(row)
    state.runner.start(job.id)
    return PlanVersion(version=row.version, state="planning", chosen=None)


@router.get(FRONTIER_PATH, response_model=FrontierView, tags=["plans"])
async def get_frontier(job: AuthorizedJob, state: State) -> FrontierView:
    """The time-energy frontier and baselines; 409 with the state while not ready."""
    view = await run_in_threadpool(state.service.plans.frontier_view, job)
    return view


@router.put(POLICY_PATH, response_model=PlanVersion, tags=["plans"])
async def set_policy(job: AuthorizedJob, body: PolicySpec, state: State) -> PlanVersion:
    """Change the policy; with a frontier, a new plan version."""
    policy: PolicyModel = body
    reply, row = await run_in_threadpool(state.service.choices.set_policy, job.id, policy)
    state.heads.put(row)
    return reply


@router.put(STRAGGLER_PATH, response_model=PlanVersion, tags=["plans"])
async def set_straggler(job: AuthorizedJob, body: StragglerSpec, state: State) -> PlanVersion:
    """Another pipeline takes this long (or this much slower): plans move along the frontier."""
    reply, row = await run_in_threadpool(state.service.choices.set_straggler, job.id, body)
    state.heads.put(row)
    return reply


@router.delete(STRAGGLER_PATH, response_model=PlanVersion, tags=["plans"])
async def clear_straggler(job: AuthorizedJob, state: State) -> PlanVersion:
    """No straggler any more: plans go back to the policy's point."""
    reply, row = await run_in_threadpool(state.service.choices.clear_straggler, job.id)
    state.heads.put(row)
    return reply


def _merged(inp: PlanningInput) -> Profile:
    """The merged profile, as planning merges it (runs in a thread).

    Raises:
        JobStateError: some stage lacks a profile, or the profiles cannot be merged.
    """
    missing = unprofiled_stages(inp)
    if missing:
        shown = ", ".join(str(s) for s in missing[:16])
        raise JobStateError(
            f"no merged profile yet: stages {shown}{' ...' if len(missing) > 16 else ''} "
            "lack a profile from some tensor-parallel rank"
        )
    try:
        profile = merged_profile(inp)
    except ProfileError as err:
        # The request is fine; what the ranks reported is not (planning would fail alike).
        raise JobStateError(f"the stage profiles cannot be merged: {err}") from err
    return profile


def _profile_csv(inp: PlanningInput) -> tuple[str, float | None]:
    """The merged profile as Zeus CSV and the stage blocking power (runs in a thread)."""
    profile = _merged(inp)
    return profile_to_csv(profile), profile.p_block_w


@router.get(
    PROFILE_CSV_PATH,
    response_class=Response,
    responses={
        200: {
            "content": {"text/csv": {}},
            "description": "Zeus CSV stage,instruction,frequency,time,energy",
        }
    },
    tags=["plans"],
)
async def get_profile_csv(job: AuthorizedJob, state: State) -> Response:
    """The job's profile merged as for planning, as the Zeus CSV ``perseus plan`` reads.

    Each stage's ranks are combined exactly as planning combines them (the slowest rank's
    time; energy summed over the tensor-parallel group and averaged over replicas; only
    clocks every rank measured). Answers 409 until every stage has a profile from each of
    its tensor-parallel ranks: a partial profile is never sent. The CSV has no column for
    blocking power; the ``X-Perseus-P-Block-W`` header carries the stage's (the job's
    ``p_block_w``, else the ranks' mean, times the tensor-parallel size) when known.
    """
    inp = await run_in_threadpool(state.service.lease.planning_input, job.id)
    text, p_block_w = await run_in_threadpool(_profile_csv, inp)
    headers = {"Cache-Control": "no-cache"}
    if p_block_w is not None:
        headers[P_BLOCK_HEADER] = repr(p_block_w)
    return Response(text, media_type="text/csv", headers=headers)


@router.get(
    PROFILE_JSON_PATH,
    response_class=JSONResponse,
    responses={200: {"description": "perseus.profile/1 JSON, with p_block_w when known"}},
    tags=["plans"],
)
async def get_profile_json(job: AuthorizedJob, state: State) -> JSONResponse:
    """The job's profile merged as for planning, as ``perseus.profile/1`` JSON: the rows of
    the CSV and the stage's blocking power, so ``perseus plan`` takes it as it is."""
    inp = await run_in_threadpool(state.service.lease.planning_input, job.id)
    profile = await run_in_threadpool(_merged, inp)
    return JSONResponse(profile_to_json(profile), headers={"Cache-Control": "no-cache"})


@router.get(
    FRONTIER_FILE_PATH,
    response_class=Response,
    responses={200: {"description": "perseus.frontier/1 JSON with every point's clocks"}},
    tags=["plans"],
)
async def get_frontier_file(job: AuthorizedJob, state: State) -> Response:
    """The job's frontier as the ``perseus.frontier/1`` file ``perseus plan --output``
    writes (every point's clocks), for ``perseus simulate``; 409 while not planned."""

    def render() -> bytes:
        if not job.frontier_rev:
            raise not_ready(job)
        frontiers = state.service.frontiers
        frontier = frontiers.get(job.id, job.frontier_rev)
        profile = frontiers.profile(job.id, job.frontier_rev)
        return FrontierFile.of_run(
            frontier,
            frontier.baselines,
            profile=None if profile is None else profile_fingerprint(profile),
            baselines_deadline_s=None,
        ).render()

    body = await run_in_threadpool(render)
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-cache"})


@router.get(ACTIVITY_PATH, response_model=ActivityView, tags=["jobs"])
async def get_activity(job: AuthorizedJob, state: State) -> ActivityView:
    """Each rank's state and last report, and the job's recent iterations (time: median
    over ranks; energy: sum over ranks), as this server process received them."""
    ranks = await run_in_threadpool(state.service.jobs.ranks, job.id)
    return await run_in_threadpool(state.activity.view, job.version, job.id, ranks)


def _etag_versions(if_none_match: str | None) -> tuple[bool, set[int]]:
    """``(matches anything, versions)`` named by an If-None-Match header."""
    if not if_none_match:
        return False, set()
    versions: set[int] = set()
    for tag in if_none_match.split(","):
        tag = tag.strip().removeprefix("W/").strip('"')
        if tag == "*":
            return True, set()
        # isascii: headers arrive as latin-1, whose superscript digits pass isdigit().
        if tag.isascii() and tag.isdigit() and len(tag) < 19:
            versions.add(int(tag))
    return False, versions


def _host(scope: Scope) -> str | None:
    client = scope.get("client")
    return None if not client else str(client[0])


async def plan_reply(
    state: ServerState,
    job_id: str,
    token: str | None,
    query: PlanQuery,
    if_none_match: str | None,
) -> Response:
    """The plan route's logic, shared by the FastAPI route and :class:`PlanFastPath`.

    A rank that names a version in If-None-Match is never sent an older one: versions only
    grow, so when this process's cached row is older than the rank's version, another
    process made a newer one; the row is re-read, and a long poll waits for a version
    newer than every one named.

    Raises:
        PerseusError: unknown job (404), token (401/403), rank not registered or no plan (409).
    """
    row = await _job(state, job_id, token)
    place = await state.heads.rank_position(job_id, query.rank)
    anything, known = _etag_versions(if_none_match)
    newest_known = max(known, default=-1)
    if row.version < newest_known:
        row = await state.heads.refresh(job_id)
    wait_s = min(query.wait_s, state.settings.max_wait_s)
    if wait_s > 0:
        row = await state.heads.wait_until(
            job_id,
            lambda r: (
                (has_plan(r) and not anything and r.version > newest_known)
                or (r.state == "failed" and not has_plan(r))
            ),
            wait_s,
        )
    try:
        return await _plan_response(state, row, place, anything, newest_known)
    except PlanError:
        # The frontier this row names was replaced meanwhile (by another process) and has
        # left this process's cache: the job's current row names the one that replaced it.
        row = await state.heads.refresh(job_id)
        return await _plan_response(state, row, place, anything, newest_known)


async def _plan_response(
    state: ServerState, row: JobRow, place: RankPlace, anything: bool, newest_known: int
) -> Response:
    """:func:`plan_reply` once the row is settled: 304, or the plan's bytes.

    Raises:
        PlanNotReady: the row has no plan.
        PlanError: the frontier the row names is no longer stored.
    """
    headers = {"Cache-Control": "no-cache"}
    if has_plan(row):
        headers["ETag"] = f'"{row.version}"'
        if anything or row.version <= newest_known:
            return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    stage, dp_rank, _ = place
    straggler = row.straggler is not None and dp_rank in row.straggler.data_parallel_ranks
    body = state.service.plans.cached(row, stage, straggler)
    if body is None:
        body = await state.renders.run(
            (row.id, row.version, stage, straggler),
            lambda: run_in_threadpool(state.service.plans.render, row, stage, straggler),
        )
    return Response(body, media_type="application/json", headers=headers)


@router.get(
    PLAN_PATH,
    response_class=Response,
    responses={
        200: {"model": PlanResponse, "description": "The plan; ETag is its version"},
        304: {"description": "The plan is still the version named in If-None-Match"},
    },
    tags=["plans"],
)
async def get_plan(
    state: State,
    job_id: JobIdPath,
    credentials: Credentials,
    query: Annotated[PlanQuery, Query()],
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The rank's plan: clocks per instruction in execution order.

    Well-formed requests are answered by :class:`PlanFastPath` before they reach this
    route; this one answers the rest (with the same :class:`PlanQuery`, the usual 422 for
    a bad query) and documents the API.
    """
    return await plan_reply(state, job_id, _token(credentials), query, if_none_match)


class PlanFastPath:
    """Answers well-formed plan fetches without FastAPI's per-request machinery.

    Plan fetches are the one hot path (every rank, every iteration or long poll); routing
    and dependency injection cost more than the answer itself, which is cached bytes. The
    query is validated by the route's own model, :class:`PlanQuery`; a request it rejects
    goes on to the FastAPI route, which answers it with the usual 422. Both share
    :func:`plan_reply`.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # Each rank sends the same query string every time: validate each one once.
        self._queries: dict[bytes, PlanQuery | None] = {}

    def _query(self, query_string: bytes) -> PlanQuery | None:
        try:
            return self._queries[query_string]
        except KeyError:
            pass
        query = _plan_query(query_string)
        if len(query_string) <= _QUERY_MEMO_BYTES:  # a rank's is ~20 bytes; a long one is no rank's
            if len(self._queries) >= _QUERY_MEMO:
                self._queries.clear()
            self._queries[query_string] = query
        return query

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            match = _PLAN_PATH.fullmatch(scope["path"])
            if match is not None:
                query = self._query(scope["query_string"])
                if query is not None:
                    await self._answer(scope, receive, send, match.group(1), query)
                    return
        await self.app(scope, receive, send)

    async def _answer(
        self, scope: Scope, receive: Receive, send: Send, job_id: str, query: PlanQuery
    ) -> None:
        headers = {name: value for name, value in scope["headers"]}
        authorization = headers.get(b"authorization")
        if_none_match = headers.get(b"if-none-match")
        state: ServerState = scope["app"].state.perseus
        scope["route"] = _FAST_ROUTE
        try:
            response = await plan_reply(
                state,
                job_id,
                bearer_token(None if authorization is None else authorization.decode("latin-1")),
                query,
                None if if_none_match is None else if_none_match.decode("latin-1"),
            )
        except PerseusError as exc:
            response = error_response(exc)
        await response(scope, receive, send)


_PLAN_PATH = re.compile(PLAN_PATH.replace("{job_id}", "([^/]+)"))
_QUERY_MEMO = 16_384  # distinct plan queries remembered (a few per rank)
# Longest query remembered: the memo holds at most 16,384 x 128 bytes (it held 16,384
# unauthenticated query strings of any length, ~15 KB each: 240 MB).
_QUERY_MEMO_BYTES = 128
_FAST_ROUTE = SimpleNamespace(path=PLAN_PATH)


def _plan_query(query_string: bytes) -> PlanQuery | None:
    """The query as :class:`PlanQuery` validates it, or None (let the route explain)."""
    text = query_string.decode("latin-1")
    # As Starlette reads a query: blank values kept, the last of a repeated name wins.
    # Ranks send plain ``rank=R&wait_s=S``: split it directly, unquote only when needed.
    if "%" in text or "+" in text:
        values = dict(parse_qsl(text, keep_blank_values=True))
    else:
        values = {
            name: value for name, _, value in (p.partition("=") for p in text.split("&") if p)
        }
    try:
        return PlanQuery.model_validate(values)
    except ValidationError:
        return None


@router.post(ITERATIONS_PATH, response_model=IterationAccepted, tags=["ranks"])
async def report_iteration(
    job: AuthorizedJob, body: IterationReport, state: State, request: Request
) -> IterationAccepted:
    """A rank's measured iteration time and energy (predicted against measured).

    Accepted reports are written in batches (every ``telemetry_flush_s``); the job's view
    always includes them.
    """
    place = await state.heads.rank_position(job.id, body.rank)  # 409 unless registered
    state.check_host(job.id, body.rank, place, _host(request.scope))
    state.telemetry.add(job, body)
    state.activity.record(job.id, body)
    return IterationAccepted(rank=body.rank, iteration=body.iteration, version=job.version)
