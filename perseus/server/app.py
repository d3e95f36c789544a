"""The FastAPI application factory.

``create_app(settings)`` builds the app; its lifespan opens the store, the planning pool
and the caches and puts them on ``app.state.perseus``. Nothing is built at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from http import HTTPStatus
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from perseus import __version__
from perseus.core.errors import PerseusError
from perseus.schemas import (
    CLUSTER_BUDGET_PATH,
    JOBS_PATH,
    OVERVIEW_PATH,
    ErrorBody,
    ValidationErrorBody,
)
from perseus.server.api import cluster_routes
from perseus.server.api.auth import hash_token
from perseus.server.api.edge import AuthBeforeBody, bounded_accept_errors
from perseus.server.api.metrics import BodyLimitMiddleware, Metrics, MetricsMiddleware
from perseus.server.api.routes import PlanFastPath, ServerState, error_response, router
from perseus.server.api.ui import add_ui_routes
from perseus.server.budget_runtime import BudgetKeeper
from perseus.server.lifecycle.jobs import RequestFieldError
from perseus.server.lifecycle.quotas import Quotas
from perseus.server.planning.runner import PlanningRunner
from perseus.server.runtime import JobHeads, TelemetryBuffer
from perseus.server.service import JobService
from perseus.server.settings import Settings
from perseus.server.store.job_store import Store

__all__ = ["create_app", "create_app_from_env"]

log = logging.getLogger("perseus.server")


def _validation_response(
    detail: list[dict[str, Any]], error: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"detail": detail, "error": error}, status_code=422, headers=headers)


async def _perseus_error(request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, PerseusError):  # registered for PerseusError only
        raise exc
    response = error_response(exc)
    if response.status_code != 422 or isinstance(exc, RequestFieldError):
        return response
    # Every 422 has the documented shape (a list of rejected fields): an error about the
    # request as a whole (an infeasible deadline, a profile that does not fit) names the body.
    loc: list[str] = ["body"] if request.method in ("POST", "PUT", "PATCH") else []
    return _validation_response([{"loc": loc, "msg": str(exc), "type": "value_error"}],
                                type(exc).__name__)  # fmt: skip


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, RequestValidationError):
        raise exc
    # FastAPI's default echoes the input back, which fails on NaN and can be large.
    detail = [
        {
            "loc": list(err.get("loc", ())),
            "msg": str(err.get("msg", "")),
            "type": str(err.get("type", "")),
        }
        for err in exc.errors()
    ]
    return _validation_response(detail, "ValidationError")


_HTTP_METHODS = frozenset({"get", "put", "post", "delete", "patch", "head", "options", "trace"})


def _allow_table(app: FastAPI) -> list[tuple[re.Pattern[str], frozenset[str]]]:
    """Path patterns and their methods: the OpenAPI paths, and the routes outside it."""
    table: list[tuple[re.Pattern[str], frozenset[str]]] = []
    for template, item in app.openapi().get("paths", {}).items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        methods = frozenset(m.upper() for m in item if m in _HTTP_METHODS)
        table.append((re.compile(pattern), methods))
    for route in app.routes:
        if isinstance(route, Route) and not route.include_in_schema and route.methods:
            table.append((route.path_regex, frozenset(route.methods)))
    return table


def _allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route serves at ``path`` (for ``Allow``); empty where none does."""
    table = getattr(app.state, "allow_table", None)
    if table is None:
        table = app.state.allow_table = _allow_table(app)
    methods: set[str] = set()
    for pattern, route_methods in table:
        if pattern.fullmatch(path):
            methods |= route_methods
    return sorted(methods | {"OPTIONS"}) if methods else []


async def _http_error(request: Request, exc: Exception) -> Response:
    """Router and parsing errors (404, 405, an unreadable body) in the documented shape."""
    if not isinstance(exc, HTTPException):
        raise exc
    headers = dict(exc.headers or {})
    if exc.status_code == 400:
        # FastAPI answers 400 to a body json.loads cannot take (invalid UTF-8, nesting too
        # deep); a body that is not valid JSON is a 422 json_invalid, so this is one too.
        detail = [{"loc": ["body"], "msg": str(exc.detail), "type": "json_invalid"}]
        return _validation_response(detail, "ValidationError", headers)
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(_allowed_methods(request.app, request.url.path))
    name = HTTPStatus(exc.status_code).phrase.replace(" ", "").replace("-", "")
    return JSONResponse(
        {"detail": str(exc.detail), "error": name}, status_code=exc.status_code, headers=headers
    )


class _Options:
    """``OPTIONS`` on any API path: 204 with ``Allow`` (404 where no route matches)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await self.app(scope, receive, send)
            return
        allowed = _allowed_methods(scope["app"], scope["path"])
        if not allowed:
            await self.app(scope, receive, send)
            return
        response = Response(status_code=204, headers={"Allow": ", ".join(allowed)})
        await response(scope, receive, send)


def _docs_routes(app: FastAPI) -> None:
    """``/docs``: Swagger UI from files installed with the package (no CDN).

    The files come from ``fastapi-offline`` (a dependency of the ``server`` extra), which
    ships a current Swagger UI 5 build; it is only read from, never imported.
    """
    static = resources.files("fastapi_offline") / "static"
    app.mount("/docs/static", StaticFiles(directory=str(static)), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
            swagger_js_url=f"{root}/docs/static/swagger-ui-bundle.js",
            swagger_css_url=f"{root}/docs/static/swagger-ui.css",
            swagger_favicon_url=f"{root}/docs/static/favicon.png",
            # Swagger UI's default validator badge calls validator.swagger.io.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()


def _edge_lifespan(
    inner: Callable[[FastAPI], AbstractAsyncContextManager[None]],
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The lifespan, with accept errors ("Too many open files") logged at a bounded rate."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        bounded_accept_errors(asyncio.get_running_loop())
        async with inner(app):
            yield

    return lifespan


def _document_errors(app: FastAPI, *, admin: bool) -> None:
    """Every operation documents 422 as :class:`ValidationErrorBody` (FastAPI's own 422
    schema lacks ``error``), and 404/405 where the router answers. Without an admin token,
    creating and listing jobs (and the overview) needs no token: the document says so
    (security optional)."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = original()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (ErrorBody, ValidationErrorBody):
            defs = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in defs.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components[model.__name__] = defs
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        validation = {
            "description": "Rejected fields (or a body that is not JSON)",
            "content": {"application/json": {"schema": {
                "$ref": "#/components/schemas/ValidationErrorBody"}}},
        }  # fmt: skip
        error = {"content": {"application/json": {"schema": {
            "$ref": "#/components/schemas/ErrorBody"}}}}  # fmt: skip
        for path, path_item in schema.get("paths", {}).items():
            for operation in path_item.values():
                # The admin's routes take any caller on a server without an admin token.
                open_paths = (JOBS_PATH, OVERVIEW_PATH, CLUSTER_BUDGET_PATH)
                if path in open_paths and not admin and "security" in operation:
                    operation["security"] = [*operation["security"], {}]
                responses = operation.setdefault("responses", {})
                responses["422"] = validation
                responses.setdefault("404", {**error, "description": "Not found"})
                responses.setdefault("405", {**error, "description": "Method not allowed",
                    "headers": {"Allow": {"schema": {"type": "string"}}}})  # fmt: skip
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the planner app.

    Args:
        settings: server settings; read from ``PERSEUS_*`` environment variables if None.

    Returns:
        The FastAPI app; its lifespan opens the store and the planning pool.
    """
    settings = settings if settings is not None else Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.database)
        await run_in_threadpool(store.create_schema)
        quotas = Quotas(
            max_jobs=settings.max_jobs,
            max_ranks_per_job=settings.max_ranks_per_job,
            max_profile_rows=settings.max_profile_rows,
            max_job_profile_bytes=settings.max_job_profile_bytes,
        )
        service = JobService(
            store,
            max_cells=settings.planning_max_cells,
            quotas=quotas,
            default_gpu_w=settings.budget_default_gpu_w,
        )
        heads = JobHeads(
            service.jobs,
            settings.cache_ttl_s,
            settings.change_poll_s,
            max_jobs=settings.cached_jobs,
        )
        heads.bind_loop()
        listener = await run_in_threadpool(store.listen, heads.changed_threadsafe)
        runner = PlanningRunner(
            service.lease,
            heads,
            metrics,
            workers=settings.planning_workers,
            lease_s=settings.planning_lease_s,
            polish_s=settings.polish_s,
            warm=settings.warm_planner,
            timeout_s=settings.planning_timeout_s,
            memory_mb=settings.planning_memory_mb,
            max_cells=settings.planning_max_cells,
            clock_change_delay_s=settings.clock_change_delay_s,
        )
        telemetry = TelemetryBuffer(
            service.iterations, service.choices, heads, settings.telemetry_flush_s
        )
        budget = BudgetKeeper(service.budget, heads)
        runner.after_plan = budget.rebalance
        telemetry.after_straggler = budget.rebalance
        admin = settings.admin_token.get_secret_value() if settings.admin_token else None
        app.state.perseus = ServerState(
            settings=settings,
            service=service,
            heads=heads,
            runner=runner,
            metrics=metrics,
            telemetry=telemetry,
            admin_token_hash=hash_token(admin) if admin else None,
            budget=budget,
        )
        runner.start_maintenance()
        telemetry.start()
        budget.start()
        storage_probe = (
            asyncio.create_task(_probe_storage(store), name="perseus storage probe")
            if store.guard is not None
            else None
        )
        # Everything loaded so far (modules, the app, caches) lives as long as the process:
        # keep it out of the garbage collector's full passes, which would otherwise stall
        # the event loop for 100 ms and more once the heap is large.
        gc.freeze()
        log.info("perseus planner: store %s, owner %s", store.backend, service.owner)
        try:
            yield
        finally:
            if storage_probe is not None:
                storage_probe.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await storage_probe
            await budget.close()
            await telemetry.close()
            await runner.close()
            await heads.close()
            if listener is not None:
                await run_in_threadpool(listener.close)
            store.close()

    app = FastAPI(
        title="perseus planner",
        version=__version__,
        description="Plans per-instruction GPU clocks for pipeline-parallel training.",
        lifespan=_edge_lifespan(lifespan),
        docs_url=None,
        redoc_url=None,
    )
    # "/v1/jobs/" is a 404, not a redirect to a path that then answers 405.
    app.router.redirect_slashes = False
    app.include_router(router)
    app.include_router(cluster_routes.router)
    _docs_routes(app)
    add_ui_routes(app)
    _document_errors(app, admin=settings.admin_token is not None)
    app.add_exception_handler(PerseusError, _perseus_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    # Outermost last: metrics, then the token (before any byte of the body is read), then
    # the body cap, then OPTIONS and the plan fast path.
    app.add_middleware(PlanFastPath)
    app.add_middleware(_Options)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuthBeforeBody)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


STORAGE_PROBE_S = 1.0
"""How often the SQLite store's files are checked for writability (a fault found answers
503 and /healthz names it; the next check that passes clears it)."""


async def _probe_storage(store: Store) -> None:
    while True:
        await asyncio.sleep(STORAGE_PROBE_S)
        try:
            await run_in_threadpool(store.probe_storage)
        except Exception:  # the probe must outlive any one failure
            log.exception("storage probe failed")


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` (several workers): settings from the environment."""
    return create_app(Settings())
