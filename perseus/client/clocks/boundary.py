"""What the training thread hands the clock controller: boundary events, stamps, log entries.

The controller (:mod:`perseus.client.clocks.controller`) re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["BoundaryEvent", "LogEntry", "Stamp"]


class BoundaryEvent(Protocol):
    """What the training thread records at a boundary (a ``torch.cuda.Event``).

    An event may also offer ``query() -> bool`` (torch's does): the controller then polls it
    while it has a clock change on its way, instead of blocking in :meth:`synchronize`.
    """

    def synchronize(self) -> None:
        """Block until the device has reached the point the event was recorded at."""
        ...


@dataclass(slots=True)
class Stamp:
    """When the device reached a boundary, on the controller's clock; None until it has.

    On a GPU the host runs ahead of the device, so host timestamps of instruction calls say
    little about when the work ran; the controller thread, already waiting on the boundary
    events in order, notes when each marked one completes.
    """

    at_s: float | None = None


class LogEntry:
    """One instruction in the clock log: what the plan asked for and what really ran.

    ``ran_mhz`` is filled in by the training thread (a simulated GPU tells it at the start)
    or by the controller thread (it reads the GPU once the instruction has started); None
    where it could not be read.
    """

    __slots__ = ("chunk", "frequency_mhz", "kind", "microbatch", "ran_mhz")

    def __init__(
        self,
        kind: str,
        microbatch: int,
        chunk: int,
        frequency_mhz: int | None,
        ran_mhz: int | None,
    ) -> None:
        self.kind = kind
        self.microbatch = microbatch
        self.chunk = chunk
        self.frequency_mhz = frequency_mhz
        self.ran_mhz = ran_mhz
