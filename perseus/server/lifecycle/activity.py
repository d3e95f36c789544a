"""What the web page shows live: each rank's last report (with how far its clock sweep got,
while it profiles) and the job's recent iterations.

Kept in this process's memory, not in the store: the page needs when a rank last reported
and each iteration's time (neither is stored per report), and losing them at a restart
costs only the chart's history. Several server processes each see the reports they
received. Everything here is O(1) per report, off the database.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from perseus.schemas import (
    ActivityView,
    IterationPhase,
    IterationPoint,
    IterationReport,
    JobView,
    ProfilingProgress,
    RankProfiling,
    RankStatus,
)
from perseus.server.store.tables import RankRow

__all__ = ["ITERATIONS_KEPT", "Activity"]

ITERATIONS_KEPT = 512
"""Recent iterations kept per job (the oldest go first)."""


@dataclass(slots=True)
class _LastReport:
    phase: IterationPhase | None
    plan_version: int | None
    at_s: float  # monotonic
    progress: ProfilingProgress | None = None  # the clock sweep's, while profiling


@dataclass(slots=True)
class _Iteration:
    times_s: list[float] = field(default_factory=list)
    energy_j: float = 0.0
    phase: IterationPhase | None = None
    plan_version: int | None = None
    received_s: float = 0.0


@dataclass(slots=True)
class _Job:
    ranks: dict[int, _LastReport] = field(default_factory=dict)
    iterations: OrderedDict[int, _Iteration] = field(default_factory=OrderedDict)


class Activity:
    """Per job: each rank's last report and the last :data:`ITERATIONS_KEPT` iterations.

    Thread-safe (reports arrive on the event loop, views are built in the thread pool).

    Args:
        clock: wall clock in seconds (the iterations' arrival times).
        monotonic: a monotonic clock (the ranks' report ages).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}

    def record(self, job_id: str, report: IterationReport) -> None:
        """Count one accepted iteration report."""
        now_s, at_s = self._clock(), self._monotonic()
        with self._lock:
            job = self._jobs.setdefault(job_id, _Job())
            job.ranks[report.rank] = _LastReport(
                report.phase, report.plan_version, at_s, report.profiling
            )
            it = job.iterations.get(report.iteration)
            if it is None:
                it = job.iterations[report.iteration] = _Iteration()
                while len(job.iterations) > ITERATIONS_KEPT:
                    job.iterations.popitem(last=False)
            it.times_s.append(report.time_s)
            it.energy_j += report.energy_j
            it.phase = report.phase
            if report.plan_version is not None:
                it.plan_version = max(it.plan_version or 0, report.plan_version)
            it.received_s = now_s

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)

    def profiling(self, job_id: str) -> list[RankProfiling]:
        """The ranks whose last report says how far their clock sweep got, by rank.

        Complexity: O(ranks).
        """
        now = self._monotonic()
        with self._lock:
            job = self._jobs.get(job_id)
            last = sorted(job.ranks.items()) if job is not None else []
        return [
            RankProfiling.from_progress(rank, heard.progress, max(0.0, now - heard.at_s))
            for rank, heard in last
            if heard.progress is not None
        ]

    def with_profiling(self, view: JobView) -> JobView:
        """``view`` with its ranks' profiling progress (:meth:`profiling`)."""
        profiling = self.profiling(view.job_id)
        return view.model_copy(update={"profiling": profiling}) if profiling else view

    def view(self, version: int, job_id: str, ranks: Sequence[RankRow]) -> ActivityView:
        """The job's ranks (from the store, with what this process heard) and its recent
        iterations in ascending order.

        Complexity: O(ranks + kept iterations x ranks).
        """
        now = self._monotonic()
        with self._lock:
            job = self._jobs.get(job_id) or _Job()
            last = dict(job.ranks)
            iterations = [
                IterationPoint(
                    iteration=number,
                    received_s=it.received_s,
                    time_s=statistics.median(it.times_s),
                    energy_j=it.energy_j,
                    ranks=len(it.times_s),
                    phase=it.phase,
                    plan_version=it.plan_version,
                )
                for number, it in sorted(job.iterations.items())
            ]
        statuses = []
        for row in ranks:
            heard = last.get(row.rank)
            statuses.append(
                RankStatus(
                    rank=row.rank,
                    stage=row.stage,
                    data_parallel_rank=row.data_parallel_rank,
                    tensor_parallel_rank=row.tensor_parallel_rank,
                    host=row.host,
                    iterations=row.iterations,
                    phase=None if heard is None else heard.phase,
                    plan_version=None if heard is None else heard.plan_version,
                    following=heard is not None
                    and heard.phase in ("plan", None)
                    and version > 0
                    and heard.plan_version == version,
                    last_report_age_s=None if heard is None else max(0.0, now - heard.at_s),
                    profiling=None
                    if heard is None or heard.progress is None
                    else RankProfiling.from_progress(
                        row.rank, heard.progress, max(0.0, now - heard.at_s)
                    ),
                )
            )
        return ActivityView(version=version, ranks=statuses, iterations=iterations)
