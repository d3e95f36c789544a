"""Quotas: how much one client may make the server hold, each with a clear 4xx answer.

Without them, 3,000 jobs were created without a token in 7 s (each cached forever), one
job token registered ``data_parallel=131072``, and one job could store ~15 GiB of
profiles, which planning then loads into the server process. Each limit is a server
setting (``PERSEUS_MAX_JOBS``, ``PERSEUS_MAX_RANKS_PER_JOB``, ``PERSEUS_MAX_PROFILE_ROWS``,
``PERSEUS_MAX_JOB_PROFILE_BYTES``); None means no limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus.core.errors import QuotaExceeded

__all__ = ["QuotaExceeded", "Quotas"]


@dataclass(frozen=True, slots=True)
class Quotas:
    """The limits; None: none.

    Attributes:
        max_jobs: jobs stored at once (a new one past it: 409).
        max_ranks_per_job: a job's world size, stages x data_parallel x tensor_parallel
            (a larger job: 422 at creation).
        max_profile_rows: rows of one rank's profile (more: 422).
        max_job_profile_bytes: the profile rows one job stores, as JSON text, over all its
            ranks (past it: 409 naming the total).
    """

    max_jobs: int | None = None
    max_ranks_per_job: int | None = None
    max_profile_rows: int | None = None
    max_job_profile_bytes: int | None = None
