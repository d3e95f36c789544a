"""Typed reads and writes (perseus.server.store.transaction), on SQLite and (when set)
PostgreSQL."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy.exc import IntegrityError

from perseus.core.jobs import JobState
from perseus.schemas import StragglerView
from perseus.server.service import JobService
from perseus.server.store.job_store import FrontierRow, ProfileRecord, RankRow, Store

from .conftest import Clock, job_spec


def test_job_rows_round_trip_and_update(store: Store) -> None:
    service = JobService(store, clock=Clock())
    _, row = service.jobs.create(job_spec(name="ünïcode ✓"))
    assert service.jobs.get(row.id) == row
    changed = dataclasses.replace(
        row,
        state=JobState.PROFILING,
        reason="why",
        straggler=StragglerView(slowdown=1.5, data_parallel_ranks=[1]),
    )
    with store.write() as tx:
        tx.save_job(changed)
    assert service.jobs.get(row.id) == changed
    assert service.jobs.count_by_state() == {"profiling": 1}


def test_ranks_profiles_frontiers_and_delete(store: Store) -> None:
    service = JobService(store)
    _, job = service.jobs.create(job_spec())
    rank = RankRow(job.id, 3, 1, 0, 0, "H200", (1980, 1000), 1.0)
    rows = (("forward", 1980, 0.1, 10.0), ("backward", 1980, 0.2, 20.0))
    with store.write() as tx:
        tx.put_rank(rank, new=True)
        tx.put_rank(dataclasses.replace(rank, gpu_name="H100"), new=False)
        assert not tx.has_profile(job.id, 3)
        tx.put_profile(ProfileRecord(job.id, 3, 1, rows, 80.0, 2.0), new=True)
        tx.put_profile(ProfileRecord(job.id, 3, 1, rows[:1], None, 3.0), new=False)
        tx.put_frontier(FrontierRow(job.id, 1, "{}"))
        tx.put_frontier(FrontierRow(job.id, 2, '{"a": 1}'))
    with store.read() as tx:
        assert tx.rank(job.id, 3) == dataclasses.replace(rank, gpu_name="H100")
        assert tx.rank_at(job.id, 1, 0, 0) == dataclasses.replace(rank, gpu_name="H100")
        assert tx.rank_layout(job.id) == {3: (1, 0, 0)}
        assert tx.profiles(job.id) == [ProfileRecord(job.id, 3, 1, rows[:1], None, 3.0)]
        assert tx.profiled_coverage(job.id) == {(1, 0)}
        assert tx.frontier(job.id) == FrontierRow(job.id, 2, '{"a": 1}')
    with store.write() as tx:
        assert tx.delete_job(job.id)
        assert not tx.delete_job(job.id)
    with store.read() as tx:
        assert tx.job(job.id) is None
        assert tx.ranks(job.id) == []
        assert tx.profiles(job.id) == []
        assert tx.frontier(job.id) is None


def test_one_rank_per_coordinate_is_enforced_by_the_database(store: Store) -> None:
    service = JobService(store)
    _, job = service.jobs.create(job_spec())
    with pytest.raises(IntegrityError), store.write() as tx:
        tx.put_rank(RankRow(job.id, 0, 1, 0, 0, "H200", (1000,), 1.0), new=True)
        tx.put_rank(RankRow(job.id, 1, 1, 0, 0, "H200", (1000,), 1.0), new=True)
    with store.read() as tx:
        assert tx.ranks(job.id) == []  # the failed transaction left nothing
