"""perseus for DeepSpeed pipeline parallelism (``PipelineEngine``): one call per rank.

::

    engine, _, _, _ = deepspeed.initialize(model=pipeline_module, ...)
    rank = perseus.client.connect()
    perseus.client.integrations.deepspeed.instrument(rank, engine)
    for step in range(steps):
        loss = engine.train_batch(data)             # one perseus iteration each

How it hooks in. ``PipelineEngine._exec_schedule`` runs every command of a schedule through
the class attribute ``_INSTRUCTION_MAP`` (command type to method). :func:`instrument` puts a
copy of the map on the engine instance in which ``ForwardPass`` and ``BackwardPass`` run inside
``rank.instruction(...)``, and wraps the instance's ``train_batch`` in ``rank.iteration()``:
every ``train_batch`` is one iteration, so the training loop needs no line of its own (and
must not add a ``with rank.iteration()`` around ``train_batch``: iterations do not nest).
Overriding the methods in a subclass would not do: the map holds the base class's functions.

Microbatch ids. The commands carry only a ``buffer_id`` (the microbatch modulo the number of
buffers), so the ids are counted: ``TrainSchedule`` issues a batch's forwards in microbatch
order 0, 1, ... and its backwards likewise, and its order on every stage is exactly perseus's
``1f1b`` (warm-up forwards, then one backward and one forward, then the remaining backwards;
checked against :func:`perseus.solver.schedules.make_schedule` through DeepSpeed's own dispatch
loop in ``tests/e2e/test_deepspeed.py``, up to 6 stages and 10 microbatches; by hand up to 8
and 16, deepspeed 0.19.8). The counts restart at every ``train_batch``.

What is supported. Only DeepSpeed's synchronous 1F1B ``TrainSchedule``: :func:`instrument`
builds the schedule the engine trains with and raises :class:`~perseus.core.errors.ScheduleError`
for anything else (a subclass whose ``_train_schedule`` returns another schedule, such as
``DualPipeVSchedule``), and for an engine that is not a ``PipelineEngine``. The stage, the
number of stages and the microbatches (``gradient_accumulation_steps``) are bound to the rank,
which checks them against the job on the server and logs an error at the start on a mismatch
(training goes on at default clocks). ``eval_batch`` (``InferenceSchedule``) runs as before,
outside the plan: its forwards are no instructions, and the GPU keeps the clock the last
iteration ended with. Changing the batch size during training (``set_train_batch_size``)
changes the instruction count; the rank notices that the plan no longer matches, logs it and
stops changing clocks.

Online profiling. The first ``train_batch`` captures this stage's input of one microbatch
(detached) and, on the last stage, its labels; the profiling loops rerun the stage module on
it, with the loss on the last stage, forward and forward+backward, with
``torch.autograd.grad`` so no gradient reaches the parameters, and with the random-number
states, the module's buffers and ``PipelineModule.micro_offset`` restored afterwards: training
after profiling computes exactly what it would have without it. DeepSpeed's activation
checkpointing refuses ``torch.autograd.grad``; with it, the loops run ``backward`` and put
every ``.grad`` back.

Ranks. The stage comes from the engine; the planner places ranks as Megatron does (tensor
parallel fastest, then data parallel, then stage), which is also the rank order of DeepSpeed's
``PipeDataParallelTopology`` and ``PipeModelDataParallelTopology``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from deepspeed.runtime.pipe.engine import PipelineEngine
from deepspeed.runtime.pipe.schedule import BackwardPass, ForwardPass, TrainSchedule

from perseus.client.integrations.tensors import StateHook, detached, flatten_tensors, preserved
from perseus.client.rank import Rank
from perseus.core.errors import ProfileError, ScheduleError
from perseus.core.pipeline import InstructionKind

__all__ = ["EngineWorkload", "MicrobatchCounter", "instrument"]

InstructionFn = Callable[..., Any]


def instrument(rank: Rank, engine: Any) -> None:
    """Make every forward and backward of ``engine`` a perseus instruction.

    Call it once, after ``deepspeed.initialize`` returned the engine and before training.
    Afterwards every ``engine.train_batch()`` is one perseus iteration.

    Args:
        rank: From :func:`perseus.client.connect`; a rank that is off leaves the engine alone
            (the schedule is still checked).
        engine: The ``PipelineEngine`` that ``deepspeed.initialize`` returned.

    Raises:
        ScheduleError: ``engine`` is not a ``PipelineEngine``, it trains with a schedule
            other than ``TrainSchedule`` (1F1B), or it was instrumented already.
    """
    if not isinstance(engine, PipelineEngine):
        raise ScheduleError(
            "perseus.client.integrations.deepspeed needs a PipelineEngine (deepspeed.initialize "
            f"with a PipelineModule), not {type(engine).__name__}"
        )
    # Building a schedule object only stores its sizes; this is the one the engine will run.
    schedule = engine._train_schedule()
    if type(schedule) is not TrainSchedule:
        raise ScheduleError(
            f"perseus plans DeepSpeed's 1F1B TrainSchedule, not {type(schedule).__name__}"
        )
    if "_INSTRUCTION_MAP" in vars(engine):
        raise ScheduleError("instrument: this engine is instrumented already")
    if not rank.active:
        return
    counter = MicrobatchCounter()
    workload = EngineWorkload(engine)
    engine._INSTRUCTION_MAP = instruction_map(
        rank, counter, type(engine)._INSTRUCTION_MAP, capture=workload.capture_labels
    )
    _wrap_train_batch(rank, engine, counter)
    engine.module.register_forward_pre_hook(workload.capture_hook, with_kwargs=True)
    rank.bind(
        stage=int(engine.stage_id),
        stages=int(engine.num_stages),
        schedule="1f1b",
        microbatches=int(engine.micro_batches),
        workload=workload.ready,
    )


class MicrobatchCounter:
    """Microbatch ids of ``TrainSchedule``'s forwards and backwards, by counting.

    Only counts while a ``train_batch`` runs (:meth:`start` to :meth:`stop`), so that the
    forwards of ``eval_batch`` are not taken for training instructions.
    """

    __slots__ = ("backwards", "forwards", "training")

    def __init__(self) -> None:
        self.training = False
        self.forwards = 0
        self.backwards = 0

    def start(self) -> None:
        self.training = True
        self.forwards = 0
        self.backwards = 0

    def stop(self) -> None:
        self.training = False

    def next_forward(self) -> int:
        j = self.forwards
        self.forwards += 1
        return j

    def next_backward(self) -> int:
        j = self.backwards
        self.backwards += 1
        return j


def instruction_map(
    rank: Rank,
    counter: MicrobatchCounter,
    base: dict[type, InstructionFn],
    *,
    capture: Callable[[Any, int], None] | None = None,
) -> dict[type, InstructionFn]:
    """A copy of an engine's instruction map whose forward and backward are instructions.

    Args:
        rank: The rank whose :meth:`~perseus.client.Rank.instruction` brackets them.
        counter: Supplies the microbatch ids.
        base: The engine class's ``_INSTRUCTION_MAP``.
        capture: Called as ``capture(engine, buffer_id)`` after every training forward
            (the workload takes the last stage's labels from it).

    Returns:
        The map to set on the engine instance.
    """
    forward = base[ForwardPass]
    backward = base[BackwardPass]

    def exec_forward_pass(engine: Any, buffer_id: int) -> None:
        if not counter.training:
            forward(engine, buffer_id=buffer_id)
            return
        with rank.instruction(InstructionKind.FORWARD, counter.next_forward(), None):
            forward(engine, buffer_id=buffer_id)
        if capture is not None:
            capture(engine, buffer_id)

    def exec_backward_pass(engine: Any, buffer_id: int) -> None:
        if not counter.training:
            backward(engine, buffer_id=buffer_id)
            return
        with rank.instruction(InstructionKind.BACKWARD, counter.next_backward(), None):
            backward(engine, buffer_id=buffer_id)

    return {**base, ForwardPass: exec_forward_pass, BackwardPass: exec_backward_pass}


def _wrap_train_batch(rank: Rank, engine: Any, counter: MicrobatchCounter) -> None:
    train_batch = engine.train_batch

    def instrumented_train_batch(*args: Any, **kwargs: Any) -> Any:
        with rank.iteration():
            counter.start()
            try:
                return train_batch(*args, **kwargs)
            finally:
                counter.stop()

    engine.train_batch = instrumented_train_batch


class EngineWorkload:
    """This stage's forward (with the loss on the last stage) and backward on one microbatch."""

    def __init__(self, engine: Any) -> None:
        self._module: torch.nn.Module = engine.module
        self._loss_fn = getattr(self._module, "loss_fn", None) if engine.is_last_stage() else None
        self._inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._labels: Any = None
        self._checkpointing = int(getattr(self._module, "activation_checkpoint_interval", 0)) > 0

    def capture_hook(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Forward pre-hook of the stage module: keep the first training microbatch's input."""
        if self._inputs is None and module.training:
            self._inputs = (detached(args), detached(kwargs))

    def capture_labels(self, engine: Any, buffer_id: int) -> None:
        """After a training forward: keep the last stage's labels of that microbatch."""
        if self._loss_fn is None or self._labels is not None:
            return
        buffers = getattr(engine, "pipe_buffers", {})
        labels = buffers.get("labels", [])
        if buffer_id < len(labels) and labels[buffer_id] is not None:
            self._labels = detached(labels[buffer_id])

    def ready(self) -> EngineWorkload | None:
        """Self once a microbatch (and on the last stage its labels) was seen, else None."""
        if self._inputs is None or (self._loss_fn is not None and self._labels is None):
            return None
        return self

    def forward(self) -> object:
        if self._inputs is None:
            raise ProfileError("the stage has not run a microbatch yet")
        args, kwargs = self._inputs
        module = self._module
        with _preserved(module):
            was_training = module.training
            module.train()
            try:
                out = module(*args, **kwargs)
                if self._loss_fn is not None:
                    out = self._loss_fn(out, self._labels)
            finally:
                module.train(was_training)
        return args, out

    def backward(self, handle: object) -> None:
        args: Any
        out: Any
        args, out = handle  # type: ignore[misc]
        tensors = [t for t in flatten_tensors(out) if t.requires_grad]
        if not tensors:
            return
        parameters = [p for p in self._module.parameters() if p.requires_grad]
        wrt: list[torch.Tensor] = [
            *parameters,
            *(t for t in flatten_tensors(args) if t.requires_grad),
        ]
        grads = [torch.ones_like(t) for t in tensors]
        with _preserved(self._module):
            if not self._checkpointing:
                torch.autograd.grad(tensors, wrt, grads, allow_unused=True)
                return
            # DeepSpeed's activation checkpointing refuses torch.autograd.grad; backward
            # accumulates into .grad, so the gradients are put back afterwards.
            with _grads_kept(wrt):
                torch.autograd.backward(tensors, grads)

    def synchronize(self) -> None:
        for p in self._module.parameters():
            if p.device.type == "cuda":
                torch.cuda.synchronize(p.device)
            return


def _preserved(module: torch.nn.Module) -> AbstractContextManager[None]:
    """Restores random-number states, module buffers and the pipeline's microbatch offset.

    ``PipelineModule`` counts forwards in ``micro_offset`` and, with ``seed_layers``, reseeds
    torch, numpy and ``random`` from it.
    """
    extra: list[StateHook] = []
    if hasattr(module, "micro_offset"):
        extra.append(
            (lambda: module.micro_offset, lambda value: setattr(module, "micro_offset", value))
        )
    return preserved([module], extra)


@contextmanager
def _grads_kept(tensors: list[torch.Tensor]) -> Iterator[None]:
    """Puts every tensor's ``.grad`` back as it was (values and, where it existed, object)."""
    saved = [None if t.grad is None else t.grad.detach().clone() for t in tensors]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, grad in zip(tensors, saved, strict=True):
                if grad is None:
                    t.grad = None
                elif t.grad is not None:
                    t.grad.copy_(grad)
                else:
                    t.grad = grad
