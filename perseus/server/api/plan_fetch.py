"""The plan fetch, the one hot path: its logic (:func:`plan_reply`) and the ASGI shortcut
(:class:`PlanFastPath`) that answers well-formed fetches without FastAPI's machinery."""

from __future__ import annotations

import re
from types import SimpleNamespace
from urllib.parse import parse_qsl

from fastapi import Response, status
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from perseus.core.errors import PerseusError, PlanError
from perseus.core.jobs import JobState
from perseus.schemas import PLAN_PATH, PlanQuery
from perseus.server.api.auth import bearer_token
from perseus.server.api.deps import ServerState, job_for_token
from perseus.server.api.http_errors import error_response
from perseus.server.planning.plans import has_plan
from perseus.server.runtime import RankPlace
from perseus.server.store.job_store import JobRow

__all__ = ["PlanFastPath", "plan_reply"]


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
    newer than every one named. A version newer than the database's own even then was
    never issued by this database (a backup restored, a database replaced): it counts for
    nothing, and the rank gets the current plan.

    Raises:
        PerseusError: unknown job (404), token (401/403), rank not registered or no plan (409).
    """
    row = await job_for_token(state, job_id, token)
    place = await state.heads.rank_position(job_id, query.rank)
    anything, known = _etag_versions(if_none_match)
    newest_known = max(known, default=-1)
    if row.version < newest_known:
        row = await state.heads.refresh(job_id)
        # Still newer than the database's: a version this database never issued (it was
        # restored from a backup, or replaced). The rank's plan is not this job's: it gets
        # the current one, or waits for the first, never for a version past its own.
        newest_known = max((v for v in known if v <= row.version), default=-1)
    wait_s = min(query.wait_s, state.settings.max_wait_s)
    if wait_s > 0:
        row = await state.heads.wait_until(
            job_id,
            lambda r: (
                (has_plan(r) and not anything and r.version > newest_known)
                or (r.state == JobState.FAILED and not has_plan(r))
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
