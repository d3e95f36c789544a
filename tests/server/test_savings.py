"""The saving measured through the API: baseline and plan samples, old reports, rejected
reports, the warning, the metrics counters; and plans carrying their instructions' times."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from perseus.core.defaults import CLOCK_CHANGE_MARGIN_S
from perseus.formats.plan_files import FrontierFile
from perseus.schemas import FRONTIER_FILE_PATH, PROFILE_JSON_PATH, PlanResponse
from perseus.server.lifecycle.savings import SAMPLE_WINDOW
from perseus.solver import replay
from perseus.solver.profiles import profile_from_json

from .conftest import Job, ProfileRows

_next_iteration: dict[int, int] = {}


def _report(job: Job, rank: int, time_s: float, energy_j: float, **fields: Any) -> int:
    iteration = _next_iteration[rank] = _next_iteration.get(rank, -1) + 1
    body = {"rank": rank, "iteration": iteration, "time_s": time_s, "energy_j": energy_j}
    r = job.client.post(job.url("/iterations"), json={**body, **fields}, headers=job.auth)
    return r.status_code


@pytest.fixture(autouse=True)
def _fresh_iterations() -> None:
    _next_iteration.clear()


def _ranks(job: Job) -> range:
    return range(job.stages * job.data_parallel)


def _whole_iterations(job: Job) -> tuple[float, float]:
    """(slowdown, saving) of the chosen point against the default plan, from /frontier:
    whole iterations, the pipeline's fill and drain included."""
    frontier = job.client.get(job.url("/frontier"), headers=job.auth).json()
    chosen = frontier["points"][frontier["chosen_index"]]
    default = frontier["baselines"]["default"]
    return (
        chosen["time_s"] / default["time_s"] - 1,
        1 - chosen["energy_j"] / default["energy_j"],
    )


def _predicted(job: Job) -> tuple[float, float]:
    """(slowdown, saving) on the ranks' measure, replayed here from the job's files: each
    GPU's span (first start to last finish; the median over GPUs) and every GPU's energy over
    its span (the iteration's less the blocking outside the spans)."""
    ids = {"job_id": job.job_id}
    profile = profile_from_json(
        job.client.get(PROFILE_JSON_PATH.format(**ids), headers=job.auth).content
    )
    raw = job.client.get(FRONTIER_FILE_PATH.format(**ids), headers=job.auth).content
    frontier = FrontierFile.model_validate_json(raw).to_frontier()
    chosen = job.client.get(job.url("/frontier"), headers=job.auth).json()["chosen_index"]
    measured = []
    for clocks in (frontier.baselines["default"].frequencies_mhz,
                   frontier.point(chosen).frequencies_mhz):  # fmt: skip
        r = replay(profile, frontier.schedule, frontier.p_block_w, clocks,
                   clock_change_margin_s=frontier.clock_change_margin_s)  # fmt: skip
        spans = [f[-1] - s[0] for s, f in zip(r.start_s, r.finish_s, strict=True)]
        outside = sum(r.time_s - span for span in spans)
        measured.append((statistics.median(spans), r.energy_j - frontier.p_block_w * outside))
    (base_s, base_j), (plan_s, plan_j) = measured
    return plan_s / base_s - 1, 1 - plan_j / base_j


def _run(
    job: Job, baseline: int, plan: int, slowdown: float, saving: float, **plan_fields: Any
) -> None:
    """``baseline`` iterations per rank at 1 s and 100 J (+ rank J), then ``plan`` under
    plan version 1, ``slowdown`` slower and ``saving`` cheaper."""
    for _ in range(baseline):
        for rank in _ranks(job):
            assert _report(job, rank, 1.0, 100.0 + rank, phase="baseline") == 200
    for _ in range(plan):
        for rank in _ranks(job):
            fields = {"phase": "plan", "plan_version": 1, **plan_fields}
            code = _report(job, rank, 1.0 + slowdown, (100.0 + rank) * (1 - saving), **fields)
            assert code == 200


def test_baseline_and_plan_give_medians_counts_and_the_saving(ready_job: Job) -> None:
    slowdown, saving = _predicted(ready_job)
    _run(ready_job, baseline=5, plan=7, slowdown=slowdown, saving=saving)
    s = ready_job.view()["savings"]
    ranks = len(_ranks(ready_job))
    base_j = sum(100.0 + r for r in _ranks(ready_job))
    assert s["baseline"] == {
        "iterations": 5 * ranks,
        "ranks": ranks,
        "samples": 5 * ranks,
        "time_s": 1.0,
        "time_p10_s": 1.0,
        "time_p90_s": 1.0,
        "energy_j": pytest.approx(base_j),
        "energy_p10_j": pytest.approx(base_j),
        "energy_p90_j": pytest.approx(base_j),
    }
    assert s["plan"]["iterations"] == 7 * ranks
    assert s["plan"]["time_s"] == pytest.approx(1.0 + slowdown)
    assert s["plan"]["energy_j"] == pytest.approx(base_j * (1 - saving))
    assert s["plan_version"] == 1
    assert s["realized_slowdown"] == pytest.approx(slowdown)
    assert s["realized_saving"] == pytest.approx(saving)
    assert s["predicted_slowdown"] == pytest.approx(slowdown)
    assert s["predicted_saving"] == pytest.approx(saving)
    assert s["warning"] is None
    saved_j = 7 * base_j * saving
    assert s["energy_saved_j"] == pytest.approx(saved_j)
    assert s["energy_saved_kwh"] == pytest.approx(saved_j / 3.6e6)
    assert s["energy_j"] == pytest.approx(5 * base_j + 7 * base_j * (1 - saving))


def test_the_prediction_is_on_the_ranks_measure_not_whole_iterations(ready_job: Job) -> None:
    # A 1F1B pipeline of 4 stages: each GPU's span leaves out fill and drain blocking that
    # both plans pay alike, so the ranks' measure states a larger saving than the frontier's
    # whole iterations; the view predicts what the ranks will measure.
    _run(ready_job, baseline=1, plan=1, slowdown=0.0, saving=0.0)
    s = ready_job.view()["savings"]
    _, whole_saving = _whole_iterations(ready_job)
    slowdown, saving = _predicted(ready_job)
    assert saving > whole_saving > 0
    assert (s["predicted_slowdown"], s["predicted_saving"]) == (
        pytest.approx(slowdown, abs=1e-12),
        pytest.approx(saving, abs=1e-12),
    )


def test_spread_and_the_window(ready_job: Job) -> None:
    # Rank 0 alone, its baseline times 1..n s: more than the window, so only the last count.
    n = SAMPLE_WINDOW + 10
    for i in range(n):
        assert _report(ready_job, 0, float(i + 1), 50.0, phase="baseline") == 200
    baseline = ready_job.view()["savings"]["baseline"]
    kept = [float(i + 1) for i in range(n - SAMPLE_WINDOW, n)]
    deciles = statistics.quantiles(kept, n=10, method="inclusive")
    assert (baseline["iterations"], baseline["samples"], baseline["ranks"]) == (n, SAMPLE_WINDOW, 1)
    assert baseline["time_s"] == pytest.approx(statistics.median(kept))
    assert baseline["time_p10_s"] == pytest.approx(deciles[0])
    assert baseline["time_p90_s"] == pytest.approx(deciles[-1])
    assert ready_job.view()["savings"]["energy_j"] == pytest.approx(50.0 * n)


def test_times_aggregate_by_median_over_ranks_and_energies_by_sum(ready_job: Job) -> None:
    for rank, time_s in zip(
        _ranks(ready_job), (1.0, 1.0, 1.0, 2.0, 1.0, 1.0, 3.0, 1.0), strict=True
    ):
        assert _report(ready_job, rank, time_s, 10.0, phase="baseline") == 200
    baseline = ready_job.view()["savings"]["baseline"]
    assert baseline["time_s"] == 1.0  # one slow rank does not move the median
    assert baseline["energy_j"] == pytest.approx(80.0)


def test_a_rank_compares_only_with_its_own_baseline(ready_job: Job) -> None:
    # Rank 0 has a baseline, rank 1 only plan samples: the realized saving pairs rank 0 alone,
    # and only rank 0's plan iterations count as saved energy.
    assert _report(ready_job, 0, 1.0, 100.0, phase="baseline") == 200
    assert _report(ready_job, 0, 1.0, 90.0, phase="plan", plan_version=1) == 200
    assert _report(ready_job, 1, 1.0, 10.0, phase="plan", plan_version=1) == 200
    s = ready_job.view()["savings"]
    assert s["realized_saving"] == pytest.approx(0.1)
    assert s["plan"]["ranks"] == 2
    assert s["energy_saved_j"] == pytest.approx(10.0)


def test_old_reports_without_a_phase(ready_job: Job) -> None:
    # As before phases: a plan sample when its version is the current one or unset.
    assert _report(ready_job, 0, 1.0, 80.0) == 200
    assert _report(ready_job, 0, 1.0, 80.0, plan_version=1) == 200
    assert _report(ready_job, 0, 1.0, 80.0, plan_version=0) == 200  # another version
    s = ready_job.view()["savings"]
    assert s["baseline"] is None
    assert s["plan"]["iterations"] == 2
    assert s["realized_saving"] is None and s["warning"] is None
    assert s["energy_saved_j"] == 0.0  # no baseline to save against
    assert s["energy_j"] == pytest.approx(240.0)  # every report counts in the total
    assert ready_job.view()["counts"]["iterations_reported"] == 3


def test_other_phases_count_in_the_total_only(ready_job: Job) -> None:
    assert _report(ready_job, 0, 1.0, 70.0, phase="profiling") == 200
    assert _report(ready_job, 0, 1.0, 30.0, phase="default") == 200
    s = ready_job.view()["savings"]
    assert s["baseline"] is None and s["plan"] is None
    assert s["energy_j"] == pytest.approx(100.0)


def test_samples_of_an_older_plan_version_stay_out_of_the_current_plan(ready_job: Job) -> None:
    r = ready_job.client.put(
        ready_job.url("/policy"), json={"kind": "min-energy"}, headers=ready_job.auth
    )
    assert r.status_code == 200, r.text
    version = r.json()["version"]
    assert version == 2
    assert _report(ready_job, 0, 1.0, 100.0, phase="baseline") == 200
    assert _report(ready_job, 0, 1.0, 50.0, phase="plan", plan_version=1) == 200
    assert _report(ready_job, 0, 1.0, 80.0, phase="plan", plan_version=2) == 200
    assert _report(ready_job, 0, 1.0, 80.0, phase="plan", plan_version=9) == 200  # not a version
    s = ready_job.view()["savings"]
    assert s["plan_version"] == 2
    assert s["plan"]["iterations"] == 1 and s["plan"]["energy_j"] == 80.0
    assert s["realized_saving"] == pytest.approx(0.2)
    assert s["energy_saved_j"] == pytest.approx(50.0 + 20.0)  # every version's iterations
    assert s["energy_j"] == pytest.approx(310.0)


def test_a_rejected_report_changes_nothing(ready_job: Job) -> None:
    _run(ready_job, baseline=2, plan=2, slowdown=0.0, saving=0.1)
    before = ready_job.view()
    auth = ready_job.auth
    good = {"rank": 0, "iteration": 1000, "time_s": 1.0, "energy_j": 1.0, "phase": "baseline"}
    for body, headers, status in (
        ({**good, "phase": "warmup"}, auth, 422),
        ({**good, "energy_j": -1.0}, auth, 422),
        ({**good, "rank": 99}, auth, 409),  # not registered
        (good, {"Authorization": "Bearer wrong"}, 403),
    ):
        r = ready_job.client.post(ready_job.url("/iterations"), json=body, headers=headers)
        assert r.status_code == status, r.text
    assert ready_job.view() == before


def test_a_report_sent_twice_counts_once(ready_job: Job) -> None:
    for _ in range(2):
        r = ready_job.client.post(
            ready_job.url("/iterations"),
            json={"rank": 0, "iteration": 7, "time_s": 1.0, "energy_j": 5.0, "phase": "baseline"},
            headers=ready_job.auth,
        )
        assert r.status_code == 200
    assert ready_job.view()["savings"]["baseline"]["iterations"] == 1


@pytest.mark.parametrize(
    ("slowdown_off", "saving_off", "words"),
    [(0.05, 0.0, ["slowdown"]), (0.0, -0.05, ["saving"]), (0.031, 0.031, ["slowdown", "saving"])],
)
def test_the_view_warns_when_realized_and_predicted_disagree(
    ready_job: Job, slowdown_off: float, saving_off: float, words: list[str]
) -> None:
    slowdown, saving = _predicted(ready_job)
    _run(
        ready_job, baseline=3, plan=3, slowdown=slowdown + slowdown_off, saving=saving + saving_off
    )
    warning = ready_job.view()["savings"]["warning"]
    assert warning is not None
    for word in ("slowdown", "saving"):
        assert (f"realized {word}" in warning) == (word in words)


def test_no_warning_within_three_points(ready_job: Job) -> None:
    slowdown, saving = _predicted(ready_job)
    _run(ready_job, baseline=3, plan=3, slowdown=slowdown + 0.029, saving=saving - 0.029)
    assert ready_job.view()["savings"]["warning"] is None


def test_no_savings_before_any_report(ready_job: Job) -> None:
    assert ready_job.view()["savings"] is None


def test_metrics_export_each_jobs_energy_and_saving(ready_job: Job) -> None:
    text = ready_job.client.get("/metrics").text
    assert "# TYPE perseus_job_energy_joules_total counter" in text
    energy_series = ("perseus_job_energy_joules_total", "perseus_job_energy_saved_joules_total")

    def energy_values(text: str) -> dict[str, float]:
        # The job's energy series only (a planned job also has gauges of its plan).
        return {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if f'{{job="{ready_job.job_id}"}}' in line and line.startswith(energy_series)
        }

    assert energy_values(text) == {}  # no reports yet
    _run(ready_job, baseline=2, plan=3, slowdown=0.0, saving=0.25)
    text = ready_job.client.get("/metrics").text
    s = ready_job.view()["savings"]
    values = energy_values(text)
    assert values == {
        "perseus_job_energy_joules_total": pytest.approx(s["energy_j"]),
        "perseus_job_energy_saved_joules_total": pytest.approx(s["energy_saved_j"]),
    }
    assert s["energy_saved_j"] == pytest.approx(3 * 0.25 * sum(100.0 + r for r in range(8)))
    # Job labels come from stored jobs only: a report to an unknown job adds none.
    r = ready_job.client.post(
        "/v1/jobs/" + "f" * 32 + "/iterations",
        json={"rank": 0, "iteration": 0, "time_s": 1.0, "energy_j": 1.0},
        headers=ready_job.auth,
    )
    assert r.status_code in (401, 403, 404)
    assert 'job="' + "f" * 32 not in ready_job.client.get("/metrics").text
    ready_job.client.delete(ready_job.url(), headers=ready_job.auth)
    assert f'job="{ready_job.job_id}"' not in ready_job.client.get("/metrics").text


# ----------------------------------------------------------------------------- plan times


def test_plans_carry_each_instructions_time_and_the_margin(
    ready_job: Job, example_rows: ProfileRows
) -> None:
    for stage in range(ready_job.stages):
        r = ready_job.wait_plan(rank=ready_job.rank_of(stage, 0))
        assert r.status_code == 200, r.text
        plan = PlanResponse.model_validate_json(r.content)
        assert plan.clock_change_margin_s == pytest.approx(CLOCK_CHANGE_MARGIN_S)
        measured = {
            (row["instruction"], row["frequency_mhz"]): row["time_s"] for row in example_rows[stage]
        }
        instructions = plan.instructions
        for k, ins in enumerate(instructions):
            assert ins.time_s is not None and ins.time_s > 0
            profiled = measured[(ins.instruction.value, ins.frequency_mhz)]
            # Neighbours wrap around the iteration.
            before = instructions[k - 1].frequency_mhz
            after = instructions[(k + 1) % len(instructions)].frequency_mhz
            if before <= ins.frequency_mhz and after <= ins.frequency_mhz:
                # No neighbour at a higher clock: no head or tail at another clock, exactly the
                # profile's time at its clock.
                assert ins.time_s == pytest.approx(profiled)
            else:
                # A head or tail runs at a neighbour's higher clock: faster (the example
                # profile is faster at every higher clock), never slower.
                assert ins.time_s < profiled
