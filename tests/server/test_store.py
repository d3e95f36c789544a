"""The store (perseus.server.store.job_store): its schema, upgrades of older databases, write
locks."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from sqlalchemy import create_engine

from perseus.core.errors import JobNotFound
from perseus.schemas import ClockLatencyReport, IterationReport, RankRegistration
from perseus.server.service import JobService
from perseus.server.store.alembic import VERSION_TABLE
from perseus.server.store.database import normalize_database_url
from perseus.server.store.job_store import Store
from perseus.server.store.migrations import head_revision

from .conftest import job_spec, register_ranks


def test_schema_creation_is_idempotent(store: Store) -> None:
    assert store.create_schema() == head_revision()
    assert store.schema_revision() == head_revision()
    with store.read() as tx:
        assert tx.list_jobs(10, 0) == []


@pytest.mark.parametrize("writer", ["iterations", "delete"])
def test_writes_lock_the_job_before_its_ranks(store: Store, writer: str) -> None:
    """A batch of iteration reports, or a deletion, waits for a transaction holding the job
    (a re-registration) instead of locking the rank rows first: on PostgreSQL the opposite
    order was a deadlock, and one of the two failed."""
    service = JobService(store)
    spec = job_spec(stages=2, data_parallel=1)
    _, job = service.jobs.create(spec)
    register_ranks(service, job.id, spec, [1000])
    errors: list[BaseException] = []

    def write() -> None:
        try:
            if writer == "iterations":
                reports = [
                    IterationReport(rank=r, iteration=1, time_s=1.0, energy_j=1.0) for r in (0, 1)
                ]
                service.iterations.record(job.id, reports, window=5)
            else:
                service.jobs.delete(job.id)
        except Exception as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=write)
    with store.write() as tx:  # what register_rank does for a rank registering again
        locked = tx.job(job.id)
        assert locked is not None
        thread.start()
        thread.join(0.5)  # the other write is under way (and waits for the job row)
        rank = tx.rank(job.id, 1)
        assert rank is not None
        tx.put_rank(dataclasses.replace(rank, host="10.0.0.2"), new=False)
        tx.save_job(dataclasses.replace(locked, updated_at_s=locked.updated_at_s + 1))
    thread.join(30)
    assert not thread.is_alive()
    assert errors == []
    if writer == "iterations":
        assert service.jobs.get(job.id).iterations_reported == 2
    else:
        with pytest.raises(JobNotFound):
            service.jobs.get(job.id)


def test_a_database_from_before_rank_hosts_gains_the_column(database_url: str) -> None:
    first = Store(database_url)
    first.create_schema()
    first.close()
    engine = create_engine(normalize_database_url(database_url))
    with engine.begin() as conn:  # as the first release made it: no host, no schema revision
        conn.exec_driver_sql("ALTER TABLE perseus_ranks DROP COLUMN host")
        conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
        # ... nor what revisions after the first added
        conn.exec_driver_sql("DROP TABLE perseus_samples")
        conn.exec_driver_sql("ALTER TABLE perseus_frontiers DROP COLUMN profile")
        conn.exec_driver_sql("DROP TABLE perseus_gave_up")
        conn.exec_driver_sql("ALTER TABLE perseus_jobs DROP COLUMN planned_from_s")
        conn.exec_driver_sql("ALTER TABLE perseus_ranks DROP COLUMN instance")
        conn.exec_driver_sql("ALTER TABLE perseus_ranks DROP COLUMN seen_at_s")
        conn.exec_driver_sql("DROP TABLE perseus_cluster_budget")
        conn.exec_driver_sql("ALTER TABLE perseus_jobs DROP COLUMN priority")
        conn.exec_driver_sql("ALTER TABLE perseus_jobs DROP COLUMN budget_index")
        conn.exec_driver_sql("ALTER TABLE perseus_jobs DROP COLUMN clock_delay_rank")
        conn.exec_driver_sql("ALTER TABLE perseus_ranks DROP COLUMN clock_latency_s")
    engine.dispose()
    store = Store(database_url)
    store.create_schema()  # what a newer server does at start
    service = JobService(store)
    spec = job_spec(stages=1, data_parallel=1)
    _, job = service.jobs.create(spec)
    registration = RankRegistration(
        rank=0,
        stage=0,
        data_parallel_rank=0,
        tensor_parallel_rank=0,
        gpu_name="H200",
        supported_clocks_mhz=[1000],
    )
    service.jobs.register_rank(job.id, registration, "10.0.0.1")
    assert service.jobs.rank_layout(job.id) == {0: (0, 0, "10.0.0.1")}
    # 0005's column: a rank's measured clock-change latency is kept.
    accepted, claimed = service.lease.add_clock_latency(
        job.id, ClockLatencyReport(rank=0, clock_change_latency_s=0.04)
    )
    assert accepted.clock_change_delay_s == 0.04 and claimed is None  # nothing planned yet
    assert service.lease.planning_input(job.id).measured_delay == (0, 0.04)
    store.close()
