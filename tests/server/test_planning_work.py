"""The planning-work estimate and its limit (perseus.server.planning.work)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from perseus.core.errors import PlanningTooLarge
from perseus.server.planning.work import (
    DEFAULT_MAX_CELLS,
    InstructionTimes,
    PlanningWork,
    check_planning_work,
    estimate_planning_work,
    instruction_times,
)
from perseus.server.settings import Settings
from perseus.solver import compute_frontier, make_schedule, profile_from_rows
from perseus.solver.synthetic import EXAMPLE_P_BLOCK_W, synthetic_profile

from .conftest import ProfileRows, clocks_of, create_job, synthetic_rows


def _times(stages: int, scale: float = 1.0) -> list[InstructionTimes]:
    """Ranges of the synthetic H200-like profile, its times multiplied by ``scale``."""
    per_stage: dict[int, list[tuple[str, int, float, float]]] = {}
    for stage, kind, clock, time_s, energy_j in synthetic_profile(stages):
        per_stage.setdefault(stage, []).append((kind, clock, time_s * scale, energy_j))
    return [t for stage, rows in per_stage.items() for t in instruction_times(stage, rows)]


def _work(
    stages: int, microbatches: int, virtual_stages: int = 1, scale: float = 1.0, **kw: Any
) -> PlanningWork:
    return estimate_planning_work(
        stages=stages,
        microbatches=microbatches,
        virtual_stages=virtual_stages,
        times=_times(stages, scale),
        resolution_s=kw.get("resolution_s"),
    )


@pytest.mark.parametrize(
    ("stages", "microbatches", "virtual_stages"),
    [(8, 12, 1), (8, 96, 1), (16, 128, 1), (16, 128, 2), (8, 96, 4), (32, 64, 1)],
)
def test_realistic_jobs_fit_the_default_limit(
    stages: int, microbatches: int, virtual_stages: int
) -> None:
    # Instruction times twice as spread as the synthetic model's (large models, slow GPUs).
    work = _work(stages, microbatches, virtual_stages, scale=2.0)
    assert work.cells <= DEFAULT_MAX_CELLS
    assert work.instructions == 2 * stages * microbatches * virtual_stages


@pytest.mark.parametrize(
    ("stages", "microbatches", "time_s"),
    [(4, 32_768, None), (4, 8, 5_000.0), (2, 2, 1e6)],
    ids=["4x32768 microbatches", "4x8 at 5000 s", "2x2 at 1e6 s"],
)
def test_the_issues_pathological_jobs_are_refused(
    stages: int, microbatches: int, time_s: float | None
) -> None:
    scale = 1.0 if time_s is None else time_s / 0.1  # synthetic instructions take ~0.1 s
    times = _times(stages, scale)
    # Very long instructions are refused on a 1 ms grid; by default the grid follows the
    # job's length (a bounded number of deadlines), so they plan.
    resolution_s = None if time_s is None else 1e-3
    if time_s is not None:
        admitted = check_planning_work(
            stages=stages,
            microbatches=microbatches,
            virtual_stages=1,
            times=times,
            resolution_s=None,
            max_cells=DEFAULT_MAX_CELLS,
        )
        assert admitted.cells <= DEFAULT_MAX_CELLS
    with pytest.raises(PlanningTooLarge) as caught:
        check_planning_work(
            stages=stages,
            microbatches=microbatches,
            virtual_stages=1,
            times=times,
            resolution_s=resolution_s,
            max_cells=DEFAULT_MAX_CELLS,
        )
    message = str(caught.value)
    assert "planning_max_cells" in message
    assert "resolution_s" in message
    assert "microbatches" in message
    assert caught.value.max_cells == DEFAULT_MAX_CELLS
    assert caught.value.cells > DEFAULT_MAX_CELLS


def test_the_refusal_says_how_many_microbatches_fit_and_that_many_do() -> None:
    limit = 10_000_000  # below the default grid's bound on cells, so a large job passes it
    with pytest.raises(PlanningTooLarge, match=r"at most ([\d,]+) microbatches fit") as caught:
        check_planning_work(
            stages=8,
            microbatches=1_000,
            virtual_stages=1,
            times=_times(8),
            resolution_s=None,
            max_cells=limit,
        )
    fits = int(str(caught.value).split("at most ")[1].split(" ")[0].replace(",", ""))
    assert _work(8, fits).cells <= limit < _work(8, fits + 1).cells


def test_a_finer_resolution_is_named_as_the_knob() -> None:
    times = _times(8)
    kwargs: dict[str, Any] = {"stages": 8, "microbatches": 96, "virtual_stages": 1}
    at_default = estimate_planning_work(times=times, resolution_s=None, **kwargs)
    with pytest.raises(PlanningTooLarge, match=r"coarser resolution_s \(now 0.0001 s"):
        check_planning_work(
            times=times, resolution_s=1e-4, max_cells=2 * at_default.cells, **kwargs
        )


def test_the_estimate_grows_with_the_job_and_never_with_fewer_ranges() -> None:
    base = _work(8, 32)
    assert _work(8, 64).cells > base.cells
    assert _work(8, 32, resolution_s=1e-4).cells > base.cells
    assert _work(8, 32, scale=3.0).cells > base.cells
    # A subset of the stages (one rank's own profile, checked on arrival) estimates no more.
    every = _times(8)
    for stage in range(8):
        subset = [t for t in every if t.stage == stage]
        part = estimate_planning_work(
            stages=8, microbatches=32, virtual_stages=1, times=subset, resolution_s=None
        )
        assert part.cells <= base.cells


@pytest.mark.parametrize(
    ("schedule", "stages", "microbatches", "virtual_stages"),
    [("1f1b", 4, 8, 1), ("gpipe", 3, 5, 1), ("interleaved-1f1b", 2, 4, 2), ("1f1b", 1, 3, 1)],
)
def test_the_estimate_covers_the_frontier_the_solver_computes(
    schedule: str, stages: int, microbatches: int, virtual_stages: int
) -> None:
    rows = synthetic_profile(stages)
    profile = profile_from_rows(rows, p_block_w=EXAMPLE_P_BLOCK_W)
    frontier = compute_frontier(
        profile, make_schedule(schedule, stages, microbatches, virtual_stages)
    )
    work = _work(stages, microbatches, virtual_stages)
    span_s = float(frontier.times_s[-1] - frontier.times_s[0])
    assert work.deadlines >= span_s / 1e-3
    assert work.deadlines >= len(frontier)


def test_a_job_too_large_to_plan_is_refused_when_its_profile_arrives(
    client: TestClient, example_rows: ProfileRows
) -> None:
    job = create_job(client, microbatches=32_768, data_parallel=1)
    job.register_all(clocks_of(example_rows))
    r = client.post(
        job.url("/profiles"),
        json={"rank": 0, "stage": 0, "rows": example_rows[0]},
        headers=job.auth,
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "PlanningTooLarge"
    assert "planning_max_cells" in r.text
    assert job.view()["counts"]["profiles_reported"] == 0


def test_a_profile_that_puts_the_job_over_the_limit_gets_422(
    settings: Settings, make_client: Callable[[Settings], TestClient]
) -> None:
    client = make_client(settings.model_copy(update={"planning_max_cells": 1_000_000}))
    rows = synthetic_rows(4, scale=100.0)
    job = create_job(client, stages=4, microbatches=8, data_parallel=1, tensor_parallel=1)
    job.register_all(clocks_of(rows))
    r = client.post(
        job.url("/profiles"),
        json={"rank": job.rank_of(0, 0), "stage": 0, "rows": rows[0]},
        headers=job.auth,
    )
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "PlanningTooLarge"
    detail = body["detail"]
    text = detail if isinstance(detail, str) else " ".join(d["msg"] for d in detail)
    assert "planning_max_cells" in text
    assert "microbatches fit" in text and "resolution_s" in text
    assert job.view()["counts"]["profiles_reported"] == 0


def test_large_1f1b_jobs_are_estimated_by_the_miniature_their_relaxation_solves() -> None:
    """A large 1F1B job's LP term counts its miniature's instructions (the knots solve that:
    see perseus.solver.miniature.Extension): 32 x 256 under GPipe's estimate of the same
    shape by the full relaxation's LP term, 32 x 128 (no miniature small enough) alike."""
    times = _times(32)

    def seconds(schedule: str, microbatches: int) -> float:
        return estimate_planning_work(
            stages=32, microbatches=microbatches, virtual_stages=1, times=times,
            resolution_s=None, schedule=schedule,
        ).seconds  # fmt: skip

    full_lp = 4.0 * (16384 / 8192) ** 2 * 8  # _LP_SECONDS x (instructions / 8,192)^2 x 2^3
    assert seconds("gpipe", 256) - seconds("1f1b", 256) == pytest.approx(
        full_lp - 4.0 * (2 * 32 * 129 / 8192) ** 2 * 8
    )
    assert seconds("gpipe", 128) == pytest.approx(seconds("1f1b", 128))
