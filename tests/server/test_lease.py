"""Profiles and the planning lease (perseus.server.lifecycle.lease): checks, claims, failing,
replanning."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from perseus.core.errors import JobStateError
from perseus.schemas import MinEnergyPolicy, ProfileReport, ProfileRow
from perseus.server.lifecycle.jobs import RequestFieldError
from perseus.server.lifecycle.lease import check_stage_clocks
from perseus.server.planning.worker import plan_frontier
from perseus.server.service import JobService
from perseus.server.store.job_store import Store

from .conftest import (
    Clock,
    Job,
    ProfileRows,
    clocks_of,
    create_job,
    job_spec,
    rank_body,
    register_ranks,
    report_profiles,
    small_profile_rows,
    snapshot,
)

Row = tuple[str, int, float, float]


def test_plan_compute_with_one_replica_and_recompute(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client)
    job.register_all(clocks_of(example_rows))
    r = client.post(job.url("/plan:compute"), headers=job.auth)
    assert r.status_code == 409
    assert "lack a profile" in r.json()["detail"]
    job.report_all(example_rows, replicas=range(1))
    r = client.post(job.url("/plan:compute"), headers=job.auth)
    assert r.status_code == 202, r.text
    assert r.json()["state"] == "planning"
    assert client.post(job.url("/plan:compute"), headers=job.auth).status_code == 409
    assert job.wait_plan().headers["etag"] == '"1"'
    # Recomputing keeps serving the old plan, then moves to a new version.
    r = client.post(job.url("/plan:compute"), headers=job.auth)
    assert r.status_code == 202
    assert job.wait_plan(wait_s=0).headers["etag"] == '"1"'
    assert job.wait_plan(etag='"1"').headers["etag"] == '"2"'
    assert job.view()["state"] == "ready"


def test_planning_failure_sets_failed_with_the_reason(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, p_block_w=None)  # and no profile reports one
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    r = job.wait_plan(wait_s=60)
    assert r.status_code == 409
    assert r.json()["state"] == "failed"
    view = job.view()
    assert view["state"] == "failed"
    assert "blocking power" in view["reason"]


def test_a_failed_job_replans_on_a_corrected_profile(
    client: TestClient, example_rows: ProfileRows
) -> None:
    # Issue 24, item 7: it stayed failed, with the stale reason, and its ranks polled forever.
    job = create_job(client, p_block_w=None, data_parallel=1)
    job.register_all(clocks_of(example_rows))
    job.report_all(example_rows)
    assert job.wait_plan(wait_s=60).json()["state"] == "failed"
    r = client.post(
        job.url("/profiles"),
        json={"rank": 0, "stage": 0, "rows": example_rows[0], "p_block_w": 90.0},
        headers=job.auth,
    )
    assert r.status_code == 200, r.text
    assert r.json()["planning"] is True and r.json()["state"] == "planning"
    assert job.wait_plan().status_code == 200
    view = job.view()
    assert view["state"] == "ready" and view["reason"] is None


def _stage_rows(rows: list[dict[str, Any]], keep: Callable[[int], bool]) -> list[dict[str, Any]]:
    return [r for r in rows if keep(r["frequency_mhz"])]


def _report(job: Job, rank: int, stage: int, rows: list[dict[str, Any]]) -> Any:
    return job.client.post(
        job.url("/profiles"), json={"rank": rank, "stage": stage, "rows": rows}, headers=job.auth
    )


def test_a_replica_with_clocks_disjoint_from_its_stage_is_refused_at_upload(
    client: TestClient, example_rows: ProfileRows
) -> None:
    # Issue 24, item 7: both got 200; the conflict surfaced only at planning.
    job = create_job(client)
    clocks = clocks_of(example_rows)
    job.register_all(clocks)
    middle = clocks[len(clocks) // 2]
    assert (
        _report(job, 0, 0, _stage_rows(example_rows[0], lambda f: f >= middle)).status_code == 200
    )
    r = _report(job, job.rank_of(0, 1), 0, _stage_rows(example_rows[0], lambda f: f < middle))
    assert r.status_code == 422, r.text
    msg = r.json()["detail"][0]["msg"]
    assert "share none of them" in msg and "stage 0's ranks 0" in msg
    assert job.view()["counts"]["profiles_reported"] == 1  # nothing stored


def test_a_single_clock_replica_does_not_pin_its_stage(
    client: TestClient, example_rows: ProfileRows
) -> None:
    # Issue 24, item 8: a replica without clock rights (it measures its default clock only)
    # pinned its whole stage to that clock: a one-point frontier, state ready, no warning.
    job = create_job(client)
    clocks = clocks_of(example_rows)
    job.register_all(clocks)
    top = max(clocks)
    single = _stage_rows(example_rows[0], lambda f: f == top)
    replica = job.rank_of(0, 1)
    assert _report(job, 0, 0, example_rows[0]).status_code == 200
    r = _report(job, replica, 0, single)
    assert r.status_code == 422, r.text
    assert "(this profile) measured" in r.json()["detail"][0]["msg"]
    assert "pinned" in r.json()["detail"][0]["msg"]
    # The other order: the single-clock profile came first; the full one names it.
    other = create_job(client)
    other.register_all(clocks)
    assert _report(other, replica, 0, single).status_code == 200
    r = _report(other, 0, 0, example_rows[0])
    assert r.status_code == 422, r.text
    assert f"stage 0's rank {replica} measured" in r.json()["detail"][0]["msg"]
    # Profiled again with clock control, its new profile replaces the old: both accepted.
    assert _report(other, replica, 0, example_rows[0]).status_code == 200
    assert _report(other, 0, 0, example_rows[0]).status_code == 200
    other.report_all(example_rows)
    assert other.wait_plan().status_code == 200
    assert other.view()["frontier_points"] > 1


@pytest.mark.parametrize(
    ("body", "status", "loc"),
    [
        (
            {"rank": 0, "stage": 0, "rows": small_profile_rows(instruction="sideways")},
            422,
            ["body", "rows", 1, "instruction"],
        ),
        (
            {"rank": 0, "stage": 0, "rows": small_profile_rows(time_s=0)},
            422,
            ["body", "rows", 1, "time_s"],
        ),
        (
            {"rank": 0, "stage": 0, "rows": small_profile_rows(energy_j=-1.0)},
            422,
            ["body", "rows", 1, "energy_j"],
        ),
        (
            {"rank": 0, "stage": 0, "rows": small_profile_rows(frequency_mhz=1500)},
            422,
            ["body", "rows", 1, "frequency_mhz"],
        ),
        ({"rank": 0, "stage": 1, "rows": small_profile_rows()}, 422, ["body", "stage"]),
        ({"rank": 0, "stage": 0, "rows": small_profile_rows()[:1]}, 422, ["body", "rows"]),
        (
            {
                "rank": 0,
                "stage": 0,
                "rows": small_profile_rows(frequency_mhz=1000, instruction="forward"),
            },
            422,
            None,
        ),
        ({"rank": 0, "stage": 0, "rows": small_profile_rows()[::2]}, 422, None),
        ({"rank": 5, "stage": 1, "rows": small_profile_rows()}, 409, None),
    ],
)
def test_bad_profiles_are_rejected_and_change_nothing(
    client: TestClient, body: dict[str, Any], status: int, loc: list[Any] | None
) -> None:
    job = create_job(client)
    assert client.post(job.url("/ranks"), json=rank_body(0), headers=job.auth).status_code == 200
    before = snapshot(job)
    r = client.post(job.url("/profiles"), json=body, headers=job.auth)
    assert r.status_code == status, r.text
    if loc is not None:
        assert loc in [err["loc"] for err in r.json()["detail"]]
    assert snapshot(job) == before


def test_exactly_one_server_claims_planning(store: Store, example_rows: ProfileRows) -> None:
    a = JobService(store, owner="a")
    b = JobService(store, owner="b")
    spec = job_spec()
    _, job = a.jobs.create(spec)
    register_ranks(a, job.id, spec, clocks_of(example_rows))
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
    spec = job_spec()
    _, job = a.jobs.create(spec)
    register_ranks(a, job.id, spec, clocks_of(example_rows))
    assert report_profiles(a, job.id, spec, example_rows)
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


# ----------------------------------------------------------------------------- a stage's clocks


def rows_at(*clocks: int, names: tuple[str, ...] = ("forward", "backward")) -> list[Row]:
    return [(name, clock, 0.1, 1.0) for name in names for clock in clocks]


def refusal(rank: int, rows: list[Row], others: list[tuple[int, list[Row]]]) -> str:
    with pytest.raises(RequestFieldError) as caught:
        check_stage_clocks(rank, 2, rows, others)
    assert caught.value.loc == ("body", "rows")
    return caught.value.message


def test_a_profile_sharing_clocks_with_its_stage_passes() -> None:
    check_stage_clocks(0, 2, rows_at(1980, 1500, 1000), [])
    check_stage_clocks(0, 2, rows_at(1980, 1500), [(4, rows_at(1980, 1500, 1000))])
    # Its own earlier profile is replaced, not compared with.
    check_stage_clocks(4, 2, rows_at(1000), [(4, rows_at(1980, 1500))])
    # One clock everywhere (no rank could set clocks) pins nothing that was not pinned.
    check_stage_clocks(0, 2, rows_at(1980), [(4, rows_at(1980))])
    # An instruction only some ranks measured is compared among those only.
    split = rows_at(1980, 1500) + rows_at(1000, names=("backward_weight",))
    check_stage_clocks(0, 2, split, [(4, rows_at(1980, 1500))])


def test_disjoint_clocks_are_refused_naming_the_ranks() -> None:
    message = refusal(0, rows_at(1980, 1500), [(4, rows_at(1000, 900)), (8, rows_at(1000))])
    assert message.startswith("rank 0 measured backward at 2 clocks, 1500-1980 MHz")
    assert "stage 2's ranks 4, 8 share none of them (2 clocks, 900-1000 MHz)" in message


def test_one_common_clock_among_many_is_refused_naming_who_measured_one() -> None:
    mine = refusal(0, rows_at(1980), [(4, rows_at(1980, 1500, 1000))])
    assert "rank 0 (this profile) measured backward only at 1980 MHz" in mine
    assert "up to 3 clocks" in mine and "pinned" in mine
    theirs = refusal(0, rows_at(1980, 1500), [(4, rows_at(1980))])
    assert "stage 2's rank 4 measured backward only at 1980 MHz" in theirs
