"""One exception tree for the whole project.

::

    PerseusError
    ├── ProfileError            a profile file or request is malformed (names file, row, field)
    ├── ScheduleError           a schedule cannot be built (bad sizes, unknown name, cyclic DAG)
    ├── PlanError               a plan does not fit its schedule or profile
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
    ├── RequestRejected         the planner refused a request as malformed (400, 413, 422)
    ├── JobNotFound             no job with that id
    ├── JobStateError           the job is not in a state that allows the request
    │   └── PlanNotReady            no plan or frontier yet; ``state`` says where the job stands
    ├── AuthError               a token is missing (401) or wrong (403)
    ├── QuotaExceeded           the planner holds as much as its settings allow (409)
    └── StoreError              the job database cannot be reached, read or migrated
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthError",
    "GpuControlError",
    "InfeasibleDeadline",
    "JobNotFound",
    "JobStateError",
    "NvmlNotSupported",
    "NvmlPermissionError",
    "PerseusError",
    "PlanError",
    "PlanNotReady",
    "PlannerUnavailable",
    "PlanningTooLarge",
    "PolicyError",
    "ProfileError",
    "QuotaExceeded",
    "RequestRejected",
    "ScheduleError",
    "SolverTimeout",
    "StoreError",
    "ZeusdRefused",
    "ZeusdUnavailable",
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


class RequestRejected(PerseusError):
    """The planner refused a request as malformed; retrying it unchanged cannot help.

    The message names each rejected field by its path (``body.rows.3.time_s: ...``).

    Attributes:
        status_code: the HTTP status the planner answered (400, 413 or 422).
    """

    def __init__(self, message: str, status_code: int = 422) -> None:
        super().__init__(message)
        self.status_code = status_code


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
