"""The GPU as the rank sees it: one protocol (:mod:`.control`), NVML (:mod:`.nvml`), a dry run,
a fake (:mod:`.fake`) and the energy counter (:mod:`.meter`).

The protocol's names are importable from here, as they were before the folder held them.
"""

from __future__ import annotations

from perseus.client.gpu.control import (
    DryRunGpu,
    GpuControl,
    GpuMode,
    NvmlGpu,
    WorkObserver,
    open_gpu,
    reset_clocks,
    validate_clock_mhz,
)

__all__ = [
    "DryRunGpu",
    "GpuControl",
    "GpuMode",
    "NvmlGpu",
    "WorkObserver",
    "open_gpu",
    "reset_clocks",
    "validate_clock_mhz",
]
