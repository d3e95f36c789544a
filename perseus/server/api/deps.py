"""What every route depends on: the server's state, the caller's token, the job in the path.

Also the error responses every route documents (:data:`ERROR_RESPONSES`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Scope

from perseus.core.errors import JobNotFound
from perseus.schemas import ErrorBody
from perseus.server.api.auth import check_job_token
from perseus.server.api.metrics import Metrics
from perseus.server.budget_runtime import BudgetKeeper
from perseus.server.lifecycle.activity import Activity
from perseus.server.planning.runner import PlanningRunner
from perseus.server.runtime import Coalescer, JobHeads, RankPlace, TelemetryBuffer
from perseus.server.service import JobService
from perseus.server.settings import Settings
from perseus.server.store.job_store import JobRow

__all__ = [
    "ERROR_RESPONSES",
    "JOB_ID",
    "AuthorizedJob",
    "Credentials",
    "JobIdPath",
    "ServerState",
    "State",
    "authorized_job",
    "client_host",
    "credentials_token",
    "job_for_token",
    "server_state",
]

log = logging.getLogger("perseus.server")

JOB_ID = re.compile(r"[0-9a-f]{32}")
"""A well-formed job id (anything else is a 404 without a database read)."""


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
    # The cluster power budget's re-balances and window timer (None: tests without one).
    budget: BudgetKeeper | None = None

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


def credentials_token(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return None if credentials is None else credentials.credentials


async def job_for_token(state: ServerState, job_id: str, token: str | None) -> JobRow:
    """The job, once ``token`` is checked against it (404, 401, 403)."""
    if not JOB_ID.fullmatch(job_id):
        raise JobNotFound(f"no job {job_id!r}")
    row = await state.heads.get(job_id)
    check_job_token(token, row.token_hash, state.admin_token_hash)
    return row


async def authorized_job(state: State, job_id: JobIdPath, credentials: Credentials) -> JobRow:
    """The job named in the path, once the caller's token is checked (404, 401, 403)."""
    return await job_for_token(state, job_id, credentials_token(credentials))


AuthorizedJob = Annotated[JobRow, Depends(authorized_job)]


def client_host(scope: Scope) -> str | None:
    client = scope.get("client")
    return None if not client else str(client[0])


ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody, "description": "No token"},
    403: {"model": ErrorBody, "description": "Wrong token"},
    404: {"model": ErrorBody, "description": "Unknown job"},
    409: {"model": ErrorBody, "description": "Not in a state that allows this (or not ready yet)"},
    413: {"model": ErrorBody, "description": "Request body too large"},
}
