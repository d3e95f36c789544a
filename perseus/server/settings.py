"""Server settings: defaults, overridden by ``PERSEUS_*`` environment variables, then flags."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULT_DATABASE", "Settings"]

DEFAULT_DATABASE = "sqlite:///./perseus.db"


class Settings(BaseSettings):
    """Planner server settings.

    Every field can be set as ``PERSEUS_<NAME>`` (for example ``PERSEUS_ADMIN_TOKEN``,
    ``PERSEUS_DATABASE``).
    """

    model_config = SettingsConfigDict(env_prefix="PERSEUS_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Address to bind; loopback by default.")
    port: int = Field(default=7787, ge=0, le=65535)
    database: str = Field(
        default=DEFAULT_DATABASE,
        description="SQLAlchemy URL: an SQLite file, or postgresql+psycopg://user:pw@host/db.",
    )
    workers: int = Field(default=1, ge=1, le=256, description="Server processes (uvicorn).")
    admin_token: SecretStr | None = Field(
        default=None, description="When set, creating, listing and deleting jobs needs it."
    )
    planning_workers: int = Field(default=1, ge=1, le=256, description="Processes per server.")
    planning_lease_s: float = Field(
        default=30.0,
        gt=0,
        description="A planning job whose server stops sending heartbeats for this long "
        "is taken over by another server (or by the same one after a restart).",
    )
    polish_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="Seconds a frontier computation may spend improving the no-slowdown "
        "point with a branch and bound (0: off).",
    )
    warm_planner: bool = Field(
        default=True, description="Start a planning process at startup, not at the first job."
    )
    cache_ttl_s: float = Field(
        default=1.0,
        ge=0,
        description="How long a process trusts its cached job state; changes made by other "
        "server processes become visible within this time.",
    )
    telemetry_flush_s: float = Field(
        default=0.25, gt=0, le=60, description="Iteration reports are written this often."
    )
    max_wait_s: float = Field(default=60.0, ge=0, le=3600, description="Longest plan long poll.")
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    log_level: str = Field(default="info")
