"""Zero-bubble schedules end to end on CPU: torchrun ranks (gloo) with the fake GPU against a
real planner server (issue 23).

``examples/torch_pipeline.py`` runs ``ScheduleZBVZeroBubble`` (2 ranks, two stages each, in a
V) and ``ScheduleInterleavedZeroBubble`` (4 ranks, two chunks each): the ranks profile the
backward's halves online, the server plans the split backward, and every rank's clock log
equals its plan, instruction by instruction (``backward_input``/``backward_weight`` included),
in every planned iteration. The same steps without perseus give the same losses, to the last
printed digit. Kept short: few iterations, the example's small model, a capped profile.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import REPO, LiveServer
from .pipelines import (
    Launch,
    check_ranks_follow_plans,
    create_job,
    job_env,
    plan_of,
    stop_after_planned,
    wait_for,
)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

EXAMPLE = "torch_pipeline.py"
PLANNED_ITERATIONS = 5
"""Planned iterations per rank: the first 3 of a plan are not held to their clocks
(``pipelines.WARM_UP_ITERATIONS``), the rest are."""


@pytest.mark.parametrize(
    ("schedule", "ranks"),
    [pytest.param("zbv", 2, id="zbv-2-ranks"), pytest.param("interleaved-zb", 4, id="zb-4-ranks")],
)
def test_zero_bubble_ranks_follow_their_plans_and_train_the_same(
    schedule: str,
    ranks: int,
    live_server: Callable[..., LiveServer],
    launches: list[Launch],
    tmp_path: Path,
) -> None:
    server = live_server()
    job, token = create_job(
        server, schedule=schedule, stages=ranks, microbatches=4, virtual_stages=2
    )
    args = ("--schedule", schedule, "--microbatches", "4", "--seed", "3")
    planned = Launch(
        tmp_path / "planned", EXAMPLE, ranks, *args, "--steps", "100000",
        # A few clocks from the top are enough to plan; the sweep keeps what it has.
        perseus=job_env(server, job, token, profile_max_s="6"), loss_log=True,
    )  # fmt: skip
    launches.append(planned)
    stop_after_planned(planned, PLANNED_ITERATIONS, timeout_s=240)

    check_ranks_follow_plans(planned, server, job, token, reset="SIGTERM", chunks=2, strict=True)
    output = planned.text()
    assert "does not match" not in output, output[-4000:]
    for rank in range(ranks):
        kinds = {i["instruction"] for i in plan_of(server, job, token, rank)["instructions"]}
        assert {"backward_input", "backward_weight"} <= kinds, (rank, kinds)
        assert any(e["instruction"] == "backward_weight" for e in planned.entries(rank))

    # The same steps without perseus give the same losses, to the last printed digit.
    losses = planned.loss_lines()
    assert len(losses) > PLANNED_ITERATIONS
    plain = Launch(
        tmp_path / "plain", EXAMPLE, ranks, *args, "--steps", str(len(losses)),
        perseus=None, loss_log=True,
    )  # fmt: skip
    launches.append(plain)
    plain.finish(120)
    assert plain.loss_lines() == losses


def test_a_saved_zbv_profile_skips_profiling_and_plans_the_split_backward(
    live_server: Callable[..., LiveServer], launches: list[Launch], tmp_path: Path
) -> None:
    # Profile a ZBV job once, save its profile with `perseus job profile -o`, and run the
    # next job with PERSEUS_PROFILE naming it: the ranks upload each row with its own kind
    # (backward_input and backward_weight included), sweep no clock, and follow the plan.
    server = live_server()
    sizes = {"schedule": "zbv", "stages": 2, "microbatches": 4, "virtual_stages": 2}
    args = ("--schedule", "zbv", "--microbatches", "4", "--steps", "100000")
    first, first_token = create_job(server, **sizes)
    profiling = Launch(
        tmp_path / "profiling", EXAMPLE, 2, *args,
        perseus=job_env(server, first, first_token, profile_max_s="6"),
    )  # fmt: skip
    launches.append(profiling)
    wait_for("a plan", lambda: profiling.all_planned(1), 240, profiling)
    profiling.stop()
    saved = tmp_path / "zbv-profile.csv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
    env.update(job_env(server, first, first_token))
    done = subprocess.run(
        [sys.executable, "-m", "perseus.cli", "job", "profile", "-o", str(saved)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with saved.open() as file:
        kinds = {row["instruction"] for row in csv.DictReader(file)}
    assert {"backward_input", "backward_weight"} <= kinds, kinds

    job, token = create_job(server, **sizes)
    launch = Launch(
        tmp_path / "saved", EXAMPLE, 2, *args,
        perseus=job_env(server, job, token, profile=str(saved)),
    )  # fmt: skip
    launches.append(launch)
    stop_after_planned(launch, PLANNED_ITERATIONS, timeout_s=180)

    check_ranks_follow_plans(launch, server, job, token, reset="SIGTERM", chunks=2, strict=True)
    for rank in range(2):
        kinds = {i["instruction"] for i in plan_of(server, job, token, rank)["instructions"]}
        assert {"backward_input", "backward_weight"} <= kinds, (rank, kinds)
        phases = {e["phase"] for e in launch.entries(rank)}
        assert "profiling" not in phases, (rank, phases)
