"""Running the planner (perseus.server.planning.worker): the worker function, its limit, its
failures."""

from __future__ import annotations

import json
import logging

import pytest

from perseus.core.errors import PlanningTooLarge
from perseus.formats.plan_files import frontier_from_json
from perseus.server.planning.worker import (
    PlanningInput,
    StoredProfile,
    failure_reason,
    plan_frontier,
    warm_up,
)
from perseus.solver import planner as solver_planner

from .conftest import ProfileRows, synthetic_rows


def test_worker_function_returns_the_frontier_and_its_json(example_rows: ProfileRows) -> None:
    profiles = tuple(
        StoredProfile(
            stage,
            0,
            0,
            json.dumps(
                [[r["instruction"], r["frequency_mhz"], r["time_s"], r["energy_j"]] for r in rows]
            ),
        )
        for stage, rows in example_rows.items()
    )
    result = plan_frontier(PlanningInput("j", "gpipe", 4, 3, 1, 1, 100.0, 1e-3, profiles))
    frontier = frontier_from_json(result.frontier_json)
    assert frontier.schedule.name == result.frontier.schedule.name == "gpipe"
    assert len(frontier) == len(result.frontier) > 1
    assert list(frontier.times_s) == list(result.frontier.times_s)


def test_the_worker_checks_the_limit_again_on_every_rank_combined() -> None:
    # A job admitted elsewhere (another server's limit) is refused by the planning run.
    rows = synthetic_rows(4)
    profiles = tuple(
        StoredProfile(
            stage,
            0,
            0,
            json.dumps(
                [
                    [r["instruction"], r["frequency_mhz"], r["time_s"], r["energy_j"]]
                    for r in stage_rows
                ]
            ),
        )
        for stage, stage_rows in rows.items()
    )
    inp = PlanningInput(
        job_id="j",
        schedule="1f1b",
        stages=4,
        microbatches=64,
        virtual_stages=1,
        tensor_parallel=1,
        p_block_w=100.0,
        resolution_s=None,
        profiles=profiles,
        max_cells=1_000_000,
    )
    with pytest.raises(PlanningTooLarge, match="planning_max_cells"):
        plan_frontier(inp)


def test_a_memory_error_reads_as_the_limit_not_numpy() -> None:
    numpy_text = "Unable to allocate 29.1 GiB for an array with shape (3906250000,)"
    failure = failure_reason(MemoryError(numpy_text), 512 * 2**20)
    assert "Unable to allocate" not in failure.reason
    assert "512 MiB" in failure.reason and "planning_memory_mb" in failure.reason
    assert not failure.internal
    internal = failure_reason(ValueError("boom"), None)
    assert internal.internal and "ValueError: boom" in internal.details


def test_a_warm_up_that_fails_leaves_the_worker_planning_with_numpy(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose kernels cannot be loaded ahead of its jobs still starts and plans."""

    def broken() -> None:
        raise OSError("numba's cache is not writable")

    monkeypatch.setattr(solver_planner, "warm_kernels", broken)
    monkeypatch.setitem(solver_planner._kernel_state, "warm", False)
    with caplog.at_level(logging.WARNING, logger="perseus.server"):
        warm_up()
    assert "could not be loaded ahead of jobs" in caplog.text
    assert "not writable" in caplog.text
    assert not solver_planner._kernel_state["warm"]
