"""What the web page shows live (perseus.server.lifecycle.activity): each rank's last report, the
job's recent iterations, who follows the current plan."""

from __future__ import annotations

from perseus.schemas import IterationReport
from perseus.server.lifecycle.activity import ITERATIONS_KEPT, Activity
from perseus.server.store.tables import RankRow

from .conftest import Clock


def ranks(count: int) -> list[RankRow]:
    return [RankRow("j", r, r, 0, 0, "H200", (1980,), 0.0, host="10.0.0.1") for r in range(count)]


def report(rank: int, iteration: int, time_s: float, **more: object) -> IterationReport:
    return IterationReport.model_validate(
        {"rank": rank, "iteration": iteration, "time_s": time_s, "energy_j": 10.0, **more}
    )


def test_an_iteration_is_the_median_time_and_the_summed_energy_of_its_ranks() -> None:
    clock = Clock(5000.0)
    activity = Activity(clock=clock, monotonic=Clock(0.0))
    for rank, time_s in enumerate((1.0, 3.0, 2.0)):
        clock.now_s += 1
        activity.record("j", report(rank, 7, time_s, phase="plan", plan_version=2))
    (point,) = activity.view(2, "j", ranks(3)).iterations
    assert (point.iteration, point.time_s, point.energy_j, point.ranks) == (7, 2.0, 30.0, 3)
    assert (point.phase, point.plan_version, point.received_s) == ("plan", 2, 5003.0)


def test_iterations_come_in_order_and_only_the_last_ones_are_kept() -> None:
    activity = Activity(clock=Clock(), monotonic=Clock())
    for iteration in reversed(range(ITERATIONS_KEPT + 10)):
        activity.record("j", report(0, iteration, 1.0))
    numbers = [p.iteration for p in activity.view(0, "j", ranks(1)).iterations]
    assert len(numbers) == ITERATIONS_KEPT
    assert numbers == sorted(numbers)
    assert 0 in numbers  # the oldest recorded went first, not the lowest numbered


def test_a_rank_follows_the_plan_its_last_report_ran() -> None:
    monotonic = Clock(100.0)
    activity = Activity(clock=Clock(), monotonic=monotonic)
    activity.record("j", report(0, 1, 1.0, phase="plan", plan_version=3))
    activity.record("j", report(1, 1, 1.0, phase="plan", plan_version=2))  # an older plan
    activity.record("j", report(2, 1, 1.0, phase="baseline", plan_version=3))
    activity.record("j", report(3, 1, 1.0, plan_version=3))  # an older client: no phase
    monotonic.now_s += 4.5
    view = activity.view(3, "j", ranks(5))
    assert [r.following for r in view.ranks] == [True, False, False, True, False]
    assert [r.last_report_age_s for r in view.ranks] == [4.5, 4.5, 4.5, 4.5, None]
    assert view.ranks[4].phase is None and view.ranks[0].host == "10.0.0.1"
    assert not any(r.following for r in activity.view(0, "j", ranks(5)).ranks)  # no plan yet


def test_jobs_are_kept_apart_and_forgotten() -> None:
    activity = Activity(clock=Clock(), monotonic=Clock())
    activity.record("a", report(0, 1, 1.0))
    activity.record("b", report(0, 1, 2.0))
    assert [p.time_s for p in activity.view(0, "b", ranks(1)).iterations] == [2.0]
    activity.forget("a")
    forgotten = activity.view(0, "a", ranks(1))
    assert forgotten.iterations == [] and forgotten.ranks[0].last_report_age_s is None
    assert activity.view(0, "b", ranks(1)).iterations


def test_a_profiling_rank_shows_its_clocks_and_the_time_left_until_it_reports_otherwise() -> None:
    monotonic = Clock(100.0)
    activity = Activity(clock=Clock(), monotonic=monotonic)
    progress = {"clocks_done": 10, "clocks_planned": 110, "elapsed_s": 34.0, "budget_s": 600.0}
    activity.record("j", report(0, 12, 0.8, phase="profiling", profiling=progress))
    activity.record("j", report(1, 12, 0.8, phase="profiling"))  # an older rank: no progress
    first = {"clocks_done": 0, "clocks_planned": 110, "elapsed_s": 0.0}
    activity.record("j", report(2, 12, 0.8, phase="profiling", profiling=first))
    monotonic.now_s += 2.0
    (zero, two) = activity.profiling("j")
    assert (zero.rank, zero.clocks_done, zero.clocks_planned) == (0, 10, 110)
    assert zero.seconds_per_clock == 3.4 and zero.time_left_s == 340.0
    assert zero.report_age_s == 2.0
    assert two.rank == 2 and two.seconds_per_clock is None and two.time_left_s is None
    statuses = activity.view(0, "j", ranks(3)).ranks
    assert statuses[0].profiling == zero and statuses[1].profiling is None
    # The sweep's time budget caps the time left.
    late = progress | {"elapsed_s": 550.0}
    activity.record("j", report(0, 13, 0.8, phase="profiling", profiling=late))
    assert activity.profiling("j")[0].time_left_s == 50.0
    # Done profiling: the next report has no progress, and the rank is no longer shown.
    activity.record("j", report(0, 14, 0.8, phase="baseline"))
    activity.record("j", report(2, 14, 0.8, phase="baseline"))
    assert activity.profiling("j") == []
    assert activity.view(0, "j", ranks(3)).ranks[0].profiling is None
