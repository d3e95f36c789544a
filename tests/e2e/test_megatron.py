"""perseus inside megatron-core's pipeline schedules.

In-process (quick): a forward's output names its backward, unsupported configurations are
refused, and megatron's one-stage schedule on a one-process gloo group runs its forwards and
backwards through the rank with the right ids.

Multi-process (slow): ``examples/megatron_pipeline.py`` under ``torch.distributed.run`` (gloo,
fake GPU) against a real planner server: each rank's clock log follows its plan instruction
by instruction, and the loss is the same, bit for bit, with and without perseus.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from .conftest import LiveServer
from .pipelines import Launch, check_ranks_follow_plans, create_job, job_env, stop_after_planned

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.enums import ModelType  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func, schedules  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402

from perseus.client.integrations import megatron as pm  # noqa: E402
from perseus.core.errors import ScheduleError  # noqa: E402

EXAMPLE = "megatron_pipeline.py"
QUIET = {"PYTHONWARNINGS": "ignore"}


# ---------------------------------------------------------------------- in process


def test_forward_output_names_its_backward() -> None:
    outputs = pm.ForwardOutputs()
    a, b, loss = torch.ones(2), torch.ones(2), torch.ones(())
    listed = [b]
    outputs.record(a, 0, None)
    outputs.record(listed, 1, 1)  # the 1F1B schedule returns [tensor] and keeps that list
    outputs.record(loss, 2, 0)
    assert outputs.match(listed) == (1, 1)
    assert outputs.match([a]) == (0, None)  # a list around the same tensor matches too
    assert outputs.match(a) is None  # each backward once
    assert outputs.match(torch.ones(2)) is None  # equal values are not the same output
    assert len(outputs) == 1
    outputs.clear()
    assert outputs.match(loss) is None


def test_a_recycled_id_does_not_match() -> None:
    outputs = pm.ForwardOutputs()
    dead = torch.ones(3)
    outputs.record(dead, 5, None)
    probe = weakref.ref(dead)
    del dead
    # The entry holds no reference: the tensor is gone, so whatever now lives at its
    # address is not the forward's output.
    assert probe() is None and len(outputs) == 1


def test_unsupported_configurations_are_refused() -> None:
    def config(**changes: Any) -> SimpleNamespace:
        base = {
            "overlap_moe_expert_parallel_comm": False,
            "delay_wgrad_compute": False,
            "hybrid_context_parallel": False,
            "microbatch_group_size_per_vp_stage": 2,
            "cuda_graph_impl": "none",
            "cuda_graph_scope": [],
        }
        return SimpleNamespace(**{**base, **changes})

    pm.check_config(config(), pipeline_size=2, interleaved=True)
    for changes, words in (
        ({"overlap_moe_expert_parallel_comm": True}, "combined 1F1B"),
        ({"delay_wgrad_compute": True}, r"\(delay_wgrad_compute"),
        ({"hybrid_context_parallel": True}, "hybrid context-parallel"),
        ({"microbatch_group_size_per_vp_stage": 4}, "groups of 4"),
        ({"cuda_graph_impl": "local", "cuda_graph_scope": ["full_iteration"]}, "CUDA graphs"),
    ):
        with pytest.raises(ScheduleError, match=words):
            pm.check_config(config(**changes), pipeline_size=2, interleaved=True)
    # The microbatch group only matters when interleaved.
    pm.check_config(
        config(microbatch_group_size_per_vp_stage=4), pipeline_size=2, interleaved=False
    )
    assert pm.schedule_of(4, None) == ("1f1b", None)
    assert pm.schedule_of(2, 2) == ("interleaved-1f1b", 2)
    assert pm.schedule_of(1, None) == ("1f1b", None)
    with pytest.raises(ScheduleError, match="one model chunk"):
        pm.schedule_of(2, 1)


@dataclass
class FakeRank:
    """Records what the integration tells a rank."""

    active: bool = True
    settings: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(profile_path=None))
    events: list[tuple[str, int, int | None]] = field(default_factory=list)
    iterations: int = 0
    bound: dict[str, Any] = field(default_factory=dict)

    @contextlib.contextmanager
    def iteration(self) -> Iterator[None]:
        self.events.append(("iteration", self.iterations, None))
        yield
        self.iterations += 1

    @contextlib.contextmanager
    def instruction(self, kind: str, microbatch: int, chunk: int | None = None) -> Iterator[None]:
        self.events.append((kind, microbatch, chunk))
        yield

    def bind(self, **values: Any) -> None:
        self.bound.update({k: v for k, v in values.items() if v is not None})


class Chunk(torch.nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.model_type = ModelType.encoder_or_decoder
        self.linear = torch.nn.Linear(4, 4)

    def set_input_tensor(self, input_tensor: object) -> None:
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class CpuTorch:
    """``torch`` as megatron's schedules see it, with their one "cuda" tensor on the CPU."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, device: Any = None, **kwargs: Any) -> Any:
        return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)


@pytest.fixture
def one_stage(monkeypatch: pytest.MonkeyPatch) -> Iterator[Chunk]:
    """A one-process gloo group with megatron's parallel state (one pipeline stage)."""
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    monkeypatch.setattr(schedules, "torch", CpuTorch())
    # An in-process store: no port picked free that something else may take first.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel()
        config = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1)
        torch.manual_seed(0)
        yield Chunk(config)
    finally:
        installed = pm.installed()
        if installed is not None:
            installed.remove()
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _run(model: Chunk, microbatches: int, forward_only: bool = False) -> list[Any]:
    data = [torch.randn(2, 4) for _ in range(microbatches)]

    def forward_step(iterator: Iterator[torch.Tensor], chunk: Chunk) -> Any:
        out = chunk(next(iterator))

        def loss(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            value = output.square().mean()
            return value, {"loss": value.detach().clone()}

        return out, loss

    result: list[Any] = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(data),
        model=model,
        num_microbatches=microbatches,
        seq_length=1,
        micro_batch_size=2,
        forward_only=forward_only,
    )
    return result


def test_one_stage_schedule_runs_through_the_rank(one_stage: Chunk) -> None:
    originals = {name: getattr(schedules, name) for name in ("forward_step", "backward_step")}
    rank = FakeRank()
    handle = pm.instrument(rank, microbatches=3)  # type: ignore[arg-type]
    assert handle is not None
    assert pm.instrument(rank) is handle  # Megatron-LM's model_provider runs once per chunk
    assert rank.bound["stage"] == 0 and rank.bound["stages"] == 1
    assert rank.bound["schedule"] == "1f1b"
    _run(one_stage, 3)
    _run(one_stage, 3, forward_only=True)  # evaluation: no iteration, no instructions
    assert rank.events == [
        ("iteration", 0, None),
        ("forward", 0, None), ("backward", 0, None),
        ("forward", 1, None), ("backward", 1, None),
        ("forward", 2, None), ("backward", 2, None),
    ]  # fmt: skip
    assert len(handle.outputs) == 0
    # The first call captured the chunk: the workload reruns it without touching gradients.
    assert handle.workload is not None
    workload = handle.workload.ready()
    assert workload is not None
    grads = [p.grad.clone() for p in one_stage.parameters()]
    state = torch.random.get_rng_state()
    workload.backward(workload.forward())
    assert all(torch.equal(p.grad, g) for p, g in zip(one_stage.parameters(), grads, strict=True))
    assert torch.equal(torch.random.get_rng_state(), state)
    handle.remove()
    assert all(getattr(schedules, n) is f for n, f in originals.items())


def test_an_unsupported_schedule_is_refused_before_it_runs(one_stage: Chunk) -> None:
    rank = FakeRank()
    pm.instrument(rank)  # type: ignore[arg-type]
    one_stage.config.overlap_moe_expert_parallel_comm = True  # the combined 1F1B schedule
    with pytest.raises(ScheduleError, match="combined 1F1B"):
        _run(one_stage, 2)
    assert rank.events == []
    with pytest.raises(ScheduleError, match="combined 1F1B"):
        pm.check_config(one_stage.config, pipeline_size=1, interleaved=False)


@pytest.mark.parametrize("setting", ["overlap_moe_expert_parallel_comm", "delay_wgrad_compute"])
def test_the_combined_1f1b_settings_are_refused_at_instrument(
    one_stage: Chunk, setting: str
) -> None:
    # The combined 1F1B schedule never calls forward_step/backward_step: refused by name
    # when the config is given, before anything is installed.
    before = schedules.forward_step
    setattr(one_stage.config, setting, True)
    with pytest.raises(ScheduleError, match=setting):
        pm.instrument(FakeRank(), config=one_stage.config)  # type: ignore[arg-type]
    assert pm.installed() is None and schedules.forward_step is before


def _backward_step_0_16(
    input_tensor: Any, output_tensor: Any, output_tensor_grad: Any, model_type: Any, config: Any
) -> None:
    """megatron-core 0.16's signature."""


def _backward_step_0_19(
    input_tensor: Any, output_tensor: Any, output_tensor_grad: Any, config: Any
) -> None:
    """megatron-core 0.19's signature: no model_type."""


def test_parameters_are_found_by_name_in_either_version() -> None:
    installed = inspect.signature(schedules.backward_step).parameters
    assert "output_tensor" in installed and "config" in installed
    tensor = object()
    for backward_step in (_backward_step_0_16, _backward_step_0_19):
        at = pm._position(backward_step, "output_tensor")
        config_at = pm._position(backward_step, "config")
        args = [None] * (config_at + 1)
        args[at] = tensor
        assert pm._argument(args, {}, at, "output_tensor") is tensor
        assert pm._argument([], {"output_tensor": tensor}, at, "output_tensor") is tensor
    assert pm._position(_backward_step_0_19, "config") == 3
    with pytest.raises(ScheduleError, match="has no parameter 'model_type'"):
        pm._position(_backward_step_0_19, "model_type")


def test_an_inactive_rank_changes_nothing(one_stage: Chunk) -> None:
    before = schedules.forward_step
    assert pm.instrument(FakeRank(active=False)) is None  # type: ignore[arg-type]
    assert schedules.forward_step is before


def test_a_function_fetched_before_remove_runs_as_megatrons_afterwards(one_stage: Chunk) -> None:
    rank = FakeRank()
    handle = pm.instrument(rank, microbatches=2)  # type: ignore[arg-type]
    assert handle is not None
    forward_backward = get_forward_backward_func()  # held by the training loop
    handle.remove()
    data = iter([torch.randn(2, 4) for _ in range(2)])
    forward_backward(
        forward_step_func=lambda iterator, chunk: (chunk(next(iterator)), _mean_loss),
        data_iterator=data,
        model=one_stage,
        num_microbatches=2,
        seq_length=1,
        micro_batch_size=2,
    )
    assert rank.events == []  # no iteration: perseus is gone


def _mean_loss(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    value = output.square().mean()
    return value, {"loss": value.detach().clone()}


# ---------------------------------------------------------------------- multi-process


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ranks", "schedule"),
    [(2, "1f1b"), (4, "1f1b"), (2, "interleaved-1f1b")],
    ids=["1f1b-2", "1f1b-4", "interleaved-2x2"],
)
def test_ranks_follow_their_plans_and_the_loss_is_unchanged(
    live_server: Callable[..., LiveServer],
    launches: list[Launch],
    tmp_path: Path,
    ranks: int,
    schedule: str,
) -> None:
    server = live_server()
    chunks = 2 if schedule == "interleaved-1f1b" else 1
    job, token = create_job(
        server, schedule=schedule, stages=ranks, microbatches=4, virtual_stages=chunks
    )
    args = ("--schedule", schedule, "--microbatches", "4")
    # The run without perseus goes alongside (the planned one mostly waits: profiling
    # windows, the fake GPU's modelled instruction times) and runs long enough to compare
    # (a loaded CI host saw the planned run reach 63 steps while the plain one ran 60).
    plain_steps = 150
    plain = Launch(
        tmp_path / "plain", EXAMPLE, ranks, *args, "--steps", str(plain_steps),
        perseus=None, env=QUIET, loss_log=True,
    )  # fmt: skip
    launches.append(plain)
    planned = Launch(
        tmp_path / "planned", EXAMPLE, ranks, *args, "--steps", "100000",
        # A few clocks from the top are enough to plan; the sweep keeps what it has.
        perseus=job_env(server, job, token, profile_max_s="8"),
        env=QUIET,
        loss_log=True,
    )  # fmt: skip
    launches.append(planned)
    stop_after_planned(planned, 3)
    plain.finish(120)

    check_ranks_follow_plans(
        planned, server, job, token, reset="SIGTERM", chunks=chunks, strict=True
    )
    output = planned.text()
    assert "does not match" not in output and "unplanned" not in output, output[-4000:]
    losses = planned.loss_lines()
    assert 3 <= len(losses) <= plain_steps, len(losses)
    assert losses == plain.loss_lines()[: len(losses)]
