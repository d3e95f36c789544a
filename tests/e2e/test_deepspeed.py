"""DeepSpeed pipeline parallelism: the instruction map, and the whole loop on CPU.

The first tests need no processes: DeepSpeed's own dispatch loop (``_exec_schedule``) runs its
``TrainSchedule`` through the instrumented map, and the microbatch ids counted there must be
perseus's 1F1B order. The slow ones start ``examples/deepspeed_pipeline.py`` under
``torch.distributed.run`` (gloo, fake GPU) against a real planner server: every rank's clock
log must equal its plan from the first planned iteration on, and the losses must equal those
of the same run without perseus.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest

from .conftest import LiveServer
from .pipelines import Launch, check_ranks_follow_plans, create_job, job_env, stop_after_planned

deepspeed = pytest.importorskip("deepspeed")

from deepspeed.runtime.pipe import schedule as ds_schedule  # noqa: E402
from deepspeed.runtime.pipe.engine import PipelineEngine  # noqa: E402

from perseus.client.integrations.deepspeed import MicrobatchCounter, instruction_map, instrument  # noqa: E402
from perseus.client.rank import Rank  # noqa: E402
from perseus.client.settings import load_settings  # noqa: E402
from perseus.core.errors import ScheduleError  # noqa: E402
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


EXAMPLE = "deepspeed_pipeline.py"


@pytest.mark.slow
@pytest.mark.parametrize("stages", [2, 4])
def test_ranks_follow_their_plans_and_train_the_same(
    stages: int, live_server: Callable[..., LiveServer], launches: list[Launch], tmp_path: Path
) -> None:
    server = live_server()
    job, token = create_job(server, schedule="1f1b", stages=stages, microbatches=4)
    args = ("--microbatches", "4", "--seed", "3")
    launch = Launch(
        tmp_path / "perseus", EXAMPLE, stages, *args, "--steps", "100000",
        perseus=job_env(server, job, token), loss_log=True,
    )  # fmt: skip
    launches.append(launch)
    stop_after_planned(launch, 4)
    check_ranks_follow_plans(launch, server, job, token, reset="SIGTERM")

    # The same steps without perseus give the same losses, to the last printed digit.
    with_perseus = launch.loss_lines()
    assert len(with_perseus) > 10
    baseline = Launch(
        tmp_path / "baseline", EXAMPLE, stages, *args, "--steps", str(len(with_perseus)),
        perseus=None, loss_log=True,
    )  # fmt: skip
    launches.append(baseline)
    baseline.finish(120)
    assert "perseus does nothing in this run" in baseline.text()
    assert baseline.loss_lines() == with_perseus
