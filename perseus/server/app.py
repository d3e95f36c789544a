"""The FastAPI application factory.

``create_app(settings)`` builds the app; its lifespan opens the store, the planning pool
and the caches and puts them on ``app.state.perseus``. Nothing is built at import time.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from perseus import __version__
from perseus.errors import PerseusError
from perseus.server.auth import hash_token
from perseus.server.jobs import JobService
from perseus.server.metrics import BodyLimitMiddleware, Metrics, MetricsMiddleware
from perseus.server.routes import PlanFastPath, ServerState, error_response, router
from perseus.server.runtime import JobHeads, PlanningRunner, TelemetryBuffer
from perseus.server.settings import Settings
from perseus.server.store import Store

__all__ = ["create_app", "create_app_from_env"]

log = logging.getLogger("perseus.server")


async def _perseus_error(_request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, PerseusError):  # registered for PerseusError only
        raise exc
    return error_response(exc)


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
    return JSONResponse({"detail": detail, "error": "ValidationError"}, status_code=422)


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
        service = JobService(store)
        heads = JobHeads(service, settings.cache_ttl_s)
        runner = PlanningRunner(
            service,
            heads,
            metrics,
            workers=settings.planning_workers,
            lease_s=settings.planning_lease_s,
            polish_s=settings.polish_s,
            warm=settings.warm_planner,
        )
        telemetry = TelemetryBuffer(service, heads, settings.telemetry_flush_s)
        admin = settings.admin_token.get_secret_value() if settings.admin_token else None
        app.state.perseus = ServerState(
            settings=settings,
            service=service,
            heads=heads,
            runner=runner,
            metrics=metrics,
            telemetry=telemetry,
            admin_token_hash=hash_token(admin) if admin else None,
        )
        runner.start_maintenance()
        telemetry.start()
        # Everything loaded so far (modules, the app, caches) lives as long as the process:
        # keep it out of the garbage collector's full passes, which would otherwise stall
        # the event loop for 100 ms and more once the heap is large.
        gc.freeze()
        log.info("perseus planner: store %s, owner %s", store.backend, service.owner)
        try:
            yield
        finally:
            await telemetry.close()
            await runner.close()
            store.close()

    app = FastAPI(
        title="perseus planner",
        version=__version__,
        description="Plans per-instruction GPU clocks for pipeline-parallel training.",
        lifespan=lifespan,
        docs_url="/docs",
    )
    app.include_router(router)
    app.add_exception_handler(PerseusError, _perseus_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(PlanFastPath)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` (several workers): settings from the environment."""
    return create_app(Settings())
