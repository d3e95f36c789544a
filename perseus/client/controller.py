"""Applying a clock at each instruction boundary without stalling the training thread.

On a GPU, the training thread runs ahead of the device: when it starts instruction ``k`` the
device may still be busy with ``k - 1``. Setting the clock right away would slow the tail of
``k - 1``; synchronizing the device first would stall the thread (what Zeus does before every
instruction). So the training thread only records a CUDA event at the boundary (a few
microseconds) and hands ``(event, clock)`` to a controller thread, which waits for the event
and then sets the clock through NVML (milliseconds, off the training thread). Unchanged
clocks are skipped. Without CUDA (the CPU, or the fake GPU, whose setter is a memory write)
the boundary is the host call itself, and the clock is set inline.

A failure to set a clock never reaches training: the controller logs it once, stops
changing clocks and resets the GPU to its default. At exit, on SIGTERM/SIGINT and on an
exception in training the GPU is reset (:meth:`ClockController.reset`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from perseus.client.gpu import GpuControl
from perseus.errors import GpuControlError, NvmlPermissionError

__all__ = ["BoundaryEvent", "ClockController", "Stamp"]

_log = logging.getLogger("perseus.client")


class BoundaryEvent(Protocol):
    """What the training thread records at a boundary (a ``torch.cuda.Event``)."""

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


@dataclass(slots=True)
class _Change:
    event: BoundaryEvent
    frequency_mhz: int | None
    generation: int


@dataclass(slots=True)
class _Mark:
    event: BoundaryEvent
    stamp: Stamp


class ClockController:
    """Sets one GPU's SM clock at instruction boundaries.

    Args:
        gpu: The GPU.
        record_event: Records an event on the training stream and returns it; None sets
            clocks inline (CPU, fake GPU).
        clock: The time base of :meth:`mark` stamps (the energy meter's).
    """

    def __init__(
        self,
        gpu: GpuControl,
        record_event: Callable[[], BoundaryEvent] | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._gpu = gpu
        self._record = record_event
        self._clock = clock
        self._current: int | None = None  # what the training thread last asked for
        # Bumped by every reset: clock changes queued before a reset are dropped, so a
        # boundary that completes after the reset cannot lock the GPU low again.
        self._generation = 0
        self._enabled = True
        # Re-entrant: a signal handler that closes the rank runs on the main thread, which
        # may hold this lock at that moment (an inline clock change, a reset after an error).
        self._lock = threading.RLock()
        # Boundaries in stream order; None stops the thread.
        self._queue: queue.SimpleQueue[_Change | _Mark | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.applied = 0
        """Clock changes handed to the GPU (skipped unchanged ones are not counted)."""
        self.failure: str | None = None
        if record_event is not None:
            self._thread = threading.Thread(target=self._run, name="perseus-clocks", daemon=True)
            self._thread.start()

    @property
    def thread(self) -> threading.Thread | None:
        """The controller thread (event mode), or None (clocks are set inline)."""
        return self._thread

    @property
    def enabled(self) -> bool:
        """False once setting a clock failed; the GPU is then left at its default."""
        return self._enabled

    def apply(self, frequency_mhz: int | None) -> None:
        """Run what follows at ``frequency_mhz`` (None: the GPU's default). Training thread."""
        if frequency_mhz == self._current or not self._enabled:
            return
        self._current = frequency_mhz
        if self._record is None:
            self._set(frequency_mhz)
        else:
            self._queue.put(_Change(self._record(), frequency_mhz, self._generation))

    def mark(self) -> Stamp:
        """A stamp of when the device reaches this point of the stream. Training thread."""
        if self._record is None:
            return Stamp(self._clock())
        stamp = Stamp()
        self._queue.put(_Mark(self._record(), stamp))
        return stamp

    def reset(self, reason: str = "") -> None:
        """Put the GPU back to its default clock now, from any thread; never raises."""
        self._current = None
        try:
            with self._lock:
                self._generation += 1
                self._gpu.reset_clock()
        except Exception as err:
            _log.error("perseus: could not reset GPU %d clocks: %s", self._gpu.index, err)
            return
        if reason:
            _log.info("perseus: GPU %d clocks reset (%s)", self._gpu.index, reason)

    def discard_pending(self) -> None:
        """Drop queued clock changes without taking a lock (for signal handlers)."""
        self._generation += 1
        self._current = None

    def close(self, reason: str = "exit") -> None:
        """Stop the controller thread and reset the GPU."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5.0)
            self._thread = None
        self.reset(reason)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                item.event.synchronize()
            except Exception as err:  # a CUDA error here must not kill the thread silently
                _log.error("perseus: waiting for an instruction boundary failed: %s", err)
            if isinstance(item, _Mark):
                item.stamp.at_s = self._clock()
            else:
                self._set(item.frequency_mhz, item.generation)

    def _set(self, frequency_mhz: int | None, generation: int | None = None) -> None:
        try:
            with self._lock:
                if not self._enabled or (generation is not None and generation != self._generation):
                    return
                if frequency_mhz is None:
                    self._gpu.reset_clock()
                else:
                    self._gpu.lock_clock(frequency_mhz)
                self.applied += 1
        except NvmlPermissionError as err:
            self._disable(f"{err}; training goes on at default clocks")
        except Exception as err:  # a bug or a foreign error too: training and thread go on
            known = isinstance(err, GpuControlError)
            detail = str(err) if known else f"{type(err).__name__}: {err}"
            self._disable(f"setting GPU {self._gpu.index} to {frequency_mhz} MHz failed: {detail}")

    def _disable(self, message: str) -> None:
        self._enabled = False
        self.failure = message
        _log.warning("perseus: %s", message)
        self.reset()
