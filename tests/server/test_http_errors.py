"""Our errors as HTTP answers (perseus.server.api.http_errors): one status table, one body shape,
the headers a client acts on, never a traceback."""

from __future__ import annotations

import json

import pytest

from perseus.core.errors import (
    AuthError,
    GpuControlError,
    InfeasibleDeadline,
    JobNotFound,
    JobStateError,
    PerseusError,
    PlanError,
    PlanningTooLarge,
    PlanNotReady,
    PolicyError,
    ProfileError,
    QuotaExceeded,
    ScheduleError,
    SolverTimeout,
)
from perseus.schemas import ErrorBody, ValidationErrorBody
from perseus.server.api.http_errors import error_response, error_status
from perseus.server.lifecycle.jobs import RequestFieldError
from perseus.server.store.storage import StorageFault


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (JobNotFound("no job"), 404),
        (PlanNotReady("not ready", "profiling"), 409),
        (JobStateError("planning"), 409),
        (QuotaExceeded("max_jobs"), 409),
        (PlanError("replaced"), 409),
        (RequestFieldError(("body", "rows"), "no"), 422),
        (ProfileError("bad row"), 422),
        (ScheduleError("bad sizes"), 422),
        (PolicyError("bad factor"), 422),
        (InfeasibleDeadline("too short"), 422),
        (PlanningTooLarge("too large", cells=2, max_cells=1), 422),
        (SolverTimeout("slow"), 503),
        (StorageFault("read-only"), 503),
        (AuthError("no token", 401), 401),
        (AuthError("wrong token", 403), 403),
        (GpuControlError("not on the server"), 400),  # not listed: a plain bad request
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, PerseusError) else str(v),
)
def test_each_error_has_its_status(error: PerseusError, status: int) -> None:
    assert error_status(error) == status
    response = error_response(error)
    assert response.status_code == status
    body = json.loads(response.body)
    assert body["error"] == type(error).__name__
    model = ValidationErrorBody if isinstance(error, RequestFieldError) else ErrorBody
    model.model_validate(body)  # the documented shape
    assert "Traceback" not in response.body.decode()


def test_a_field_error_reads_like_pydantics() -> None:
    response = error_response(RequestFieldError(("body", "rows", 3), "share none of them"))
    assert json.loads(response.body) == {
        "detail": [
            {"loc": ["body", "rows", 3], "msg": "share none of them", "type": "value_error"}
        ],
        "error": "RequestFieldError",
    }


def test_headers_tell_the_client_when_to_retry_and_how_to_authenticate() -> None:
    not_ready = error_response(PlanNotReady("no plan yet", "planning"))
    assert not_ready.headers["retry-after"] == "1"
    assert json.loads(not_ready.body)["state"] == "planning"
    assert error_response(StorageFault("read-only")).headers["retry-after"] == "5"
    assert error_response(AuthError("no token", 401)).headers["www-authenticate"] == "Bearer"
    forbidden = error_response(AuthError("wrong", 403))
    assert "www-authenticate" not in forbidden.headers
    assert "retry-after" not in error_response(JobNotFound("no job")).headers
