"""Tensor helpers shared by the framework integrations' profiling workloads (needs torch).

A workload reruns a stage's module on a captured microbatch; these keep that invisible to
training: inputs are detached copies, and :func:`preserved` puts back every random-number
state and buffer the reruns could have moved.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

__all__ = ["detached", "flatten_tensors", "preserved", "with_grad"]

StateHook = tuple[Callable[[], Any], Callable[[Any], None]]
"""``(get, set)`` of one more piece of state to restore (a framework's RNG tracker)."""


@contextmanager
def preserved(
    modules: Iterable[torch.nn.Module], extra: Sequence[StateHook] = ()
) -> Iterator[None]:
    """Restore random-number states (torch CPU and CUDA, ``random``, numpy), the modules'
    buffers (running statistics) and ``extra`` state on exit."""
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    py_state = random.getstate()
    np_state = np.random.get_state()
    saved_extra = [get() for get, _ in extra]
    buffers = [(b, b.detach().clone()) for m in modules for b in m.buffers()]
    try:
        yield
    finally:
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py_state)
        np.random.set_state(np_state)
        for (_, put), value in zip(extra, saved_extra, strict=True):
            put(value)
        # Through ``.data``: the copy keeps the buffer's version counter, so a backward still
        # to run on a rerun's graph (a BatchNorm in training mode saved its running statistics
        # for it) does not see them as modified in place. Its gradients are the rerun's only,
        # never training's.
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.data.copy_(saved)


def detached(value: Any) -> Any:
    """A detached copy of every tensor in ``value`` (nested tuples, lists, dicts), keeping
    ``requires_grad`` for floating-point tensors."""
    if isinstance(value, torch.Tensor):
        out = value.detach().clone()
        out.requires_grad_(value.requires_grad and value.is_floating_point())
        return out
    if isinstance(value, tuple):
        return tuple(detached(v) for v in value)
    if isinstance(value, list):
        return [detached(v) for v in value]
    if isinstance(value, dict):
        return {k: detached(v) for k, v in value.items()}
    return value


def with_grad(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Fresh leaves of the captured inputs, so each rerun builds its own graph.

    Stages after the first receive activations that need gradients (their backward computes
    the input gradient sent upstream); the capture kept that flag.
    """
    return tuple(
        a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
        for a in args
    )


def flatten_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in ``value`` (nested tuples, lists, dicts), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flatten_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flatten_tensors(v)]
    return []
