"""Our errors as HTTP answers: the status table and the JSON body (never a traceback)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from perseus.core.errors import (
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
from perseus.server.lifecycle.jobs import RequestFieldError
from perseus.server.lifecycle.quotas import QuotaExceeded
from perseus.server.store.storage import StorageFault

__all__ = ["error_response", "error_status"]

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
    (StorageFault, 503),
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
    if isinstance(exc, StorageFault):
        headers["Retry-After"] = "5"
    if code == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(content, status_code=code, headers=headers)
