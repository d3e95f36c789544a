"""The rank's shared state: giving up, and checking the job against what runs."""

from __future__ import annotations

import logging

import pytest

from perseus.client.settings import ClientSettings
from perseus.client.state import ActivePlan, Expectation, RankState, job_mismatches
from perseus.core.defaults import CLOCK_CHANGE_MARGIN_S
from perseus.schemas import JobCreate, PlanInstruction, PlanResponse
from perseus.solver import InstructionKind

SPEC = JobCreate(schedule="1f1b", stages=4, microbatches=8, data_parallel=1, tensor_parallel=1)


def test_nothing_expected_matches_any_job() -> None:
    assert job_mismatches(Expectation(), SPEC) == []
    assert job_mismatches(Expectation(schedule="1f1b", stages=4, microbatches=8), SPEC) == []


def test_every_difference_is_named() -> None:
    problems = job_mismatches(
        Expectation(schedule="gpipe", stages=2, microbatches=4, virtual_stages=2), SPEC
    )
    assert problems == [
        "schedule 'gpipe' runs, the job has '1f1b'",
        "2 pipeline stages run, the job has 4",
        "4 microbatches run, the job has 8",
        "2 virtual stages run, the job has 1",
    ]


def test_a_known_stage_makes_the_position_ready() -> None:
    assert RankState(ClientSettings(stage=2)).position_ready.is_set()
    assert not RankState(ClientSettings()).position_ready.is_set()


def test_giving_up_stops_plans_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    state = RankState(ClientSettings())
    assert state.failure is None and not state.stopped
    with caplog.at_level(logging.ERROR, logger="perseus.client"):
        state.give_up("the planner refused this rank")
    assert state.stopped and state.failure == "the planner refused this rank"
    assert "training goes on at default clocks" in caplog.text


def test_an_active_plan_keeps_the_plans_order() -> None:
    plan = PlanResponse(
        job_id="j",
        version=3,
        stage=0,
        time_s=1.0,
        energy_j=1.0,
        instructions=[
            PlanInstruction(instruction="forward", microbatch=0, frequency_mhz=1980, time_s=0.02),
            PlanInstruction(instruction="backward", microbatch=0, chunk=1, frequency_mhz=1200),
        ],
    )
    active = ActivePlan.from_response(plan)
    assert active.version == 3
    # chunk null on the wire is chunk 0 in the rank; kinds are the solver's InstructionKind
    assert active.keys == ((InstructionKind.FORWARD, 0, 0), (InstructionKind.BACKWARD, 0, 1))
    assert all(type(key[0]) is InstructionKind for key in active.keys)
    assert active.frequencies_mhz == (1980, 1200)
    assert active.times_s == (0.02, None)
    # an old server sends no margin (0): the rank aims with the default one
    assert active.margin_s == CLOCK_CHANGE_MARGIN_S
    assert ActivePlan.from_response(
        plan.model_copy(update={"clock_change_margin_s": 0.002})
    ).margin_s == pytest.approx(0.002)
