"""Routes of a job's lifecycle: create, list, read, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from starlette.concurrency import run_in_threadpool

from perseus.core.errors import JobNotFound
from perseus.schemas import JOB_PATH, JOBS_PATH, JobCreate, JobCreated, JobList, JobView
from perseus.server.api.auth import check_admin
from perseus.server.api.deps import (
    ERROR_RESPONSES,
    JOB_ID,
    AuthorizedJob,
    Credentials,
    JobIdPath,
    State,
    credentials_token,
    job_for_token,
)

__all__ = ["create_job", "delete_job", "get_job", "list_jobs", "router"]

router = APIRouter(responses=ERROR_RESPONSES)


@router.post(
    JOBS_PATH, status_code=status.HTTP_201_CREATED, response_model=JobCreated, tags=["jobs"]
)
async def create_job(spec: JobCreate, state: State, credentials: Credentials) -> JobCreated:
    """Create a job; the reply's token is its secret (needs the admin token if one is set)."""
    check_admin(credentials_token(credentials), state.admin_token_hash)
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
    check_admin(credentials_token(credentials), state.admin_token_hash)
    return JobList(jobs=await run_in_threadpool(state.service.jobs.list, limit, offset))


@router.get(JOB_PATH, response_model=JobView, tags=["jobs"])
async def get_job(job: AuthorizedJob, state: State) -> JobView:
    """State, counts, policy, straggler, the chosen point, predicted against measured."""
    await state.telemetry.flush(job.id)
    view = await run_in_threadpool(state.service.jobs.view, job.id)
    return state.activity.with_profiling(view)


@router.delete(JOB_PATH, status_code=status.HTTP_204_NO_CONTENT, tags=["jobs"])
async def delete_job(state: State, job_id: JobIdPath, credentials: Credentials) -> Response:
    """Delete a job (the admin token if one is set, else the job's token)."""
    if state.admin_token_hash is not None:
        check_admin(credentials_token(credentials), state.admin_token_hash)
    else:
        await job_for_token(state, job_id, credentials_token(credentials))
    if not JOB_ID.fullmatch(job_id):
        raise JobNotFound(f"no job {job_id!r}")
    await run_in_threadpool(state.service.jobs.delete, job_id)
    state.runner.cancel(job_id)  # queued or running: nothing would store what it computes
    state.heads.forget(job_id)
    state.telemetry.forget(job_id)
    state.activity.forget(job_id)
    state.foreign_reports = {key for key in state.foreign_reports if key[0] != job_id}
    if state.budget is not None:
        await state.budget.rebalance()  # its power is free for the others
    return Response(status_code=status.HTTP_204_NO_CONTENT)
