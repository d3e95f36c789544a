"""A profiling workload on a :class:`~perseus.client.gpu.fake.FakeGpu` that records the fake's
ground
truth (:class:`SweepProbe`), for the profiler's tests and ``benchmarks/profiler_accuracy.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["ProbedGpu", "SweepProbe"]


class ProbedGpu(Protocol):
    """What the probe uses of a :class:`~perseus.client.gpu.fake.FakeGpu` (a protocol, so this
    module needs nothing of the fake's: the fake re-exports the probe)."""

    def begin(self, kind: str) -> object: ...

    def end(self) -> object: ...

    def true_energy_j(self) -> float: ...


@dataclass
class SweepProbe:
    """A profiling workload on a :class:`FakeGpu` that records what the fake really did.

    Pass it to ``ClockSweep`` as both the workload and the bracket (``probe.work``); then
    :meth:`realized` gives the ground truth the sweep's measurements are checked against (the
    profiler's tests and ``benchmarks/profiler_accuracy.py``).

    ClockSweep synchronizes three times per loop (start, end of settling, end) and runs two
    loops per clock, so sync ``6c + 1`` to ``6c + 2`` is the forward loop's window of the c-th
    clock and ``6c + 4`` to ``6c + 5`` the forward+backward loop's. With ``splits_backward`` (a
    zero-bubble schedule) it runs a third loop, forward+backward_input, and a clock spans nine
    synchronizations.
    """

    gpu: ProbedGpu
    splits_backward: bool = False
    syncs: list[tuple[float, float]] = field(default_factory=list)  # (time, exact energy)
    brackets: list[tuple[int, str, float]] = field(default_factory=list)  # (sync no, kind, s)

    def forward(self) -> object:
        return None

    def backward(self, handle: object) -> None:
        pass

    def backward_input(self, handle: object) -> None:
        pass

    def synchronize(self) -> None:
        self.syncs.append((time.perf_counter(), self.gpu.true_energy_j()))

    def work(self, kind: str) -> AbstractContextManager[object]:
        return self._work(kind)

    @contextmanager
    def _work(self, kind: str) -> Iterator[None]:
        start = time.perf_counter()
        self.gpu.begin(kind)
        try:
            yield
        finally:
            self.gpu.end()
            self.brackets.append((len(self.syncs), kind, time.perf_counter() - start))

    def realized(self, c: int) -> dict[str, float]:
        """What the fake really did at the c-th clock: per-instruction time and energy
        (``t_i``/``e_i``, the input half of the backward, with ``splits_backward``).

        Times are the mean bracket durations (the fake's sleeps overshoot on a loaded host and
        it counts the overshoot as busy time); energies are the fake's exact integral over each
        loop's window divided by the loop's runs.
        """

        def mean(sync_no: int, kind: str) -> float:
            d = [s for n, k, s in self.brackets if n == sync_no and k == kind]
            return sum(d) / len(d)

        def energy(sync_no: int, kind: str) -> float:
            runs = sum(1 for n, k, _ in self.brackets if n == sync_no and k == kind)
            return (self.syncs[sync_no][1] - self.syncs[sync_no - 1][1]) / runs

        def gap(sync_no: int, kinds: tuple[str, ...]) -> float:
            # Host time per loop body outside the fake's brackets (Python between bodies, a
            # busy host descheduling the thread): a GPU's queue hides it, the fake cannot.
            runs = sum(1 for n, k, _ in self.brackets if n == sync_no and k == kinds[0])
            wall = self.syncs[sync_no][0] - self.syncs[sync_no - 1][0]
            inside = sum(mean(sync_no, k) for k in kinds)
            return max(0.0, wall / runs - inside)

        base = (9 if self.splits_backward else 6) * c
        f_window, fb_window = base + 2, base + 5  # brackets seen before these syncs
        t_f = mean(f_window, "forward")
        e_f = energy(f_window, "forward")
        realized = {
            "t_f": t_f,
            "e_f": e_f,
            "t_b": mean(fb_window, "forward") + mean(fb_window, "backward") - t_f,
            "e_b": energy(fb_window, "backward") - e_f,
            "gap_f": gap(f_window, ("forward",)),
            "gap_fb": gap(fb_window, ("forward", "backward")),
        }
        if self.splits_backward:
            fi_window = base + 8
            realized["t_i"] = mean(fi_window, "forward") + mean(fi_window, "backward_input") - t_f
            realized["e_i"] = energy(fi_window, "backward_input") - e_f
            realized["gap_fi"] = gap(fi_window, ("forward", "backward_input"))
        return realized
