"""Every move of a job's state the server makes is one of perseus.core.jobs' table, and every
move the table holds is one the server makes; the store refuses any other (the
``state_moves`` fixture checks the moves of every server test)."""

from __future__ import annotations

import dataclasses

import pytest

from perseus.core.errors import JobStateError
from perseus.core.jobs import TRANSITIONS, JobState
from perseus.schemas import MinEnergyPolicy, ProfileReport, ProfileRow, RankRegistration
from perseus.server.planning.worker import plan_frontier
from perseus.server.service import JobService
from perseus.server.store.job_store import Store

from .conftest import (
    Clock,
    Moves,
    ProfileRows,
    clocks_of,
    job_spec,
    register_ranks,
    report_profiles,
)

S = JobState


def test_the_server_makes_every_move_of_the_table(
    store: Store, example_rows: ProfileRows, state_moves: Moves
) -> None:
    clock = Clock()
    a = JobService(store, owner="a", clock=clock)
    b = JobService(store, owner="b", clock=clock)

    def state(job_id: str) -> JobState:
        return a.jobs.get(job_id).state

    # registering -> profiling -> planning -> ready, every rank in
    spec = job_spec()
    _, whole = a.jobs.create(spec)
    assert state(whole.id) is S.REGISTERING
    register_ranks(a, whole.id, spec, clocks_of(example_rows))
    assert state(whole.id) is S.PROFILING
    assert report_profiles(a, whole.id, spec, example_rows)
    assert state(whole.id) is S.PLANNING
    frontier_json = plan_frontier(a.lease.planning_input(whole.id)).frontier_json
    assert a.lease.finish_planning(whole.id, frontier_json, 1.0) is not None
    assert state(whole.id) is S.READY

    # registering -> planning on request, one replica in; planning -> planning: taken over
    _, early = a.jobs.create(spec)
    for stage in range(spec.stages):  # replica 0 only
        a.jobs.register_rank(
            early.id,
            RankRegistration(
                rank=stage,
                stage=stage,
                data_parallel_rank=0,
                tensor_parallel_rank=0,
                gpu_name="H200",
                supported_clocks_mhz=clocks_of(example_rows),
            ),
        )
        a.lease.add_profile(
            early.id,
            ProfileReport(
                rank=stage,
                stage=stage,
                rows=[ProfileRow.model_validate(r) for r in example_rows[stage]],
            ),
        )
    assert state(early.id) is S.REGISTERING
    a.lease.claim_planning(early.id)
    assert state(early.id) is S.PLANNING
    clock.now_s += 60
    assert [job.id for job in b.lease.reclaim_stale(lease_s=3.0)] == [early.id]
    assert state(early.id) is S.PLANNING

    # planning -> failed -> ready (a feasible policy) -> planning -> failed -> planning
    b.lease.fail_planning(early.id, "a reason")
    assert state(early.id) is S.FAILED
    b.lease.claim_planning(early.id)
    frontier_json = plan_frontier(b.lease.planning_input(early.id)).frontier_json
    b.lease.finish_planning(early.id, frontier_json, 1.0)
    assert state(early.id) is S.READY
    b.lease.claim_planning(early.id)
    b.lease.fail_planning(early.id, "again")
    b.choices.set_policy(early.id, MinEnergyPolicy(kind="min-energy"))  # it has a frontier
    assert state(early.id) is S.READY
    b.lease.claim_planning(early.id)
    b.lease.fail_planning(early.id, "and again")
    b.lease.claim_planning(early.id)
    assert state(early.id) is S.PLANNING

    made = {(JobState(current), to) for current, to in state_moves}
    table = {(current, to) for current, exits in TRANSITIONS.items() for to in exits}
    assert made == table


def test_the_store_refuses_a_move_the_table_lacks_and_writes_nothing(
    store: Store, state_moves: Moves
) -> None:
    service = JobService(store, clock=Clock())
    _, job = service.jobs.create(job_spec())
    with pytest.raises(JobStateError, match="from registering to ready"), store.write() as tx:
        tx.save_job(dataclasses.replace(tx.job(job.id) or job, state=S.READY, reason="no"))
    assert service.jobs.get(job.id) == job
    assert state_moves == [(S.REGISTERING, S.READY)]  # the fixture saw it too
    state_moves.clear()  # made on purpose


def test_the_store_creates_jobs_registering_only(store: Store) -> None:
    service = JobService(store, clock=Clock())
    _, job = service.jobs.create(job_spec())
    with pytest.raises(JobStateError, match="created registering, not ready"), store.write() as tx:
        tx.insert_job(dataclasses.replace(job, id="another", state=S.READY))
    with store.read() as tx:
        assert tx.job("another") is None
