"""The clock-change latency estimate and the aim arithmetic of the clock controller.

What an iteration follows, how its start-to-start intervals are predicted and when each
clock change is due (see :mod:`perseus.client.clocks.controller` for the rule); the controller
thread (:class:`~perseus.client.clocks.controller.ClockController`) measures, issues and reads.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

from perseus.client.state import ActivePlan
from perseus.core.defaults import CLOCK_CHANGE_MARGIN_S

__all__ = ["LatencyEstimate"]


class LatencyEstimate:
    """A robust estimate of the time from a clock request to the clock in effect.

    Keeps the last ``window`` samples; the estimate for raises (:attr:`value_s`) is their
    ``quantile`` (the median by default: the margin a raise is aimed ahead of its boundary
    covers the spread, and a higher quantile would land raises early, costing energy and the
    lower-clocked instruction its clock); until ``min_samples`` are in, the largest sample
    (every sample lies past the true latency: a read shows a change only once it landed), and
    ``initial_s`` before the first. Where changes follow each other faster than twice the
    latency, only the first changes of a plan can be measured.
    Lowerings, which must not land early, use :attr:`low_s`. O(window log window) per
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
        quantile: float = 0.5,
        min_samples: int = 3,
    ) -> None:
        self._initial_s = initial_s
        self._samples: collections.deque[float] = collections.deque(maxlen=window)
        self._quantile = quantile
        self._min = min_samples
        self.value_s = initial_s
        """The estimate raises are aimed with (a change requested this early lands in time)."""
        self.low_s = initial_s
        """The estimate lowerings are aimed with: the shortest sample (every sample lies past
        the true latency, by up to one read interval), so a lowering errs late, never early;
        ``initial_s`` until the first sample."""

    @property
    def settled(self) -> bool:
        """Whether the window is full (further samples only track drift)."""
        return len(self._samples) == self._samples.maxlen

    @property
    def measured_s(self) -> float | None:
        """The estimate once ``min_samples`` are in (what the rank reports to its planner);
        None before: the latency is still assumed, or a few samples' largest."""
        return self.value_s if len(self._samples) >= self._min else None

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
            self.low_s = ordered[0]
        else:
            self.value_s = ordered[-1]
            self.low_s = ordered[0]


@dataclass(frozen=True, slots=True)
class _Iteration:
    """An iteration starts: what it runs and what the next one runs."""

    clocks: tuple[int | None, ...]  # per position; None: the default clock
    times_s: tuple[float | None, ...]  # the plan's expected durations (None: unknown)
    version: int | None
    margin_s: float
    following: _Iteration | None  # the next iteration (assumed to repeat after)
    generation: int


def _iteration(
    plan: ActivePlan | None, count: int, following: _Iteration | None, generation: int
) -> _Iteration:
    if plan is None:
        n = max(count, 0)
        margin = following.margin_s if following is not None else CLOCK_CHANGE_MARGIN_S
        return _Iteration((None,) * n, (None,) * n, None, margin, following, generation)
    return _Iteration(
        tuple(plan.frequencies_mhz),
        tuple(plan.times_s) if plan.times_s else (None,) * len(plan.keys),
        plan.version,
        plan.margin_s,
        following,
        generation,
    )


@dataclass(slots=True)
class _Change:
    target_mhz: int | None
    due_s: float
    generation: int


_INTERVALS_KEPT = 5
"""Start-to-start intervals kept per plan position."""


def _run_time(high_s: float | None, time_s: float | None, margin_s: float) -> float | None:
    """A late estimate of how long an instruction runs before its lowering may land.

    Its start-to-start interval (``high_s``) includes any wait before the next instruction
    (a receive from the neighbouring stage), whose length varies from iteration to
    iteration; the instruction itself runs its plan time (``time_s``). A lowering aimed past
    the plan time plus the margin lands after the instruction ends (it runs its own clock)
    and, where a wait follows, during the wait, instead of past the longest wait seen.
    """
    if high_s is None:
        return time_s
    if time_s is None:
        return high_s
    return min(high_s, time_s + margin_s)


class _Aiming:
    """The controller thread's prediction and aiming (a base of ``ClockController``)."""

    _iteration: _Iteration | None
    _base: int
    _intervals: dict[tuple[int | None, int], collections.deque[float]]
    _default_mhz: int
    _pending: dict[int, _Change]
    _issued_upto: int
    _requested: int | None
    latency: LatencyEstimate
    late: int

    def _forget(self, item: _Iteration) -> None:
        """Keep measured intervals only of the plans in use."""
        keep = {item.version, item.following.version if item.following else None}
        for key in [k for k in self._intervals if k[0] not in keep]:
            del self._intervals[key]

    # Prediction -------------------------------------------------------------------------------

    def _at(self, g: int) -> tuple[int | None, float | None, tuple[int | None, int]] | None:
        """Instruction ``g`` (global index): its clock, plan time and interval key; None where
        nothing is known."""
        it = self._iteration
        if it is None:
            return None
        p = g - self._base
        if p < 0:
            return None
        n = len(it.clocks)
        if p >= n:
            it = it.following
            if it is None or not it.clocks:
                return None
            p = (p - n) % len(it.clocks)
        return it.clocks[p], it.times_s[p], (it.version, p)

    def _mhz(self, frequency_mhz: int | None) -> int:
        return self._default_mhz if frequency_mhz is None else frequency_mhz

    def _low(self, key: tuple[int | None, int], time_s: float | None) -> float | None:
        """A low estimate of a position's start-to-start interval (raises err early): the
        shortest measured, never shorter than the plan's time (a change that landed early
        shortens an instruction; predicting from that would make the next land earlier)."""
        measured = self._intervals.get(key)
        if measured:
            return min(measured) if time_s is None else max(time_s, min(measured))
        return time_s

    def _high(self, key: tuple[int | None, int], time_s: float | None) -> float | None:
        """A high estimate of it (lowerings err late); None until measured."""
        measured = self._intervals.get(key)
        if not measured:
            return None
        ordered = sorted(measured)
        high = ordered[-2] if len(ordered) >= 3 else ordered[-1]
        return high if time_s is None else max(high, time_s)

    def _check(self, g: int, frequency_mhz: int | None, start_s: float, gen: int) -> None:
        """Make sure ``g`` gets its clock: a change nothing aimed ahead is requested now."""
        if self._issued_upto >= g:
            return  # a later change went out already: the clock is past g's
        prior = [b for b in self._pending if b <= g - 1]
        heading = self._pending[max(prior)].target_mhz if prior else self._requested
        change = self._pending.get(g - 1)
        if heading != frequency_mhz:
            self._pending[g - 1] = _Change(frequency_mhz, start_s, gen)
            self.late += 1
        elif (
            change is not None
            and change.due_s > start_s
            and self._mhz(frequency_mhz) > self._mhz(self._at_clock(g - 1, frequency_mhz))
        ):
            change.due_s = start_s  # a raise not out yet: late, out now
            self.late += 1

    def _at_clock(self, g: int, otherwise: int | None) -> int | None:
        here = self._at(g)
        return otherwise if here is None else here[0]

    def _place(self, i: int, j: int, change: _Change, next_start_s: float) -> None:
        """Schedule boundary ``i``'s change aimed from start ``j``; from ``j < i``, only if it
        is due before ``j + 1``'s predicted start (``next_start_s``). Otherwise that start
        aims it again from what it measures, so that a change aimed across a wait that
        turns out longer than predicted is not issued early (a raise a whole instruction
        early, or a lowering in the middle of the instruction before)."""
        if i > j and change.due_s >= next_start_s:
            self._pending.pop(i, None)
        else:
            self._pending[i] = change

    def _aim(self, j: int, start_s: float, margin_s: float, gen: int) -> None:
        """Schedule the changes this start is the latest anchor for (see the module)."""
        latency = self.latency.value_s
        latency_low = self.latency.low_s
        low_acc = 0.0  # predicted start of i - start_j, low
        high_acc: float | None = 0.0  # ... high (None: not measured)
        first_low = 0.0
        here = self._at(j)
        limit = j + 512
        i = j
        while here is not None and i < limit:
            after = self._at(i + 1)
            if after is None:
                break
            clock_i, time_i, key_i = here
            low_i = self._low(key_i, time_i)
            high_i = self._high(key_i, time_i)
            if i > self._issued_upto:
                target = after[0]
                if target == clock_i:
                    self._pending.pop(i, None)
                elif self._mhz(target) > self._mhz(clock_i):  # a raise
                    if low_i is not None:
                        due = start_s + low_acc + low_i - margin_s - latency
                        self._place(
                            i, j, _Change(target, max(due, start_s), gen), start_s + first_low
                        )
                    elif i == j:
                        self._pending[i] = _Change(target, start_s, gen)
                else:  # a lowering
                    own = _run_time(high_i, time_i, margin_s)
                    if i == j:
                        due = start_s if own is None else start_s + own + margin_s - latency_low
                        self._pending[i] = _Change(target, max(due, start_s), gen)
                    elif high_acc is not None and own is not None:
                        due = start_s + high_acc + own + margin_s - latency_low
                        self._place(
                            i, j, _Change(target, max(due, start_s), gen), start_s + first_low
                        )
            if low_i is None:
                break
            if i == j:
                first_low = low_i
            elif low_acc - first_low > latency + margin_s:
                break  # later starts anchor the changes from here on
            low_acc += low_i
            high_acc = None if high_acc is None or high_i is None else high_acc + high_i
            i += 1
            here = after
