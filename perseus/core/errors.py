"""One exception tree for the whole project.

::

    PerseusError
    ├── ProfileError            a profile file or request is malformed (names file, row, field)
    ├── ScheduleError           a schedule cannot be built (bad sizes, unknown name, cyclic DAG)
    ├── PlanError               a plan does not fit its schedule or profile
    │   └── PlanTooLarge            a plan's answer is longer than the rank takes (client side)
    ├── InfeasibleDeadline      no plan meets the requested iteration time
    ├── SolverTimeout           an exact solve ran out of its time
    ├── PlanningTooLarge        a job's planning would exceed the planner's work limit
    ├── PolicyError             a policy name or parameter is invalid
    ├── GpuControlError         reading or setting GPU clocks failed
    │   ├── NvmlPermissionError     the process may not change clocks
    │   ├── NvmlNotSupported        the GPU or driver lacks the call
    │   ├── ZeusdUnavailable        zeusd (the clock daemon) cannot be reached
    │   └── ZeusdRefused            zeusd answered a request with an error
    ├── PlannerUnavailable      the planner server cannot be reached
    │   └── AnswerNotUnderstood     an answer is not what this client reads (another version?)
    ├── RequestRejected         the planner refused a request as malformed (400, 413, 422)
    ├── RequestFieldError       a request field is invalid for its job (server side, 422)
    ├── JobNotFound             no job with that id
    ├── JobStateError           the job is not in a state that allows the request
    │   └── PlanNotReady            no plan or frontier yet; ``state`` says where the job stands
    ├── AuthError               a token is missing (401) or wrong (403)
    ├── QuotaExceeded           the planner holds as much as its settings allow (409)
    ├── StoreError              the job database cannot be reached, read or migrated
    │   └── StorageFault            its storage cannot be written now (503 until it can)
    ├── SettingsError           a ``PERSEUS_*`` variable or a setting is missing or malformed
    ├── UsageError              a ``perseus`` command line is invalid (names the argument)
    ├── CommandError            a ``perseus job`` command cannot run as given
    └── StartupError            ``perseus serve`` cannot start (port in use, database unusable)

Every error the planner answers with over HTTP gets its status from one table,
:data:`HTTP_STATUS`, read by the server (``perseus.server.api.http_errors``) to answer and
by the client (``perseus.client.api.http``) to raise the same class again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "HTTP_STATUS",
    "AnswerNotUnderstood",
    "AuthError",
    "CommandError",
    "GpuControlError",
    "InfeasibleDeadline",
    "JobNotFound",
    "JobStateError",
    "NvmlNotSupported",
    "NvmlPermissionError",
    "PerseusError",
    "PlanError",
    "PlanNotReady",
    "PlanTooLarge",
    "PlannerUnavailable",
    "PlanningTooLarge",
    "PolicyError",
    "ProfileError",
    "QuotaExceeded",
    "RequestFieldError",
    "RequestRejected",
    "ScheduleError",
    "SettingsError",
    "SolverTimeout",
    "StartupError",
    "StorageFault",
    "StoreError",
    "UsageError",
    "ZeusdRefused",
    "ZeusdUnavailable",
    "error_named",
    "http_status",
]


class PerseusError(Exception):
    """Base of every error perseus raises on purpose."""


class ProfileError(PerseusError):
    """A profile is malformed.

    The message names where: ``file:row: field: what is wrong``.
    """


class ScheduleError(PerseusError):
    """A schedule or its DAG cannot be built."""


class PlanError(PerseusError):
    """A plan does not match its schedule or profile."""


class PlanTooLarge(PlanError):
    """A plan's answer is longer than the rank allows; refused before it is read whole.

    Attributes:
        version: The plan's version from its ETag (None when the server sent none).
        size_bytes: Its length as far as known (Content-Length, else what was read).
    """

    def __init__(self, message: str, version: int | None = None, size_bytes: int = 0) -> None:
        super().__init__(message)
        self.version = version
        self.size_bytes = size_bytes


class InfeasibleDeadline(PerseusError):
    """No plan meets the requested iteration time."""


class SolverTimeout(PerseusError):
    """An exact (MILP) solve did not finish within its time limit."""


class PlanningTooLarge(PerseusError):
    """Planning a job would take more work than the planner allows (the server answers 422).

    The message names the estimate, the limit (its setting) and what would fit: fewer
    microbatches, a coarser ``resolution_s``.

    Attributes:
        cells: the estimated work, instructions x deadlines.
        max_cells: the limit.
    """

    def __init__(self, message: str, *, cells: int = 0, max_cells: int = 0) -> None:
        super().__init__(message)
        self.cells = cells
        self.max_cells = max_cells


class PolicyError(PerseusError):
    """A policy name or its parameter is invalid."""


class GpuControlError(PerseusError):
    """Reading or setting GPU clocks failed."""


class NvmlPermissionError(GpuControlError):
    """The process lacks the permission to change GPU clocks."""


class NvmlNotSupported(GpuControlError):
    """The GPU or driver does not support the requested NVML call."""


class PlannerUnavailable(PerseusError):
    """The planner server cannot be reached or answered with an error."""


class AnswerNotUnderstood(PlannerUnavailable):
    """A successful answer that is not the model this client expects: a server of another
    version that changed a field this client needs, or something that is not a planner
    answering. Retryable like any garbage, but a caller that keeps getting it gives up
    rather than asking forever (see :func:`perseus.client.api.retry.retry_call`)."""


class RequestRejected(PerseusError):
    """The planner refused a request as malformed; retrying it unchanged cannot help.

    The message names each rejected field by its path (``body.rows.3.time_s: ...``).

    Attributes:
        status_code: the HTTP status the planner answered (400, 413 or 422).
    """

    def __init__(self, message: str, status_code: int = 422) -> None:
        super().__init__(message)
        self.status_code = status_code


class RequestFieldError(PerseusError):
    """A request field is invalid for this job (422), with its path like pydantic's ``loc``.

    Attributes:
        loc: the field's path (``("body", "rows", 3)``).
        message: what is wrong with it (the error's text is ``loc: message``).
    """

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(f"{'.'.join(str(p) for p in loc)}: {message}")
        self.loc = loc
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # ``args`` holds the joined text, not the constructor's (loc, message).
        return type(self), (self.loc, self.message), self.__dict__


class JobNotFound(PerseusError):
    """No job with the given id exists."""


class JobStateError(PerseusError):
    """The job is not in a state that allows the request."""


class PlanNotReady(JobStateError):
    """The job has no plan (or frontier) yet.

    The server answers 409 with ``state`` in the body and ``Retry-After``; the client raises
    this same class, so a rank can tell "wait and ask again" from any other refusal.

    Attributes:
        state: where the job stands (``registering``, ``profiling``, ``planning``, ``failed``).
        retry_after_s: how long the server asked the client to wait (``Retry-After``), when
            the error came over the wire with one.
    """

    def __init__(self, message: str, state: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.state = state
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[Any, ...]:
        # Unpickling calls the class with ``args`` (the message only), which lacks the
        # required ``state``: pass it too, and the attributes as the state to restore.
        return type(self), (*self.args, self.state), self.__dict__


class AuthError(PerseusError):
    """A token is missing or wrong.

    Attributes:
        status_code: 401 when no token was given, 403 when it was wrong.
    """

    def __init__(self, message: str, status_code: int = 401) -> None:
        super().__init__(message)
        self.status_code = status_code


class QuotaExceeded(PerseusError):
    """The planner holds as much as its settings allow (409): delete something first."""


class StoreError(PerseusError):
    """The job database cannot be reached, read or brought to this version's schema.

    The message names the database (its password hidden) and what to do.
    """


class ZeusdUnavailable(GpuControlError):
    """zeusd, the privileged daemon that sets clocks for unprivileged ranks, cannot be reached.

    The message names the socket or address and what to check (is the daemon running, is the
    socket mounted into the container).
    """


class ZeusdRefused(GpuControlError):
    """zeusd answered a request with an error status.

    The message names the request, the status and zeusd's own words, and for a refusal the
    user can fix (a missing or wrong token, the ``gpu-control`` group not enabled) what to do.

    Attributes:
        status_code: the HTTP status zeusd answered (400, 401, 403, 404, 500, ...).
    """

    def __init__(self, message: str, status_code: int = 500) -> None:
        super().__init__(message)
        self.status_code = status_code


class StorageFault(StoreError):
    """The job database's storage cannot be written (read-only file or filesystem, I/O
    error): 503 until the store's probe finds it writable again."""


class SettingsError(PerseusError):
    """A setting is missing or malformed; the message names the variable (or argument) and
    says why."""


class UsageError(PerseusError):
    """A bad ``perseus`` command line; the message says which argument and why."""


class CommandError(PerseusError):
    """A job command cannot run as given (a missing server, job or token, a bad file)."""


class StartupError(PerseusError):
    """``perseus serve`` cannot go on; the message is one line: what is wrong and how to fix
    it."""


HTTP_STATUS: Mapping[type[PerseusError], int] = {
    JobNotFound: 404,
    PlanNotReady: 409,
    JobStateError: 409,
    QuotaExceeded: 409,
    PlanError: 409,
    RequestFieldError: 422,
    ProfileError: 422,
    ScheduleError: 422,
    PolicyError: 422,
    InfeasibleDeadline: 422,
    PlanningTooLarge: 422,
    SolverTimeout: 503,
    StorageFault: 503,
}
"""The HTTP status of each error the planner answers with, a subclass before its base: the
first class an error is an instance of gives its status (:func:`http_status`). The answer
names the class (``{"error": "JobNotFound"}``) and the client raises it again
(:func:`error_named`). :class:`AuthError` carries its own status (401 or 403); an error not
listed is a plain bad request (400)."""


def http_status(error: PerseusError) -> int:
    """The HTTP status the planner answers ``error`` with (see :data:`HTTP_STATUS`)."""
    if isinstance(error, AuthError):
        return error.status_code
    for cls, status in HTTP_STATUS.items():
        if isinstance(error, cls):
            return status
    return 400


def error_named(name: str) -> type[PerseusError] | None:
    """The class of :data:`HTTP_STATUS` named ``name`` (an answer's ``error``), if any."""
    return _BY_NAME.get(name)


_BY_NAME: Mapping[str, type[PerseusError]] = {cls.__name__: cls for cls in HTTP_STATUS}
