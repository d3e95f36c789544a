"""Routes the ranks and operators drive a job with: registration, profiles, planning,
policy and straggler, the merged profile and frontier files, plans, iterations."""

from __future__ import annotations

import contextlib
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from perseus.core.errors import JobStateError, PerseusError, ProfileError
from perseus.core.profiles import Profile
from perseus.formats.plan_files import FrontierFile, profile_fingerprint
from perseus.formats.profiles import profile_to_csv, profile_to_json
from perseus.schemas import (
    CLOCK_LATENCY_HEADER,
    CLOCK_LATENCY_PATH,
    FRONTIER_FILE_PATH,
    FRONTIER_PATH,
    GAVE_UP_PATH,
    ITERATIONS_PATH,
    PLAN_COMPUTE_PATH,
    PLAN_PATH,
    POLICY_PATH,
    PROFILE_CSV_PATH,
    PROFILE_JSON_PATH,
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
from perseus.server.api.cluster_routes import rebalanced
from perseus.server.api.deps import (
    ERROR_RESPONSES,
    AuthorizedJob,
    Credentials,
    JobIdPath,
    State,
    client_host,
    credentials_token,
)
from perseus.server.api.plan_fetch import plan_reply
from perseus.server.planning.plans import not_ready
from perseus.server.planning.worker import PlanningInput, merged_profile, unprofiled_stages

__all__ = [
    "P_BLOCK_HEADER",
    "clear_straggler",
    "compute_plan",
    "get_frontier",
    "get_frontier_file",
    "get_plan",
    "get_profile_csv",
    "get_profile_json",
    "rank_gave_up",
    "register_rank",
    "report_clock_latency",
    "report_iteration",
    "report_profile",
    "router",
    "set_policy",
    "set_straggler",
]

P_BLOCK_HEADER = "X-Perseus-P-Block-W"
"""Header of the profile CSV: blocking power of one stage, when the job or its ranks give one."""

router = APIRouter(responses=ERROR_RESPONSES)


@router.post(RANKS_PATH, response_model=RankRegistered, tags=["ranks"])
async def register_rank(
    job: AuthorizedJob,
    body: RankRegistration,
    state: State,
    request: Request,
    response: Response,
) -> RankRegistered:
    """Register a rank (again after a restart: same coordinates, nothing changes).

    The ``X-Perseus-Clock-Latency: 1`` header of the answer says that this planner takes
    the rank's measured clock-change latency (``POST .../ranks:clock-latency``); the answer's
    body stays what ranks of every version read.
    """
    host = client_host(request.scope)
    reply, row = await run_in_threadpool(state.service.jobs.register_rank, job.id, body, host)
    state.heads.put(row)
    state.heads.add_rank(job.id, body.rank, (body.stage, body.data_parallel_rank, host))
    state.foreign_reports.discard((job.id, body.rank))
    response.headers[CLOCK_LATENCY_HEADER] = "1"
    return reply


@router.post(CLOCK_LATENCY_PATH, response_model=ClockLatencyAccepted, tags=["ranks"])
async def report_clock_latency(
    job: AuthorizedJob, body: ClockLatencyReport, state: State
) -> ClockLatencyAccepted:
    """A rank's measured clock-change latency. The planner keeps each rank's largest and
    plans the job for the largest of its ranks' (the server's ``clock_change_delay_s``
    while none reported); a latency materially above what the job's frontier was planned
    for (more than 20 % and more than 5 ms) plans the job again at once."""
    reply, claimed = await run_in_threadpool(state.service.lease.add_clock_latency, job.id, body)
    if claimed is not None:
        state.heads.put(claimed)
        state.runner.start(job.id)
    return reply


@router.post(GAVE_UP_PATH, response_model=GaveUpAccepted, tags=["ranks"])
async def rank_gave_up(job: AuthorizedJob, body: GaveUpReport, state: State) -> GaveUpAccepted:
    """A rank stopped planning and trains on at default clocks: the job view lists it, with
    its reason and when, so that no operator believes it saves energy."""
    return await run_in_threadpool(state.service.jobs.rank_gave_up, job.id, body)


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
        state.check_host(job.id, body.rank, place, client_host(request.scope))
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
    return PlanVersion(version=row.version, state=row.state, chosen=None)


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
    if state.budget is None:
        return reply
    return await rebalanced(state, row)


@router.put(STRAGGLER_PATH, response_model=PlanVersion, tags=["plans"])
async def set_straggler(job: AuthorizedJob, body: StragglerSpec, state: State) -> PlanVersion:
    """Another pipeline takes this long (or this much slower): plans move along the frontier."""
    reply, row = await run_in_threadpool(state.service.choices.set_straggler, job.id, body)
    state.heads.put(row)
    if state.budget is None:
        return reply
    return await rebalanced(state, row)


@router.delete(STRAGGLER_PATH, response_model=PlanVersion, tags=["plans"])
async def clear_straggler(job: AuthorizedJob, state: State) -> PlanVersion:
    """No straggler any more: plans go back to the policy's point."""
    reply, row = await run_in_threadpool(state.service.choices.clear_straggler, job.id)
    state.heads.put(row)
    if state.budget is None:
        return reply
    return await rebalanced(state, row)


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
            "description": "Zeus CSV stage,instruction,frequency,time,energy[,p_block_w]",
        }
    },
    tags=["plans"],
)
async def get_profile_csv(job: AuthorizedJob, state: State) -> Response:
    """The job's profile merged as for planning, as the Zeus CSV ``perseus plan`` reads.

    Each stage's ranks are combined exactly as planning combines them (the slowest rank's
    time; energy summed over the tensor-parallel group and averaged over replicas; only
    clocks every rank measured). Answers 409 until every stage has a profile from each of
    its tensor-parallel ranks: a partial profile is never sent. When the stage's blocking
    power is known (the job's ``p_block_w``, else the ranks' mean, times the tensor-parallel
    size) a last ``p_block_w`` column carries it, so ``perseus plan`` takes the file as it
    is; the ``X-Perseus-P-Block-W`` header carries it too.
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
    return await plan_reply(state, job_id, credentials_token(credentials), query, if_none_match)


@router.post(ITERATIONS_PATH, response_model=IterationAccepted, tags=["ranks"])
async def report_iteration(
    job: AuthorizedJob, body: IterationReport, state: State, request: Request
) -> IterationAccepted:
    """A rank's measured iteration time and energy (predicted against measured).

    Accepted reports are written in batches (every ``telemetry_flush_s``); the job's view
    always includes them.
    """
    place = await state.heads.rank_position(job.id, body.rank)  # 409 unless registered
    state.check_host(job.id, body.rank, place, client_host(request.scope))
    state.telemetry.add(job, body)
    state.activity.record(job.id, body)
    return IterationAccepted(rank=body.rank, iteration=body.iteration, version=job.version)
