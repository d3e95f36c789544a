"""A fake H200 for tests and CPU runs: clocks, power limit and an energy counter, in a model.

The model (:class:`FakeGpuModel`, :class:`FakeWork`, :func:`default_work`; its equations and
defaults) lives in :mod:`perseus.client.gpu.fake_model`, and the profiling probe
(:class:`SweepProbe`) in :mod:`perseus.client.gpu.fake_probe`; both are re-exported here.

``PERSEUS_FAKE_CLOCK_DELAY_S`` sets ``clock_change_delay_s`` for ``PERSEUS_GPU=fake`` (a rank's
:func:`~perseus.client.gpu.control.open_gpu`); the default stays a realistic 20 ms, so the fake
shows
what a clock change that is requested too late costs.

:class:`FakeGpu` implements :class:`~perseus.client.gpu.control.GpuControl` over that model, and is
its
own :class:`~perseus.client.gpu.control.WorkObserver` (``work_observer``): the rank brackets each
instruction with :meth:`FakeGpu.begin` and :meth:`FakeGpu.end`, never knowing it drives a
fake; ``end`` sleeps until the instruction's work is done. A lock or reset lands
``clock_change_delay_s`` after it is requested, also in the middle of a unit of work, and
changes the pace and power of the rest of that work, as on a real GPU: at clock ``f`` the work
progresses by ``elapsed / time_s(work, f)``, so a unit that runs ``a`` seconds at ``f1`` and
then the rest at ``f2`` takes ``a + (1 - a / time_s(f1)) * time_s(f2)`` and uses
``a * power_w(f1)`` plus the rest's time at ``power_w(f2)``. Requests land in the order they
were made. ``end`` returns the clock in effect at the midpoint of the unit's run (the clock
log's ``ran_mhz``). Energy is integrated lazily and exactly (power is piecewise constant: busy
power at the clock in effect inside a bracket, idle power outside; a bracket whose host work
outlasts the modelled work stays busy until ``end``), at every state change and read, with no
timer thread. The energy counter and the power reading move only at
counter ticks (multiples of ``counter_period_s`` since the fake was created), like NVML's:
``energy_j()`` returns the exact integral up to the last tick and sleeps ``read_cost_s``;
``power_w()`` returns an exponential moving average, updated at each tick with that tick's mean
power and factor ``1 - exp(-counter_period_s / power_time_constant_s)``.
``true_energy_j()`` is the exact integral up to now, the ground truth for tests.

What ran, in time: each finished unit is a :class:`FakeRun` (its work, when it started, when
its modelled work was done, the clocks it ran at), handed to the fake's ``trace`` callable,
and :func:`time_lost_s` says how much longer it took than at a given clock: a clock change
that landed late or early shows there as time, not only as the clock at the middle.
``PERSEUS_FAKE_TRACE`` names a folder: a fake created without ``trace`` then writes one JSON
line per unit to ``fake-rank<RANK>.jsonl`` there (``benchmarks/realized_saving.py`` reads them).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from perseus.client.gpu.fake_model import FakeGpuModel, FakeWork, default_work
from perseus.client.gpu.fake_probe import SweepProbe
from perseus.core.errors import GpuControlError
from perseus.core.settings import FAKE_TRACE

__all__ = [
    "FakeGpu",
    "FakeGpuModel",
    "FakeRun",
    "FakeWork",
    "SweepProbe",
    "default_work",
    "time_lost_s",
]

#: The last stretch of :meth:`FakeGpu.end`'s wait is spent spinning: ``time.sleep`` overshoots.
_SPIN_S = 0.0005
#: Work this close to its finish is done (float rounding of the piecewise progress).
_DONE_TOLERANCE_S = 1e-9
#: With no clock-change delay a request lands at once: :meth:`FakeGpu.end` looks this often.
_NO_DELAY_POLL_S = 0.001


_DEFAULT_MODEL = FakeGpuModel()


@dataclass(frozen=True, slots=True)
class FakeRun:
    """One unit of work as it ran on the fake.

    Attributes:
        kind: The work kind :meth:`FakeGpu.begin` was given.
        work: Its model.
        scale: Its scale.
        start_s: When it began.
        done_s: When its modelled work was done (earlier than ``end_s`` where the host work
            in the bracket took longer).
        end_s: When :meth:`FakeGpu.end` returned.
        clocks: ``(from_s, MHz)``: the clock it ran at from each time on, in order (the
            first from ``start_s``).
    """

    kind: str
    work: FakeWork
    scale: float
    start_s: float
    done_s: float
    end_s: float
    clocks: tuple[tuple[float, int], ...]

    def to_json(self) -> str:
        """One JSON line (no newline): kind, scale, times and clocks."""
        return json.dumps(
            {
                "kind": self.kind,
                "time_at_max_s": self.work.time_at_max_s,
                "power_at_max_w": self.work.power_at_max_w,
                "scale": self.scale,
                "start_s": self.start_s,
                "done_s": self.done_s,
                "end_s": self.end_s,
                "clocks": self.clocks,
            }
        )

    @classmethod
    def from_json(cls, line: str) -> FakeRun:
        """The run :meth:`to_json` wrote."""
        d = json.loads(line)
        return cls(
            kind=d["kind"],
            work=FakeWork(time_at_max_s=d["time_at_max_s"], power_at_max_w=d["power_at_max_w"]),
            scale=d["scale"],
            start_s=d["start_s"],
            done_s=d["done_s"],
            end_s=d["end_s"],
            clocks=tuple((float(at), int(f)) for at, f in d["clocks"]),
        )


def time_lost_s(model: FakeGpuModel, run: FakeRun, frequency_mhz: int | None) -> float:
    """How much longer ``run`` took than wholly at ``frequency_mhz`` (None: unlocked), in
    seconds: over the stretches it ran at a lower clock than a lock at ``frequency_mhz`` runs
    it (its power limit throttles a lock too), the time they took minus the time that clock
    would have taken for the same work. 0 where it never ran below; stretches above it (a
    raise early, a lowering late) cost energy, not time, and count nothing. O(clocks).
    """
    target = model.running_clock_mhz(run.work, frequency_mhz)
    target_s = model.time_s(run.work, target)
    lost = 0.0
    ends = [at for at, _ in run.clocks[1:]] + [run.done_s]
    for (at, f), until in zip(run.clocks, ends, strict=True):
        length = min(until, run.done_s) - max(at, run.start_s)
        if length > 0 and f < target:
            lost += length * (1.0 - target_s / model.time_s(run.work, f))
    return lost


class _JsonLines:
    """Appends each run to a JSON-lines file (``PERSEUS_FAKE_TRACE``), line-buffered."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", buffering=1, encoding="utf-8")

    def __call__(self, run: FakeRun) -> None:
        self._file.write(run.to_json() + "\n")


def _trace_from_env() -> Callable[[FakeRun], None] | None:
    folder = FAKE_TRACE.read(os.environ)
    if folder is None:
        return None
    rank = os.environ.get("RANK", "").strip() or f"pid{os.getpid()}"
    return _JsonLines(Path(folder) / f"fake-rank{rank}.jsonl")


@dataclass(slots=True)
class _Busy:
    """The unit of work running: how much of it is done, at which clocks it ran."""

    kind: str
    work: FakeWork
    scale: float
    start_s: float
    clock_mhz: int  # the clock it runs at now
    at_s: float  # progress is integrated up to here
    done: float = 0.0  # the share of the work done by at_s
    clocks: list[tuple[float, int]] = field(default_factory=list)  # (from, MHz), in order


class FakeGpu:
    """A fake GPU following :class:`FakeGpuModel`; implements ``GpuControl``.

    Thread-safe: the training thread calls :meth:`begin`/:meth:`end` while other threads read
    energy and power and lock clocks. Times come from ``clock`` (seconds, monotonic) and waits
    go through ``sleep``; tests inject both to run instantly and deterministically.

    Args:
        model: The GPU model.
        work: Work kinds by name (e.g. :func:`default_work`); :meth:`begin` takes one of them.
        index: The index the fake reports.
        clock: Monotonic clock in seconds.
        sleep: Sleeps the given seconds.
        trace: Called with each finished unit (:class:`FakeRun`) on the thread that ends it;
            None: ``PERSEUS_FAKE_TRACE``'s file where that names a folder, else nothing.

    Raises:
        ValueError: A work's power is below the model's idle power.
    """

    def __init__(
        self,
        model: FakeGpuModel = _DEFAULT_MODEL,
        work: Mapping[str, FakeWork] | None = None,
        *,
        index: int = 0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        trace: Callable[[FakeRun], None] | None = None,
    ) -> None:
        self._model = model
        self._trace = trace if trace is not None else _trace_from_env()
        self._work = self._checked(work if work is not None else {})
        self._index = index
        self._clock = clock
        self._sleep = sleep
        # Reentrant: a SIGTERM handler resets the clock from the main thread, which may be
        # inside begin()/end() holding the lock (a plain Lock deadlocks the rank's exit).
        self._lock = threading.RLock()
        now = clock()
        self._origin_s = now
        # Lock state: the lock in effect (None: unlocked) and requests not yet in effect.
        self._locked_mhz: int | None = None
        self._pending: deque[tuple[float, int | None]] = deque()
        self._busy: _Busy | None = None
        # Energy: exact integral up to _integrated_to_s at the constant _power_now_w.
        self._power_now_w = self._model.idle_power_w
        self._integrated_to_s = now
        self._energy_j = 0.0
        # Counter: ticks done, and the exact energy and smoothed power at the last tick.
        self._ticks = 0
        self._counter_j = 0.0
        self._smoothed_w = self._model.idle_power_w
        self._alpha = -math.expm1(-self._model.counter_period_s / self._model.power_time_constant_s)

    # GpuControl -------------------------------------------------------------------------------

    @property
    def index(self) -> int:
        """The index given at creation."""
        return self._index

    @property
    def name(self) -> str:
        """The model's name."""
        return self._model.name

    @property
    def can_set_clocks(self) -> bool:
        """Always True: the fake applies locks."""
        return True

    @property
    def work_observer(self) -> FakeGpu:
        """This fake: it models the work the rank brackets (see ``WorkObserver``)."""
        return self

    def place(self, stage: int, stages: int) -> None:
        """Model stage ``stage`` of ``stages``: :attr:`work` becomes :func:`default_work` of it."""
        self.work = default_work(stage, stages)

    @property
    def model(self) -> FakeGpuModel:
        """The model this fake follows."""
        return self._model

    @property
    def locked_clock_mhz(self) -> int | None:
        """The lock in effect now (requests still within their delay are not), or None."""
        with self._lock:
            self._advance(self._clock())
            return self._locked_mhz

    @property
    def work(self) -> Mapping[str, FakeWork]:
        """Work kinds by name; assign to replace them (work running now keeps its own)."""
        with self._lock:
            return MappingProxyType(self._work)

    @work.setter
    def work(self, work: Mapping[str, FakeWork]) -> None:
        checked = self._checked(work)
        with self._lock:
            self._work = checked

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """The model's clocks, descending."""
        return self._model.clocks_mhz

    def default_clock_mhz(self) -> int:
        """The highest supported clock."""
        return self._model.max_clock_mhz

    def current_clock_mhz(self) -> int:
        """The SM clock now: the clock the running work runs at this instant (the lock in
        effect, else its unlocked, possibly throttled clock; it changes mid-work when a lock
        lands), else the lock in effect, else the top clock."""
        with self._lock:
            self._advance(self._clock())
            if self._busy is not None:
                return self._busy.clock_mhz
            return self._locked_mhz if self._locked_mhz is not None else self._model.max_clock_mhz

    def applied_clock_mhz(self) -> int:
        """The lock in effect now, else the default (top) clock; what the controller polls."""
        with self._lock:
            self._advance(self._clock())
            return self._locked_mhz if self._locked_mhz is not None else self._model.max_clock_mhz

    def lock_clock(self, frequency_mhz: int) -> None:
        """Request a lock at ``frequency_mhz``; it takes effect after the model's delay.

        Raises:
            GpuControlError: ``frequency_mhz`` is not a supported clock.
        """
        clocks = self._model.clocks_mhz
        if isinstance(frequency_mhz, bool) or frequency_mhz not in clocks:
            raise GpuControlError(
                f"GPU {self._index}: {frequency_mhz!r} MHz is not a supported SM clock "
                f"(supported: {clocks[-1]}-{clocks[0]} MHz, {len(clocks)} clocks)"
            )
        self._request(int(frequency_mhz))

    def reset_clock(self) -> None:
        """Request removing the lock; it takes effect after the model's delay."""
        self._request(None)

    def energy_j(self) -> float:
        """The energy counter as of its last tick, in joules; takes ``read_cost_s``."""
        with self._lock:
            self._advance(self._clock())
            value = self._counter_j
        if self._model.read_cost_s > 0:
            self._sleep(self._model.read_cost_s)
        return value

    def power_w(self) -> float:
        """The smoothed power reading as of the last counter tick, in watts."""
        with self._lock:
            self._advance(self._clock())
            return self._smoothed_w

    # Work -------------------------------------------------------------------------------------

    def begin(self, kind: str, scale: float = 1.0) -> int:
        """Start one unit of ``kind`` (``scale`` times its modelled time) on the calling thread.

        The work starts at the clock in effect now: the lock, or else its unlocked (possibly
        throttled) clock. A lock or reset that takes effect while it runs changes the pace
        and power of the rest of it, as on a real GPU: at clock ``f`` it progresses by
        ``elapsed / time_s(work, f)`` (times ``1 / scale``).

        Returns:
            The clock the unit starts at, in MHz.

        Raises:
            GpuControlError: ``kind`` is unknown, ``scale`` is not positive, or work is running.
        """
        if not (math.isfinite(scale) and scale > 0):
            raise GpuControlError(f"GPU {self._index}: work scale must be > 0, got {scale}")
        with self._lock:
            work = self._work.get(kind)
            if work is None:
                raise GpuControlError(
                    f"GPU {self._index}: unknown work {kind!r} (known: {sorted(self._work)})"
                )
            if self._busy is not None:
                raise GpuControlError(f"GPU {self._index}: begin({kind!r}) while work is running")
            now = self._clock()
            self._advance(now)
            f = self._clock_for(work)
            self._busy = _Busy(kind, work, scale, now, f, now, clocks=[(now, f)])
            self._power_now_w = self._model.power_w(work, f)
            return f

    def end(self) -> int:
        """Finish the running work: sleep until it is done, given the locks that take effect
        meanwhile; the clock it ran at in the middle of its run.

        Requests pending when it looks land at known times, so it computes the finish from
        them; a request made while it sleeps lands at least ``clock_change_delay_s`` later,
        so it looks again at most that often (every millisecond with no delay). If the host
        work in between already took longer, it does not sleep; the work then stays busy
        (at the clock in effect) until this call. The last ``0.5 ms`` is spun rather than
        slept, for precision.

        Returns:
            The clock in effect at the midpoint of the run (from :meth:`begin` to the end of
            this call's wait), exactly from the lock timeline, in MHz.

        Raises:
            GpuControlError: No work is running.
        """
        delay = self._model.clock_change_delay_s
        while True:
            with self._lock:
                busy = self._busy
                if busy is None:
                    raise GpuControlError(f"GPU {self._index}: end() without begin()")
                now = self._clock()
                self._advance(now)
                finish = self._finish_s(busy)
                if finish - now <= _DONE_TOLERANCE_S:
                    self._busy = None
                    self._power_now_w = self._model.idle_power_w
                    middle = 0.5 * (busy.start_s + now)
                    ran = busy.clocks[0][1]
                    for at, f in busy.clocks:
                        if at > middle:
                            break
                        ran = f
                    done_s = min(finish, now)
                    break
                check = min(finish, now + (delay if delay > 0 else _NO_DELAY_POLL_S))
            self._wait_until(check)
        if self._trace is not None:  # only then is the run built (end is the training thread's)
            self._trace(FakeRun(busy.kind, busy.work, busy.scale, busy.start_s, done_s, now,
                                tuple(busy.clocks)))  # fmt: skip
        return ran

    @contextmanager
    def working(self, kind: str, scale: float = 1.0) -> Iterator[None]:
        """:meth:`begin` and :meth:`end` around the host work of the ``with`` block."""
        self.begin(kind, scale)
        try:
            yield
        finally:
            self.end()

    def run(self, kind: str, scale: float = 1.0) -> None:
        """Run one unit of ``kind`` with no host work: :meth:`begin` then :meth:`end`."""
        self.begin(kind, scale)
        self.end()

    def true_energy_j(self) -> float:
        """The exact energy since creation up to now, in joules, at no read cost."""
        with self._lock:
            self._advance(self._clock())
            return self._energy_j

    # Internals (callers hold self._lock where noted) -------------------------------------------

    def _checked(self, work: Mapping[str, FakeWork]) -> dict[str, FakeWork]:
        for w in work.values():
            self._model.power_w(w, self._model.max_clock_mhz)  # raises on a bad work
        return dict(work)

    def _request(self, locked_mhz: int | None) -> None:
        with self._lock:
            now = self._clock()
            self._advance(now)
            self._pending.append((now + self._model.clock_change_delay_s, locked_mhz))
            self._advance(now)  # a zero delay takes effect at once

    def _clock_for(self, work: FakeWork) -> int:
        """The clock ``work`` runs at under the lock in effect (holds the lock)."""
        return self._model.running_clock_mhz(work, self._locked_mhz)

    def _finish_s(self, busy: _Busy) -> float:
        """When the running work will be done, given the requests pending (holds the lock).

        Complexity: O(pending requests).
        """
        at, done, f = busy.at_s, busy.done, busy.clock_mhz
        for land_s, mhz in self._pending:
            length = busy.scale * self._model.time_s(busy.work, f)
            finish = at + (1.0 - done) * length
            if finish <= land_s:
                return finish
            done += (land_s - at) / length
            at = land_s
            f = self._model.running_clock_mhz(busy.work, mhz)
        return at + (1.0 - done) * busy.scale * self._model.time_s(busy.work, f)

    def _advance(self, now: float) -> None:
        """Put the requests due by ``now`` into effect at the times they land, integrating
        energy and work progress piecewise in between (holds the lock)."""
        pending = self._pending
        while pending and pending[0][0] <= now:
            land_s, locked = pending.popleft()
            self._integrate(land_s)
            self._locked_mhz = locked
            busy = self._busy
            if busy is not None:
                f = self._clock_for(busy.work)
                if f != busy.clock_mhz:
                    busy.clock_mhz = f
                    busy.clocks.append((max(land_s, busy.start_s), f))
                    self._power_now_w = self._model.power_w(busy.work, f)
        self._integrate(now)

    def _integrate(self, now: float) -> None:
        """Integrate energy, run counter ticks and progress the running work up to ``now``
        (holds the lock).

        Power is constant since ``_integrated_to_s``, so the ticks in between are closed-form:
        the first may mix the previous power with this one, the rest see only this one.
        """
        busy = self._busy
        if busy is not None and now > busy.at_s:
            busy.done += (now - busy.at_s) / (
                busy.scale * self._model.time_s(busy.work, busy.clock_mhz)
            )
            busy.at_s = now
        if now <= self._integrated_to_s:
            return
        period = self._model.counter_period_s
        power = self._power_now_w
        ticks_now = math.floor((now - self._origin_s) / period)
        if ticks_now > self._ticks:
            first_tick_s = self._origin_s + (self._ticks + 1) * period
            energy_at_first = self._energy_j + power * (first_tick_s - self._integrated_to_s)
            mean_w = (energy_at_first - self._counter_j) / period
            self._smoothed_w += self._alpha * (mean_w - self._smoothed_w)
            rest = ticks_now - self._ticks - 1
            self._smoothed_w = power + (self._smoothed_w - power) * (1.0 - self._alpha) ** rest
            self._counter_j = energy_at_first + power * period * rest
            self._ticks = ticks_now
        self._energy_j += power * (now - self._integrated_to_s)
        self._integrated_to_s = now

    def _wait_until(self, deadline_s: float) -> None:
        """Sleep, then spin the last ``_SPIN_S``, until ``clock() >= deadline_s``.

        A spin step that sees the clock stand still (an injected clock that only moves on
        sleep) sleeps the remainder instead, so fake clocks cannot hang it.
        """
        remaining = deadline_s - self._clock()
        if remaining > _SPIN_S:
            self._sleep(remaining - _SPIN_S)
        last = self._clock()
        while last < deadline_s:
            now = self._clock()
            if now == last:
                self._sleep(deadline_s - now)
                return
            last = now
