"""HTTP routes of the planner API (``/v1``), thin over :mod:`perseus.server.lifecycle.jobs`.

Handlers are ``async``: database work runs in the thread pool, frontiers in worker
processes, and plan fetches are answered from memory whenever the plan is cached.

The routes live in modules of one job each: :mod:`~perseus.server.api.view_routes` (liveness,
metrics, views), :mod:`~perseus.server.api.job_routes` (a job's lifecycle),
:mod:`~perseus.server.api.rank_routes` (ranks, profiles, planning, plans, iterations), with
:mod:`~perseus.server.api.plan_fetch` (the plan fetch's hot path),
:mod:`~perseus.server.api.deps` (state and dependencies) and
:mod:`~perseus.server.api.http_errors` (errors as HTTP answers). This module assembles
:data:`router` and re-exports their public names.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from fastapi.routing import APIRoute

from perseus.server.api import job_routes, rank_routes, view_routes
from perseus.server.api.deps import (
    ERROR_RESPONSES,
    AuthorizedJob,
    Credentials,
    JobIdPath,
    ServerState,
    State,
    authorized_job,
    log,
    server_state,
)
from perseus.server.api.http_errors import error_response, error_status
from perseus.server.api.job_routes import create_job, delete_job, get_job, list_jobs
from perseus.server.api.plan_fetch import PlanFastPath, plan_reply
from perseus.server.api.rank_routes import (
    P_BLOCK_HEADER,
    clear_straggler,
    compute_plan,
    get_frontier,
    get_frontier_file,
    get_plan,
    get_profile_csv,
    get_profile_json,
    rank_gave_up,
    register_rank,
    report_clock_latency,
    report_iteration,
    report_profile,
    set_policy,
    set_straggler,
)
from perseus.server.api.view_routes import get_activity, get_timeline, healthz, metrics, overview

__all__ = [
    "P_BLOCK_HEADER",
    "AuthorizedJob",
    "Credentials",
    "JobIdPath",
    "PlanFastPath",
    "ServerState",
    "State",
    "authorized_job",
    "clear_straggler",
    "compute_plan",
    "create_job",
    "delete_job",
    "error_response",
    "error_status",
    "get_activity",
    "get_frontier",
    "get_frontier_file",
    "get_job",
    "get_plan",
    "get_profile_csv",
    "get_profile_json",
    "get_timeline",
    "healthz",
    "list_jobs",
    "log",
    "metrics",
    "overview",
    "plan_reply",
    "rank_gave_up",
    "register_rank",
    "report_clock_latency",
    "report_iteration",
    "report_profile",
    "router",
    "server_state",
    "set_policy",
    "set_straggler",
]

# The order routes are matched and the OpenAPI document lists them: kept as it always was.
_ORDER: tuple[Callable[..., object], ...] = (
    healthz,
    metrics,
    create_job,
    list_jobs,
    overview,
    get_job,
    delete_job,
    register_rank,
    rank_gave_up,
    report_profile,
    compute_plan,
    get_frontier,
    set_policy,
    set_straggler,
    clear_straggler,
    get_profile_csv,
    get_profile_json,
    get_frontier_file,
    get_activity,
    get_timeline,
    get_plan,
    report_iteration,
    report_clock_latency,
)


def _assemble() -> APIRouter:
    """One router of every part's routes, in :data:`_ORDER` (each part documents the same
    error responses, :data:`~perseus.server.api.deps.ERROR_RESPONSES`)."""
    found = {
        route.endpoint: route
        for part in (view_routes.router, job_routes.router, rank_routes.router)
        for route in part.routes
        if isinstance(route, APIRoute)
    }
    if len(found) != len(_ORDER) or set(found) != set(_ORDER):
        raise RuntimeError("routes.py: _ORDER must list every route exactly once")
    assembled = APIRouter(responses=ERROR_RESPONSES)
    assembled.routes.extend(found[endpoint] for endpoint in _ORDER)
    return assembled


router = _assemble()
