"""The GPU's energy counter, read off the training thread.

NVML's total-energy counter advances only about every 100 ms and one read costs about
3.6 ms (BACKGROUND.md), so a read per instruction would be both meaningless and slow. A
:class:`EnergyMeter` thread reads it instead: every ``period_s`` normally (enough to
attribute energy to iterations), back to back while someone asks for precision
(:meth:`EnergyMeter.precise`). Back-to-back reads see each counter update within one read's
time; once the update period is known, precise mode sleeps until shortly before the next
update is due (NVML energy reads are slow driver calls, and back to back they slowed a
launch-bound stage on an H200 by tens of percent); the time of an update is estimated as
the middle of the read that first saw it. That estimate is late by a roughly constant
amount, which cancels in the difference of two updates, so the average power between updates
is exact up to the read time divided by the window (3.6 ms over 1 s: 0.4 %).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from perseus.client.gpu import GpuControl
from perseus.errors import GpuControlError

__all__ = ["EnergyMeter", "PowerReading"]

_log = logging.getLogger("perseus.client")

_GUARD_S = 0.015
"""How long before a predicted counter update precise mode starts reading back to back."""


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
        self._precise = 0
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
        """Read back to back while inside (nestable)."""
        with self._lock:
            self._precise += 1
        self._wake.set()
        try:
            yield
        finally:
            with self._lock:
                self._precise -= 1

    def _run(self) -> None:
        last: float | None = None
        # Update times seen in precise mode, to predict the next one: NVML energy reads are
        # slow driver calls (3.6 ms on an H200) and, back to back, they slowed a
        # launch-bound stage's kernels; between updates the meter sleeps instead.
        last_update: float | None = None
        intervals: deque[float] = deque(maxlen=5)
        while not self._stop.is_set():
            before = self._clock()
            try:
                value = self._gpu.energy_j()
            except GpuControlError as err:
                # Telemetry and profiling lose their energy; training does not notice.
                self.failed = str(err)
                _log.warning("perseus: energy counter unreadable, energy not measured: %s", err)
                return
            after = self._clock()
            middle = 0.5 * (before + after)
            with self._lock:
                self._times.append(middle)
                self._values.append(value)
                updated = last is not None and value != last
                if updated:
                    self._update_times.append(middle)
                    self._update_values.append(value)
                precise = self._precise > 0
            last = value
            if not precise:
                last_update = None
                self._wake.wait(self._period_s)
                self._wake.clear()
                continue
            if not updated:
                continue
            if last_update is not None:
                intervals.append(middle - last_update)
            last_update = middle
            if len(intervals) >= 3:
                # Sleep until shortly before the next update is due, then read back to back.
                period = sorted(intervals)[len(intervals) // 2]
                self._stop.wait(max(0.0, middle + period - _GUARD_S - self._clock()))

    def energy_between(self, start_s: float, end_s: float) -> float | None:
        """Energy in ``[start_s, end_s]`` by linear interpolation of the reads, or None.

        None when the reads do not cover the window (the meter started late or failed).
        The counter's own lag (up to one update period) shifts the window, which does not
        matter for telemetry of whole iterations.
        """
        with self._lock:
            times = list(self._times)
            values = list(self._values)
        if len(times) < 2 or times[0] > start_s or times[-1] < end_s:
            return None
        return _interpolate(times, values, end_s) - _interpolate(times, values, start_s)

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


def _interpolate(times: list[float], values: list[float], at: float) -> float:
    i = bisect.bisect_left(times, at)
    if i <= 0:
        return values[0]
    if i >= len(times):
        return values[-1]
    t0, t1 = times[i - 1], times[i]
    v0, v1 = values[i - 1], values[i]
    return v0 if t1 == t0 else v0 + (v1 - v0) * (at - t0) / (t1 - t0)
