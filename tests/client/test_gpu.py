"""open_gpu and the GPU protocols: which implementation each mode opens, and which of them
offers the simulated GPU's work observer (the NVML implementations: test_nvml.py)."""

from __future__ import annotations

import pytest

from perseus.client.gpu.control import (
    DryRunGpu,
    GpuControl,
    NvmlGpu,
    WorkObserver,
    open_gpu,
    work_observer,
)
from perseus.client.gpu.fake import FakeGpu
from perseus.core.errors import GpuControlError

from .fake_nvml import FakeNvml


def test_open_gpu_fake_is_a_gpu_control() -> None:
    gpu = open_gpu("fake", 3)
    assert isinstance(gpu, FakeGpu) and isinstance(gpu, GpuControl)
    assert gpu.index == 3 and gpu.can_set_clocks
    assert gpu.supported_clocks_mhz()[0] == 1980


def test_only_a_simulated_gpu_has_a_work_observer() -> None:
    # The rank drives the fake through this optional hook, never by its type.
    fake = open_gpu("fake", 0)
    observer = work_observer(fake)
    assert observer is fake and isinstance(observer, WorkObserver)
    with NvmlGpu(0, nvml=FakeNvml()) as nvml_gpu, DryRunGpu(1, nvml=FakeNvml()) as dry:
        assert work_observer(nvml_gpu) is None and work_observer(dry) is None


def test_open_gpu_unknown_mode() -> None:
    with pytest.raises(GpuControlError, match="unknown GPU mode"):
        open_gpu("cuda", 0)  # type: ignore[arg-type]
