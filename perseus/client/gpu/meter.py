"""The GPU's energy counter, read off the training thread.

NVML's total-energy counter advances only about every 100 ms and one read costs about
3.6 ms (BACKGROUND.md), so a read per instruction would be both meaningless and slow. A
:class:`EnergyMeter` thread reads it instead, in one of three ways:

- normally every ``period_s`` (enough to attribute energy to iterations);
- precise (:meth:`EnergyMeter.precise`): every update is caught, its time known within one
  read: back-to-back reads until the update period is known, then a sleep until shortly
  before each predicted update and back-to-back reads from there;
- quiet (:meth:`EnergyMeter.quiet`): no reads at all except around the few updates asked
  for (:meth:`EnergyMeter.catch_update`). The profiler measures a loop between two caught
  updates, so nothing reads the counter while the loop runs: NVML energy reads are slow
  driver calls, and beside a launch-bound stage on an H200 they slowed its kernel launches
  by tens of percent (read back to back: +70 %; around every update: still +42 % on one
  stage, which drew 218 W where the same loop undisturbed drew 299 W).

An update is timed only when the read before it ended just before the read that saw it
began; its time is the middle of that read. The estimate is late by a roughly constant
amount, which cancels in the difference of two updates, so the average power between two
timed updates is exact up to the read time divided by the window (3.6 ms over 1 s: 0.4 %).

Energy over a window (:meth:`EnergyMeter.energy_between`, the ranks' iteration energies) is
read off the updates, not off the reads: a read returns the counter as of its last update, up
to one period earlier, so interpolating the reads shifts every window back by up to 100 ms.
On a pipeline rank, whose iteration starts and ends with a step in power (blocking before its
first instruction, busy after), that shift measured 4-7 % less energy than the rank used on
three of four ranks of a 1F1B job. So in normal mode the meter learns the update period once
(back-to-back reads for about two updates), times one update again every
:data:`RETIME_S` (a few reads more each time: about twice the reads of one per period),
and places each value a read sees at the predicted update it came from.
Within an update period the counter says nothing, so the energy up to a window's boundary is
split as if the power stepped there, from the period before's average to the period after's
(:func:`_interpolate` with ``step``): exact at a step between two steady levels, and the
straight line where the two agree.
"""

from __future__ import annotations

import bisect
import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from perseus.client.gpu.control import GpuControl
from perseus.core.errors import GpuControlError

__all__ = ["CounterEdge", "EnergyMeter", "PowerReading"]

_log = logging.getLogger("perseus.client")

_GUARD_S = 0.015
"""How long before a predicted counter update the meter starts reading back to back."""

_TIMED_GAP_S = 0.005
"""Two reads at most this far apart are back to back: an update between them is timed."""

RETIME_S = 0.5
"""In normal mode, an update is timed again (a few back-to-back reads) after this long, so
the predicted update times the reads are placed at do not drift (a period learnt 1 % long
drifts 5 ms in that time; each re-timing also refines the period over the whole gap)."""

_LEARN_S = 2.0
_LEARN_READS = 150
"""Normal mode reads back to back for at most this long, and this many reads, to learn the
update period (a counter that does not move is then read at the normal pace, its windows
from the reads)."""

_CHASE_LIMIT_S = 0.5
_CHASE_READS = 60
"""A normal-mode re-timing gives up after reading back to back this long, or this many
reads, without a timed update, until :data:`RETIME_S` later."""


class CounterEdge:
    """A counter update the meter was asked to catch (:meth:`EnergyMeter.catch_update`).

    Attributes:
        after_s: The update caught is the first one seen at or after this time.
        at_s: When it was seen (meter clock; the middle of the read), None until caught.
        energy_j: The counter's value then, None until caught.
    """

    __slots__ = ("_done", "after_s", "at_s", "energy_j")

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self.at_s: float | None = None
        self.energy_j: float | None = None
        self._done = threading.Event()

    def caught(self) -> bool:
        """Whether the update was caught (cheap: the profiling loop asks after every body)."""
        return self._done.is_set()

    def _resolve(self, at_s: float, energy_j: float) -> None:
        self.at_s = at_s
        self.energy_j = energy_j
        self._done.set()


@dataclass(frozen=True, slots=True)
class PowerReading:
    """Average power over a window, from the counter updates inside it.

    Attributes:
        power_w: Least-squares slope of energy against time over the updates.
        start_s: Time of the first update used (meter clock).
        end_s: Time of the last update used.
        updates: Number of counter updates used.
    """

    power_w: float
    start_s: float
    end_s: float
    updates: int


class EnergyMeter:
    """Samples one GPU's energy counter in a background thread.

    Args:
        gpu: The GPU to read.
        period_s: Seconds between reads outside precise mode.
        clock: The time base; the training thread's timestamps must use the same one.
        keep: Samples kept (a ring): at back-to-back reads of 3.6 ms, 60,000 is 3.6 min.
    """

    def __init__(
        self,
        gpu: GpuControl,
        *,
        period_s: float = 0.1,
        clock: Callable[[], float] = time.perf_counter,
        keep: int = 60_000,
    ) -> None:
        self._gpu = gpu
        self._period_s = period_s
        self._clock = clock
        self._lock = threading.Lock()
        # (time of the read's middle, counter) for every read; and for reads that saw a new value.
        self._times: deque[float] = deque(maxlen=keep)
        self._values: deque[float] = deque(maxlen=keep)
        self._update_times: deque[float] = deque(maxlen=keep)
        self._update_values: deque[float] = deque(maxlen=keep)
        # Every value seen, at the time of the update it came from (timed or predicted).
        self._aligned_times: deque[float] = deque(maxlen=keep)
        self._aligned_values: deque[float] = deque(maxlen=keep)
        self._precise = 0
        self._quiet = 0
        self._edges: deque[CounterEdge] = deque()
        # The update period, learnt from timed updates (median of recent estimates).
        self._intervals: deque[float] = deque(maxlen=9)
        self._period_s_estimate: float | None = None
        self._last_timed: float | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed: str | None = None

    def start(self) -> None:
        """Start the reading thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="perseus-meter", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the reading thread and wait for it."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    @contextmanager
    def precise(self) -> Iterator[None]:
        """Catch every counter update while inside (nestable): reads back to back until the
        update period is known, then only around each predicted update."""
        with self._lock:
            self._precise += 1
        self._wake.set()
        try:
            yield
        finally:
            with self._lock:
                self._precise -= 1

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """No reads while inside (nestable), except to catch the updates asked for with
        :meth:`catch_update` and, once, to learn the update period.

        For measurements of launch-bound work: an NVML energy read is a slow driver call,
        and reads beside a loop of short kernels slowed it by tens of percent on an H200.
        """
        with self._lock:
            self._quiet += 1
        self._wake.set()
        try:
            yield
        finally:
            with self._lock:
                self._quiet -= 1

    def catch_update(self, after_s: float) -> CounterEdge:
        """Ask for the first counter update seen at or after ``after_s`` (meter clock).

        Once the update period is known the thread sleeps until shortly before the update
        is due and reads back to back only then, so a window between two caught updates
        costs a few reads at each end and none inside.
        """
        edge = CounterEdge(after_s)
        with self._lock:
            self._edges.append(edge)
        self._wake.set()
        return edge

    @property
    def update_period_s(self) -> float | None:
        """The counter's update period as measured (None until two updates were timed)."""
        return self._period_s_estimate

    def _next_update_after(self, at_s: float) -> float | None:
        period, last = self._period_s_estimate, self._last_timed
        if period is None or last is None:
            return None
        periods = max(0, math.ceil((at_s - last) / period))
        return last + periods * period

    def _update_at_or_before(self, at_s: float) -> float | None:
        """The last predicted update at or before ``at_s`` (None while the period is unknown)."""
        period, last = self._period_s_estimate, self._last_timed
        if period is None or last is None:
            return None
        return last + math.floor((at_s - last) / period) * period

    def _learn(self, at_s: float, consecutive: bool) -> None:
        """Note a timed update at ``at_s``; ``consecutive``: no update can have been missed
        since the last timed one (the reads in between ran back to back)."""
        last = self._last_timed
        self._last_timed = at_s
        if last is None:
            return
        interval = at_s - last
        if consecutive:
            self._intervals.append(interval)
        elif self._period_s_estimate is not None:
            # A gap of several periods refines the period (the prediction drifts less).
            n = round(interval / self._period_s_estimate)
            if (
                n >= 1
                and abs(interval / n - self._period_s_estimate) < 0.1 * self._period_s_estimate
            ):
                self._intervals.append(interval / n)
        if len(self._intervals) >= 2:
            self._period_s_estimate = statistics.median(self._intervals)

    def _run(self) -> None:
        last: float | None = None
        prev_end: float | None = None  # end of the previous read
        run_start: float | None = None  # first read of the current back-to-back run
        chasing = False  # reading back to back until a timed update
        chase_from = 0.0  # when normal mode began a chase (learning or re-timing)
        chase_reads = 0  # reads since then
        learn_reads = 0  # reads while learning in normal mode
        began = self._clock()
        next_normal = 0.0
        retime_from = -math.inf  # the last re-timing given up
        while not self._stop.is_set():
            now = self._clock()
            with self._lock:
                precise = self._precise > 0
                quiet = self._quiet > 0 and not precise
                edge = self._edges[0] if self._edges else None
            normal = not (precise or quiet or edge is not None)
            learning = (
                not precise
                and self._period_s_estimate is None
                and (quiet or (now - began < _LEARN_S and learn_reads < _LEARN_READS))
            )
            retime = (
                normal
                and self._last_timed is not None
                and now - max(self._last_timed, retime_from) > RETIME_S
            )
            if (
                chasing
                and normal
                and not learning
                and (now - chase_from > _CHASE_LIMIT_S or chase_reads > _CHASE_READS)
            ):
                chasing = False  # the counter did not move as predicted: try again later
                retime_from = now
            if not chasing:
                delay: float | None
                if precise or edge is not None or learning or retime:
                    target = (
                        max(now, edge.after_s)
                        if edge is not None and not (precise or learning or retime)
                        else now
                    )
                    predicted = None if learning else self._next_update_after(target)
                    delay = target - now if predicted is None else predicted - _GUARD_S - now
                    # Sleep until then and read back to back from there on (no re-check: the
                    # clock may be one that only the reads move).
                    chasing = True
                    chase_from = max(now, now + (delay or 0.0))
                    chase_reads = 0
                elif quiet:
                    delay = None  # no reads at all until asked
                else:
                    delay = next_normal - now
                if delay is None or delay > 0:
                    self._wake.wait(0.5 if delay is None else delay)
                    self._wake.clear()
                    continue
            before = self._clock()
            chase_reads += 1
            if normal and learning:
                learn_reads += 1
            try:
                value = self._gpu.energy_j()
            except GpuControlError as err:
                # Telemetry and profiling lose their energy; training does not notice.
                self.failed = str(err)
                _log.warning("perseus: energy counter unreadable, energy not measured: %s", err)
                return
            after = self._clock()
            middle = 0.5 * (before + after)
            # An update is timed when the read before it ended just before this one began:
            # then it happened within about one read's time of ``middle``.
            back_to_back = prev_end is not None and before - prev_end <= _TIMED_GAP_S
            if not back_to_back:
                run_start = before
            updated = last is not None and value != last
            timed = updated and back_to_back
            # The update a new value came from: timed, or else the last one predicted before
            # this read, where it falls clearly between the previous read and this one (a
            # read samples the counter somewhere inside it; a predicted time is as late as the
            # timed ones are), and the last timing is recent enough not to have drifted.
            aligned = middle if timed else None
            if (
                updated
                and not timed
                and prev_end is not None
                and self._last_timed is not None
                and middle - self._last_timed <= 2 * RETIME_S
            ):
                update = self._update_at_or_before(before)
                unsure = _TIMED_GAP_S + (after - before)
                if update is not None and prev_end + unsure < update < before - unsure:
                    aligned = update
            with self._lock:
                self._times.append(middle)
                self._values.append(value)
                if timed:
                    self._update_times.append(middle)
                    self._update_values.append(value)
                    while self._edges and self._edges[0].after_s <= middle:
                        self._edges.popleft()._resolve(middle, value)
                if aligned is not None and (
                    not self._aligned_times or aligned > self._aligned_times[-1]
                ):
                    self._aligned_times.append(aligned)
                    self._aligned_values.append(value)
            last = value
            prev_end = after
            # Normal reads fall halfway between predicted updates, where the update each new
            # value came from is unambiguous.
            upcoming = self._next_update_after(after)
            period = self._period_s_estimate
            next_normal = (
                before + self._period_s
                if upcoming is None or period is None
                else upcoming + 0.5 * period
            )
            if timed:
                consecutive = (
                    self._last_timed is not None
                    and run_start is not None
                    and self._last_timed >= run_start
                )
                self._learn(middle, consecutive)
                chasing = False

    def energy_between(self, start_s: float, end_s: float) -> float | None:
        """Energy in ``[start_s, end_s]``, or None where the reads do not cover the window
        (the meter started late or failed).

        From the values placed at their updates where those cover the window, split at the
        boundaries as if the power stepped there (:func:`_interpolate` with ``step``); else (the
        update period not learnt yet) by linear interpolation of the reads, whose window is
        late by up to one update period.
        """
        found = self.energies_between([(start_s, end_s)])
        return None if found is None else found[0]

    def energies_between(self, windows: list[tuple[float, float]]) -> list[float] | None:
        """:meth:`energy_between` of each window, from one copy of the reads, or None.

        None when the reads do not cover every window (yet: the caller may wait for the
        meter to read past the last one). For many windows at once, off the training thread.
        """
        with self._lock:
            times = list(self._times)
            values = list(self._values)
            aligned_times = list(self._aligned_times)
            aligned_values = list(self._aligned_values)
        if not windows:
            return []
        first = min(start for start, _ in windows)
        last = max(end for _, end in windows)
        if len(times) < 2 or times[0] > first or times[-1] < last:
            return None
        out = []
        for start, end in windows:
            if len(aligned_times) >= 2 and aligned_times[0] <= start and aligned_times[-1] >= end:
                out.append(
                    _interpolate(aligned_times, aligned_values, end, step=True)
                    - _interpolate(aligned_times, aligned_values, start, step=True)
                )
            else:
                out.append(
                    _interpolate(times, values, end) - _interpolate(times, values, start)
                )
        return out

    def power(self, start_s: float, end_s: float, *, min_updates: int = 3) -> PowerReading | None:
        """Average power over the counter updates seen within ``[start_s, end_s]``.

        Returns None when fewer than ``min_updates`` updates fall inside (the window was
        too short or the meter was not in precise mode).
        """
        with self._lock:
            times = list(self._update_times)
            values = list(self._update_values)
        lo = bisect.bisect_left(times, start_s)
        hi = bisect.bisect_right(times, end_s)
        ts, es = times[lo:hi], values[lo:hi]
        if len(ts) < min_updates:
            return None
        mean_t = sum(ts) / len(ts)
        mean_e = sum(es) / len(es)
        var = sum((t - mean_t) ** 2 for t in ts)
        if var <= 0:
            return None
        slope = sum((t - mean_t) * (e - mean_e) for t, e in zip(ts, es, strict=True)) / var
        return PowerReading(power_w=slope, start_s=ts[0], end_s=ts[-1], updates=len(ts))

    def updates_between(self, start_s: float, end_s: float) -> int:
        """Number of counter updates seen within ``[start_s, end_s]``."""
        with self._lock:
            times = list(self._update_times)
        return bisect.bisect_right(times, end_s) - bisect.bisect_left(times, start_s)


def _interpolate(times: list[float], values: list[float], at: float, step: bool = False) -> float:
    """The counter at ``at``, between the points around it: on the straight line, or with
    ``step`` as if the power stepped at ``at`` from the average of the update period before
    to that of the period after.

    Between updates ``t0 < at < t1`` the counter grew by ``v1 - v0``; with ``p0``, ``p1`` the
    average powers over the periods before ``t0`` and after ``t1``, the step's share before
    ``at`` is ``p0 (at - t0) / (p0 (at - t0) + p1 (t1 - at))``. With ``p0 == p1`` (or either
    unknown, or not positive) it is the straight line; at a step from one steady level to
    another (a pipeline rank starting or ending its iteration) it is exact.
    """
    i = bisect.bisect_left(times, at)
    if i <= 0:
        return values[0]
    if i >= len(times):
        return values[-1]
    t0, t1 = times[i - 1], times[i]
    v0, v1 = values[i - 1], values[i]
    if t1 == t0:
        return v0
    share = (at - t0) / (t1 - t0)
    if step and 2 <= i < len(times) - 1:
        p0 = (v0 - values[i - 2]) / (t0 - times[i - 2])
        p1 = (values[i + 1] - v1) / (times[i + 1] - t1)
        before, after = p0 * (at - t0), p1 * (t1 - at)
        if p0 > 0 and p1 > 0 and before + after > 0:
            share = before / (before + after)
    return v0 + (v1 - v0) * share
