"""Server settings: defaults, overridden by ``PERSEUS_*`` environment variables, then flags."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from perseus.core.defaults import POLISH_S
from perseus.solver.deadlines import MAX_CELLS

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
    planning_workers: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Planning runs at a time per server, each in a process of its own; one "
        "more runs a small job (1/16 of planning_max_cells) when these are all busy.",
    )
    planning_max_cells: int = Field(
        default=MAX_CELLS,
        ge=1_000_000,
        description="Most planning work a job may imply, instructions x frontier deadlines "
        "(estimated from its profiles; about 12 bytes and 1 us each); a job over it gets "
        "422 naming what would fit. The default admits 16 stages x 128 microbatches "
        "interleaved (1.5e8) and refuses what would take many GiB or minutes.",
    )
    planning_timeout_s: float = Field(
        default=900.0,
        gt=0,
        le=86_400,
        description="Wall-clock limit of one planning run; past it the run's process is "
        "killed and the job fails with a reason. About twice what a job at "
        "planning_max_cells takes on a busy 2-core host.",
    )
    planning_memory_mb: int | None = Field(
        default=8192,
        ge=512,
        description="Memory limit of one planning process (RLIMIT_DATA, MiB); a run that "
        "needs more fails with a reason. Unset: no limit.",
    )
    planning_lease_s: float = Field(
        default=30.0,
        gt=0,
        description="A planning job whose server stops sending heartbeats for this long "
        "is taken over by another server (or by the same one after a restart).",
    )
    polish_s: float = Field(
        default=POLISH_S,
        ge=0,
        le=3600,
        description="Seconds a frontier computation may spend improving the no-slowdown "
        "point with a branch and bound (0, the default: off; timed, so the frontier then "
        "depends on the machine's speed).",
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
    max_wait_s: float = Field(
        default=60.0,
        le=3600,
        description="Longest plan long poll; more than 0 (0 would answer every poll at "
        "once: the ranks would each poll as fast as their floor allows).",
    )
    change_poll_s: float = Field(
        default=0.1,
        gt=0,
        le=60,
        description="While ranks long-poll, how often other server processes' changes are "
        "looked for (PostgreSQL also notifies at once).",
    )
    max_body_bytes: int = Field(
        default=2 * 1024 * 1024,
        ge=1024,
        description="Larger request bodies get 413. The largest legitimate request, a "
        "10,000-row profile report with 17-digit numbers, is 1.16 MB as the perseus client "
        "sends it (1.58 MB indented): 2 MiB leaves a margin and no more.",
    )
    keep_alive_s: int = Field(
        default=75,
        ge=1,
        le=3600,
        description="An idle keep-alive connection is closed after this long. Keep it longer "
        "than any client's pool expiry (the perseus client's is 60 s, httpx's default 5 s): "
        "a client that reuses a connection just as the server closes it sees an error.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="A connection must send a complete request head within this long of "
        "opening (or of its first byte after a keep-alive pause); else it is closed.",
    )
    body_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="A request must send its whole body within this long of its head; else "
        "its connection is closed and nothing of it is stored. The largest legitimate body "
        "(2 MiB at most) takes well under a second in a cluster.",
    )
    write_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Output a client does not read must be taken within this long once "
        "64 KiB of it wait (and a closing connection's within this long of closing); else "
        "the connection is aborted. A client that sends requests and never reads the "
        "answers would otherwise hold its connection, and its request, forever.",
    )
    max_jobs: int | None = Field(
        default=10_000,
        ge=1,
        description="Jobs stored at once; creating one more answers 409 (delete finished "
        "jobs). Unset: no limit.",
    )
    max_ranks_per_job: int | None = Field(
        default=16_384,
        ge=1,
        description="A job's ranks, stages x data_parallel x tensor_parallel; a larger job "
        "answers 422 at creation. Unset: no limit.",
    )
    max_profile_rows: int | None = Field(
        default=10_000,
        ge=2,
        description="Rows of one rank's profile; more answers 422 (a full sweep of an H200's "
        "clocks is ~220 rows per instruction kind). Unset: no limit.",
    )
    max_job_profile_bytes: int | None = Field(
        default=256 * 2**20,
        ge=1024,
        description="Profile rows one job stores, as JSON, over all its ranks; a profile past "
        "it answers 409. Planning loads them all into the server. Unset: no limit.",
    )
    cached_jobs: int = Field(
        default=4096,
        ge=16,
        description="Job rows kept in each server process's memory; the least recently "
        "changed beyond it are read again from the database when asked for.",
    )
    max_connections: int | None = Field(
        default=None,
        ge=16,
        description="Open connections per server process; past it the ones that have waited "
        "longest for a request are closed, and when none waits, requests get 503. Unset: the "
        "open-file limit (raised to its hard limit at start) less 128.",
    )
    log_level: str = Field(default="info")

    @field_validator("max_wait_s")
    @classmethod
    def _long_polls_wait(cls, value: float) -> float:
        if not value > 0:
            raise ValueError(
                "PERSEUS_MAX_WAIT_S must be more than 0 seconds: a plan long poll that "
                "returns at once turns every rank's wait for a plan into a busy loop"
            )
        return value
