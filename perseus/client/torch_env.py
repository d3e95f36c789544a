"""What the client takes from torch, imported only when asked for (torch is optional)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perseus.client.clocks.controller import BoundaryEvent
from perseus.client.settings import ClientSettings

__all__ = ["cuda_events", "distributed"]


def distributed() -> Any:
    """``torch.distributed`` when a process group is up, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def cuda_events(settings: ClientSettings) -> Callable[[], BoundaryEvent] | None:
    """A recorder of CUDA events at instruction boundaries, or None (no CUDA, or the fake GPU:
    the host call is then the boundary)."""
    if settings.gpu == "fake":
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def record() -> BoundaryEvent:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        boundary: BoundaryEvent = event
        return boundary

    return record
