"""No instruction runs slower than planned although a clock change takes tens of ms.

A rank follows a plan that changes the clock at every instruction (forwards at 1500 MHz,
backwards at 1980 MHz), on a fake GPU whose locks land 20 or 40 ms after they are requested
and change the pace and power of the work running when they land. Requested when an
instruction starts, every change would land inside it or after it; the rank must raise ahead
(the margin before the boundary) and lower late (the margin after it), also where the
instructions are shorter than the delay (then the raise is requested from an earlier
instruction's start). Checked: every instruction's ``ran_mhz`` (the clock at the middle of
its run, from the clock log) is its planned clock, the iteration is not slower than the
solver's replay of the plan with the margin, and the energy the fake integrated is that
replay's within about 1 %. The first two hold in every run; a host that stalls the training
thread by a few ms lands lowerings late (energy only), so the energy claims hold in one of up
to five runs (:func:`until_quiet`).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perseus.client.gpu.fake import FakeGpu, FakeGpuModel, FakeRun, FakeWork, time_lost_s
from perseus.client.rank import Rank
from perseus.client.settings import load_settings
from perseus.schemas import PlanInstruction, PlanResponse
from perseus.solver import Profile, Replay, make_schedule, replay
from perseus.solver.profiles import Option

from .scripted import EXAMPLE_PROFILE, JOB, SERVER, ScriptedPlanner

MICROBATCHES = 2
MARGIN_S = 0.005
LONG = {  # every instruction longer than a 40 ms delay plus the margin
    "forward": FakeWork(time_at_max_s=0.060, power_at_max_w=620.0),
    "backward": FakeWork(time_at_max_s=0.100, power_at_max_w=700.0),
}
SHORT = {  # forwards (20 ms at 1500 MHz) and backwards shorter than a 40 ms delay
    "forward": FakeWork(time_at_max_s=0.016, power_at_max_w=620.0),
    "backward": FakeWork(time_at_max_s=0.030, power_at_max_w=700.0),
}
INTERLEAVED = {  # an interleaved job's chunks: forwards 11 ms, backwards 22 ms at the top
    "forward": FakeWork(time_at_max_s=0.011, power_at_max_w=620.0),
    "backward": FakeWork(time_at_max_s=0.022, power_at_max_w=700.0),
}
# Forwards slow, backwards fast: running each at its predecessor's clock is slower.
CLOCKS_MHZ = {"forward": 1500, "backward": 1980}
ORDER = [(kind, j) for j in range(MICROBATCHES) for kind in ("forward", "backward")]


class FixedWorkGpu(FakeGpu):
    """A fake GPU that keeps its work when the rank learns its stage."""

    def place(self, stage: int, stages: int) -> None:
        pass


class UnreadableGpu(FixedWorkGpu):
    """One whose clock in effect cannot be read: the controller measures no latency."""

    applied_clock_mhz = None  # type: ignore[assignment]


def solver_replay(model: FakeGpuModel, work: dict[str, FakeWork], margin_s: float) -> Replay:
    """The solver's replay of the alternating plan on the fake's exact model."""
    options = {
        kind: tuple(
            Option(f, model.time_s(w, f), model.energy_j(w, f)) for f in sorted(CLOCKS_MHZ.values())
        )
        for kind, w in work.items()
    }
    schedule = make_schedule("1f1b", 1, MICROBATCHES)
    assert [(i.kind, i.microbatch) for i in schedule.order[0]] == ORDER
    clocks = [[CLOCKS_MHZ[kind] for kind, _ in ORDER]]
    return replay(
        Profile((options,)), schedule, model.idle_power_w, clocks, clock_change_margin_s=margin_s
    )


def alternating_plan(expected: Replay) -> PlanResponse:
    instructions = [
        PlanInstruction(
            instruction=kind, microbatch=j, frequency_mhz=CLOCKS_MHZ[kind], time_s=t
        )
        for (kind, j), t in zip(ORDER, expected.durations_s[0], strict=True)
    ]  # fmt: skip
    return PlanResponse(
        job_id=JOB,
        version=1,
        stage=0,
        time_s=expected.time_s,
        energy_j=expected.energy_j,
        instructions=instructions,
        clock_change_margin_s=MARGIN_S,
    )


def run_rank(
    delay_s: float,
    work: dict[str, FakeWork],
    tmp_path: Path,
    planned: int,
    gpu_type: type[FixedWorkGpu] = FixedWorkGpu,
    wait_before_forward_s: Callable[[], float] | None = None,
    **env: str,
) -> dict[str, Any]:
    """Train until ``planned`` iterations ran under the plan; per iteration what ran.

    ``wait_before_forward_s`` gives the seconds each forward waits (the GPU idle) before it
    starts, as a stage waits for its activations from the previous one."""
    model = FakeGpuModel(clock_change_delay_s=delay_s)
    runs: list[FakeRun] = []
    gpu = gpu_type(model, work, trace=runs.append)
    expected = solver_replay(model, work, MARGIN_S)
    planner = ScriptedPlanner(alternating_plan(expected), MICROBATCHES)
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
    versions: list[int | None] = []
    times: list[float] = []
    energies: list[float] = []
    deadline = time.monotonic() + 60
    try:
        while sum(1 for v in versions if v is not None) < planned:
            assert time.monotonic() < deadline, f"no plan followed: {rank.failure}"
            started, before = time.monotonic(), gpu.true_energy_j()
            with rank.iteration():
                for kind, j in ORDER:
                    if wait_before_forward_s is not None and kind == "forward":
                        time.sleep(wait_before_forward_s())
                    with rank.instruction(kind, j):
                        pass
            times.append(time.monotonic() - started)
            energies.append(gpu.true_energy_j() - before)
            versions.append(rank.plan_version)
    finally:
        planner.released.set()
        rank.close()
    log = tmp_path / "clocks" / "rank0.jsonl"
    by_iteration: dict[int, list[dict[str, Any]]] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        by_iteration.setdefault(entry["iteration"], []).append(entry)
    return {
        "versions": versions,
        "times": times,
        "energies": energies,
        "log": by_iteration,
        "expected": expected,
        "model": model,
        "runs": runs,
    }


def aimed(result: dict[str, Any]) -> list[int]:
    """The iterations run under the plan from its fourth on: its first ones measure its
    intervals (short instructions need them to aim from earlier starts); from the fourth on,
    every change is aimed."""
    return [i for i, v in enumerate(result["versions"]) if v is not None][3:]


def ran_entries(
    log: dict[int, list[dict[str, Any]]], iterations: list[int]
) -> list[tuple[int, str, int, int | None]]:
    """Every instruction of ``iterations``: (iteration, kind, planned MHz, ``ran_mhz``)."""
    return [
        (i, e["instruction"], e["frequency_mhz"], e["ran_mhz"]) for i in iterations for e in log[i]
    ]


def assert_none_below(log: dict[int, list[dict[str, Any]]], iterations: list[int]) -> None:
    """Every instruction of ``iterations`` ran in order with its planned clock, and none
    below it at its middle (``ran_mhz``): a raise landing late is never allowed."""
    ran = ran_entries(log, iterations)
    assert [(kind, f) for _, kind, f, _ in ran] == [
        (kind, CLOCKS_MHZ[kind]) for _ in iterations for kind, _ in ORDER
    ], ran
    below = [r for r in ran if r[3] is None or r[3] < r[2]]
    assert not below, below


def above(log: dict[int, list[dict[str, Any]]], iterations: list[int]) -> list[Any]:
    """The instructions of ``iterations`` that ran above their planned clock at their
    middle: a lowering that landed late (faster than planned; energy only)."""
    return [r for r in ran_entries(log, iterations) if r[3] != r[2]]


QUIET_RUNS = 5
"""Runs a test of the energy claims makes at most (each a fresh rank)."""


def until_quiet(
    run: Callable[[Path], dict[str, Any]],
    tmp_path: Path,
    energy: Callable[[dict[str, Any], list[int]], str | None],
    check: Callable[[dict[str, Any], list[int]], None] | None = None,
) -> None:
    """Run ``run`` (on the iterations it aimed, :func:`aimed`) until one run meets the
    energy claims, at most :data:`QUIET_RUNS` times: at most one instruction above its
    clock, and ``energy`` returns None (else why not). Every run must keep the plan's order
    with none below its clock (:func:`assert_none_below`) and pass ``check``.

    A lowering is aimed up to a whole delay (40 ms) ahead, from an earlier instruction's
    start, across start-to-start intervals the host times: where the host stalls the
    training thread by a few ms (CI's two shared cores; steal up to 100 % seen), it lands
    past a 16 ms forward's middle, and that forward runs faster than planned. That costs
    energy, never time (checked in every run); a run on a host quiet enough to time the
    changes must also meet the energy claims. The failure lists every run's reason."""
    reasons = []
    for attempt in range(QUIET_RUNS):
        result = run(tmp_path / f"run{attempt}")
        checked = aimed(result)
        assert_none_below(result["log"], checked)
        if check is not None:
            check(result, checked)
        late = above(result["log"], checked)
        reason = f"{len(late)} ran above their clock: {late}" if len(late) > 1 else None
        reason = reason or energy(result, checked)
        if reason is None:
            return
        reasons.append(reason)
    raise AssertionError(f"no run of {QUIET_RUNS} met the energy claims: {reasons}")


@pytest.mark.parametrize(
    ("delay_s", "work"),
    [(0.02, LONG), (0.04, LONG), (0.02, SHORT), (0.04, SHORT)],
    ids=["20ms-long", "40ms-long", "20ms-short", "40ms-short"],
)
def test_every_instruction_runs_its_planned_clock_and_none_is_slower(
    delay_s: float, work: dict[str, FakeWork], tmp_path: Path
) -> None:
    def check(result: dict[str, Any], checked: list[int]) -> None:
        expected: Replay = result["expected"]
        median_s = statistics.median(result["times"][i] for i in checked)
        # Host work between the fake's modelled instructions adds a little (~0.3 ms each);
        # a change landing one instruction late would add 5 % or more.
        assert median_s <= expected.time_s * 1.01 + 0.002, (median_s, expected.time_s)

    def energy(result: dict[str, Any], checked: list[int]) -> str | None:
        # The energy the fake integrated is the replay's (with the margin's transitions),
        # plus the idle power of the host time it does not model, within 2 % (a lowering a
        # few ms late costs ~1 %; every forward at the backward's clock, 3.5 %).
        expected: Replay = result["expected"]
        median_s = statistics.median(result["times"][i] for i in checked)
        energy_j = statistics.median(result["energies"][i] for i in checked)
        extra_j = result["model"].idle_power_w * max(0.0, median_s - expected.time_s)
        if energy_j != pytest.approx(expected.energy_j + extra_j, rel=0.02):
            return f"energy {energy_j} J against {expected.energy_j} + {extra_j} J"
        return None

    until_quiet(lambda path: run_rank(delay_s, work, path, planned=8), tmp_path, energy, check)


def test_the_clock_log_records_the_clock_that_ran(tmp_path: Path) -> None:
    # Aimed with a latency of 1 ms against the fake's 40 ms (which it cannot measure), the
    # changes land late: the log says so (the clock at each instruction's middle) rather
    # than repeating the plan.
    result = run_rank(
        0.04, SHORT, tmp_path, planned=3, gpu_type=UnreadableGpu, PERSEUS_CLOCK_LATENCY_S="0.001"
    )
    lines = [e for entries in result["log"].values() for e in entries]
    assert len(result["log"]) == len(result["versions"])
    planned = [e for e in lines if e["plan_version"] is not None]
    assert planned and all(e["ran_mhz"] is not None for e in lines)
    assert any(e["ran_mhz"] != e["frequency_mhz"] for e in planned)
    assert {line["phase"] for line in lines} <= {"baseline", "plan"}


def test_a_lowering_after_a_varying_wait_lands_in_the_wait(tmp_path: Path) -> None:
    # Each forward (lower clock) waits 0-50 ms for its activations, as a stage waits for the
    # previous one, a different time every iteration. The backward's start-to-start interval
    # then varies by 50 ms: a lowering aimed past the longest interval seen lands up to 50 ms
    # into the forward, which runs that long at the backward's clock (faster, but about
    # 0.7 % more energy per iteration here). Aimed past the backward's own plan time, it
    # lands in the wait, and the energy is the replay's.
    rng = random.Random(3)

    def energy(result: dict[str, Any], planned: list[int]) -> str | None:
        expected: Replay = result["expected"]
        idle_w = result["model"].idle_power_w
        extra_j = statistics.median(
            result["energies"][i]
            - expected.energy_j
            - idle_w * (result["times"][i] - expected.time_s)
            for i in planned
        )  # the energy beyond the replay's and the waits' idle power
        if extra_j > 0.005 * expected.energy_j:
            return f"{extra_j} J beyond the replay's {expected.energy_j} J"
        return None

    until_quiet(
        lambda path: run_rank(
            0.02, LONG, path, planned=10, wait_before_forward_s=lambda: rng.uniform(0.0, 0.05)
        ),
        tmp_path,
        energy,
    )


@pytest.mark.parametrize(
    ("delay_s", "work"),
    [(0.02, SHORT), (0.04, SHORT), (0.02, INTERLEAVED), (0.04, INTERLEAVED)],
    ids=["20ms-short", "40ms-short", "20ms-interleaved", "40ms-interleaved"],
)
def test_no_instruction_loses_time_to_a_clock_change(
    delay_s: float, work: dict[str, FakeWork], tmp_path: Path
) -> None:
    # What ran, in time, not only the clock at each middle: the fake's record of every
    # instruction (the clocks it ran at, when) against its planned clock. A raise landing
    # late (or a lowering early) runs part of an instruction below its clock and shows here
    # as lost time, also where the middle is right. Instructions of 11-14 ms, shorter than
    # the delay, are an interleaved job's.
    result = run_rank(delay_s, work, tmp_path, planned=8)
    model: FakeGpuModel = result["model"]
    entries = [e for i in sorted(result["log"]) for e in result["log"][i]]
    runs: list[FakeRun] = result["runs"]
    assert [r.kind for r in runs[: len(entries)]] == [e["instruction"] for e in entries]
    planned = aimed(result)
    lost = [
        time_lost_s(model, run, entry["frequency_mhz"])
        for entry, run in zip(entries, runs, strict=False)
        if entry["iteration"] in planned
    ]
    assert len(lost) == len(planned) * len(ORDER)
    # Scheduling noise of the controller thread may land a change a fraction of a
    # millisecond past its margin; one landing a whole delay late loses several ms.
    assert max(lost) <= 0.001, lost
    iteration_s = statistics.median(result["times"][i] for i in planned)
    assert sum(lost) / len(planned) <= 0.002 * iteration_s, (sum(lost), iteration_s)
