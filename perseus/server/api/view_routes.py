"""Routes that show the server and its jobs: liveness, Prometheus metrics, the web page's views."""

from __future__ import annotations

import contextlib
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from starlette.concurrency import run_in_threadpool

from perseus.core.errors import JobNotFound
from perseus.schemas import (
    ACTIVITY_PATH,
    HEALTHZ_PATH,
    METRICS_PATH,
    OVERVIEW_PATH,
    TIMELINE_PATH,
    ActivityView,
    Health,
    JobViews,
    TimelineView,
)
from perseus.server.api.auth import check_admin
from perseus.server.api.deps import (
    ERROR_RESPONSES,
    AuthorizedJob,
    Credentials,
    ServerState,
    State,
    credentials_token,
)
from perseus.server.api.metrics import JobGauges, render_cluster
from perseus.server.planning.plans import not_ready
from perseus.server.planning.timeline import timeline_view

__all__ = ["get_activity", "get_timeline", "healthz", "metrics", "overview", "router"]

router = APIRouter(responses=ERROR_RESPONSES)


@router.get(
    HEALTHZ_PATH,
    response_model=Health,
    response_model_exclude_none=True,
    tags=["server"],
    responses={503: {"model": Health, "description": "The job database cannot be written"}},
)
async def healthz(state: State, response: Response) -> Health:
    """Liveness, and whether the job database can be written (503 naming the fault)."""
    fault = state.service.store.fault
    if fault is not None:
        response.status_code = 503
        return Health(status="storage-fault", storage=fault)
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
    text += await run_in_threadpool(_cluster_gauges, state)
    return Response(text, media_type="text/plain; version=0.0.4")


def _cluster_gauges(state: ServerState) -> str:
    """The cluster power budget's gauges (in a thread)."""
    return render_cluster(state.service.budget.status())


def _job_gauges(state: ServerState) -> dict[str, JobGauges]:
    """Per planned job: predicted and measured iteration, ranks following (in a thread).

    Every job with a plan version has its gauges, however many unplanned jobs came before
    it: the series are bounded by the jobs planned (a job's gauges go with the job when it
    is deleted), never cut by age.

    Complexity: one job view per planned job, O(ranks x window) each.
    """
    jobs = state.service.jobs
    gauges: dict[str, JobGauges] = {}
    for job_id in jobs.planned_ids():
        with contextlib.suppress(JobNotFound):  # deleted meanwhile
            view = jobs.view(job_id)
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


@router.get(OVERVIEW_PATH, response_model=JobViews, tags=["jobs"])
async def overview(
    state: State,
    credentials: Credentials,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    order: Annotated[
        Literal["oldest", "newest"],
        Query(description="oldest first (the default) or newest first"),
    ] = "oldest",
) -> JobViews:
    """A page of the jobs' views as the web page shows them, ``limit`` from ``offset``,
    oldest first unless ``order=newest``, with the number of jobs in all (needs the admin
    token if one is set)."""
    check_admin(credentials_token(credentials), state.admin_token_hash)
    await state.telemetry.flush()
    jobs = state.service.jobs

    def page() -> JobViews:
        found = []
        for summary in jobs.list(limit, offset, newest_first=order == "newest"):
            with contextlib.suppress(JobNotFound):  # deleted meanwhile
                found.append(state.activity.with_profiling(jobs.view(summary.job_id)))
        return JobViews(jobs=found, total=jobs.count())

    return await run_in_threadpool(page)


@router.get(ACTIVITY_PATH, response_model=ActivityView, tags=["jobs"])
async def get_activity(job: AuthorizedJob, state: State) -> ActivityView:
    """Each rank's state and last report, and the job's recent iterations (time: median
    over ranks; energy: sum over ranks), as this server process received them."""
    ranks = await run_in_threadpool(state.service.jobs.ranks, job.id)
    return await run_in_threadpool(state.activity.view, job.version, job.id, ranks)


@router.get(TIMELINE_PATH, response_model=TimelineView, tags=["jobs"])
async def get_timeline(job: AuthorizedJob, state: State) -> TimelineView:
    """The plan the ranks run, replayed on the profile it was planned on: per GPU, every
    instruction's clock, start and finish (the web page's timeline); 409 while not ready."""

    def build() -> TimelineView:
        frontiers = state.service.frontiers
        if not job.frontier_rev:
            raise not_ready(job)
        frontier = frontiers.get(job.id, job.frontier_rev)
        return timeline_view(job, frontier, frontiers.profile(job.id, job.frontier_rev))

    return await run_in_threadpool(build)
