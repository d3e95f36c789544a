"""Which clocks a profiling sweep measures, and in what order: a pure decision, no GPU.

A plan runs an instruction only at a clock the sweep measured (the solver interpolates
nothing), so the sweep must measure the clocks plans choose, and only those. Where they lie:

- the fastest clock of each instruction (the critical path at the fastest plan's time): the
  top clock, or lower on a GPU held at its power limit, where a lower lock may run faster;
- between it and the least-energy clock, where instructions off the critical path use their
  slack: each takes the slowest measured clock that fits, so the grid's spacing is energy
  lost (every 4th H200 clock lost up to 0.6 % at 1.01x the fastest time, every 2nd 0.2 %);
- around the least energy, where the curve bends and a plan slows what has slack to spare;
  below it every clock is slower and costlier, useful only for the blocking power it saves.

So the default sweep (``PERSEUS_PROFILE_CLOCKS=auto``: :class:`SweepOrder` with ``stride``
:data:`STRIDE`) measures coarse first, then finer where plans go::

    coarse  every 4th clock from the top (60 MHz on a 15 MHz grid), down until the energy of
            a microbatch rose at 2 coarse clocks in a row (as far below the least energy as
            the full sweep's 5 clocks, in steps large enough to rise above the noise), once
            some clock used 3 % less than the top one (DESCENT), or to the lowest clock
    fine    every 2nd clock from the fastest coarse clock down to the one below the
            least-energy coarse clock, and every clock next to those bends

On an H200's 110 clocks (1980-345 MHz) with the least energy near 1200 MHz that is 33 clocks
(the full sweep: 58 where its own early stop works; all 110 where noise keeps breaking its
chain of five rises, as on a fake GPU beside other work). Plans on them stay within 0.3 %
energy of plans on every clock at 1, 1.01 and 1.05 times the fastest plan's time
(``benchmarks/sweep_reduction.py`` prints it for the shipped, synthetic and shared profiles).

The other settings measure a list in order, high to low, stopping once energy rose at
``rising_stop`` clocks in a row (``all``, ``every:N``, ``1980,1500``): ``stride`` 1, no fine
pass, as the sweep always did.

Ranks choose their fine clocks from their own measurements, so two ranks of one stage (data-
or tensor-parallel peers) may refine around neighbouring clocks; the planner keeps the clocks
every rank of a stage measured (``perseus.server.planning.stage_profiles``): the coarse grid
and the every-2nd fill are the same on every GPU of a kind, the clocks next to the bends may
not be.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

__all__ = ["AUTO", "DESCENT", "STRIDE", "SweepOrder"]

AUTO = "auto"
"""The setting (``PERSEUS_PROFILE_CLOCKS``, ``perseus profile --clocks``) of the coarse-then-fine
sweep."""

STRIDE = 4
"""Clocks of the supported grid between two coarse clocks of the ``auto`` sweep."""

DESCENT = 0.03
"""The coarse pass counts rising energy only once some clock used this share less energy than
the top clock: a GPU held at its power limit may use a little more energy at each of its top
clocks (an A40 for 20 clocks) before it falls."""


_MAX_KINDS = 4
"""Kinds of instruction a sweep times at most: forward, backward and the backward's halves."""


class SweepOrder:
    """The next clock to measure, given what the sweep measured so far.

    Args:
        clocks: The candidate clocks, strictly descending (``ProfileBudget.select``'s).
        rising_stop: Stop after the energy of a microbatch rose at this many clocks of the grid
            in a row (coarse clocks: ``ceil(rising_stop / stride)`` of them).
        stride: 1: measure ``clocks`` in order. More: coarse then fine (the module docstring).

    Raises:
        ValueError: No clocks, clocks not strictly descending, or a stride or stop below 1.
    """

    def __init__(self, clocks: Sequence[int], *, rising_stop: int, stride: int = 1) -> None:
        if not clocks or any(a <= b for a, b in itertools.pairwise(clocks)):
            raise ValueError(f"clocks must be non-empty and strictly descending, got {clocks}")
        if stride < 1 or rising_stop < 1:
            raise ValueError(f"stride and rising_stop must be >= 1, got {stride}, {rising_stop}")
        self.clocks = tuple(clocks)
        self.stride = stride
        """1: the clocks in order; more: coarse then fine."""
        self._rising_stop = math.ceil(rising_stop / stride)
        # the coarse pass, high to low; the fine pass is queued once it is over
        self._queue = list(self.clocks[::stride])
        self._energy: dict[int, float] = {}
        self._times: dict[int, tuple[float, ...]] = {}
        self._last: float | None = None
        self._rising = 0
        self._coarse = True  # stride 1: the whole sweep is its coarse pass
        self._why: str | None = None
        self.stopped: str | None = None
        """Why the sweep is over (None while it is not)."""

    @property
    def done(self) -> bool:
        """True once there is nothing left to measure."""
        return self.stopped is not None

    @property
    def measured(self) -> tuple[int, ...]:
        """The clocks measured so far, in the order they were."""
        return tuple(self._energy)

    @property
    def done_clocks(self) -> int:
        """Clocks measured so far."""
        return len(self._energy)

    @property
    def planned_clocks(self) -> int:
        """Clocks measured plus those the sweep still means to measure as things stand.

        While the coarse pass runs, an upper bound (at most every clock): its clocks down to
        the lowest, plus the
        most its fine pass could add (the every-2nd fill over all of them, and the clocks next
        to each bend: the least energy and each kind's fastest clock); it shrinks once energy
        rises and the fine pass is known. Then the exact count.
        """
        coarse = self.done_clocks + len(self._queue)
        if not self._coarse or self.stride == 1:
            return coarse
        half = self.stride // 2
        fill = coarse * (self.stride // max(1, half) - 1)
        kinds = len(next(iter(self._times.values()))) if self._times else _MAX_KINDS
        return min(len(self.clocks), coarse + fill + (1 + kinds) * 2 * half)

    def next_clock(self) -> int | None:
        """The clock to measure next; None once the sweep is over."""
        return None if self.done else self._queue[0]

    def record(self, frequency_mhz: int, energy_j: float, times_s: Sequence[float]) -> None:
        """What the measurement of :meth:`next_clock` gave: the energy of one microbatch (a
        forward and its backward), in joules, and the time of each kind of instruction
        measured (forward, backward, ...; the same kinds in the same order at every clock).

        Raises:
            ValueError: ``frequency_mhz`` is not the clock :meth:`next_clock` named.
        """
        if self.done or frequency_mhz != self._queue[0]:
            raise ValueError(f"{frequency_mhz} MHz is not the clock to measure next")
        self._queue.pop(0)
        self._energy[frequency_mhz] = energy_j
        self._times[frequency_mhz] = tuple(times_s)
        if self._coarse:
            rose = self._last is not None and energy_j > self._last and self._descended()
            self._rising = self._rising + 1 if rose else 0
            self._last = energy_j
            if self._rising >= self._rising_stop:
                self._queue.clear()
                self._why = (
                    f"energy rose at {self._rising} clocks in a row (down to {frequency_mhz} MHz)"
                )
            if not self._queue:
                self._coarse = False
                self._queue = self._fine() if self.stride > 1 else []
        if not self._queue:
            self.stopped = self._summary()

    def _descended(self) -> bool:
        """Whether energy fell by :data:`DESCENT` from the top clock's at some clock (always
        true with stride 1, which stops as it always did)."""
        if self.stride == 1:
            return True
        top = self._energy[self.clocks[0]]
        return min(self._energy.values()) < (1 - DESCENT) * top

    def _fine(self) -> list[int]:
        """The fine pass (see the module docstring), high to low, without what was measured."""
        index = {f: i for i, f in enumerate(self.clocks)}
        coarse = list(self._energy)
        least = index[min(coarse, key=lambda f: (self._energy[f], -f))]
        kinds = len(self._times[coarse[0]])
        fastest = [index[min(coarse, key=lambda f: (self._times[f][k], -f))] for k in range(kinds)]
        half = self.stride // 2
        wanted = set(range(min(fastest), least + self.stride + 1, max(1, half)))
        for bend in (least, *fastest):
            wanted.update(range(bend - half, bend + half + 1))
        return [
            self.clocks[i]
            for i in sorted(wanted)
            if 0 <= i < len(self.clocks) and self.clocks[i] not in self._energy
        ]

    def _summary(self) -> str:
        measured = len(self._energy)
        if self.stride == 1:
            return self._why or f"all {measured} clocks measured"
        return (
            f"{measured} of {len(self.clocks)} clocks measured, coarse then fine ("
            + (self._why or "the coarse pass reached the lowest clock")
            + ")"
        )
