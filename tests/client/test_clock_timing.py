"""Each instruction starts at its planned clock although a clock change takes tens of ms.

A rank follows a plan that changes the clock at every instruction, on a fake GPU whose locks
take effect 20 or 40 ms after they are requested (the fake latches the clock in effect at the
start of each instruction for its whole length). Requested when an instruction starts, every
change would land inside it, and each instruction would run at its predecessor's clock; the
rank must request each change ahead, and record the clock that really ran.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from perseus.client.fake import FakeGpu, FakeGpuModel, FakeWork
from perseus.client.rank import Rank
from perseus.client.settings import load_settings
from perseus.schemas import PlanInstruction, PlanResponse

from .scripted import EXAMPLE_PROFILE, JOB, SERVER, ScriptedPlanner

MICROBATCHES = 2
# Long enough for a 40 ms change to be aimed from inside each instruction (> delay + margin).
WORK = {
    "forward": FakeWork(time_at_max_s=0.060, power_at_max_w=620.0),
    "backward": FakeWork(time_at_max_s=0.100, power_at_max_w=700.0),
}
# Forwards slow, backwards fast: running each at its predecessor's clock is slower.
CLOCKS_MHZ = {"forward": 1500, "backward": 1980}
ORDER = [(kind, j) for j in range(MICROBATCHES) for kind in ("forward", "backward")]


class FixedWorkGpu(FakeGpu):
    """A fake GPU that keeps its work when the rank learns its stage."""

    def place(self, stage: int, stages: int) -> None:
        pass


def alternating_plan(model: FakeGpuModel) -> PlanResponse:
    instructions = [
        PlanInstruction(
            instruction=kind,
            microbatch=j,
            frequency_mhz=CLOCKS_MHZ[kind],
            time_s=model.time_s(WORK[kind], CLOCKS_MHZ[kind]),
        )
        for kind, j in ORDER
    ]
    return PlanResponse(
        job_id=JOB,
        version=1,
        stage=0,
        time_s=1.0,
        energy_j=1.0,
        instructions=instructions,
        clock_change_margin_s=0.005,
    )


def run_rank(delay_s: float, tmp_path: Path, planned: int, **env: str) -> dict[str, Any]:
    """Train until ``planned`` iterations ran under the plan; what ran, per iteration."""
    model = FakeGpuModel(clock_change_delay_s=delay_s)
    gpu = FixedWorkGpu(model, WORK)
    planner = ScriptedPlanner(alternating_plan(model), MICROBATCHES)
    settings = load_settings(
        {"PERSEUS_BASELINE_ITERATIONS": "0", **env},
        server=SERVER,
        job=JOB,
        token="t",
        stage=0,
        gpu="fake",
        profile_path=str(EXAMPLE_PROFILE),
        clock_log_dir=str(tmp_path / "clocks"),
    )
    rank = Rank(settings, gpu=gpu, planner=planner.client())
    ran: list[tuple[int | None, list[tuple[str, int]]]] = []  # (plan version, [(kind, MHz)])
    times: list[float] = []
    deadline = time.monotonic() + 60
    try:
        while sum(1 for version, _ in ran if version is not None) < planned:
            assert time.monotonic() < deadline, f"no plan followed: {rank.failure}"
            clocks = []
            started = time.perf_counter()
            with rank.iteration():
                for kind, j in ORDER:
                    with rank.instruction(kind, j):
                        clocks.append((kind, gpu.current_clock_mhz()))  # the latched clock
            times.append(time.perf_counter() - started)
            ran.append((rank.plan_version, clocks))
    finally:
        planner.released.set()
        rank.close()
    return {"ran": ran, "times": times, "model": model}


@pytest.mark.parametrize("delay_s", [0.02, 0.04])
def test_every_instruction_starts_at_its_planned_clock(delay_s: float, tmp_path: Path) -> None:
    result = run_rank(delay_s, tmp_path, planned=4)
    planned_iterations = [
        (clocks, t) for (version, clocks), t in zip(result["ran"], result["times"], strict=True)
        if version is not None
    ]  # fmt: skip
    for clocks, _ in planned_iterations:
        assert clocks == [(kind, CLOCKS_MHZ[kind]) for kind, _ in ORDER], clocks
    model = result["model"]
    planned_s = sum(model.time_s(WORK[k], CLOCKS_MHZ[k]) for k, _ in ORDER)
    median_s = statistics.median(t for _, t in planned_iterations)
    # Host work between the fake's modelled instructions adds a little; a change landing one
    # instruction late would add about 7 %.
    assert median_s <= planned_s * 1.02 + 0.004, (median_s, planned_s)


def test_the_clock_log_records_the_clock_that_ran(tmp_path: Path) -> None:
    # No margin for the fake's 40 ms delay at this short forward: changes land late, and
    # the log says so rather than repeating the plan.
    result = run_rank(0.04, tmp_path, planned=2, PERSEUS_CLOCK_LATENCY_S="0.001")
    lines = [json.loads(x) for x in (tmp_path / "clocks" / "rank0.jsonl").read_text().splitlines()]
    by_iteration: dict[int, list[dict[str, Any]]] = {}
    for line in lines:
        by_iteration.setdefault(line["iteration"], []).append(line)
    assert len(by_iteration) == len(result["ran"])
    for i, (_version, clocks) in enumerate(result["ran"]):
        assert [(e["instruction"], e["ran_mhz"]) for e in by_iteration[i]] == clocks
    assert {line["phase"] for line in lines} <= {"baseline", "plan"}
