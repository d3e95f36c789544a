"""Our errors as HTTP answers: the status (core's one table) and the JSON body (never a
traceback)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from perseus.core.errors import (
    PerseusError,
    PlanNotReady,
    RequestFieldError,
    StorageFault,
    http_status,
)

__all__ = ["error_response", "error_status"]


def error_status(exc: PerseusError) -> int:
    """The HTTP status for one of our errors: :data:`perseus.core.errors.HTTP_STATUS`'s (400
    for any not listed)."""
    return http_status(exc)


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
