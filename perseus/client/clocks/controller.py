"""Applying each instruction's clock so that no instruction runs slower than planned.

A clock change is not instant: an NVML lock takes milliseconds to tens of milliseconds to
take effect (the fake GPU models it with ``clock_change_delay_s``). Requested when an
instruction starts, it would land inside it, or after it. So changes are requested ahead,
and asymmetrically (as :mod:`perseus.solver.transitions` models them). Between consecutive
instructions ``k`` and ``n`` on the GPU (wrapping around the iteration) with different
clocks, with ``b`` their predicted boundary (the start of ``n``), ``L`` the measured latency
and ``m`` the plan's margin (``clock_change_margin_s``):

- a **raise** (``n`` higher) is aimed to take effect ``m`` *before* ``b``: requested at
  ``b - m - L``. The tail of ``k`` runs faster, never slower. Where that time lies before
  ``k`` starts (``k`` is short), it is requested from an earlier instruction's start: the
  latest ``j <= k`` whose start precedes it, with ``b`` predicted from ``start_j``;
- a **lowering** (``n`` lower) is aimed to take effect ``m`` *after* ``b``: requested at
  ``b + m - L``, from ``k``'s own start, or, once the intervals in between have been measured,
  from the latest earlier start that precedes it (predicted with a high estimate of those
  intervals, so that it errs late). ``b`` is taken as ``k``'s end (its start plus the
  shorter of its measured interval and its plan time plus ``m``): where ``n`` waits for a
  neighbouring stage, the lowering lands in the wait instead of past the longest wait seen.
  Where no start precedes it, it is requested at once: it lands late, and the head of ``n``
  runs at the higher clock, faster (it costs energy only).

So no instruction runs at a clock below its own because of a change that lands early or
late, except by the error of a prediction beyond the margin. Predictions add up intervals
from the plan and from measurement: each position's start-to-start interval is measured under
each plan (the last few kept); a raise uses the shortest measured (or the plan's
``PlanInstruction.time_s`` before one is measured: gaps only make a raise land earlier), a
lowering the second longest (never shorter than the plan's time). The wrap-around from an
iteration's last instruction to the next iteration's first is aimed the same way; its measured
interval includes the optimizer step. Changes are issued in boundary order; a change whose
successor is due no later is dropped (a short instruction between two higher clocks then runs
at the higher ones, as the solver models it). ``L`` is measured: after a change it issues,
the controller polls the clock in effect (``GpuControl.applied_clock_mhz``, about 1 us
through NVML) every ~0.75 ms until the new clock shows or 200 ms pass, and keeps a high
quantile of the recent samples (:class:`LatencyEstimate`); every change until 16 samples are
in, then one in :data:`PROBE_EVERY`, except one whose target an earlier change still on its
way has (that one could show first; changes land in order).

**What ran** (``ran_mhz`` in the clock log) is the SM clock in effect at the *middle* of each
instruction's run. On a GPU the controller thread reads the clock once, at ``start_k +
expected_k / 2`` (a timed read: never on the training thread); a simulated GPU computes it
exactly from its lock timeline (the fake's :meth:`~perseus.client.gpu.fake.FakeGpu.end`). Under
the asymmetric rule every instruction longer than ``2 * m`` is at its planned clock at its
middle whenever its changes land within their aims.

Threads: at each iteration's start the training thread hands over what it follows
(:meth:`follow`: this iteration's plan, the next one's), then one tiny item per instruction
(:meth:`started`: its index and start marker: a CUDA event recorded at the boundary, or
without CUDA (the CPU, the fake GPU) the host time). Every wait, timer and GPU call runs on
the controller thread ``perseus-clocks``: it stamps each start (polling the event while a
change is due, else blocking on it), predicts, sleeps until the next change or read is due
and issues it.

A failure to set a clock never reaches training: the controller logs it once, stops changing
clocks and resets the GPU to its default. At exit, on SIGTERM/SIGINT and on an exception in
training the GPU is reset (:meth:`ClockController.reset`); a generation counter drops every
change queued or scheduled before a reset, so none can lock the GPU low again after it.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from perseus.client.clocks.aim import (
    _INTERVALS_KEPT,
    LatencyEstimate,
    _Aiming,
    _Change,
    _Iteration,
    _iteration,
)
from perseus.client.clocks.boundary import BoundaryEvent, LogEntry, Stamp
from perseus.client.gpu.control import GpuControl
from perseus.client.state import ActivePlan
from perseus.core.errors import GpuControlError, NvmlPermissionError

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


@dataclass(slots=True)
class _Mark:
    event: BoundaryEvent | None  # None: a fence (host mode), reached when the thread gets it
    stamp: Stamp


@dataclass(slots=True)
class _Now:
    frequency_mhz: int | None
    generation: int


# An instruction started: (index in its iteration, start marker, log entry to read into,
# generation). A plain tuple: the training thread builds one per instruction.
_Started = tuple[int, "BoundaryEvent | float", "LogEntry | None", int]
_Item = _Started | _Iteration | _Mark | _Now | None  # None stops the thread


@dataclass(slots=True)
class _Probe:
    target_mhz: int
    issued_s: float
    last_read_s: float
    next_read_s: float


class ClockController(_Aiming):
    """Sets one GPU's SM clock so that no instruction runs slower than its plan.

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
        try:
            self._default_mhz = int(gpu.default_clock_mhz())
        except Exception:  # a GPU that cannot say: compare locks with none above them
            self._default_mhz = 1 << 30
        self._requested: int | None = None  # the clock last requested (None: the default)
        self._probes: collections.deque[_Probe] = collections.deque()  # changes on their way
        # Changes requested lately, (when, target MHz): any may still be on its way.
        self._on_way: collections.deque[tuple[float, int]] = collections.deque()
        self._waiting: _Started | _Mark | None = None  # its event is not reached yet
        self._iteration: _Iteration | None = None  # what the running iteration follows
        self._base = 0  # global index of its first instruction
        self._g = -1  # global index of the last instruction started
        self._last_start: tuple[tuple[int | None, int], float] | None = None
        self._intervals: dict[tuple[int | None, int], collections.deque[float]] = {}
        self._pending: dict[int, _Change] = {}  # boundary (global index before it) -> change
        self._issued_upto = -2  # the latest boundary whose change was issued or dropped
        self._reads: list[tuple[float, LogEntry]] = []  # timed reads of the clock that runs
        self._changes = 0
        self.applied = 0
        """Clock changes handed to the GPU."""
        self.late = 0
        """Changes requested once their instruction had started (nothing aimed them ahead)."""
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

    def follow(
        self, plan: ActivePlan | None, upcoming: ActivePlan | None = None, count: int = 0
    ) -> None:
        """An iteration starts: it follows ``plan`` (None: default clocks, about ``count``
        instructions), the next one ``upcoming`` (None: default clocks). Training thread;
        once per iteration."""
        generation = self._generation
        n = len(upcoming.keys) if upcoming is not None else count
        following = _iteration(upcoming, n, None, generation)
        self._queue.put(_iteration(plan, count, following, generation))

    def started(self, position: int, entry: LogEntry | None = None) -> None:
        """Instruction ``position`` of the iteration starts now. Training thread; about a
        microsecond, no wait.

        Args:
            position: Its index in the iteration (its plan's position).
            entry: Its clock log entry, for the controller to read ``ran_mhz`` into at the
                instruction's middle (None: the caller records it, e.g. a simulated GPU).
        """
        start: BoundaryEvent | float = self._record() if self._record else self._clock()
        self._queue.put((position, start, entry, self._generation))

    def apply(self, frequency_mhz: int | None) -> None:
        """Request ``frequency_mhz`` (None: the default) at once, on the controller thread,
        and drop the changes scheduled (the plan is no longer followed)."""
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
        """A stamp set once the controller has handled everything queued before it (in event
        mode: the device reached it, and every timed read before it is done)."""
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
                self._probes.clear()
                self._on_way.append((self._clock(), self._default_mhz))
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
        """Stop the controller thread and reset the GPU; log what the changes were aimed
        with (a latency never measured is the setting, assumed)."""
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=5.0)
            self._thread = None
        if self.applied:
            samples = len(self.latency.samples)
            _log.info(
                "perseus: GPU %d: %d clock changes, %d requested late; latency %.1f ms (%s)",
                self._gpu.index,
                self.applied,
                self.late,
                1e3 * self.latency.value_s,
                f"from the last {samples} measured" if samples else "assumed: never measured",
            )
        self.reset(reason)

    # ------------------------------------------------------------------ controller thread

    def _run(self) -> None:
        while True:
            try:
                item = self._next()
                if item is None:
                    return
                self._handle(item)
            except Exception:  # a bug here must not kill the thread silently
                _log.exception("perseus: the clock controller failed")

    def _next(self) -> _Item:
        """Issue what is due, and return the next item to handle, waiting for it (and for
        the start event of the instruction queued first) meanwhile."""
        while True:
            now = self._clock()
            self._issue_due(now)
            self._read_probe()
            wake = self._next_due()
            waiting = self._waiting
            if waiting is not None:
                event = waiting.event if isinstance(waiting, _Mark) else waiting[1]
                assert event is not None and not isinstance(event, float)
                query = getattr(event, "query", None)
                if query is None or (wake is None and not self._probes):
                    self._await(event)  # nothing due meanwhile: block on it
                    return self._take_waiting()
                try:
                    reached = bool(query())
                except Exception as err:
                    _log.error("perseus: waiting for an instruction boundary failed: %s", err)
                    reached = True
                if reached:
                    return self._take_waiting()
                pause = PROBE_INTERVAL_S if wake is None else min(wake - now, PROBE_INTERVAL_S)
                self._sleep(max(pause, 0.0))
                continue
            if self._probes:
                read_s = self._probes[0].next_read_s
                wake = read_s if wake is None else min(wake, read_s)
            try:
                item = (
                    self._queue.get()
                    if wake is None
                    else self._queue.get(timeout=max(wake - self._clock(), 0.0))
                )
            except queue.Empty:
                continue
            if (isinstance(item, tuple) and not isinstance(item[1], float)) or (
                isinstance(item, _Mark) and item.event is not None
            ):
                self._waiting = item  # handled once its event is reached
                continue
            return item

    def _take_waiting(self) -> _Started | _Mark:
        item = self._waiting
        assert item is not None
        self._waiting = None
        if isinstance(item, _Mark):
            return item
        return (item[0], self._clock(), item[2], item[3])

    def _next_due(self) -> float | None:
        due = [c.due_s for c in self._pending.values()]
        if self._reads:
            due.append(self._reads[0][0])
        return min(due) if due else None

    def _handle(self, item: _Started | _Iteration | _Mark | _Now) -> None:
        if isinstance(item, tuple):
            start = item[1]
            assert isinstance(start, float)
            self._start(item[0], start, item[2], item[3])
        elif isinstance(item, _Iteration):
            self._iteration = item if item.generation == self._generation else None
            self._base = self._g + 1
            self._forget(item)
        elif isinstance(item, _Now):
            self._iteration = None
            self._pending.clear()
            if item.frequency_mhz != self._requested:
                self._set(item.frequency_mhz, item.generation)
        else:
            for _, entry in self._reads:  # everything before the fence is read
                self._read_into(entry)
            self._reads.clear()
            item.stamp.at_s = self._clock()

    def _start(self, position: int, start_s: float, entry: LogEntry | None, gen: int) -> None:
        """Instruction ``position`` started at ``start_s``: measure, check, aim ahead."""
        it = self._iteration
        g = self._base + position
        last = self._last_start
        here = self._at(g)
        if last is not None and g == self._g + 1 and here is not None:
            history = self._intervals.get(last[0])
            if history is None:
                history = self._intervals[last[0]] = collections.deque(maxlen=_INTERVALS_KEPT)
            history.append(start_s - last[1])
        self._g = g
        self._last_start = None if here is None else (here[2], start_s)
        if entry is not None:
            half = 0.0
            if here is not None:
                half = 0.5 * (self._low(here[2], here[1]) or 0.0)
            self._reads.append((start_s + half, entry))
        if it is None or here is None or gen != self._generation or not self._enabled:
            return
        self._check(g, here[0], start_s, gen)
        self._aim(g, start_s, it.margin_s, gen)

    # Issuing ----------------------------------------------------------------------------------

    def _issue_due(self, now: float) -> None:
        """Issue the changes and reads due by ``now``, changes in boundary order; a change
        whose successor is due no later is dropped, once that successor is due: until then a
        later start may aim both again (a drop decided from an early prediction, where the
        waits in between vary, would be final)."""
        pending = self._pending
        while pending:
            order = sorted(pending)
            first = pending[order[0]]
            successor = pending[order[1]] if len(order) > 1 else None
            if successor is not None and successor.due_s <= min(first.due_s, now):
                del pending[order[0]]
                self._issued_upto = max(self._issued_upto, order[0])
                continue
            if first.due_s > now:
                break
            del pending[order[0]]
            self._issued_upto = max(self._issued_upto, order[0])
            if first.target_mhz != self._requested and first.generation == self._generation:
                self._set(first.target_mhz, first.generation)
        reads = self._reads
        while reads and reads[0][0] <= now:
            self._read_into(reads.pop(0)[1])

    def _read_into(self, entry: LogEntry) -> None:
        if entry.ran_mhz is not None or self._read_clock is None or not self._enabled:
            return
        try:
            entry.ran_mhz = self._read_clock()
        except Exception as err:  # a reading is worth no failure
            _log.debug("perseus: reading GPU %d's clock failed: %s", self._gpu.index, err)

    def _await(self, event: BoundaryEvent) -> None:
        """Wait for ``event`` (reading the clock in effect meanwhile)."""
        query = getattr(event, "query", None)
        try:
            if self._probes and query is not None:
                while not query():
                    self._sleep(PROBE_INTERVAL_S)
                    self._read_probe()
            else:
                event.synchronize()
        except Exception as err:  # a CUDA error here must not kill the thread silently
            _log.error("perseus: waiting for an instruction boundary failed: %s", err)
        self._read_probe()

    def _read_probe(self) -> None:
        """Read the clock in effect if a change on its way is due a look; changes land in
        the order issued, so each reading settles the oldest ones it shows."""
        probes = self._probes
        if not probes or self._read_clock is None:
            return
        now = self._clock()
        if now < probes[0].next_read_s:
            return
        try:
            seen = self._read_clock()
        except Exception:
            probes.clear()
            return
        read_s = self._clock()
        while probes and probes[0].target_mhz != seen and any(p.target_mhz == seen for p in probes):
            probes.popleft()  # landed unseen, overtaken by a later one: no sample
        while probes:
            probe = probes[0]
            if seen == probe.target_mhz:
                probes.popleft()
                if read_s - probe.last_read_s <= _PROBE_UNSURE_S:
                    self.latency.add(read_s - probe.issued_s)
            elif read_s - probe.issued_s > PROBE_TIMEOUT_S:
                probes.popleft()
            else:
                break
        for probe in probes:
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
                target = self._mhz(frequency_mhz)
                # Measured only where no change still on its way (issued less than twice the
                # latency ago) has the same target: that one would end the measurement early.
                # Changes land in order, so one with another target cannot, and a plan that
                # changes clocks every few milliseconds is measured too (waiting for a quiet
                # stretch, it would aim with the initial guess all along).
                now = self._clock()
                on_way = self._on_way
                while on_way and now - on_way[0][0] > 2.0 * self.latency.value_s + 0.005:
                    on_way.popleft()
                probing = probing and all(t != target for _, t in on_way)
                on_way.append((now, target))
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
            if probing and before != target and not self._probes:
                self._probes.append(_Probe(target, issued, issued, issued + PROBE_INTERVAL_S))
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
