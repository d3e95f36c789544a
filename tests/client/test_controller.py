"""The clock controller, inline and event mode, against scripted GPUs and boundary events."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from perseus.client.controller import ClockController
from perseus.client.fake import FakeGpuModel
from perseus.errors import GpuControlError, NvmlPermissionError

# Helpers ----------------------------------------------------------------------------------------


class SetterGpu:
    """A GpuControl whose setters only record; ``lock_error`` makes locking fail."""

    def __init__(self, lock_error: GpuControlError | None = None) -> None:
        self.lock_error = lock_error
        self.locked: int | None = None
        self.calls: list[tuple[str, int | None]] = []
        self.changed = threading.Event()

    index = 3
    name = "setter"
    can_set_clocks = True

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return FakeGpuModel().clocks_mhz

    def default_clock_mhz(self) -> int:
        return 1980

    def current_clock_mhz(self) -> int:
        return self.locked or 1980

    def lock_clock(self, frequency_mhz: int) -> None:
        self.calls.append(("lock", frequency_mhz))
        if self.lock_error is not None:
            raise self.lock_error
        self.locked = frequency_mhz
        self.changed.set()

    def reset_clock(self) -> None:
        self.calls.append(("reset", None))
        self.locked = None
        self.changed.set()

    def energy_j(self) -> float:
        return 0.0

    def power_w(self) -> float:
        return 0.0


def test_inline_controller_skips_unchanged_clocks() -> None:
    gpu = SetterGpu()
    controller = ClockController(gpu)
    for frequency in (None, 1500, 1500, 1200, 1200, None, None, 1200):
        controller.apply(frequency)
    assert gpu.calls == [("lock", 1500), ("lock", 1200), ("reset", None), ("lock", 1200)]
    assert controller.applied == 4
    assert gpu.locked == 1200
    controller.close()
    assert gpu.locked is None and controller.enabled


@pytest.mark.parametrize(
    "error",
    [
        NvmlPermissionError("GPU 3: nvmlDeviceSetGpuLockedClocks: no permission; run as root"),
        GpuControlError("GPU 3: nvmlDeviceSetGpuLockedClocks: unknown error"),
    ],
    ids=["permission", "other"],
)
def test_failing_lock_disables_the_controller_once(
    error: GpuControlError, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = SetterGpu(lock_error=error)
    controller = ClockController(gpu)
    with caplog.at_level(logging.WARNING, logger="perseus.client"):
        controller.apply(1500)  # must not raise into training
        assert not controller.enabled
        assert controller.failure is not None and str(error) in controller.failure
        assert gpu.calls == [("lock", 1500), ("reset", None)]  # reset to the default
        for frequency in (1200, None, 900, 1500):
            controller.apply(frequency)  # training calls go on, nothing reaches the GPU
    assert gpu.calls == [("lock", 1500), ("reset", None)]
    assert controller.applied == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(error) in warnings[0].getMessage()
    controller.close()


class BrokenSetterGpu(SetterGpu):
    """Locks 900 MHz, then fails with an error that is no GpuControlError (a bug, ctypes)."""

    def lock_clock(self, frequency_mhz: int) -> None:
        if frequency_mhz != 900:
            self.calls.append(("lock", frequency_mhz))
            raise OSError("driver call failed")
        super().lock_clock(frequency_mhz)


class DoneEvent:
    def synchronize(self) -> None:
        pass


@pytest.mark.parametrize("event_mode", [False, True], ids=["inline", "event"])
def test_an_unexpected_setter_error_resets_the_gpu_and_spares_training_and_thread(
    event_mode: bool,
) -> None:
    gpu = BrokenSetterGpu()
    controller = ClockController(gpu, DoneEvent if event_mode else None)
    try:
        controller.apply(900)
        controller.apply(1200)  # inline: must not raise into the training thread
        deadline = time.monotonic() + 5.0
        while controller.enabled and time.monotonic() < deadline:
            time.sleep(0.001)
        assert not controller.enabled
        assert controller.failure is not None and "OSError: driver call failed" in (
            controller.failure
        )
        assert gpu.locked is None  # not left at 900 MHz
        if event_mode:
            assert controller.thread is not None and controller.thread.is_alive()
    finally:
        controller.close()


class GateEvent:
    """A boundary event whose ``synchronize`` blocks until the test releases it."""

    def __init__(self) -> None:
        self.waiting = threading.Event()
        self.released = threading.Event()

    def synchronize(self) -> None:
        self.waiting.set()
        if not self.released.wait(10.0):
            raise TimeoutError("the test never released the event")


@pytest.fixture
def gated() -> Iterator[tuple[SetterGpu, ClockController, list[GateEvent]]]:
    gpu = SetterGpu()
    events: list[GateEvent] = []

    def record() -> GateEvent:
        events.append(GateEvent())
        return events[-1]

    controller = ClockController(gpu, record)
    yield gpu, controller, events
    for event in events:
        event.released.set()
    controller.close()


def test_event_mode_sets_the_clock_only_once_the_boundary_is_reached(
    gated: tuple[SetterGpu, ClockController, list[GateEvent]],
) -> None:
    gpu, controller, events = gated
    # apply() returns while the boundary's event is still pending: the training thread never
    # waits for the device (if it did, this line would block until the event gave up).
    controller.apply(1500)
    controller.apply(1200)
    controller.apply(1200)  # unchanged: no event recorded
    assert len(events) == 2
    assert events[0].waiting.wait(5.0)  # the controller thread waits on the first boundary
    assert gpu.calls == [] and controller.applied == 0
    events[0].released.set()
    assert events[1].waiting.wait(5.0)  # ... set 1500, and waits on the second
    assert gpu.calls == [("lock", 1500)]
    events[1].released.set()
    deadline = time.monotonic() + 5.0
    while controller.applied < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert gpu.calls == [("lock", 1500), ("lock", 1200)]
    assert gpu.locked == 1200


def test_event_mode_close_resets_after_pending_boundaries(
    gated: tuple[SetterGpu, ClockController, list[GateEvent]],
) -> None:
    gpu, controller, events = gated
    controller.apply(900)
    events[0].released.set()
    controller.close("exit")
    assert gpu.calls == [("lock", 900), ("reset", None)]
    assert gpu.locked is None


def test_event_mode_reset_is_not_undone_by_a_queued_boundary(
    gated: tuple[SetterGpu, ClockController, list[GateEvent]],
) -> None:
    gpu, controller, events = gated
    controller.apply(600)
    assert events[0].waiting.wait(5.0)
    controller.reset("exception in training")  # whatever runs next must not run at 600 MHz
    assert gpu.locked is None
    gpu.changed.clear()
    events[0].released.set()
    gpu.changed.wait(0.5)  # give a wrongly queued lock its chance
    assert gpu.locked is None
