"""Applying each instruction's clock so that it is in effect when the instruction starts.

A clock change is not instant: an NVML lock takes milliseconds to tens of milliseconds to
take effect (the fake GPU models it with ``clock_change_delay_s``). Requested when an
instruction starts, the change would land inside it, or after it: every planned instruction
would run at its predecessor's clock. So the clock of instruction ``k + 1`` is requested
*ahead*, while ``k`` runs::

    issue_at = start_k + expected_k - latency - margin        (never before start_k)

so that it lands ``margin`` before the boundary the controller predicts. ``expected_k`` is the
instruction's expected duration from the plan (``PlanInstruction.time_s``), or the shortest
start-to-start interval measured for that position under the same plan; the wrap-around from
an iteration's last instruction to the next iteration's first is aimed the same way, from the
measured interval (it includes the optimizer step). ``latency`` is measured: after a change it
issues, the controller polls the clock in effect (``GpuControl.applied_clock_mhz``, about 1 us
through NVML) every ~0.75 ms, sleeping in between, until the new clock shows or 200 ms pass,
and keeps a high quantile of the recent samples (:class:`LatencyEstimate`); every change
until 16 samples are in, then one in :data:`PROBE_EVERY`.

Threads: the training thread only enqueues one small item per instruction (:meth:`step`) with
the instruction's start marker: a CUDA event recorded at the boundary (the device reaches it
when ``k`` starts) or, without CUDA (the CPU, the fake GPU), the host time. Every wait, timer
and GPU call runs on the controller thread ``perseus-clocks``: it waits for the start of
``k``, reads the clock ``k`` really started at where the training thread could not (the
fake's work observer tells it directly), sleeps until ``issue_at`` and requests ``f(k + 1)``.
A change the prediction could not place (the first instruction of a plan that nothing aimed
for, an instruction shorter than the latency) is requested at once and lands late; the clock
log records the clock that really ran.

A failure to set a clock never reaches training: the controller logs it once, stops changing
clocks and resets the GPU to its default. At exit, on SIGTERM/SIGINT and on an exception in
training the GPU is reset (:meth:`ClockController.reset`); a generation counter drops every
change queued or scheduled before a reset, so none can lock the GPU low again after it.
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from perseus.client.gpu import GpuControl
from perseus.defaults import CLOCK_CHANGE_MARGIN_S
from perseus.errors import GpuControlError, NvmlPermissionError

__all__ = [
    "BoundaryEvent",
    "ClockController",
    "LatencyEstimate",
    "LogEntry",
    "Stamp",
]

_log = logging.getLogger("perseus.client")

PROBE_INTERVAL_S = 0.00075
"""How often the controller reads the clock in effect while a change is on its way."""
PROBE_EVERY = 16
"""Once the estimate has a full window, one change in this many is measured: each
measurement wakes the thread every ~0.75 ms, CPU that the training thread may need."""
PROBE_TIMEOUT_S = 0.2
"""A change not seen after this long gives no latency sample."""
_PROBE_UNSURE_S = 0.005
"""A sample whose previous read lies further back than this is too coarse to keep."""


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


class LatencyEstimate:
    """A robust estimate of the time from a clock request to the clock in effect.

    Keeps the last ``window`` samples; the estimate is their ``quantile`` (the 90th by
    default: a change issued that early lands in time nine times out of ten, and the margin
    covers the rest); until ``min_samples`` are in, the largest of ``initial_s`` and the
    samples (a first slow change must not make the next ones late). O(window log window) per
    sample.

    Args:
        initial_s: The estimate before enough samples (``PERSEUS_CLOCK_LATENCY_S``).
        window: Samples kept.
        quantile: The quantile used, in (0, 1].
        min_samples: Samples needed before they replace ``initial_s``.
    """

    def __init__(
        self,
        initial_s: float,
        *,
        window: int = 16,
        quantile: float = 0.9,
        min_samples: int = 3,
    ) -> None:
        self._initial_s = initial_s
        self._samples: collections.deque[float] = collections.deque(maxlen=window)
        self._quantile = quantile
        self._min = min_samples
        self.value_s = initial_s

    @property
    def settled(self) -> bool:
        """Whether the window is full (further samples only track drift)."""
        return len(self._samples) == self._samples.maxlen

    @property
    def samples(self) -> tuple[float, ...]:
        """The samples kept, oldest first."""
        return tuple(self._samples)

    def add(self, sample_s: float) -> None:
        """Take one measured latency, in seconds."""
        self._samples.append(sample_s)
        ordered = sorted(self._samples)
        if len(ordered) >= self._min:
            self.value_s = ordered[max(0, math.ceil(self._quantile * len(ordered)) - 1)]
        else:
            self.value_s = max(self._initial_s, ordered[-1])


@dataclass(slots=True)
class _Step:
    """Instruction ``position`` started: make sure it runs ``frequency_mhz`` and aim the next."""

    start: BoundaryEvent | float  # an event (CUDA) or the host time the instruction started
    position: int
    frequency_mhz: int | None
    next_mhz: int | None
    expected_s: float | None
    wrap: bool
    version: int | None
    margin_s: float
    entry: LogEntry | None
    generation: int


@dataclass(slots=True)
class _Mark:
    event: BoundaryEvent | None  # None: a fence (host mode), reached when the thread gets it
    stamp: Stamp


@dataclass(slots=True)
class _Now:
    frequency_mhz: int | None
    generation: int


_Item = _Step | _Mark | _Now | None  # None stops the thread


@dataclass(slots=True)
class _Probe:
    target_mhz: int
    issued_s: float
    last_read_s: float
    next_read_s: float


class ClockController:
    """Sets one GPU's SM clock so that each instruction starts at its own.

    Args:
        gpu: The GPU.
        record_event: Records an event on the training stream and returns it; None: the
            host call is the boundary (CPU, fake GPU).
        clock: The time base of stamps and waits (the energy meter's).
        latency_s: The clock-change latency assumed until measured (``PERSEUS_CLOCK_LATENCY_S``).
        sleep: Sleeps between reads of the clock in effect (tests may inject it).
    """

    def __init__(
        self,
        gpu: GpuControl,
        record_event: Callable[[], BoundaryEvent] | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        latency_s: float = 0.03,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._gpu = gpu
        # An implementation written before the protocol had it reads nothing: no latency is
        # measured and no clock recorded, changes go on.
        self._read_clock: Callable[[], int] | None = getattr(gpu, "applied_clock_mhz", None)
        self._record = record_event
        self._clock = clock
        self._sleep = sleep
        self.latency = LatencyEstimate(latency_s)
        """The clock-change latency in use (measured where the GPU's clocks change)."""
        # Bumped by every reset: clock changes queued before a reset are dropped, so a
        # boundary that completes after the reset cannot lock the GPU low again.
        self._generation = 0
        self._enabled = True
        # Re-entrant: a signal handler that closes the rank runs on the main thread, which
        # may hold this lock at that moment (a reset after an error).
        self._lock = threading.RLock()
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        # Controller-thread state.
        self._requested: int | None = None  # the clock last requested (None: the default)
        self._probe: _Probe | None = None
        self._held: _Item | None = None  # taken from the queue while waiting, not yet handled
        self._holding = False
        self._last_start: tuple[int, float, int | None] | None = None  # position, start, version
        self._intervals: dict[tuple[int, bool], collections.deque[float]] = {}
        self._intervals_version: int | None = None
        self._changes = 0
        self.applied = 0
        """Clock changes handed to the GPU."""
        self.late = 0
        """Changes requested at once because nothing aimed them ahead (they land late)."""
        self.failure: str | None = None
        self._thread: threading.Thread | None = threading.Thread(
            target=self._run, name="perseus-clocks", daemon=True
        )
        self._thread.start()

    @property
    def thread(self) -> threading.Thread | None:
        """The controller thread (None once closed)."""
        return self._thread

    @property
    def enabled(self) -> bool:
        """False once setting a clock failed; the GPU is then left at its default."""
        return self._enabled

    @property
    def latency_s(self) -> float:
        """The clock-change latency the controller aims with, in seconds."""
        return self.latency.value_s

    # ------------------------------------------------------------------ training thread

    def step(
        self,
        position: int,
        frequency_mhz: int | None,
        next_mhz: int | None,
        expected_s: float | None,
        *,
        wrap: bool = False,
        version: int | None = None,
        margin_s: float = CLOCK_CHANGE_MARGIN_S,
        entry: LogEntry | None = None,
    ) -> None:
        """Instruction ``position`` starts now: it should run ``frequency_mhz``, the next one
        ``next_mhz`` (None: the default clock). Training thread; a few microseconds.

        Args:
            position: The instruction's index in its iteration.
            frequency_mhz: Its planned clock.
            next_mhz: The planned clock of the instruction after it (the first of the next
                iteration when ``wrap``).
            expected_s: Its expected duration at its clock (None: unknown).
            wrap: It is the last instruction of its iteration.
            version: The plan it follows (measured intervals are kept per plan).
            margin_s: How long before the predicted boundary the change should land.
            entry: Its clock log entry; the controller fills in ``ran_mhz`` if still None.
        """
        start: BoundaryEvent | float = self._record() if self._record else self._clock()
        self._queue.put(
            _Step(
                start,
                position,
                frequency_mhz,
                next_mhz,
                expected_s,
                wrap,
                version,
                margin_s,
                entry,
                self._generation,
            )
        )

    def apply(self, frequency_mhz: int | None) -> None:
        """Request ``frequency_mhz`` (None: the default) at once, on the controller thread."""
        if self._enabled:
            self._queue.put(_Now(frequency_mhz, self._generation))

    def mark(self) -> Stamp:
        """A stamp of when the device reaches this point of the stream. Training thread."""
        if self._record is None:
            return Stamp(self._clock())
        stamp = Stamp()
        self._queue.put(_Mark(self._record(), stamp))
        return stamp

    def fence(self) -> Stamp:
        """A stamp set once the controller has handled everything queued before it."""
        stamp = Stamp()
        self._queue.put(_Mark(self._record() if self._record else None, stamp))
        return stamp

    # ------------------------------------------------------------------ any thread

    def reset(self, reason: str = "") -> None:
        """Put the GPU back to its default clock now, from any thread; never raises."""
        try:
            with self._lock:
                self._generation += 1
                self._requested = None
                self._probe = None
                self._gpu.reset_clock()
        except Exception as err:
            _log.error("perseus: could not reset GPU %d clocks: %s", self._gpu.index, err)
            return
        if reason:
            _log.info("perseus: GPU %d clocks reset (%s)", self._gpu.index, reason)

    def discard_pending(self) -> None:
        """Drop queued and scheduled clock changes without taking a lock (signal handlers)."""
        self._generation += 1

    def close(self, reason: str = "exit") -> None:
        """Stop the controller thread and reset the GPU."""
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=5.0)
            self._thread = None
        self.reset(reason)

    # ------------------------------------------------------------------ controller thread

    def _run(self) -> None:
        while True:
            item = self._take()
            if item is None:
                return
            try:
                self._handle(item)
            except Exception:  # a bug here must not kill the thread silently
                _log.exception("perseus: the clock controller failed on %r", item)

    def _take(self) -> _Item:
        if self._holding:
            self._holding = False
            item, self._held = self._held, None
            return item
        while True:
            if self._probe is None:
                return self._queue.get()
            try:
                return self._queue.get(timeout=max(self._probe.next_read_s - self._clock(), 0))
            except queue.Empty:
                self._read_probe()

    def _handle(self, item: _Step | _Mark | _Now) -> None:
        if isinstance(item, _Now):
            if item.frequency_mhz != self._requested:
                self._set(item.frequency_mhz, item.generation)
        elif isinstance(item, _Mark):
            if item.event is not None:
                self._await(item.event)
            item.stamp.at_s = self._clock()
        else:
            self._step(item)

    def _step(self, item: _Step) -> None:
        start = item.start if isinstance(item.start, float) else self._await(item.start)
        entry = item.entry
        if entry is not None and entry.ran_mhz is None and self._read_clock and self._enabled:
            try:
                entry.ran_mhz = self._read_clock()
            except Exception as err:  # a reading is worth no failure
                _log.debug("perseus: reading GPU %d's clock failed: %s", self._gpu.index, err)
        predicted = self._predict(item, start)
        # Nothing aimed this change ahead (a plan's first instruction, a mismatch, a change
        # that was dropped): request it now; it lands late and the log shows it.
        if item.frequency_mhz != self._requested and self._set(item.frequency_mhz, item.generation):
            self.late += 1
        if item.next_mhz == self._requested or item.generation != self._generation:
            return
        # The boundary to land before; the latency is read at every wake-up, since a
        # measurement may finish while this change waits.
        target = start if predicted is None else start + predicted - item.margin_s
        if self._wait_until(start, target):
            self._set(item.next_mhz, item.generation)

    def _predict(self, item: _Step, start: float) -> float | None:
        """The expected time from this start to the next one; records the interval before."""
        if item.version != self._intervals_version:
            self._intervals.clear()
            self._intervals_version = item.version
            self._last_start = None
        last = self._last_start
        if last is not None and (last[0] + 1 == item.position or item.position == 0):
            wrapped = item.position == 0
            history = self._intervals.setdefault((last[0], wrapped), collections.deque(maxlen=4))
            history.append(start - last[1])
        self._last_start = (item.position, start, item.version)
        measured = self._intervals.get((item.position, item.wrap))
        shortest = min(measured) if measured else None
        if item.wrap:
            # The next start follows the optimizer step and the peers: the measured interval
            # predicts it; the instruction's own time is a floor before one is measured.
            return shortest if shortest is not None else item.expected_s
        if item.expected_s is None:
            return shortest
        return item.expected_s if shortest is None else min(item.expected_s, shortest)

    def _wait_until(self, start_s: float, target_s: float) -> bool:
        """Sleep until the latency before ``target_s``, never before ``start_s`` (reading the
        clock in effect meanwhile); False when stopping.

        Returns early when the next instruction has already started (the host queued it, or
        its event completed): the change is then late, and issued at once.
        """
        while True:
            due_s = max(start_s, target_s - self.latency.value_s)
            now = self._clock()
            if now >= due_s:
                return True
            wake = due_s
            if self._probe is not None:
                wake = min(wake, self._probe.next_read_s)
            if not self._holding:
                try:
                    self._held = self._queue.get(timeout=max(wake - now, 0))
                    self._holding = True
                except queue.Empty:
                    self._read_probe()
                    continue
            held = self._held
            if held is None:
                return False
            if isinstance(held, _Mark) and held.event is None:
                self._holding = False  # a fence: everything before it is handled
                self._held = None
                held.stamp.at_s = self._clock()
                continue
            if isinstance(held, _Now):
                return True
            event = held.start if isinstance(held, _Step) else held.event
            if event is None or isinstance(event, float):
                return True  # the host started the next instruction already
            query = getattr(event, "query", None)
            if query is not None and query():
                if isinstance(held, _Mark):  # the iteration ended early; keep waiting
                    self._holding = False
                    self._held = None
                    held.stamp.at_s = self._clock()
                    continue
                return True
            self._sleep(min(max(wake - self._clock(), 0), PROBE_INTERVAL_S))
            self._read_probe()

    def _await(self, event: BoundaryEvent) -> float:
        """Wait for ``event`` (reading the clock in effect meanwhile); when it completed."""
        query = getattr(event, "query", None)
        try:
            if self._probe is not None and query is not None:
                while not query():
                    self._sleep(PROBE_INTERVAL_S)
                    self._read_probe()
            else:
                event.synchronize()
        except Exception as err:  # a CUDA error here must not kill the thread silently
            _log.error("perseus: waiting for an instruction boundary failed: %s", err)
        now = self._clock()
        self._read_probe()
        return now

    def _read_probe(self) -> None:
        probe = self._probe
        if probe is None or self._read_clock is None:
            return
        now = self._clock()
        if now < probe.next_read_s:
            return
        try:
            seen = self._read_clock()
        except Exception:
            self._probe = None
            return
        read_s = self._clock()
        if seen == probe.target_mhz:
            self._probe = None
            if read_s - probe.last_read_s <= _PROBE_UNSURE_S:
                self.latency.add(read_s - probe.issued_s)
        elif read_s - probe.issued_s > PROBE_TIMEOUT_S:
            self._probe = None
        else:
            probe.last_read_s = read_s
            probe.next_read_s = read_s + PROBE_INTERVAL_S

    def _set(self, frequency_mhz: int | None, generation: int) -> bool:
        """Request ``frequency_mhz`` unless a reset came since ``generation``; True if sent."""
        gpu = self._gpu
        try:
            with self._lock:
                if not self._enabled or generation != self._generation:
                    return False
                self._changes += 1
                probing = (
                    gpu.can_set_clocks
                    and self._read_clock is not None
                    and (not self.latency.settled or self._changes % PROBE_EVERY == 0)
                )
                target = gpu.default_clock_mhz() if frequency_mhz is None else frequency_mhz
                before = self._read_clock() if probing and self._read_clock else None
                issued = self._clock()
                if frequency_mhz is None:
                    gpu.reset_clock()
                else:
                    gpu.lock_clock(frequency_mhz)
                self._requested = frequency_mhz
                self.applied += 1
                if generation != self._generation and frequency_mhz is not None:
                    # A signal handler reset the GPU while this lock was on its way (it
                    # takes no lock): undo the lock, never leave the GPU low.
                    gpu.reset_clock()
                    self._requested = None
                    return False
            self._probe = (
                _Probe(target, issued, issued, issued + PROBE_INTERVAL_S)
                if probing and before != target
                else None
            )
            return True
        except NvmlPermissionError as err:
            self._disable(f"{err}; training goes on at default clocks")
        except Exception as err:  # a bug or a foreign error too: training and thread go on
            known = isinstance(err, GpuControlError)
            detail = str(err) if known else f"{type(err).__name__}: {err}"
            self._disable(f"setting GPU {gpu.index} to {frequency_mhz} MHz failed: {detail}")
        return False

    def _disable(self, message: str) -> None:
        self._enabled = False
        self.failure = message
        _log.warning("perseus: %s", message)
        self.reset()
