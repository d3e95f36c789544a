"""Server settings: defaults, overridden by ``PERSEUS_*`` environment variables, then flags.

Each field is one of :mod:`perseus.core.settings`' variables (its name, default, bounds and
description come from there); pydantic-settings reads them from the environment.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from perseus.core import settings as variables
from perseus.core.settings import Number, Variable, Whole

__all__ = ["DEFAULT_DATABASE", "Settings", "variable_field"]

DEFAULT_DATABASE: str = variables.DATABASE.default or ""


def variable_field(variable: Variable[Any], *, checked_here: tuple[str, ...] = ()) -> Any:
    """The pydantic field of ``variable``: its default, description and bounds.

    ``checked_here`` names bounds (``"gt"``) a validator of the model checks instead, with
    its own message.
    """
    kind = variable.kind
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    if isinstance(kind, Whole):
        ge, le = kind.minimum, kind.maximum
    elif isinstance(kind, Number):
        ge, gt, le = kind.minimum, kind.above, kind.maximum
    if "gt" in checked_here:
        gt = None
    return Field(default=variable.default, description=variable.help or None, ge=ge, gt=gt, le=le)


class Settings(BaseSettings):
    """Planner server settings.

    Every field can be set as ``PERSEUS_<NAME>`` (for example ``PERSEUS_ADMIN_TOKEN``,
    ``PERSEUS_DATABASE``).
    """

    model_config = SettingsConfigDict(env_prefix="PERSEUS_", extra="ignore")

    host: str = variable_field(variables.HOST)
    port: int = variable_field(variables.PORT)
    database: str = variable_field(variables.DATABASE)
    workers: int = variable_field(variables.WORKERS)
    admin_token: SecretStr | None = variable_field(variables.ADMIN_TOKEN)
    planning_workers: int = variable_field(variables.PLANNING_WORKERS)
    planning_max_cells: int = variable_field(variables.PLANNING_MAX_CELLS)
    planning_timeout_s: float = variable_field(variables.PLANNING_TIMEOUT_S)
    clock_change_delay_s: float = variable_field(variables.CLOCK_CHANGE_DELAY_S)
    planning_memory_mb: int | None = variable_field(variables.PLANNING_MEMORY_MB)
    planning_lease_s: float = variable_field(variables.PLANNING_LEASE_S)
    polish_s: float = variable_field(variables.POLISH_S)
    warm_planner: bool = variable_field(variables.WARM_PLANNER)
    cache_ttl_s: float = variable_field(variables.CACHE_TTL_S)
    telemetry_flush_s: float = variable_field(variables.TELEMETRY_FLUSH_S)
    max_wait_s: float = variable_field(variables.MAX_WAIT_S, checked_here=("gt",))
    change_poll_s: float = variable_field(variables.CHANGE_POLL_S)
    max_body_bytes: int = variable_field(variables.MAX_BODY_BYTES)
    keep_alive_s: int = variable_field(variables.KEEP_ALIVE_S)
    header_timeout_s: float = variable_field(variables.HEADER_TIMEOUT_S)
    body_timeout_s: float = variable_field(variables.BODY_TIMEOUT_S)
    write_timeout_s: float = variable_field(variables.WRITE_TIMEOUT_S)
    max_jobs: int | None = variable_field(variables.MAX_JOBS)
    max_ranks_per_job: int | None = variable_field(variables.MAX_RANKS_PER_JOB)
    max_profile_rows: int | None = variable_field(variables.MAX_PROFILE_ROWS)
    max_job_profile_bytes: int | None = variable_field(variables.MAX_JOB_PROFILE_BYTES)
    cached_jobs: int = variable_field(variables.CACHED_JOBS)
    max_connections: int | None = variable_field(variables.MAX_CONNECTIONS)
    log_level: str = variable_field(variables.LOG_LEVEL)
    budget_default_gpu_w: float = variable_field(variables.BUDGET_DEFAULT_GPU_W)

    @field_validator("max_wait_s")
    @classmethod
    def _long_polls_wait(cls, value: float) -> float:
        if not value > 0:
            raise ValueError(
                f"{variables.MAX_WAIT_S.name} must be more than 0 seconds: a plan long poll "
                "that returns at once turns every rank's wait for a plan into a busy loop"
            )
        return value
