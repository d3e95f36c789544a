"""DeepSpeed pipeline parallelism: the instruction map, and the whole loop on CPU.

The first tests need no processes: DeepSpeed's own dispatch loop (``_exec_schedule``) runs its
``TrainSchedule`` through the instrumented map, and the microbatch ids counted there must be
perseus's 1F1B order. The slow ones start ``examples/deepspeed_pipeline.py`` under
``torch.distributed.run`` (gloo, fake GPU) against a real planner server: every rank's clock
log must equal its plan from the first planned iteration on, and the losses must equal those
of the same run without perseus.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, LiveServer, free_port
from .test_torch_pipeline import FAST_PROFILE, check_log_follows, create_job, plan_of

deepspeed = pytest.importorskip("deepspeed")

from deepspeed.runtime.pipe import schedule as ds_schedule  # noqa: E402
from deepspeed.runtime.pipe.engine import PipelineEngine  # noqa: E402

from perseus.client.deepspeed import MicrobatchCounter, instruction_map, instrument  # noqa: E402
from perseus.client.rank import Rank  # noqa: E402
from perseus.client.settings import load_settings  # noqa: E402
from perseus.errors import ScheduleError  # noqa: E402
from perseus.solver.schedules import make_schedule  # noqa: E402

# ---------------------------------------------------------------------- without processes


class RecordingRank:
    """Stands in for a rank: records the instructions it is asked to bracket."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int | None]] = []

    def instruction(self, kind: str, microbatch: int, chunk: int | None = None) -> Any:
        self.seen.append((kind, microbatch, chunk))
        return nullcontext()


class FakeEngine:
    """Just enough of a PipelineEngine for its unbound ``_exec_schedule`` to dispatch."""

    def __init__(self, instruction_map: dict[type, Any]) -> None:
        self._INSTRUCTION_MAP = instruction_map
        self.buffers: list[tuple[str, int]] = []

    def _reserve_pipe_buffers(self, num_buffers: int) -> None:
        pass


def run_schedule(schedule: Any, training: bool = True) -> tuple[RecordingRank, FakeEngine]:
    rank = RecordingRank()

    def record(kind: str) -> Callable[..., None]:
        def run(engine: FakeEngine, buffer_id: int) -> None:
            engine.buffers.append((kind, buffer_id))

        return run

    base: dict[type, Any] = {
        t: (lambda engine, **kwargs: None) for t in PipelineEngine._INSTRUCTION_MAP
    }
    base[ds_schedule.ForwardPass] = record("forward")
    base[ds_schedule.BackwardPass] = record("backward")
    counter = MicrobatchCounter()
    if training:
        counter.start()
    engine = FakeEngine(instruction_map(rank, counter, base))  # type: ignore[arg-type]
    PipelineEngine._exec_schedule(engine, schedule)
    return rank, engine


def test_train_schedule_counts_to_perseus_1f1b() -> None:
    for stages in range(1, 7):
        for microbatches in range(1, 11):
            expected = make_schedule("1f1b", stages, microbatches).order
            for stage in range(stages):
                schedule = ds_schedule.TrainSchedule(
                    micro_batches=microbatches, stages=stages, stage_id=stage
                )
                rank, engine = run_schedule(schedule)
                where = f"{stages} stages, {microbatches} microbatches, stage {stage}"
                assert rank.seen == [(i.kind, i.microbatch, None) for i in expected[stage]], where
                # The counted ids agree with the buffers DeepSpeed passes.
                buffers = schedule.num_pipe_buffers()
                assert engine.buffers == [(k, j % buffers) for k, j, _ in rank.seen], where


def test_eval_forwards_are_not_instructions() -> None:
    schedule = ds_schedule.InferenceSchedule(micro_batches=4, stages=2, stage_id=1)
    rank, engine = run_schedule(schedule, training=False)
    assert rank.seen == []
    assert [k for k, _ in engine.buffers] == ["forward"] * 4


def test_other_schedules_and_objects_are_refused() -> None:
    off = Rank(load_settings({}))
    with pytest.raises(ScheduleError, match="PipelineEngine"):
        instrument(off, object())

    class DataParallelEngine(PipelineEngine):  # type: ignore[misc]
        def _train_schedule(self) -> Any:
            return ds_schedule.DataParallelSchedule(micro_batches=4, stages=1, stage_id=0)

    engine = object.__new__(DataParallelEngine)  # no process group needed to be refused
    with pytest.raises(ScheduleError, match="DataParallelSchedule"):
        instrument(off, engine)


# ---------------------------------------------------------------------- torchrun ranks


class Launch:
    """One torchrun process tree running the DeepSpeed example, with or without perseus."""

    def __init__(self, tmp: Path, ranks: int, env: dict[str, str], *args: str) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.logs = tmp / "clocks"
        self.losses = tmp / "loss.txt"
        self.output = tmp / "torchrun.log"
        full = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
        full.update(OMP_NUM_THREADS="1", **env)
        if "PERSEUS_SERVER" in env:
            full["PERSEUS_CLOCK_LOG"] = str(self.logs)
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            str(REPO / "examples" / "deepspeed_pipeline.py"),
            "--loss-log", str(self.losses), *args,
        ]  # fmt: skip
        self._out = self.output.open("wb")
        self.process = subprocess.Popen(
            command, env=full, stdout=self._out, stderr=subprocess.STDOUT, cwd=REPO
        )

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def entries(self, rank: int) -> list[dict[str, Any]]:
        path = self.logs / f"rank{rank}.jsonl"
        out = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written
                break
        return out

    def loss_lines(self) -> list[str]:
        text = self.losses.read_text() if self.losses.exists() else ""
        return text.splitlines(keepends=True)[: text.count("\n")]

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout_s)
        finally:
            self._out.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # torchrun stops its workers on SIGTERM
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.kill()


def planned_iterations(launch: Launch, rank: int) -> int:
    return len({e["iteration"] for e in launch.entries(rank) if e["plan_version"] is not None})


@pytest.mark.slow
@pytest.mark.parametrize("stages", [2, 4])
def test_ranks_follow_their_plans_and_train_the_same(
    stages: int, live_server: Callable[..., LiveServer], launches: list[Launch], tmp_path: Path
) -> None:
    server = live_server()
    job, token = create_job(server, schedule="1f1b", stages=stages, microbatches=4)
    env = {
        **FAST_PROFILE,
        "PERSEUS_SERVER": server.url,
        "PERSEUS_JOB": job,
        "PERSEUS_TOKEN": token,
        "PERSEUS_GPU": "fake",
        "PERSEUS_POLL_WAIT_S": "5",
    }
    args = ("--microbatches", "4", "--seed", "3")
    launch = Launch(tmp_path / "perseus", stages, env, *args, "--steps", "100000")
    launches.append(launch)

    deadline = time.monotonic() + 150
    while not all(planned_iterations(launch, r) >= 4 for r in range(stages)):
        if launch.process.poll() is not None:
            pytest.fail(f"training exited early:\n{launch.text()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no plan followed in time:\n{launch.text()[-4000:]}")
        time.sleep(0.5)
    launch.kill()
    launch.wait(10)
    output = launch.text()
    for rank in range(stages):
        assert f"GPU {rank} clocks reset (SIGTERM)" in output, output[-4000:]
        plan = plan_of(server, job, token, rank)
        assert check_log_follows(launch, rank, {plan["version"]: plan}) >= 3  # type: ignore[arg-type]

    # The same steps without perseus give the same losses, to the last printed digit.
    with_perseus = launch.loss_lines()
    assert len(with_perseus) > 10
    baseline = Launch(tmp_path / "baseline", stages, {}, *args, "--steps", str(len(with_perseus)))
    launches.append(baseline)
    assert baseline.wait(120) == 0, baseline.text()[-4000:]
    assert "perseus does nothing in this run" in baseline.text()
    assert baseline.loss_lines() == with_perseus
