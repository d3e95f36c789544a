"""Routes of the cluster's power budget: read it, set it, lift it; a job's priority."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from perseus.core.errors import PerseusError
from perseus.schemas import (
    CLUSTER_BUDGET_PATH,
    PRIORITY_PATH,
    BudgetSet,
    ClusterBudgetView,
    PlanVersion,
    PrioritySet,
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
from perseus.server.budget_runtime import BudgetKeeper
from perseus.server.store.job_store import JobRow

__all__ = ["get_budget", "lift_budget", "rebalanced", "router", "set_budget", "set_priority"]

router = APIRouter(responses=ERROR_RESPONSES)


def _keeper(state: ServerState) -> BudgetKeeper:
    if state.budget is None:  # pragma: no cover - the lifespan always makes one
        raise PerseusError("the cluster budget is not running in this server")
    return state.budget


@router.get(CLUSTER_BUDGET_PATH, response_model=ClusterBudgetView, tags=["cluster"])
async def get_budget(state: State, credentials: Credentials) -> ClusterBudgetView:
    """The budget, the cluster's predicted and measured power, each job's share (the admin
    token, if the server has one)."""
    check_admin(credentials_token(credentials), state.admin_token_hash)
    await state.telemetry.flush()  # measured power from every report this process took
    return await run_in_threadpool(state.service.budget.status)


@router.put(CLUSTER_BUDGET_PATH, response_model=ClusterBudgetView, tags=["cluster"])
async def set_budget(body: BudgetSet, state: State, credentials: Credentials) -> ClusterBudgetView:
    """Set the standing budget, or (with ``from_s``/``to_s``) the scheduled window; the jobs'
    points move at once (the admin token, if the server has one)."""
    check_admin(credentials_token(credentials), state.admin_token_hash)
    budget = state.service.budget
    await _keeper(state).change(lambda: budget.set(body))
    return await run_in_threadpool(budget.status)


@router.delete(CLUSTER_BUDGET_PATH, response_model=ClusterBudgetView, tags=["cluster"])
async def lift_budget(state: State, credentials: Credentials) -> ClusterBudgetView:
    """Lift the budget and its window: every job back at its own policy."""
    check_admin(credentials_token(credentials), state.admin_token_hash)
    budget = state.service.budget
    await _keeper(state).change(budget.lift)
    return await run_in_threadpool(budget.status)


@router.put(PRIORITY_PATH, response_model=PlanVersion, tags=["cluster"])
async def set_priority(job: AuthorizedJob, body: PrioritySet, state: State) -> PlanVersion:
    """Change how much the job's slowdown weighs under a cluster power budget (the job's
    token or the admin token); the points move at once where a budget is in force."""
    row = await run_in_threadpool(state.service.budget.set_priority, job.id, body.priority)
    state.heads.put(row)
    return await rebalanced(state, row)


async def rebalanced(state: ServerState, row: JobRow) -> PlanVersion:
    """Re-balance the budget after ``row`` changed; the reply of its version after that."""
    keeper = state.budget
    if keeper is not None:
        row = (await keeper.rebalance()).get(row.id, row)
    return await run_in_threadpool(state.service.plans.version, row)
