"""Telemetry: ranks' measured iterations, kept per plan version, against the prediction.

Every rank reports every iteration; :class:`IterationLog` writes a batch of those reports in
one transaction and keeps each rank's last few samples under the current plan version (what
the job view and straggler detection compare with the plan), and each report in its phase's
samples (baseline, plan by version: what the realized saving is measured on).
:func:`telemetry_view` is the comparison, a pure function.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from perseus.schemas import ChosenPoint, IterationReport, ReplicaTelemetry, Telemetry
from perseus.server.lifecycle.decisions import predicted_time_s, replica_measurements
from perseus.server.lifecycle.savings import BASELINE, PLAN, add_sample, bucket_key, median_energy_j
from perseus.server.planning.plans import choice_of
from perseus.server.store.job_store import IterationWindow, JobRow, RankWindow, Store
from perseus.server.store.tables import SampleBucket
from perseus.solver import Frontier

__all__ = ["IterationLog", "telemetry_view"]


class IterationLog:
    """Writes ranks' iteration reports to the store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def record(self, job_id: str, reports: Sequence[IterationReport], window: int) -> None:
        """Record ranks' measured iterations, keeping each rank's last ``window`` of them
        under the current plan version, and counting each in its phase's samples
        (:mod:`perseus.server.lifecycle.savings`). One transaction for the whole batch; reports of
        ranks or jobs deleted meanwhile are dropped, and a report sent twice counts once.
        """
        with self._store.write() as tx:
            version = tx.job_version(job_id)
            if version is None:
                return
            ranks = sorted({r.rank for r in reports})
            windows = tx.iteration_windows(job_id, ranks)
            placed = (bucket_key(report, version) for report in reports)
            plan_versions = sorted({v for phase, v in placed if phase == PLAN})
            buckets = tx.sample_buckets(job_id, ranks, plan_versions)
            new: set[tuple[int, str, int]] = set()
            counted = 0
            now_s = time.time()  # the ranks were heard from (a re-registration's test)
            for report in reports:
                state = windows.get(report.rank)
                if state is None or state.last_iteration == report.iteration:
                    continue  # unregistered meanwhile, or a report sent twice
                times: tuple[float, ...] = ()
                energies: tuple[float, ...] = ()
                if state.window_version == version:
                    times, energies = state.recent_times_s, state.recent_energies_j
                if report.plan_version in (None, version):
                    times = (*times, report.time_s)[-window:]
                    energies = (*energies, report.energy_j)[-window:]
                windows[report.rank] = IterationWindow(
                    state.iterations + 1, report.iteration, version, times, energies, now_s
                )
                phase, ran = bucket_key(report, version)
                key = (report.rank, phase, ran)
                bucket = buckets.get(key)
                if bucket is None:
                    bucket = SampleBucket(phase, ran)
                    new.add(key)
                baseline = median_energy_j(buckets.get((report.rank, BASELINE, 0)))
                buckets[key] = add_sample(bucket, report, baseline)
                counted += 1
            tx.save_iteration_windows(job_id, windows, counted)
            tx.save_sample_buckets(job_id, buckets, new)


def telemetry_view(
    job: JobRow,
    windows: Sequence[RankWindow],
    frontier: Frontier | None,
    chosen: ChosenPoint | None,
) -> Telemetry | None:
    """Predicted against measured, per replica and over the job; None before any report.

    Complexity: O(ranks x window).
    """
    if not job.iterations_reported:
        return None
    spec = job.spec
    replicas = replica_measurements(windows, spec.stages * spec.tensor_parallel, 1)
    choice = choice_of(job)
    stragglers = set(job.straggler.data_parallel_ranks) if job.straggler else set()
    return Telemetry(
        predicted_time_s=None if chosen is None else chosen.expected_iteration_time_s,
        predicted_energy_j=None if chosen is None else chosen.expected_energy_j,
        measured_time_s=statistics.fmean(r.time_s for r in replicas) if replicas else None,
        measured_energy_j=statistics.fmean(r.energy_j for r in replicas) if replicas else None,
        replicas=[
            ReplicaTelemetry(
                data_parallel_rank=r.data_parallel_rank,
                time_s=r.time_s,
                energy_j=r.energy_j,
                predicted_time_s=None
                if frontier is None or choice is None
                else predicted_time_s(frontier, choice, stragglers, r.data_parallel_rank),
            )
            for r in replicas
        ],
    )
