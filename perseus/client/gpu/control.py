"""GPU control on the rank: one protocol, a real NVML implementation, a dry run and a fake.

The rest of the client talks to a GPU only through :class:`GpuControl`. :func:`open_gpu` picks
the implementation from ``PERSEUS_GPU``:

- ``nvml``: :class:`NvmlGpu` reads and sets the GPU through NVML (the ``nvidia-ml-py`` package,
  module ``pynvml``; the PyPI package named ``pynvml`` is a different one). Setting clocks
  needs root or ``CAP_SYS_ADMIN``.
- ``dry-run``: :class:`DryRunGpu` reads the real GPU but only logs the clocks it would set; for
  machines where clocks may not or must not change (shared machines, no root).
- ``zeusd``: :class:`~perseus.client.gpu.zeusd.ZeusdGpu` sets clocks through zeusd, Zeus's
  privileged daemon, and reads the GPU through NVML: clocks without root. Where zeusd is comes
  from Zeus's variables (``ZEUSD_SOCK_PATH``, ``ZEUSD_HOST_PORT``, ``ZEUSD_TOKEN``).
- ``fake``: :class:`~perseus.client.gpu.fake.FakeGpu`, a modelled H200 for tests and CPU runs.
  :func:`open_gpu` is the one place that imports it (lazily): the rest of the client knows a
  simulated GPU only through the optional :class:`WorkObserver` it offers.

The NVML implementations, their one table of NVML errors and the unit conversions (NVML
hands out millijoules and milliwatts; the protocol speaks joules and watts) are in
:mod:`perseus.client.gpu.nvml`; their names are re-exported here.

GPU indices are NVML's (the order of ``nvidia-smi``), which ``CUDA_VISIBLE_DEVICES`` does not
renumber.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from perseus.client.gpu.nvml import DryRunGpu, NvmlGpu, reset_clocks, validate_clock_mhz
from perseus.core.errors import GpuControlError

if TYPE_CHECKING:
    from perseus.client.gpu.fake import FakeWork

__all__ = [
    "DryRunGpu",
    "GpuControl",
    "GpuMode",
    "NvmlGpu",
    "WorkObserver",
    "open_gpu",
    "reset_clocks",
    "validate_clock_mhz",
    "work_observer",
]

GpuMode = Literal["nvml", "dry-run", "fake", "zeusd"]


@runtime_checkable
class GpuControl(Protocol):
    """What the client needs from one GPU: its clocks, a clock lock, energy and power."""

    @property
    def index(self) -> int:
        """The GPU's NVML index."""
        ...

    @property
    def name(self) -> str:
        """The GPU's product name."""
        ...

    @property
    def can_set_clocks(self) -> bool:
        """Whether :meth:`lock_clock` changes the GPU (False in a dry run)."""
        ...

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """SM clocks supported at the highest memory clock, descending, no duplicates."""
        ...

    def default_clock_mhz(self) -> int:
        """The clock the GPU runs unlocked: the highest supported SM clock."""
        ...

    def current_clock_mhz(self) -> int:
        """The SM clock now."""
        ...

    def applied_clock_mhz(self) -> int:
        """The SM clock in effect now, cheaply (the controller polls it after each change).

        Through NVML the SM clock reading (about 1 us); on the fake, its lock in effect, else
        its default clock.
        """
        ...

    def lock_clock(self, frequency_mhz: int) -> None:
        """Lock the SM clock to exactly ``frequency_mhz`` (minimum = maximum)."""
        ...

    def reset_clock(self) -> None:
        """Remove the SM clock lock (the GPU's default behaviour)."""
        ...

    def energy_j(self) -> float:
        """The GPU's cumulative energy counter, in joules."""
        ...

    def power_w(self) -> float:
        """The GPU's power reading, in watts."""
        ...


@runtime_checkable
class WorkObserver(Protocol):
    """Sees each unit of work the rank runs: how a GPU simulated on the host models it.

    A GPU object may offer one as an optional ``work_observer`` attribute (the fake GPU does,
    NVML does not); the client looks it up with :func:`work_observer`, never by the GPU's
    type. The simulated work runs on the thread that calls :meth:`end`, so the rank sets
    the start of an instruction on such a GPU at the host call (there is no device stream to
    mark).
    """

    def begin(self, kind: str, scale: float = 1.0) -> int | None:
        """One unit of ``kind`` (``"forward"``, ``"backward"``) starts, ``scale`` times its size.

        Returns the clock the unit starts at, in MHz, if the simulation knows it.
        """
        ...

    def end(self) -> int | None:
        """The unit begun last ends (the simulation may wait until its work is done).

        Returns the clock in effect at the midpoint of the unit's run, in MHz, if the
        simulation knows it: the clock log records it as the clock the instruction ran at
        (``ran_mhz``).
        """
        ...

    def working(self, kind: str, scale: float = 1.0) -> AbstractContextManager[object]:
        """:meth:`begin` and :meth:`end` around a ``with`` block (the profiling loops)."""
        ...

    def place(self, stage: int, stages: int) -> None:
        """The rank's pipeline position became known: model stage ``stage`` of ``stages``."""
        ...


def work_observer(gpu: GpuControl) -> WorkObserver | None:
    """The GPU's optional :class:`WorkObserver`, or None (a real GPU needs none)."""
    observer: WorkObserver | None = getattr(gpu, "work_observer", None)
    return observer


# Entry points ---------------------------------------------------------------------------------


def open_gpu(
    mode: GpuMode,
    index: int,
    *,
    fake_work: Mapping[str, FakeWork] | None = None,
    fake_clock_delay_s: float | None = None,
    environ: Mapping[str, str] | None = None,
    reader: GpuControl | None = None,
) -> GpuControl:
    """Open GPU ``index`` in the given mode (the value of ``PERSEUS_GPU``).

    Args:
        mode: ``"nvml"`` (:class:`NvmlGpu`), ``"dry-run"`` (:class:`DryRunGpu`), ``"fake"``
            (:class:`~perseus.client.gpu.fake.FakeGpu` with the default model) or ``"zeusd"``
            (:class:`~perseus.client.gpu.zeusd.ZeusdGpu`).
        index: NVML index of the GPU (reported as is by the fake).
        fake_work: The fake's work kinds; defaults to ``default_work(0, 1)``. Ignored otherwise.
        fake_clock_delay_s: The fake's clock-change delay (``PERSEUS_FAKE_CLOCK_DELAY_S``);
            None keeps the model's default (20 ms). Ignored otherwise.
        environ: Where ``zeusd`` mode reads Zeus's variables (``os.environ`` when None).
        reader: What reads the GPU in ``zeusd`` mode; None: NVML. Ignored otherwise.

    Returns:
        The GPU.

    Raises:
        GpuControlError: Unknown mode, or NVML cannot open the GPU.
        ZeusdUnavailable: ``zeusd`` mode, and zeusd cannot be reached.
        ZeusdRefused: ``zeusd`` mode, and zeusd refused this process clock changes.
    """
    if mode == "nvml":
        return NvmlGpu(index)
    if mode == "dry-run":
        return DryRunGpu(index)
    if mode == "fake":
        from perseus.client.gpu.fake import FakeGpu, FakeGpuModel, default_work

        work = fake_work if fake_work is not None else default_work(0, 1)
        model = FakeGpuModel()
        if fake_clock_delay_s is not None:
            model = dataclasses.replace(model, clock_change_delay_s=fake_clock_delay_s)
        return FakeGpu(model, work, index=index)
    if mode == "zeusd":
        from perseus.client.gpu.zeusd import ZeusdEndpoint, open_zeusd_gpu

        endpoint = ZeusdEndpoint.from_env(os.environ if environ is None else environ)
        return open_zeusd_gpu(index, endpoint, reader=reader)
    raise GpuControlError(f"unknown GPU mode {mode!r}: use 'nvml', 'dry-run', 'fake' or 'zeusd'")
