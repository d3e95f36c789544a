"""The profiling workload of a Megatron rank: its model chunks rerun on one captured microbatch.

The adapter (:mod:`perseus.client.integrations.megatron`) captures the arguments of each local
chunk's first real call; the online profiler then runs :class:`ChunkWorkload`'s forward and
backward at each clock, with the random-number states and buffers restored, and no gradient
reaching the parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from megatron.core.utils import get_attr_wrapped_model

from perseus.client.integrations.tensors import (
    StateHook,
    detached,
    flatten_tensors,
    preserved,
    with_grad,
)

__all__ = ["ChunkWorkload"]


@dataclass(slots=True)
class _Captured:
    model: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    inputs: list[torch.Tensor | None]


class ChunkWorkload:
    """The local model chunks' forward and backward on one captured microbatch.

    A forward runs every local chunk (an interleaved rank's instruction cost is the whole
    stage divided by its chunks, as the planner models it).
    """

    def __init__(self) -> None:
        self._captured: dict[int, _Captured] = {}
        self.chunks: int | None = None
        """How many chunks this rank holds (known at the first forward-backward call)."""

    def wants(self, chunk: int) -> bool:
        """Whether ``chunk`` still needs capturing."""
        return chunk not in self._captured

    def watch(
        self, chunk: int, model: torch.nn.Module, input_tensor: object
    ) -> torch.utils.hooks.RemovableHandle:
        """Capture the arguments of ``model``'s next call; remove the handle after the step.

        ``input_tensor`` is what the schedule gives the step (the activation received from
        the previous stage, or None on the first).
        """
        inputs = input_tensor if isinstance(input_tensor, list) else [input_tensor]

        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if chunk not in self._captured:
                self._captured[chunk] = _Captured(
                    model=module,
                    args=detached(args),
                    kwargs=detached(kwargs),
                    inputs=[detached(t) if isinstance(t, torch.Tensor) else None for t in inputs],
                )

        return model.register_forward_pre_hook(hook, with_kwargs=True)

    def ready(self) -> ChunkWorkload | None:
        """Self once every local chunk has been captured, else None."""
        if self.chunks is None or len(self._captured) < self.chunks:
            return None
        return self

    def forward(self) -> object:
        outputs = []
        models = [c.model for c in self._captured.values()]
        with preserved(models, _rng_hooks()):
            for chunk in sorted(self._captured):
                captured = self._captured[chunk]
                inputs = [
                    None if t is None else t.detach().requires_grad_(t.requires_grad)
                    for t in captured.inputs
                ]
                get_attr_wrapped_model(captured.model, "set_input_tensor")(inputs)
                out = captured.model(*with_grad(captured.args), **captured.kwargs)
                outputs.append((inputs, captured.args, out, captured.model))
        return outputs

    def backward(self, handle: object) -> None:
        models = [c.model for c in self._captured.values()]
        with preserved(models, _rng_hooks()):
            for inputs, args, out, model in handle:  # type: ignore[attr-defined]
                tensors = [t for t in flatten_tensors(out) if t.requires_grad]
                if not tensors:
                    continue
                wrt = [p for p in model.parameters() if p.requires_grad]
                wrt += [t for t in flatten_tensors([inputs, args]) if t.requires_grad]
                grads = [torch.ones_like(t) for t in tensors]
                torch.autograd.grad(tensors, wrt, grads, allow_unused=True)

    def synchronize(self) -> None:
        for captured in self._captured.values():
            for p in captured.model.parameters():
                if p.device.type == "cuda":
                    torch.cuda.synchronize(p.device)
                return


def _rng_hooks() -> list[StateHook]:
    """Megatron's model-parallel CUDA RNG tracker as a state to restore, when in use."""
    tracker = _rng_tracker()
    return [] if tracker is None else [(tracker.get_states, tracker.set_states)]


def _rng_tracker() -> Any:
    """Megatron's model-parallel CUDA RNG tracker when CUDA is in use, else None."""
    if not torch.cuda.is_available():
        return None
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return get_cuda_rng_tracker()
