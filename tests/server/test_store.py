"""The job store and the job logic over it, on SQLite and (when configured) PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError

from perseus.errors import JobNotFound, JobStateError
from perseus.schemas import (
    IterationReport,
    JobCreate,
    MinEnergyPolicy,
    ProfileReport,
    ProfileRow,
    RankRegistration,
    StragglerView,
)
from perseus.server.alembic import VERSION_TABLE
from perseus.server.migrations import head_revision
from perseus.server.planning import plan_frontier
from perseus.server.service import JobService
from perseus.server.store import FrontierRow, ProfileRecord, RankRow, Store, normalize_database_url

from .conftest import JOB_SPEC, ProfileRows, clocks_of


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    store = Store(database_url)
    store.create_schema()
    yield store
    store.close()


class Clock:
    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def _spec(**change: object) -> JobCreate:
    return JobCreate.model_validate({**JOB_SPEC, **change})


def _register(service: JobService, job_id: str, spec: JobCreate, clocks: list[int]) -> None:
    for dp in range(spec.data_parallel):
        for stage in range(spec.stages):
            service.jobs.register_rank(
                job_id,
                RankRegistration(
                    rank=dp * spec.stages + stage,
                    stage=stage,
                    data_parallel_rank=dp,
                    tensor_parallel_rank=0,
                    gpu_name="H200",
                    supported_clocks_mhz=clocks,
                ),
            )


def _report(service: JobService, job_id: str, spec: JobCreate, rows: ProfileRows) -> bool:
    claimed = False
    for dp in range(spec.data_parallel):
        for stage in range(spec.stages):
            report = ProfileReport(
                rank=dp * spec.stages + stage,
                stage=stage,
                rows=[ProfileRow.model_validate(r) for r in rows[stage]],
            )
            _, _, claimed = service.lease.add_profile(job_id, report)
    return claimed


def test_schema_creation_is_idempotent(store: Store) -> None:
    assert store.create_schema() == head_revision()
    assert store.schema_revision() == head_revision()
    with store.read() as tx:
        assert tx.list_jobs(10, 0) == []


def test_job_rows_round_trip_and_update(store: Store) -> None:
    service = JobService(store, clock=Clock())
    _, row = service.jobs.create(_spec(name="ünïcode ✓"))
    assert service.jobs.get(row.id) == row
    changed = dataclasses.replace(
        row,
        state="failed",
        reason="why",
        straggler=StragglerView(slowdown=1.5, data_parallel_ranks=[1]),
    )
    with store.write() as tx:
        tx.save_job(changed)
    assert service.jobs.get(row.id) == changed
    assert service.jobs.count_by_state() == {"failed": 1}


def test_list_is_ordered_and_paged(store: Store) -> None:
    clock = Clock()
    service = JobService(store, clock=clock)
    ids = []
    for i in range(5):
        clock.now_s += 1
        ids.append(service.jobs.create(_spec(name=f"j{i}"))[1].id)
    assert [j.job_id for j in service.jobs.list(100, 0)] == ids
    assert [j.job_id for j in service.jobs.list(2, 1)] == ids[1:3]


def test_ranks_profiles_frontiers_and_delete(store: Store) -> None:
    service = JobService(store)
    _, job = service.jobs.create(_spec())
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
    _, job = service.jobs.create(_spec())
    with pytest.raises(IntegrityError), store.write() as tx:
        tx.put_rank(RankRow(job.id, 0, 1, 0, 0, "H200", (1000,), 1.0), new=True)
        tx.put_rank(RankRow(job.id, 1, 1, 0, 0, "H200", (1000,), 1.0), new=True)
    with store.read() as tx:
        assert tx.ranks(job.id) == []  # the failed transaction left nothing


def test_concurrent_registrations_count_exactly(store: Store) -> None:
    service = JobService(store)
    spec = _spec(stages=8, data_parallel=4)
    _, job = service.jobs.create(spec)

    def register(rank: int) -> None:
        service.jobs.register_rank(
            job.id,
            RankRegistration(
                rank=rank,
                stage=rank % 8,
                data_parallel_rank=rank // 8,
                tensor_parallel_rank=0,
                gpu_name="H200",
                supported_clocks_mhz=[1000],
            ),
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(register, range(32)))
    row = service.jobs.get(job.id)
    assert row.ranks_registered == 32
    assert row.state == "profiling"


@pytest.mark.parametrize("writer", ["iterations", "delete"])
def test_writes_lock_the_job_before_its_ranks(store: Store, writer: str) -> None:
    """A batch of iteration reports, or a deletion, waits for a transaction holding the job
    (a re-registration) instead of locking the rank rows first: on PostgreSQL the opposite
    order was a deadlock, and one of the two failed."""
    service = JobService(store)
    spec = _spec(stages=2, data_parallel=1)
    _, job = service.jobs.create(spec)
    _register(service, job.id, spec, [1000])
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


def test_exactly_one_server_claims_planning(store: Store, example_rows: ProfileRows) -> None:
    a = JobService(store, owner="a")
    b = JobService(store, owner="b")
    spec = _spec()
    _, job = a.jobs.create(spec)
    _register(a, job.id, spec, clocks_of(example_rows))
    for stage in range(4):  # one replica: enough to plan on request, not by itself
        a.lease.add_profile(
            job.id,
            ProfileReport(
                rank=stage,
                stage=stage,
                rows=[ProfileRow.model_validate(r) for r in example_rows[stage]],
            ),
        )
    assert a.jobs.get(job.id).state == "profiling"
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def claim(service: JobService) -> None:
        barrier.wait()
        try:
            service.lease.claim_planning(job.id)
            outcomes[service.owner] = "claimed"
        except JobStateError:
            outcomes[service.owner] = "refused"

    threads = [threading.Thread(target=claim, args=(s,)) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes.values()) == ["claimed", "refused"]
    winner = a if outcomes["a"] == "claimed" else b
    loser = b if winner is a else a
    assert store_row_owner(store, job.id) == winner.owner
    assert loser.lease.finish_planning(job.id, "{}", 1.0) is None  # not its job: ignored unread


def store_row_owner(store: Store, job_id: str) -> str | None:
    with store.read() as tx:
        row = tx.job(job_id)
    assert row is not None
    return row.planning_owner


def test_full_flow_and_takeover_after_a_missed_heartbeat(
    store: Store, example_rows: ProfileRows
) -> None:
    clock = Clock()
    a = JobService(store, owner="a", clock=clock)
    b = JobService(store, owner="b", clock=clock)
    spec = _spec()
    _, job = a.jobs.create(spec)
    _register(a, job.id, spec, clocks_of(example_rows))
    assert _report(a, job.id, spec, example_rows)
    assert a.jobs.get(job.id).state == "planning"
    clock.now_s += 2
    a.lease.heartbeat([job.id])
    clock.now_s += 2
    assert b.lease.reclaim_stale(lease_s=3.0) == []  # a's heartbeat is fresh
    clock.now_s += 10
    taken = b.lease.reclaim_stale(lease_s=3.0)
    assert [row.planning_owner for row in taken] == ["b"]
    frontier_json = plan_frontier(b.lease.planning_input(job.id)).frontier_json
    assert a.lease.finish_planning(job.id, frontier_json, 1.0) is None
    row = b.lease.finish_planning(job.id, frontier_json, 1.0)
    assert row is not None
    assert (row.state, row.version, row.chosen_index) == ("ready", 1, 0)
    assert len(json.loads(frontier_json)["points"]) > 1
    _, row = a.choices.set_policy(job.id, MinEnergyPolicy(kind="min-energy"))
    assert row.version == 2
    assert row.chosen_index == len(json.loads(frontier_json)["points"]) - 1
    plan = json.loads(b.plans.render(b.jobs.get(job.id), 2, False))
    assert plan["version"] == 2
    assert len(plan["instructions"]) == 8


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p@h/db", "postgresql+psycopg://u:p@h/db"),
        ("postgresql+psycopg://u:p@h:5/db", "postgresql+psycopg://u:p@h:5/db"),
        ("sqlite:///x.db", "sqlite:///x.db"),
    ],
)
def test_database_urls_use_psycopg3(url: str, expected: str) -> None:
    assert normalize_database_url(url) == expected


def test_iteration_batches_keep_windows_per_plan_version(store: Store) -> None:
    service = JobService(store)
    spec = _spec(stages=2, data_parallel=1)
    _, job = service.jobs.create(spec)
    _register(service, job.id, spec, [1000])

    def report(rank: int, iteration: int, time_s: float, plan_version: int | None = None) -> Any:
        return IterationReport(
            rank=rank, iteration=iteration, time_s=time_s, energy_j=1.0, plan_version=plan_version
        )

    service.iterations.record(
        job.id,
        [
            report(0, 1, 1.0),
            report(0, 1, 9.0),  # sent twice: counted once
            report(0, 2, 2.0),
            report(1, 1, 3.0, plan_version=7),  # another plan's sample: counted, not kept
            report(5, 1, 1.0),  # not a rank of this job: dropped
            report(0, 3, 3.0),
            report(0, 4, 4.0),
        ],
        window=3,
    )
    with store.read() as tx:
        windows = tx.iteration_windows(job.id, [0, 1])
        assert tx.job(job.id) is not None
    assert windows[0].recent_times_s == (2.0, 3.0, 4.0)
    assert windows[0].iterations == 4
    assert windows[1].recent_times_s == ()
    assert windows[1].last_iteration == 1
    assert service.jobs.get(job.id).iterations_reported == 5
    service.iterations.record("0" * 32, [report(0, 1, 1.0)], window=3)  # a deleted job


def test_a_database_from_before_rank_hosts_gains_the_column(database_url: str) -> None:
    store = Store(database_url)
    store.create_schema()
    with store.write() as tx:  # as the first release made it: no host, no schema revision
        tx._conn.exec_driver_sql("ALTER TABLE perseus_ranks DROP COLUMN host")
        tx._conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
        # ... nor what revisions after the first added
        tx._conn.exec_driver_sql("DROP TABLE perseus_samples")
        tx._conn.exec_driver_sql("ALTER TABLE perseus_frontiers DROP COLUMN profile")
        tx._conn.exec_driver_sql("DROP TABLE perseus_gave_up")
        tx._conn.exec_driver_sql("ALTER TABLE perseus_jobs DROP COLUMN planned_from_s")
        tx._conn.exec_driver_sql("ALTER TABLE perseus_ranks DROP COLUMN instance")
        tx._conn.exec_driver_sql("ALTER TABLE perseus_ranks DROP COLUMN seen_at_s")
    store.create_schema()  # what a newer server does at start
    service = JobService(store)
    spec = _spec(stages=1, data_parallel=1)
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
    store.close()
