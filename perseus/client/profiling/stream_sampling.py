"""The training stream while a rank profiles: device stamps around its own instructions, and
the meter's energy over whole iterations.

:class:`StreamSampler` is fed by the training thread (one stamp per instruction boundary, one
per iteration's end); :class:`StreamEnergy` reads the meter over the sampled iterations on a
thread of its own, so the training thread never reads the meter.
:class:`~perseus.client.profiling.online.OnlineProfiling` decides when to sample and what the
samples
calibrate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from perseus.client.clocks.controller import Stamp
from perseus.client.gpu.meter import EnergyMeter
from perseus.client.profiling.wait_power import StreamWindow

__all__ = [
    "MAX_CALIBRATION_SPANS",
    "MAX_STREAM_SAMPLES",
    "IterationSpan",
    "StreamEnergy",
    "StreamSampler",
]

MAX_STREAM_SAMPLES = 256
MAX_CALIBRATION_SPANS = 1024
"""Iteration spans kept at most (bounded memory); collecting stops when full."""

_KINDS = ("forward", "backward", "backward_input", "backward_weight")
"""The instruction kinds a profile can hold (a split backward's halves included)."""


class IterationSpan:
    """One iteration under calibration: its first instruction's start to its end (device
    stamps), and the instructions it ran per kind."""

    __slots__ = ("counts", "end", "start")

    def __init__(self, start: Stamp, end: Stamp, counts: dict[str, int]) -> None:
        self.start = start
        self.end = end
        self.counts = counts

    @property
    def seconds(self) -> float | None:
        """Its duration, None until both stamps are resolved."""
        if self.start.at_s is None or self.end.at_s is None:
            return None
        return self.end.at_s - self.start.at_s


class StreamSampler:
    """Device stamps around the training stream's instructions while the sweep runs.

    The training thread calls :meth:`begin`/:meth:`end` around each instruction and
    :meth:`iteration_done` at each iteration's end. While :attr:`collecting`, it also keeps
    each iteration's span (:class:`IterationSpan`, one more stamp per iteration). Bounded: at
    most :data:`MAX_STREAM_SAMPLES` per kind and :data:`MAX_CALIBRATION_SPANS` spans.
    """

    __slots__ = (
        "_counts",
        "_mark",
        "_span_start",
        "_start",
        "collecting",
        "iterations",
        "samples",
        "spans",
    )

    def __init__(self, mark: Callable[[], Stamp]) -> None:
        self._mark = mark
        self._start: tuple[str, Stamp] | None = None
        self.samples: dict[str, list[tuple[Stamp, Stamp]]] = {}
        self.iterations = 0
        self.collecting = False
        """Whether iteration spans are kept (set by :class:`OnlineProfiling`)."""
        self.spans: list[IterationSpan] = []
        self._span_start: Stamp | None = None
        self._counts: dict[str, int] = {}

    def begin(self, kind: str) -> None:
        """An instruction of ``kind`` starts."""
        stamp = self._mark()
        self._start = (kind, stamp)
        if self.collecting:
            if self._span_start is None:
                self._span_start = stamp
            self._counts[kind] = self._counts.get(kind, 0) + 1

    def end(self) -> None:
        """The instruction begun last ends."""
        if self._start is not None:
            kind, start = self._start
            samples = self.samples.setdefault(kind, [])
            if len(samples) < MAX_STREAM_SAMPLES:
                samples.append((start, self._mark()))
            self._start = None

    def iteration_done(self) -> None:
        """An iteration under calibration ended."""
        self.iterations += 1
        start, self._span_start = self._span_start, None
        counts, self._counts = self._counts, {}
        if self.collecting and start is not None and len(self.spans) < MAX_CALIBRATION_SPANS:
            self.spans.append(IterationSpan(start, self._mark(), counts))
        if self.iterations == 1:
            # The first iteration under calibration still warms up (allocator, kernel
            # autotuning) and runs slower than the rest: its times would inflate the ratio.
            self.samples.clear()


class StreamEnergy:
    """The meter's energy over calibration spans, read on a thread of its own.

    The thread waits (up to ``timeout_s``) until the meter has read past the last span, then
    reads every span's energy from one copy of the reads. :attr:`done` is set when it has
    finished; then :attr:`window` holds the result, or :attr:`error` says why not.
    """

    def __init__(self, meter: EnergyMeter, spans: list[IterationSpan], timeout_s: float) -> None:
        self.window: StreamWindow | None = None
        self.error: str | None = None
        self.done = threading.Event()
        self._meter = meter
        self._spans = spans
        self._timeout_s = timeout_s
        self._thread = threading.Thread(target=self._run, name="perseus-calibration", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the thread (tests)."""
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            windows = [(s.start.at_s or 0.0, s.end.at_s or 0.0) for s in self._spans]
            deadline = time.monotonic() + self._timeout_s
            while (energies := self._meter.energies_between(windows)) is None:
                if self._meter.failed is not None:
                    self.error = f"the energy counter failed: {self._meter.failed}"
                    return
                if time.monotonic() > deadline:
                    self.error = "the meter did not read past the iterations"
                    return
                time.sleep(0.1)
            counts: dict[str, int] = {}
            for span in self._spans:
                for kind, n in span.counts.items():
                    counts[kind] = counts.get(kind, 0) + n
            other = set(counts) - set(_KINDS)
            if other:
                self.error = f"the iterations ran instructions the profile lacks: {sorted(other)}"
                return
            self.window = StreamWindow(
                iterations=len(windows),
                time_s=sum(end - start for start, end in windows),
                energy_j=sum(energies),
                forwards=counts.get("forward", 0),
                backwards=counts.get("backward", 0),
                backward_inputs=counts.get("backward_input", 0),
                backward_weights=counts.get("backward_weight", 0),
            )
        except Exception as err:  # never reaches training; the idle power is kept
            self.error = f"{type(err).__name__}: {err}"
        finally:
            self.done.set()
